"""mp.torch: a torch.nn.Module trained by mp, sharded, in the user's own loop.

    import mp, mp.torch
    mp.init()
    model = transformers.GPT2LMHeadModel(config)             # the same seed on every rank
    sharded = mp.torch.shard(model, config="sharding { strategy: FULL_SHARD } precision { recipe: BF16_MASTER }")
    for tokens in batches:
        model(tokens, labels=tokens).loss.backward()
        result = sharded.step()                              # mp.StepResult: loss, grad_norm, ...

shard() (mp/_shard.py) makes the model's blocks (or the given submodules)
units and every other parameter the root unit; hooks gather each unit's
parameters for its forward and backward, hand its gradients to mp as soon
as the backward has accumulated them, and step() runs mp's fused optimizer
on each rank's shard. docs/embedding.md ("Python") has the rest.
"""
import torch

from mp._shard import ShardedModel, plan, shard  # noqa: F401

__all__ = ["shard", "plan", "ShardedModel", "causal_lm_loss"]


def causal_lm_loss(logits, batch):
    """The next-token cross entropy of a [B, T, V] logits tensor against a
    [B, T] batch of tokens (position t predicts token t + 1), as Hugging
    Face's GPT-2 computes it."""
    tokens = batch if torch.is_tensor(batch) else batch[0]
    v = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits[:, :-1, :].reshape(-1, v).float(),
                                             tokens[:, 1:].reshape(-1))
