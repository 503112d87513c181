#!/usr/bin/env python3
"""examples/hf_trainer.py: transformers' Trainer trains a Llama sharded by mp.

    torchrun --standalone --nproc-per-node 2 examples/hf_trainer.py [--steps 20]

No patch to transformers or accelerate, and no Trainer subclass:

1. mp.init() reads torchrun's environment (who this rank is, the store).
2. The Trainer then sees one process: RANK, WORLD_SIZE and LOCAL_RANK are
   taken out of the environment. Otherwise accelerate would start
   torch.distributed and wrap the model in DistributedDataParallel, whose
   gradient all-reduce would do again what mp does (docs/embedding.md).
   So each rank's Trainer reads its own part of the data (here an
   IterableDataset of rank r's sequences r, r + W, ...), and only rank 0
   logs.
3. mp.torch.shard(model) shards it; the Trainer gets
   mp.torch.ShardedOptimizer(sharded, lr) as its optimizer: its step() is
   mp's step at the lr the Trainer's scheduler sets (linear decay).
   max_grad_norm=0: mp clips (the config's grad_clip; the Trainer would
   find no .grad to clip).

Rank 0 prints each step's loss, gradient norm and lr as mp's step reports
them (full precision: a test compares them with the plain loop).
"""
import argparse
import os
import sys

import torch
import transformers

import mp
import mp.torch

VOCAB, CONTEXT = 256, 32


def sequence(index):
    """Sequence `index`: token t+1 = 7 token t + 3 (mod VOCAB) from a random
    start, one token in eight random."""
    g = torch.Generator().manual_seed(5000 + index)
    tokens = torch.empty(CONTEXT, dtype=torch.long)
    tokens[0] = torch.randint(0, VOCAB, (1,), generator=g)
    noise = torch.randint(0, VOCAB, (CONTEXT,), generator=g)
    noisy = torch.rand(CONTEXT, generator=g) < 0.125
    for t in range(1, CONTEXT):
        tokens[t] = noise[t] if noisy[t] else (7 * tokens[t - 1] + 3) % VOCAB
    return tokens


class RankSequences(torch.utils.data.IterableDataset):
    """This rank's sequences r, r + W, r + 2W, ... (count of them)."""

    def __init__(self, rank, world, count):
        self.rank, self.world, self.count = rank, world, count

    def __iter__(self):
        for j in range(self.count):
            tokens = sequence(self.rank + self.world * j)
            yield {"input_ids": tokens, "labels": tokens}


def make_model(layers=2, channels=64):
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=channels, intermediate_size=2 * channels, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT))


def config_text(recipe, deterministic, lr):
    return (f"sharding {{ strategy: FULL_SHARD }} precision {{ recipe: {recipe} }} "
            f"deterministic: {'true' if deterministic else 'false'} "
            f"optimizer {{ lr: {lr} weight_decay: 0.1 grad_clip: 1.0 }}")


class PrintSteps(transformers.TrainerCallback):
    def __init__(self, optimizer):
        self.optimizer = optimizer

    def on_step_end(self, args, state, control, **kwargs):
        r = self.optimizer.results[-1]
        if mp.rank() == 0:
            # one write: unbuffered, print's line and newline are two
            sys.stdout.write(f"step {r.step:4d}  loss {r.loss!r}  norm {r.grad_norm!r}  lr {r.lr!r}\n")
            sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank and step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--recipe", default="BF16_MASTER")
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--out", default="/tmp/mp_hf_trainer")
    args = ap.parse_args()
    torch.set_num_threads(1)

    mp.init()
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(var, None)  # the Trainer sees one process (see above)

    model = make_model()
    sharded = mp.torch.shard(model, config=config_text(args.recipe, args.deterministic, args.lr))
    optimizer = mp.torch.ShardedOptimizer(sharded, lr=args.lr)
    training = transformers.TrainingArguments(
        output_dir=args.out, max_steps=args.steps, per_device_train_batch_size=args.batch, learning_rate=args.lr,
        lr_scheduler_type="linear", max_grad_norm=0.0, use_cpu=True, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
    data = RankSequences(mp.rank(), mp.world_size(), args.steps * args.batch)
    trainer = transformers.Trainer(model=model, args=training, train_dataset=data,
                                   optimizers=(optimizer, None), callbacks=[PrintSteps(optimizer)])
    if mp.rank() != 0:
        trainer.remove_callback(transformers.PrinterCallback)  # each Trainer thinks it is process 0
    trainer.train()
    sharded.close()


if __name__ == "__main__":
    main()
