"""One Lightning run for check_lightning.py (Lightning's own launcher starts
rank 1 by running this script again):

  lightning_case.py fit --out FILE --epochs E --epoch-steps K [--recipe R]
                        [--ckpt-dir DIR] [--resume CKPT]
  lightning_case.py plain --out FILE --epochs E --epoch-steps K
      the same training in mp.torch.shard's own loop, on 1 rank with 2
      backwards a step (the 2 ranks' micro-batches).

A LightningModule wrapping gpt2_case.py's Llama; step s of epoch e reads
micro-batch 2 (s mod K) + r on rank r (its own DistributedSampler, no
shuffle);
configure_optimizers gives AdamW and a LambdaLR that lowers the lr each
step (MPStrategy keeps the scheduler; mp's optimizer steps). fit saves a
checkpoint at the end of every epoch into --ckpt-dir. Rank 0 writes every
step's loss and norm (hex) and the lr, and what the strategy's barrier,
all_gather, reduce and broadcast gave at the end.
"""
import argparse
import json

import lightning
import torch

import gpt2_case as case
import mp
import mp.lightning
import mp.torch


def lr_factor(step):
    return 1.0 - 0.02 * step


class Module(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = case.make("llama")

    def training_step(self, batch, batch_idx):
        loss = case.forward(self.model, int(batch[0]))
        self.log("train_loss", loss, sync_dist=True)  # the strategy's reduce
        return loss

    def on_train_end(self):  # the metrics' collectives, through the strategy
        s, r = self.trainer.strategy, self.trainer.global_rank
        s.barrier()
        self.collectives = {"all_gather": self.all_gather(torch.tensor([r, 10 * r])).tolist(),
                            "reduce_sum": s.reduce(torch.tensor(r + 1.0), reduce_op="sum").item(),
                            "reduce_mean": s.reduce(torch.tensor(r + 1.0)).item(),
                            "broadcast": s.broadcast({"from": r}, src=1)}

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=case.LR)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.LambdaLR(opt, lr_factor),
                                                   "interval": "step"}}

    def train_dataloader(self):  # rank r: items r, r + 2, ... (Lightning's own sampler would shuffle)
        items = list(range(2 * self.trainer.epoch_steps))
        sampler = torch.utils.data.DistributedSampler(items, num_replicas=self.trainer.world_size,
                                                      rank=self.trainer.global_rank, shuffle=False)
        return torch.utils.data.DataLoader(items, batch_size=1, sampler=sampler)


def write(path, results, extra=None):
    with open(path, "w") as f:
        json.dump({"losses": [r.loss.hex() for r in results], "norms": [r.grad_norm.hex() for r in results],
                   "lrs": [r.lr for r in results], **(extra or {})}, f)


def fit(args):
    callbacks = []
    if args.ckpt_dir:
        callbacks.append(lightning.pytorch.callbacks.ModelCheckpoint(dirpath=args.ckpt_dir, every_n_epochs=1,
                                                                      save_top_k=-1))
    strategy = mp.lightning.MPStrategy(config=case.config_text(recipe=args.recipe))
    trainer = lightning.Trainer(strategy=strategy, accelerator="cpu", devices=2, max_epochs=args.epochs,
                                logger=False, enable_checkpointing=bool(callbacks), callbacks=callbacks,
                                enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                                use_distributed_sampler=False)
    trainer.epoch_steps = args.epoch_steps
    module = Module()
    trainer.fit(module, ckpt_path=args.resume or None)
    if trainer.global_rank == 0:
        write(args.out, strategy.results, {"world_size": mp.world_size(), "data_plane": mp.data_plane(),
                                           "global_step": trainer.global_step, "collectives": module.collectives})


def plain(args):
    mp.init()
    model = case.make("llama")
    sharded = mp.torch.shard(model, config=case.config_text(micro_batches=2))
    results = []
    for s in range(args.epochs * args.epoch_steps):
        sharded.lr = case.LR * lr_factor(s)
        for m in range(2):
            case.forward(model, 2 * (s % args.epoch_steps) + m).backward()
        results.append(sharded.step())
    write(args.out, results)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["fit", "plain"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--epoch-steps", type=int, default=4)
    ap.add_argument("--recipe", default="RECIPE_FP32")
    ap.add_argument("--ckpt-dir", default="")
    ap.add_argument("--resume", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)
    fit(args) if args.what == "fit" else plain(args)


if __name__ == "__main__":
    main()
