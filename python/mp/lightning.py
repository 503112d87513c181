"""mp.lightning: Lightning's Trainer trains a LightningModule sharded by mp.

    import lightning, mp.lightning
    strategy = mp.lightning.MPStrategy(config="sharding { strategy: FULL_SHARD } precision { recipe: BF16_MASTER }")
    trainer = lightning.Trainer(strategy=strategy, accelerator="cpu", devices=2)
    trainer.fit(module)

MPStrategy is a ParallelStrategy, as Lightning's FSDPStrategy is:

- Ranks. Lightning's cluster environment (its own launcher for devices=N,
  or torchrun's, or Slurm's) tells mp.init who each process is and where
  rank 0's store is; mp.init refuses a launcher environment that says
  otherwise. The data plane is Gloo.
- Model. setup() shards the LightningModule with mp.torch.shard (units as
  shard chooses them, or `units=`).
- Optimizer. configure_optimizers' optimizer is kept for its param groups'
  lr, which its lr scheduler moves; mp's fused optimizer steps in its
  place: every optimizer_step runs the closure (training_step and
  backward), sets mp's lr to the optimizer's, and runs mp's step. Without
  an `optimizer { }` in the config, mp's takes kind, lr, betas, eps and
  weight decay from a torch.optim.AdamW (decaying 1-D parameters as torch
  does when every group has the same decay). Clip with the config's
  grad_clip (Lightning's gradient_clip_val sees no .grad: mp holds the
  gradients); accumulate_grad_batches sets micro_batches.
- Metrics. reduce, all_gather, broadcast and barrier go through mp's
  control plane (mp._mp.all_gather_bytes: small host values, in rank
  order), not torch.distributed.
- Checkpoints. A Lightning checkpoint path is a directory: mp's sharded
  checkpoint (every rank's shard, any world size can resume it) and
  lightning.ckpt, Lightning's own dict (loops, callbacks, the optimizer's
  param groups and the lr scheduler), written by rank 0. Resuming loads
  both after setup.

`results` holds mp.StepResult of every step (loss, grad_norm, lr, ...).
"""
import os
import pickle
import re
import shutil

import torch

import mp
import mp.torch
from mp import _mp

try:
    from lightning.pytorch.strategies import ParallelStrategy
    from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
    from lightning.pytorch.trainer.states import TrainerFn
except ImportError:  # the pytorch-lightning package
    from pytorch_lightning.strategies import ParallelStrategy
    from pytorch_lightning.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
    from pytorch_lightning.trainer.states import TrainerFn

__all__ = ["MPStrategy"]

_LIGHTNING_FILE = "lightning.ckpt"


class MPStrategy(ParallelStrategy):
    strategy_name = "mp"

    def __init__(self, config="", units=None, muon=None, accelerator=None, parallel_devices=None,
                 cluster_environment=None, checkpoint_io=None, precision_plugin=None):
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin)
        self._config, self._units, self._muon = config, units, muon
        self._num_nodes = 1
        self._resume_from = None
        self.sharded = None
        self.results = []

    # ---- processes and ranks (as DDPStrategy) -------------------------------------
    @property
    def num_nodes(self):
        return self._num_nodes

    @num_nodes.setter
    def num_nodes(self, n):
        self._num_nodes = n

    @property
    def is_distributed(self):  # Lightning then gives each rank its own DistributedSampler
        return True

    @property
    def num_processes(self):
        return len(self.parallel_devices) if self.parallel_devices is not None else 0

    @property
    def root_device(self):
        return self.parallel_devices[self.local_rank]

    @property
    def distributed_sampler_kwargs(self):
        return {"num_replicas": self.num_nodes * self.num_processes, "rank": self.global_rank}

    def _configure_launcher(self):
        if not self.cluster_environment.creates_processes_externally:
            self._launcher = _SubprocessScriptLauncher(self.cluster_environment, self.num_processes, self.num_nodes)

    def set_world_ranks(self):
        if self.cluster_environment is not None:
            self.cluster_environment.set_global_rank(self.node_rank * self.num_processes + self.local_rank)
            self.cluster_environment.set_world_size(self.num_nodes * self.num_processes)

    def setup_environment(self):
        super().setup_environment()
        self.set_world_ranks()
        env = self.cluster_environment  # Lightning's, torchrun's, Slurm's: it knows the ranks and the store
        mp.init(rank=self.global_rank, world_size=self.world_size, local_rank=self.local_rank,
                local_world_size=self.num_processes, master_addr=env.main_address, master_port=env.main_port)

    # ---- model and optimizer -------------------------------------------------------
    def setup(self, trainer):
        self.accelerator.setup(trainer)
        self.model_to_device()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            self.sharded = mp.torch.shard(self.lightning_module, config=self._engine_config(trainer),
                                          units=self._units, muon=self._muon)
        self.setup_precision_plugin()

    def _engine_config(self, trainer):
        config = self._config
        if not re.search(r"\bmicro_batches\b", config):
            config += f" micro_batches: {trainer.accumulate_grad_batches}"
        opt = self.optimizers[0] if self.optimizers else None
        opt = getattr(opt, "_optimizer", opt)
        if not re.search(r"\boptimizer\s*{", config) and isinstance(opt, torch.optim.AdamW):
            g = opt.param_groups[0]
            decays = {group["weight_decay"] for group in opt.param_groups}
            config += (f" optimizer {{ kind: ADAMW lr: {g['lr']} beta1: {g['betas'][0]} beta2: {g['betas'][1]} "
                       f"eps: {g['eps']} weight_decay: {g['weight_decay']} "
                       f"weight_decay_1d: {'true' if len(decays) == 1 else 'false'} }}")
        return config

    def model_to_device(self):
        self.model.to(self.root_device)

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        loss = closure()  # training_step and its backward: the gradients go to mp
        inner = getattr(optimizer, "_optimizer", optimizer)
        self.sharded.lr = inner.param_groups[0]["lr"]
        self.results.append(self.sharded.step())
        inner._opt_called = True  # torch's lr schedulers check that the optimizer stepped: mp did, for it
        return loss

    def training_step(self, *args, **kwargs):
        # Lightning calls the module's training_step, not its forward: shard's forward wrapper encloses it.
        return self.sharded.run_as_forward(self.lightning_module.training_step, *args, **kwargs)

    def validation_step(self, *args, **kwargs):
        return self.sharded.run_as_forward(self.lightning_module.validation_step, *args, **kwargs)

    def lightning_module_state_dict(self):
        return {}  # the weights are in mp's checkpoint (save_checkpoint)

    # ---- metrics: mp's control plane -----------------------------------------------
    def _all_gather_objects(self, obj):
        return [pickle.loads(b) for b in _mp.all_gather_bytes(pickle.dumps(obj))]

    def barrier(self, name=None):
        if _mp.initialized():
            _mp.all_gather_bytes(b"")

    def broadcast(self, obj, src=0):
        if not _mp.initialized():
            return obj
        return pickle.loads(_mp.all_gather_bytes(pickle.dumps(obj) if self.global_rank == src else b"")[src])

    def all_gather(self, tensor, group=None, sync_grads=False):
        parts = self._all_gather_objects(tensor.detach().cpu())
        return torch.stack(parts).to(tensor.device)

    def reduce(self, tensor, group=None, reduce_op="mean"):
        if not isinstance(tensor, torch.Tensor):
            return tensor
        op = str(getattr(reduce_op, "name", reduce_op) or "mean").lower()
        stacked = self.all_gather(tensor)  # rank order: the same bits on every rank
        if op in ("sum", "redop.sum"):
            return stacked.sum(0)
        if op in ("mean", "avg", "redop.avg"):
            return stacked.float().mean(0).to(tensor.dtype)
        if op in ("max", "redop.max"):
            return stacked.max(0).values
        if op in ("min", "redop.min"):
            return stacked.min(0).values
        raise mp.ConfigError(f"MPStrategy.reduce: reduce_op {reduce_op!r}: expected sum, mean, max or min")

    # ---- checkpoints: a directory of mp's shards and Lightning's dict ----------------
    @property
    def restore_checkpoint_after_setup(self):
        return True  # mp loads into the sharded engine

    def save_checkpoint(self, checkpoint, filepath, storage_options=None):
        path = str(filepath)
        self.sharded.save_checkpoint(path)
        if self.is_global_zero:
            torch.save(checkpoint, os.path.join(path, _LIGHTNING_FILE))
        self.barrier()

    def load_checkpoint(self, checkpoint_path, weights_only=None):
        self._resume_from = str(checkpoint_path)
        return torch.load(os.path.join(self._resume_from, _LIGHTNING_FILE), weights_only=False)

    def load_model_state_dict(self, checkpoint, strict=True):
        self.sharded.load_checkpoint(self._resume_from)

    def remove_checkpoint(self, filepath):
        if self.is_global_zero:
            shutil.rmtree(str(filepath), ignore_errors=True)

    def teardown(self):
        super().teardown()
        if self.sharded is not None:
            self.sharded.close()
            self.sharded = None
