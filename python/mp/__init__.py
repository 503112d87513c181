"""mp: sharded mixed-precision training, from Python.

    import mp
    mp.init()                                   # every rank: under mpirun, torchrun or srun
    units = [mp.Unit("linear", [mp.Param("w", (4,)), mp.Param("b", (1,), init="zeros")])]
    engine = mp.Engine(units, "sharding { strategy: FULL_SHARD } optimizer { lr: 0.1 }")
    result = engine.step(model)                 # model: begin_micro_batch, forward, loss, backward

The model's calls get each unit's gathered parameters and its gradient
buffer as DLPack arrays (torch.from_dlpack, numpy.asarray), valid during the
call. Errors are mp.Error subclasses named after the C++ tiers
(ConfigError, CommError, ModelError, ...), carrying the C++ message.
mp.torch trains a torch.nn.Module split into units. mp.init (mp/_launch.py)
finds the ranks from the launcher: mpirun, torchrun or srun.
docs/embedding.md (Python) has the whole contract: which thread runs the
callbacks, the GIL, failures.
"""
import atexit as _atexit

from ._mp import (  # noqa: F401
    CommError,
    ConfigError,
    CudaError,
    Engine,
    EnforceError,
    Error,
    IoError,
    ModelError,
    NumericError,
    OutOfMemoryError,
    Param,
    StepResult,
    Unit,
    data_plane,
    finalize,
    initialized,
    launcher,
    local_rank,
    local_world_size,
    optimizer_kind,
    optimizer_updates_matrices,
    plan_memory,
    rank,
    version,
    world_size,
)
from ._launch import init  # noqa: F401

__version__ = version()

_atexit.register(finalize)
