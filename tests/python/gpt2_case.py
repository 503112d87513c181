"""The small transformers models the Python tests train (GPT-2 first, then
Llama, Qwen2 and a ResNet), their data and mp's config for them."""
import torch
import transformers

VOCAB, CHANNELS, LAYERS, HEADS, CONTEXT, BATCH = 256, 64, 2, 4, 32, 4
LR, WEIGHT_DECAY, CLIP = 1e-3, 0.1, 1.0


def config_text(strategy="FULL_SHARD", recipe="RECIPE_FP32", micro_batches=1, extra=""):
    return (f"sharding {{ strategy: {strategy} }} precision {{ recipe: {recipe} }} micro_batches: {micro_batches} "
            f"deterministic: {'true' if recipe == 'RECIPE_FP32' else 'false'} "
            f"optimizer {{ lr: {LR} weight_decay: {WEIGHT_DECAY} grad_clip: {CLIP} }} {extra}")


# Optimizer kind MUON: Muon for the blocks' matrices, AdamW for the rest.
MUON_LR, MUON_WEIGHT_DECAY, ADAMW_WEIGHT_DECAY, ADAMW_BETAS = 0.02, 0.1, 0.01, (0.9, 0.95)


def muon_config_text(strategy="FULL_SHARD", recipe="RECIPE_FP32", micro_batches=1, iteration="BF16"):
    """config_text with optimizer kind MUON (Newton-Schulz in `iteration`:
    BF16, torch's, or FP32); AdamW at LR for the parameters Muon does not
    take."""
    return (f"sharding {{ strategy: {strategy} }} precision {{ recipe: {recipe} }} micro_batches: {micro_batches} "
            f"deterministic: {'true' if recipe == 'RECIPE_FP32' else 'false'} "
            f"optimizer {{ kind: MUON lr: {MUON_LR} weight_decay: {MUON_WEIGHT_DECAY} grad_clip: {CLIP} "
            f"muon {{ iteration_dtype: {iteration} adamw_lr: {LR} adamw_beta1: {ADAMW_BETAS[0]} "
            f"adamw_beta2: {ADAMW_BETAS[1]} adamw_weight_decay: {ADAMW_WEIGHT_DECAY} }} }}")


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




def make(family, seed=0):
    """One of the test models, built from `seed`: "gpt2" (tied head),
    "llama" (rotary, RMSNorm, grouped-query attention), "qwen2" (biases in
    attention) or "resnet" (BatchNorm and its buffers)."""
    torch.manual_seed(seed)
    if family == "gpt2":
        return make_model(seed)
    if family == "resnet":
        return transformers.ResNetForImageClassification(transformers.ResNetConfig(
            num_channels=3, embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1], layer_type="basic",
            num_labels=10))
    common = dict(vocab_size=VOCAB, hidden_size=CHANNELS, intermediate_size=2 * CHANNELS, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=CONTEXT)
    if family == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    if family == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    raise ValueError(family)


def forward(model, index):
    """The loss of micro-batch `index`: tokens for the language models,
    images (labels shifting their mean) for ResNet."""
    if isinstance(model, transformers.ResNetForImageClassification):
        g = torch.Generator().manual_seed(2000 + index)
        labels = torch.randint(0, 10, (BATCH,), generator=g)
        images = torch.randn(BATCH, 3, 16, 16, generator=g) + labels.view(-1, 1, 1, 1) * 0.3
        return model(pixel_values=images, labels=labels).loss
    tokens = batch(index)
    return model(tokens, labels=tokens).loss


def torch_adamw_losses(model, steps, lr_at=None, autocast=False, ranks=1):
    """Plain PyTorch on `model`: torch.optim.AdamW with mp's parameter groups
    (decay for 2-D and larger) and clipping. Step s's loss is the mean of
    micro-batches s * ranks .. s * ranks + ranks - 1, as `ranks` ranks of
    mp each with one backward (micro-batch s * ranks + r on rank r) give."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.999), eps=1e-8,
                            foreach=False)
    losses = []
    for s in range(steps):
        if lr_at is not None and lr_at(s) is not None:
            for group in opt.param_groups:
                group["lr"] = lr_at(s)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = sum(forward(model, s * ranks + r) for r in range(ranks)) / ranks
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses
