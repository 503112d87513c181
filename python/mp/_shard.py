"""mp.torch.shard: an unmodified torch.nn.Module trained by mp in the
user's own loop, as FSDP2's fully_shard.

    model = transformers.LlamaForCausalLM(config)       # the same seed on every rank
    sharded = mp.torch.shard(model, config="sharding { strategy: FULL_SHARD } precision { recipe: BF16_MASTER }")
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()
        result = sharded.step()                          # mp.StepResult: loss, grad_norm, skipped, ...

The units are the given submodules (by default the blocks: the longest
nn.ModuleList in the model); every other parameter belongs to the root
unit (unit 0: embeddings, final norm, head). Hooks drive mp's engine
(Note [Driving the engine] in runtime/engine.h) as the user's passes reach
each unit:
- before a unit's forward its parameters are gathered (prefetching the
  next units) and become views of the gathered buffer; after it they are
  released (the root's after the whole forward, which it encloses);
- a tensor autograd saves that lives in a gathered buffer (a weight a
  matmul saves) is saved as its place in that buffer, and read back in the
  backward from the buffer gathered again for it: the first read gathers
  the unit (saved_tensors_hooks);
- once the backward has accumulated all of a unit's gradients
  (post-accumulate-grad hooks; at the end of the backward for parameters
  that got none) they go to mp's gradient buffer, the unit's reduction
  starts at once, overlapping the rest of the backward, and the unit is
  released;
- step() finishes mp's step: statistics, clipping, the skip decision and
  the fused update. Several backwards before one step() are gradient
  accumulation: the config's micro_batches says how many.
Forwards without gradients (model.eval(), torch.no_grad()) gather, run and
release. torch.utils.checkpoint inside a unit (transformers'
gradient_checkpointing_enable) works as it does without mp; so does the
config's activation_checkpointing, which runs the units it picks under
torch.utils.checkpoint, gathering them again for the recomputation. Build the module with the same seed on every rank: the weights
start from rank 0's.

Optimizer kind MUON (optimizer { kind: MUON }) updates the parameters
marked for it with Muon, each whole, and the rest with its AdamW. By
default the marked ones are the 2-D parameters of the units other than the
root, less nn.Embedding weights: a transformer's block matrices, and not
its embeddings, head, norms or biases (the root holds the embeddings, the
head and the final norm). shard(muon=...) picks them instead: a callable
(name, parameter) -> bool, or an iterable of parameter names. Each must be
2-D; Muon reads it as the matrix of its stored shape (torch.optim.Muon's
param.shape: a Hugging Face Conv1D weight [in, out] as it is). With other
kinds nothing is marked. ShardedModel.muon_params names the marked ones.
"""
import contextlib
import enum
import functools
import weakref

import torch

import mp as _mp

__all__ = ["shard", "ShardedModel"]

_IN_BUFFER = object()  # marks a saved tensor packed as a place in a gathered buffer


def _default_units(model):
    """The longest nn.ModuleList of the model (a transformer's blocks)."""
    best = None
    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList) and (best is None or len(m) > len(best)):
            best = m
    if best is None:
        raise _mp.ConfigError("mp.torch.shard: the model has no nn.ModuleList of blocks; pass units=[...]")
    return list(best)


class _Guard(torch.overrides.TorchFunctionMode):
    """During a forward: a parameter passed to a torch function while its
    unit is not gathered (used outside its unit) is an error naming it."""

    def __init__(self, sharded):
        super().__init__()
        self.sharded = sharded

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.nn.Parameter):
                self.sharded._check_gathered(a, func)
        return func(*args, **kwargs)


class _Phase(enum.Enum):
    """Why a unit is gathered, as FSDP2 names its TrainingState; whether it
    is, the engine says (Engine.unsharded)."""
    IDLE = "idle"                  # sharded
    FORWARD = "forward"            # gathered for its forward
    PRE_BACKWARD = "pre_backward"  # gathered again for its backward (saved weights, recomputation)


class _Unit:
    def __init__(self, index, name, module):
        self.index = index
        self.name = name
        self.module = module
        self.params = []          # [parameter, name, offset, numel, shape]
        self.phase = _Phase.IDLE
        self.flat = None          # the gathered buffer, while the engine has the unit unsharded
        self.depth = 0            # its forwards under way (nested or re-entered)
        self.due = None           # this backward's gradients not accumulated yet (a count); None: none due


class ShardedModel:
    """What shard() returns: the engine behind the module's hooks.

    step()            finishes the step after the config's micro_batches
                      backwards; returns mp.StepResult. Collective.
    muon_params       the names of the parameters Muon updates (kind MUON;
                      () with other kinds), in unit order.
    memory()          what this rank holds, by owner and category (Note
                      [What a rank holds] in docs/embedding.md).
    plan(world_size)  the engine's bytes per rank at world_size ranks, as
                      predicted (equal to memory()["engine"] once a step ran).
    full_state_dict() the fp32 weights by parameter name, on every rank, or
                      (rank0_only) on rank 0 alone, gathered a unit at a time.
    save_checkpoint(root), load_checkpoint(path): mp's sharded checkpoints.
    """

    def __init__(self, model, units=None, config="", device="cpu", muon=None):
        if not _mp.initialized():
            _mp.init()
        self.model = model
        self._units, self.muon_params, spec, held = _layout(model, units, config, muon)
        self.engine = _mp.Engine(spec, config, device, held_units=held, param_dtype_gradients=True)
        self.device = torch.device("cpu") if self.engine.device == "cpu" else torch.device(self.engine.device)
        for u in self._units:
            where = {d["name"]: d["offset"] for d in self.engine.params(u.index)}
            for entry in u.params:
                entry[2] = where[entry[1]]
        self._load_weights()
        self._owner = {id(e[0]): u for u in self._units for e in u.params}
        self._hooks = []
        self._install()
        self._in_forward = False
        self._pack_fn, self._unpack_fn = _packers(weakref.proxy(self))
        self._losses = []         # the forwards' losses, noted at step()
        self._saved = {}          # the last forward's saved activations: storage -> bytes
        self._engine_storage = set()  # the gathered buffers' storage (parameters' views stay in them)
        self._scale = self.engine.loss_scale()
        self._lr = None
        self._stream = (torch.cuda.ExternalStream(self.engine.compute_stream(), device=self.device)
                        if self.device.type == "cuda" else None)
        self._backward = False    # a backward is under way (its end callback queued)

    # ---- set-up --------------------------------------------------------------------

    @staticmethod
    def place(model, blocks):
        names = {}
        for n, p in model.named_parameters():
            names.setdefault(id(p), n)
        module_names = {id(m): n for n, m in model.named_modules()}
        owner = {}
        units = []
        for i, block in enumerate(blocks):
            u = _Unit(i + 1, module_names.get(id(block), f"unit{i + 1}"), block)
            for p in block.parameters():
                if id(p) in owner:
                    raise _mp.ConfigError(f"mp.torch.shard: parameter '{names.get(id(p))}' is in units "
                                          f"'{owner[id(p)].name}' and '{u.name}': a parameter belongs to one unit")
                owner[id(p)] = u
                u.params.append([p, names[id(p)], 0, p.numel(), tuple(p.shape)])
            if not u.params:
                raise _mp.ConfigError(f"mp.torch.shard: unit {i + 1} ('{u.name}') has no parameters")
            units.append(u)
        root = _Unit(0, "root", model)
        for n, p in model.named_parameters():
            if id(p) not in owner:
                owner[id(p)] = root
                root.params.append([p, n, 0, p.numel(), tuple(p.shape)])
        if root.params:
            return [root] + units
        for u in units:  # no root unit: the blocks are units 0..
            u.index -= 1
        return units

    @staticmethod
    def muon_choice(model, units, muon, kind_takes_matrices):
        """The names of the parameters Muon updates: shard()'s `muon` rule
        (None: the default of the module docstring), () unless the
        optimizer kind updates marked matrices (MUON). A chosen parameter
        must be 2-D."""
        entries = [(u, p, name, shape) for u in units for (p, name, _, _, shape) in u.params]
        if muon is None:
            embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
            chosen = [name for u, p, name, shape in entries
                      if u.module is not model and len(shape) == 2 and id(p) not in embeddings]
        elif callable(muon):
            chosen = [name for u, p, name, _ in entries if muon(name, p)]
        else:
            if isinstance(muon, (str, bytes)):
                raise _mp.ConfigError(f"mp.torch.shard(muon={muon!r}): a callable (name, parameter) -> bool or an "
                                      "iterable of parameter names, not a string")
            # Every name of a parameter counts (a tied head's too).
            canonical = {id(p): name for _, p, name, _ in entries}
            alias = {n: canonical[id(p)] for n, p in model.named_parameters(remove_duplicate=False)
                     if id(p) in canonical}
            wanted = set()
            for n in muon:
                if n not in alias:
                    raise _mp.ConfigError(f"mp.torch.shard(muon=...): the model has no parameter '{n}'")
                wanted.add(alias[n])
            chosen = [name for _, _, name, _ in entries if name in wanted]
        if muon is not None:
            shapes = {name: shape for _, _, name, shape in entries}
            for name in chosen:
                if len(shapes[name]) != 2:
                    raise _mp.ConfigError(f"mp.torch.shard(muon=...): parameter '{name}' of shape "
                                          f"{list(shapes[name])} is marked for Muon, which takes 2-D matrices only")
        return tuple(chosen) if kind_takes_matrices else ()

    def _load_weights(self):
        """The engine's weights := the module's, rank 0's on every rank; then
        the module's own storage is freed, a unit at a time: from here on a
        parameter's data is a view of its unit's gathered buffer while the
        unit is unsharded, else a stand-in of its shape that holds one
        element (_stand_in)."""
        import numpy as np
        for u in self._units:
            flat = np.zeros(self.engine.unit_numel(u.index), dtype=np.float32)
            for p, _, off, n, _ in u.params:
                flat[off:off + n] = p.detach().float().cpu().reshape(-1).numpy()
            self.engine.set_weights(u.index, flat, root=0)
            del flat
            for p, _, _, _, shape in u.params:
                p.data = _stand_in(shape, p.dtype, p.device)
        _return_freed_memory()

    def _install(self):
        root = self._units[0] if self._units[0].module is self.model else None
        me = weakref.proxy(self)  # the module's hooks do not keep the engine alive
        self._recomputed = {}  # unit -> the module's own forward, where mp recomputes the unit
        for u in self._units:
            if u is root:
                continue
            self._hooks.append(u.module.register_forward_pre_hook(lambda m, a, u=u: me._pre_forward(u)))
            self._hooks.append(u.module.register_forward_hook(lambda m, a, out, u=u: me._post_forward(u)))
            if self.engine.recomputes(u.index):
                self._recomputed[u] = u.module.forward
                u.module.forward = _recomputing_forward(me, u, u.module.forward)
        # The root's forward encloses the rest: wrapped, so that whatever it
        # raises, the contexts it entered are left.
        inner = self.model.forward

        @functools.wraps(inner)  # its signature stays the module's (transformers' Trainer reads it)
        def forward(*args, **kwargs):
            return me._root_forward(root, inner, args, kwargs)
        self.model.forward = forward
        self._inner_forward = inner
        self._root = root
        for u in self._units:
            for p, *_ in u.params:
                if p.requires_grad:
                    self._hooks.append(p.register_post_accumulate_grad_hook(lambda p, u=u: me._accumulated(u)))

    # ---- the forward -----------------------------------------------------------------

    def _root_forward(self, root, inner, args, kwargs):
        if self._in_forward:  # the model calling itself
            return inner(*args, **kwargs)
        grad = torch.is_grad_enabled()
        if grad:
            self._saved = {}  # this forward's, counted by _pack
        self._in_forward = True
        try:
            with contextlib.ExitStack() as stack:
                if grad:
                    stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack_fn, self._unpack_fn))
                stack.enter_context(_Guard(self))
                if root is not None:
                    self._pre_forward(root)
                    stack.callback(self._post_forward, root)
                out = inner(*args, **kwargs)
        finally:
            self._in_forward = False
        if grad:
            for u in self._units:
                if any(p.requires_grad for p, *_ in u.params):
                    u.due = sum(1 for p, *_ in u.params if p.requires_grad)
            loss = getattr(out, "loss", None) if not isinstance(out, dict) else out.get("loss")
            if torch.is_tensor(loss) and loss.numel() == 1:
                self._losses.append(loss.detach())
        return out

    def run_as_forward(self, fn, *args, **kwargs):
        """fn(*args, **kwargs) as the module's forward is run (the root
        unit gathered around it, the loss it returns noted): for a trainer
        whose step is another method of the module (Lightning's
        training_step)."""
        out = self._root_forward(self._root, fn, args, kwargs)
        if torch.is_tensor(out) and out.numel() == 1 and torch.is_grad_enabled():
            self._losses.append(out.detach())
        return out

    def _pre_forward(self, u):
        u.depth += 1
        # In the backward: the forward again (torch.utils.checkpoint's recomputation).
        self._unshard(u, _Phase.PRE_BACKWARD if _in_backward() else _Phase.FORWARD)

    def _post_forward(self, u):
        u.depth -= 1
        if u.depth == 0 and u.phase is _Phase.FORWARD:
            self._reshard(u)

    def _gathered(self, u):
        """The engine's word: unit u is unsharded (u.flat its buffer)."""
        return self.engine.unsharded(u.index)

    def _unshard(self, u, phase):
        """Gathers unit u for `phase`, unless the engine has it unsharded already."""
        if self._gathered(u):
            return
        backward = phase is _Phase.PRE_BACKWARD
        u.flat = torch.from_dlpack(self.engine.unshard(u.index, backward=backward))
        u.phase = phase
        self._engine_storage.add(u.flat.untyped_storage().data_ptr())
        self._after_engine()
        for p, _, off, n, shape in u.params:
            p.data = u.flat[off:off + n].view(shape)
        if backward:
            self._begin_backward()

    def _reshard(self, u):
        if self._gathered(u):
            self._before_engine()
            self.engine.reshard(u.index)
            u.flat = None
            u.phase = _Phase.IDLE

    # ---- streams (CUDA): mp's compute stream and torch's current one ---------------------

    def _after_engine(self):
        """torch's work from now on after what the engine enqueued."""
        if self._stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self._stream)

    def _before_engine(self):
        """The engine's work from now on after what torch enqueued."""
        if self._stream is not None:
            self._stream.wait_stream(torch.cuda.current_stream(self.device))

    def _check_gathered(self, p, func):
        u = self._owner.get(id(p))
        if u is not None and not self._gathered(u):
            name = next(e[1] for e in u.params if e[0] is p)
            raise _mp.ConfigError(
                f"mp.torch.shard: rank {self.engine.rank}: parameter '{name}' of unit {u.index} ('{u.name}') used "
                f"by {getattr(func, '__name__', func)} outside the unit's forward (it is not gathered there): make "
                "the module that uses it part of that unit (units=...)")

    # ---- saved tensors -----------------------------------------------------------------

    def _pack(self, t):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        for u in self._units:
            if self._gathered(u) and ptr == u.flat.untyped_storage().data_ptr() and t.dtype == u.flat.dtype:
                return (_IN_BUFFER, u, tuple(t.shape), t.stride(), t.storage_offset())
        self._saved[ptr] = storage.nbytes()
        return t

    def _unpack(self, saved):
        if not (isinstance(saved, tuple) and len(saved) == 5 and saved[0] is _IN_BUFFER):
            return saved
        _, u, shape, stride, offset = saved
        self._begin_backward()
        self._unshard(u, _Phase.PRE_BACKWARD)
        return u.flat.as_strided(shape, stride, offset)

    # ---- the backward ------------------------------------------------------------------

    def _begin_backward(self):
        if not self._backward:
            self._backward = True
            _at_end_of_backward(self._end_backward)

    def _accumulated(self, u):
        self._begin_backward()
        if u.due is not None:
            u.due -= 1
            if u.due == 0:
                self._hand_over(u)

    def _end_backward(self):
        """Units some of whose parameters got no gradient this backward."""
        self._backward = False
        for u in sorted(self._units, key=lambda u: -u.index):
            if u.due is not None:
                self._hand_over(u)

    def _hand_over(self, u):
        g = torch.from_dlpack(self.engine.gradient_buffer(u.index))
        self._after_engine()
        unscale = 1.0 / self._scale if self._scale != 1.0 else None
        for p, _, off, n, _ in u.params:
            if p.grad is None:
                g[off:off + n].zero_()
            else:
                g[off:off + n].copy_(p.grad.reshape(-1))
                if unscale is not None:
                    g[off:off + n].mul_(unscale)
                p.grad = None
        self._before_engine()
        u.due = None
        if u.phase is _Phase.PRE_BACKWARD:  # first: the reduction prefetches the next unit, maybe into this buffer
            self._reshard(u)
        self.engine.reduce_gradients(u.index)

    # ---- the step and the state ---------------------------------------------------------

    def step(self):
        """mp's step after the config's micro_batches backwards. Collective."""
        for loss in self._losses:  # one device read per loss, here rather than in the forward
            self.engine.note_loss(float(loss))
        self._losses = []
        result = self.engine.finish_step()
        self._scale = self.engine.loss_scale()
        return result

    def scale(self, loss):
        """The loss times the loss scale of the fp16 recipe (dynamic or static
        loss_scaling), as GradScaler.scale: `sharded.scale(loss).backward()`;
        the gradients are unscaled as they are handed over. Without loss
        scaling, the loss itself."""
        return loss if self._scale == 1.0 else loss * self._scale

    @property
    def lr(self):
        """The lr of the last step (StepResult.lr); set it to change the lr
        of the steps from the next on, in place of the config's schedule."""
        return self._lr

    @lr.setter
    def lr(self, value):
        self.engine.set_lr(float(value))
        self._lr = float(value)

    def note_loss(self, loss):
        """A micro-batch's loss for StepResult.loss, where the module's
        output carries none (an output with a `loss` is noted by itself)."""
        self._losses.append(loss.detach() if torch.is_tensor(loss) else float(loss))

    def full_state_dict(self, rank0_only=False):
        """Every parameter's fp32 weights by name (the module's own names),
        on the CPU, gathered a unit at a time; load it into a fresh module
        with load_state_dict(strict=False) (buffers are the module's). On
        every rank, or with rank0_only on rank 0 alone (the others get {}
        and never hold more than one unit of it), as FSDP2's
        get_model_state_dict(full_state_dict=True, cpu_offload=True).
        Collective."""
        keep = not rank0_only or self.engine.rank == 0
        out = {}
        for u in self._units:
            flat = torch.from_numpy(self.engine.gather_master(u.index))
            if keep:
                for _, name, off, n, shape in u.params:
                    out[name] = flat[off:off + n].view(shape).clone()
            del flat
        return out

    def plan(self, world_size=0):
        """The engine's bytes per rank by category, and their total, at
        world_size ranks (0: this run's) as its memory plan predicts them:
        equal to memory()["engine"] once a step has run."""
        return self.engine.plan(world_size)

    def memory(self):
        """What this rank holds (Note [What a rank holds], docs/embedding.md):
        - engine: mp's buffers by category (current bytes; plan() predicts them);
        - module: the module's own parameter storage (stand-ins while
          sharded), its buffers, and the .grad tensors alive now;
        - activations: the tensors autograd saved in the last forward with
          gradients, outside the gathered buffers (freed by its backward);
        - rss: the process's resident set now and at its peak."""
        engine = dict(self.engine.memory()["current"])
        params = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in self.model.parameters()
                  if p.untyped_storage().data_ptr() not in self._engine_storage}
        buffers = {b.untyped_storage().data_ptr(): b.untyped_storage().nbytes() for b in self.model.buffers()}
        grads = {p.grad.untyped_storage().data_ptr(): p.grad.untyped_storage().nbytes()
                 for p in self.model.parameters() if p.grad is not None}
        status = {}
        with open("/proc/self/status") as f:  # Linux: the resident set now (VmRSS) and at its peak (VmHWM)
            for line in f:
                if line.startswith(("VmRSS", "VmHWM")):
                    status[line[:5]] = int(line.split()[1]) * 1024
        return {"engine": engine,
                "module": {"parameters": sum(params.values()), "buffers": sum(buffers.values()),
                           "grads": sum(grads.values())},
                "activations": sum(self._saved.values()),
                "rss": {"current": status.get("VmRSS", 0), "peak": status.get("VmHWM", 0)}}

    def save_checkpoint(self, root):
        return self.engine.save_checkpoint(root)

    def load_checkpoint(self, path):
        """Loads a checkpoint (a directory, or a root's latest); returns its step."""
        return self.engine.load_checkpoint(path)

    def close(self):
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.model.forward = self._inner_forward
        for u, forward in self._recomputed.items():
            u.module.forward = forward
        self._recomputed = {}
        self.engine.close()


# Private torch APIs, where no public one exists; FSDP2 itself
# (torch.distributed.fsdp._fully_shard) relies on both. Checked on torch
# 2.4 to 2.15.
def _in_backward():
    """Whether autograd's engine is running a backward on this thread."""
    return torch._C._current_graph_task_id() != -1


def _at_end_of_backward(callback):
    """Runs `callback` when the backward under way ends."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def _stand_in(shape, dtype, device):
    """A tensor of `shape` that holds one element (a stride-0 view): what a
    parameter is while its unit is sharded."""
    return torch.empty(1, dtype=dtype, device=device).expand(shape)


def _return_freed_memory():
    """glibc keeps freed heap memory mapped; give it back (Linux, glibc only)."""
    import ctypes
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _recomputing_forward(me, u, forward):
    """engine.activation_checkpointing: the unit's forward under
    torch.utils.checkpoint (keeping its inputs only), its recomputation in
    the backward on the unit gathered again."""
    import torch.utils.checkpoint

    def run(*args, **kwargs):
        if _in_backward():  # the forward run again: its parameters, not through the module's hooks
            me._unshard(u, _Phase.PRE_BACKWARD)
        return forward(*args, **kwargs)

    def checkpointed(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(run, *args, use_reentrant=False, **kwargs)
    return checkpointed


def _packers(me):
    return (lambda t: me._pack(t)), (lambda saved: me._unpack(saved))


def _layout(model, units, config, muon):
    """shard()'s units (_Unit, the root first where there is one), the
    Muon parameters, the engine's unit specs and its held_units."""
    blocks = list(units) if units is not None else _default_units(model)
    placed = ShardedModel.place(model, blocks)
    muon_params = ShardedModel.muon_choice(model, placed, muon, _mp.optimizer_updates_matrices(config))
    marked = set(muon_params)
    # Every unit but the root may have its activations recomputed
    # (engine.activation_checkpointing picks which).
    spec = [_mp.Unit(u.name, [_mp.Param(name, list(shape), init="zeros", muon=name in marked)
                              for (_, name, _, _, shape) in u.params],
                     recomputable=u.module is not model)
            for u in placed]
    # The root unit stays gathered around the whole forward: one more buffer
    # (sharding.held_units), so the blocks still prefetch. Autograd's
    # gradients are in the param dtype: handed over as they are where that is
    # the reduction's wire dtype (sharding.param_dtype_gradients, set by shard).
    held = 1 if placed[0].module is model else 0
    return placed, muon_params, spec, held


def plan(model, units=None, config="", world_size=1, device="cpu", muon=None):
    """The engine's bytes per rank, by category and in total, that
    shard(model, units, config, device, muon) would hold at world_size ranks,
    without sharding anything (no collective; mp.init() not needed)."""
    _, _, spec, held = _layout(model, units, config, muon)
    return _mp.plan_memory(spec, config, world_size, device, held_units=held, param_dtype_gradients=True)


def shard(model, units=None, config="", device="cpu", muon=None):
    """Shards `model` (an nn.Module, unmodified) over the ranks of mp.init()
    and returns the ShardedModel that steps it; the user's own loop runs
    model(...) and loss.backward() as before.

    muon: under optimizer kind MUON, which parameters Muon updates (the
    rest: its AdamW). None: the 2-D parameters of the units other than the
    root, less nn.Embedding weights; a callable (name, parameter) -> bool;
    or an iterable of parameter names. A chosen parameter that is not 2-D
    is a ConfigError naming it. Other kinds mark nothing. The choice:
    ShardedModel.muon_params."""
    return ShardedModel(model, units=units, config=config, device=device, muon=muon)
