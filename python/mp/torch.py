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

from mp._mp import ConfigError
from mp._shard import ShardedModel, plan, shard  # noqa: F401

__all__ = ["shard", "plan", "ShardedModel", "ShardedOptimizer", "causal_lm_loss"]


class ShardedOptimizer(torch.optim.Optimizer):
    """A torch.optim.Optimizer face of a ShardedModel, for code that steps
    an optimizer: step() runs sharded.step() at the lr of the first param
    group, which torch's lr schedulers move; zero_grad() does nothing (mp
    holds the gradients); `results` keeps every mp.StepResult. Its own
    state is only the param groups (mp's optimizer state is in mp's
    checkpoints). transformers' Trainer takes it as
    Trainer(..., optimizers=(ShardedOptimizer(sharded), None))."""

    def __init__(self, sharded, lr=None):
        lr = sharded.lr if lr is None else lr
        if lr is None:
            raise ConfigError("ShardedOptimizer(sharded, lr): give the lr (the model has not stepped yet)")
        super().__init__([p for p in sharded.model.parameters() if p.requires_grad], {"lr": float(lr)})
        self.sharded = sharded
        self.results = []

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self.sharded.lr = self.param_groups[0]["lr"]
        self.results.append(self.sharded.step())
        return loss

    def zero_grad(self, set_to_none=True):
        pass


def causal_lm_loss(logits, batch):
    """The next-token cross entropy of a [B, T, V] logits tensor against a
    [B, T] batch of tokens (position t predicts token t + 1), as Hugging
    Face's GPT-2 computes it."""
    tokens = batch if torch.is_tensor(batch) else batch[0]
    v = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits[:, :-1, :].reshape(-1, v).float(),
                                             tokens[:, 1:].reshape(-1))
