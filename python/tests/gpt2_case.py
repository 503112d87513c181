"""The small transformers.GPT2LMHeadModel the Python tests train, its data
and mp's config for it."""
import torch
import transformers

VOCAB, CHANNELS, LAYERS, HEADS, CONTEXT, BATCH = 256, 64, 2, 4, 32, 4
LR, WEIGHT_DECAY, CLIP = 1e-3, 0.1, 1.0


def config_text(strategy="FULL_SHARD", recipe="RECIPE_FP32", micro_batches=1, extra=""):
    return (f"sharding {{ strategy: {strategy} }} precision {{ recipe: {recipe} }} micro_batches: {micro_batches} "
            f"deterministic: {'true' if recipe == 'RECIPE_FP32' else 'false'} "
            f"optimizer {{ lr: {LR} weight_decay: {WEIGHT_DECAY} grad_clip: {CLIP} }} {extra}")


def make_model(seed=0):
    """The model, built from `seed` (the same on every rank), no dropout."""
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=CONTEXT, n_embd=CHANNELS, n_layer=LAYERS,
                                     n_head=HEADS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                     bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1)
    return transformers.GPT2LMHeadModel(config)


def batch(index):
    """Micro-batch `index`: BATCH x CONTEXT tokens, a pure function of the
    index: each row from a random start, token t+1 = 7 token t + 3 (mod
    VOCAB), one in eight tokens random; learnable."""
    g = torch.Generator().manual_seed(1000 + index)
    tokens = torch.empty(BATCH, CONTEXT, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, VOCAB, (BATCH,), generator=g)
    noise = torch.randint(0, VOCAB, (BATCH, CONTEXT), generator=g)
    noisy = torch.rand(BATCH, CONTEXT, generator=g) < 0.125
    for t in range(1, CONTEXT):
        tokens[:, t] = torch.where(noisy[:, t], noise[:, t], (7 * tokens[:, t - 1] + 3) % VOCAB)
    return tokens


