"""mp.torch: a torch.nn.Module trained by mp, sharded.

    import mp, mp.torch
    mp.init()
    model = transformers.GPT2LMHeadModel(config)             # the same seed on every rank
    units = mp.torch.gpt2_units(model)                       # or your own list of mp.torch.Unit
    trainer = mp.torch.Sharded(units, loss=mp.torch.causal_lm_loss, data=lambda index: batch(index),
                               config="sharding { strategy: FULL_SHARD } precision { recipe: BF16_MASTER }")
    for _ in range(steps):
        result = trainer.step()                              # mp.StepResult: loss, grad_norm, ...

The units are an ordered list of submodules with the function that runs
each on the previous unit's output (the first on the micro-batch); the loss
takes the last unit's output and the micro-batch. For each micro-batch mp
gathers a unit's parameters, the unit's parameters become views of that
buffer (no copy), its forward runs with autograd; the backward runs unit by
unit in reverse, handing the gradient of each unit's input on, and writes
the parameters' gradients into mp's buffer; mp then reduces them and
applies its fused optimizer (the config's `optimizer`).

A parameter used by several units (GPT-2's wte and lm_head) belongs to the
first unit that holds it; that unit's forward keeps a copy of its values
for the later units (as mp's own GPT does, Note [Tied head] in
models/gpt.h), and its gradient is the sum of every unit's part, written
with the owner's in its backward. A tensor that autograd saves and that
lives in a unit's gathered buffer (a weight a matmul saves) is saved as a
place in that buffer and read back, in the backward, from the buffer
gathered for it (torch.autograd.graph.saved_tensors_hooks): the forward's
gathered copy may be gone by then (FULL_SHARD).

With the config's activation_checkpointing (as torch.utils.checkpoint,
but planned by mp), a unit mp recomputes runs its forward without autograd,
keeping only its input (and the RNG state); just before its backward mp
calls recompute, which runs the forward again with autograd on the
parameters the backward gathered. Units that own or use a tied parameter,
and the last unit, are never recomputed; Unit(recompute=False) opts a unit
out.

Micro-batch `index` is the engine's global index (step, micro-batch, rank):
`data(index)` must give every rank its own data, the same for the same
index. Build the module with the same seed on every rank: the weights start
from rank 0's (Engine.set_weights(root=0)). docs/embedding.md ("Python") has
the rest.
"""
import contextlib

import torch

import mp as _mp

__all__ = ["Unit", "Sharded", "gpt2_units", "causal_lm_loss"]

_IN_BUFFER = object()  # marks a saved tensor packed as a place in a gathered buffer


class Unit:
    """A part of the model mp gathers, runs and reduces as one.

    module:    the nn.Module (or ModuleList) whose parameters the unit owns;
    forward:   forward(x) -> y, run on the previous unit's output (the first
               unit on the micro-batch), a single tensor;
    recompute: whether activation_checkpointing may recompute the unit.
    """

    def __init__(self, name, module, forward, recompute=True):
        self.name = name
        self.module = module
        self.forward = forward
        self.recompute = recompute


def causal_lm_loss(logits, batch):
    """The next-token cross entropy of a [B, T, V] logits tensor against a
    [B, T] batch of tokens (position t predicts token t + 1), as Hugging
    Face's GPT-2 computes it."""
    tokens = batch if torch.is_tensor(batch) else batch[0]
    v = logits.shape[-1]
    return torch.nn.functional.cross_entropy(logits[:, :-1, :].reshape(-1, v).float(),
                                             tokens[:, 1:].reshape(-1))


def gpt2_units(model):
    """transformers.GPT2LMHeadModel as units: the embeddings (wte, wpe),
    each block, then the final LayerNorm and the head (tied to wte)."""
    t = model.transformer

    def embed(batch):
        tokens = batch if torch.is_tensor(batch) else batch[0]
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return t.drop(t.wte(tokens) + t.wpe(positions))

    def mask(x):  # what GPT2Model gives its blocks: None where attention is causal by itself
        return _causal_mask(model.config, x)

    units = [Unit("embed", torch.nn.ModuleList([t.wte, t.wpe]), embed)]
    for i, block in enumerate(t.h):
        units.append(Unit(f"h{i}", block, lambda x, block=block: _first(block(x, attention_mask=mask(x)))))
    units.append(Unit("head", torch.nn.ModuleList([t.ln_f, model.lm_head]), lambda x: model.lm_head(t.ln_f(x))))
    return units


def _causal_mask(config, x):
    import inspect

    from transformers.masking_utils import create_causal_mask
    positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
    offered = {"config": config, "inputs_embeds": x, "input_embeds": x, "attention_mask": None, "cache": None,
               "past_key_values": None, "position_ids": positions, "cache_position": positions[0]}
    accepted = inspect.signature(create_causal_mask).parameters
    return create_causal_mask(**{k: v for k, v in offered.items() if k in accepted})


def _first(output):
    return output[0] if isinstance(output, (tuple, list)) else output


def _to_device(batch, device):
    if torch.is_tensor(batch):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


class _UnitParams:
    """Where a unit's parameters live: those it owns at their offsets in its
    flat buffer, and those of earlier units it uses (tied)."""

    def __init__(self):
        self.owned = []  # (parameter, name, offset, numel, shape)
        self.tied = []   # parameters owned by an earlier unit


class Sharded:
    """Trains `units` (a list of Unit) with mp's engine.

    loss:    loss(last unit's output, micro-batch) -> scalar tensor (the
             micro-batch's mean);
    data:    data(index) -> the micro-batch of global index `index`;
    config:  an EngineConfig in protobuf text format (docs/engine.md);
    device:  'cpu' or 'cuda' (this rank's GPU);
    root:    the module whose parameter names mp uses (e.g. the whole
             model); by default each unit's own names, prefixed by the unit.
    """

    def __init__(self, units, loss, data, config="", device="cpu", root=None):
        if not _mp.initialized():
            _mp.init()
        self.units = list(units)
        self.loss_fn = loss
        self.data = data
        names = {id(p): n for n, p in root.named_parameters()} if root is not None else {}
        self._params = self._place(names)
        spec = [_mp.Unit(u.name, [_mp.Param(name, list(shape), init="zeros") for (_, name, _, _, shape) in
                                  self._params[i].owned], recomputable=self._recomputable(i))
                for i, u in enumerate(self.units)]
        self.engine = _mp.Engine(spec, config, device)
        self._recomputed = [self.engine.recomputes(i) for i in range(len(self.units))]
        self.device = torch.device("cpu") if self.engine.device == "cpu" else torch.device(self.engine.device)
        self._dtype = getattr(torch, self.engine.param_dtype)
        self._offsets(spec)
        self._load_module_weights()
        self._stream = None
        self._reset()

    # ---- set-up ---------------------------------------------------------------------

    def _place(self, names):
        owner = {}
        placed = []
        for i, unit in enumerate(self.units):
            up = _UnitParams()
            for local, p in unit.module.named_parameters():
                if id(p) in owner:
                    if owner[id(p)] != i:
                        up.tied.append(p)
                    continue
                owner[id(p)] = i
                name = names.get(id(p), f"{unit.name}.{local}")
                up.owned.append([p, name, 0, p.numel(), tuple(p.shape)])
            if not up.owned:
                raise _mp.ConfigError(f"mp.torch: unit {i} ('{unit.name}') owns no parameters")
            placed.append(up)
        self._tied_ids = {id(p) for up in placed for p in up.tied}
        return placed

    def _recomputable(self, i):
        up = self._params[i]
        tied = up.tied or any(id(e[0]) in self._tied_ids for e in up.owned)
        return self.units[i].recompute and not tied and i < len(self.units) - 1

    def _offsets(self, spec):
        for u, up in enumerate(self._params):
            where = {d["name"]: d["offset"] for d in self.engine.params(u)}
            for entry in up.owned:
                entry[2] = where[entry[1]]

    def _load_module_weights(self):
        """The engine's weights := the module's, rank 0's on every rank."""
        import numpy as np
        for u, up in enumerate(self._params):
            flat = np.zeros(self.engine.unit_numel(u), dtype=np.float32)
            for p, _, off, n, _ in up.owned:
                flat[off:off + n] = p.detach().float().cpu().reshape(-1).numpy()
            self.engine.set_weights(u, flat, root=0)

    def _reset(self):
        self._batch = None
        self._inputs = {}
        self._outputs = {}
        self._grad_in = {}
        self._tied_values = {}
        self._tied_grads = {}
        self._backward_flat = {}
        self._rng = {}
        self._loss = None

    # ---- what the engine calls (Note [Python callbacks] in python/src/models.h) ------------

    def begin_micro_batch(self, index):
        self._reset()
        self._batch = self.data(index)  # to the device in unit 0's forward, on the engine's stream

    def forward(self, unit, params, stream=None):
        with self._on(stream):
            flat = torch.from_dlpack(params)
            self._bind(unit, flat)
            if unit == 0:
                self._batch = _to_device(self._batch, self.device)
            x = self._batch if unit == 0 else self._inputs[unit]
            last = unit == len(self.units) - 1
            grad = torch.is_grad_enabled() and not self._evaluating
            recomputed = grad and self._recomputed[unit]
            if recomputed:  # the input is kept (self._inputs), and the RNG state for the recompute
                self._rng[unit] = self._rng_state()
            with torch.set_grad_enabled(grad and not recomputed), torch.autograd.graph.saved_tensors_hooks(
                    self._packer(flat), self._unpacker(unit)):
                y = self.units[unit].forward(x)
                if last:
                    y = self.loss_fn(y, self._batch)
            if last:
                self._loss = y
            else:
                if y.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr():
                    y = y.clone()  # an output that is a view of the gathered buffer outlives it
                nxt = y.detach()
                if grad and nxt.is_floating_point():
                    nxt.requires_grad_()
                self._inputs[unit + 1] = nxt
            if grad and not recomputed:
                self._outputs[unit] = y

    def recompute(self, unit, params, stream=None):
        """The forward of a recomputed unit again, with autograd, just
        before its backward, on the same input and RNG state."""
        with self._on(stream):
            flat = torch.from_dlpack(params)
            self._backward_flat[unit] = flat  # what the unpacker reads; backward sets the same buffer
            self._bind(unit, flat)
            x = self._batch if unit == 0 else self._inputs[unit]
            with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
                self._set_rng_state(self._rng.pop(unit))
                with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(
                        self._packer(flat), self._unpacker(unit)):
                    self._outputs[unit] = self.units[unit].forward(x)

    def loss(self):
        if self._stream is not None:  # a device engine copies it to the host on its stream
            with torch.cuda.stream(self._stream):
                return self._loss.detach().double().reshape(1)
        return float(self._loss.detach())

    def backward(self, unit, params, grads, stream=None):
        with self._on(stream):
            self._backward_flat[unit] = torch.from_dlpack(params)
            g = torch.from_dlpack(grads)
            up = self._params[unit]
            inputs = [e[0] for e in up.owned] + up.tied
            x = self._inputs.get(unit) if unit > 0 else None
            with_x = x is not None and x.requires_grad
            if with_x:
                inputs.append(x)
            seed = self._grad_in.pop(unit + 1, None)
            got = torch.autograd.grad(self._outputs.pop(unit), inputs, grad_outputs=seed, allow_unused=True)
            for (p, name, off, n, shape), gp in zip(up.owned, got):
                dst = g[off:off + n]
                if gp is None:
                    dst.zero_()
                else:
                    dst.copy_(gp.reshape(-1))
                tied = self._tied_grads.pop(id(p), None)
                if tied is not None:
                    dst.add_(tied.reshape(-1))
            for p, gp in zip(up.tied, got[len(up.owned):]):
                if gp is not None:
                    prev = self._tied_grads.get(id(p))
                    self._tied_grads[id(p)] = gp if prev is None else prev + gp
            if with_x:
                self._grad_in[unit] = got[-1]
            del self._backward_flat[unit]
            self._inputs.pop(unit, None)
            if unit == 0:
                self._reset()

    # ---- helpers ------------------------------------------------------------------

    def _on(self, stream):
        if stream is None:
            return contextlib.nullcontext()
        if self._stream is None or self._stream.cuda_stream != stream:
            self._stream = torch.cuda.ExternalStream(stream, device=self.device)
        return torch.cuda.stream(self._stream)

    def _bind(self, unit, flat):
        """The unit's parameters become views of its gathered buffer; a tied
        parameter a later unit uses is kept as a copy."""
        for p, _, off, n, shape in self._params[unit].owned:
            p.data = flat[off:off + n].view(shape)
            if id(p) in self._tied_ids:  # the buffer may be gone when a later unit runs
                self._tied_values[id(p)] = p.data.clone()
        for p in self._params[unit].tied:
            p.data = self._tied_values[id(p)]

    def _rng_state(self):
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return torch.get_rng_state(), cuda

    def _set_rng_state(self, state):
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], self.device)

    @staticmethod
    def _packer(flat):
        base = flat.untyped_storage().data_ptr()

        def pack(t):
            if t.untyped_storage().data_ptr() == base and t.dtype == flat.dtype:
                return (_IN_BUFFER, tuple(t.shape), t.stride(), t.storage_offset())
            return t
        return pack

    def _unpacker(self, unit):
        def unpack(saved):
            if isinstance(saved, tuple) and len(saved) == 4 and saved[0] is _IN_BUFFER:
                _, shape, stride, offset = saved
                return self._backward_flat[unit].as_strided(shape, stride, offset)
            return saved
        return unpack

    # ---- the trainer --------------------------------------------------------------

    _evaluating = False

    def step(self):
        """One optimizer step over the config's micro-batches. Collective."""
        try:
            return self.engine.step(self)
        finally:
            self._reset()

    def evaluate(self, first, count):
        """The mean loss of `count` micro-batches per rank from index
        `first`, without gradients. Collective."""
        self._evaluating = True
        try:
            return self.engine.evaluate(self, first, count)
        finally:
            self._evaluating = False
            self._reset()

    def save_checkpoint(self, root):
        return self.engine.save_checkpoint(root)

    def load_checkpoint(self, path):
        """Loads a checkpoint (a directory, or a root's latest); returns its step."""
        return self.engine.load_checkpoint(path)

    def sync_module(self):
        """Copies the engine's fp32 weights into the module's parameters (their
        own memory, in fp32), e.g. to evaluate or save it with torch.
        Collective."""
        for u, up in enumerate(self._params):
            flat = torch.from_numpy(self.engine.gather_master(u))
            for p, _, off, n, shape in up.owned:
                p.data = flat[off:off + n].view(shape).clone().to(self.device)

    def close(self):
        self.engine.close()
