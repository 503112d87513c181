"""mp.init(): who this process is (the launcher's environment, or the
arguments), and the world it joins. Under mpirun (or with no launcher) the
world is MPI's. Under torchrun, srun without MPI, or explicit ranks, MPI is
never started: the ranks meet through a TCP store, torchrun's agent's at
MASTER_ADDR:MASTER_PORT (torch.distributed.TCPStore, what torchrun itself
runs), or one rank 0 starts there, and the data plane is Gloo over TCP.
docs/embedding.md ("Launchers") has each launcher."""
import datetime
import os

from . import _mp


class _Store:
    """The store as the C++ world uses it: set(key, bytes) and get(key,
    timeout_s) -> bytes, under a prefix of this run's (torchrun's run id and
    restart count: a restarted job does not read the last one's keys)."""

    def __init__(self, store, prefix):
        self._store, self._prefix = store, prefix

    def set(self, key, value):
        self._store.set(self._prefix + key, value)

    def get(self, key, timeout_s):
        self._store.wait([self._prefix + key], datetime.timedelta(seconds=timeout_s))
        return self._store.get(self._prefix + key)


def _open_store(ranks, timeout_s):
    try:
        from torch.distributed import TCPStore
    except ImportError as e:
        raise _mp.ConfigError(f"{ranks!r}: ranks that MPI does not start meet through torch.distributed.TCPStore, "
                              f"and torch is not importable ({e}); launch with mpirun instead") from None
    host, port = ranks.master_addr, ranks.master_port
    starts = ranks.rank == 0 and not ranks.agent_store
    try:
        store = TCPStore(host, port, ranks.size, starts, datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)
    except Exception as e:  # torch's errors: RuntimeError, DistStoreError, TimeoutError
        raise _mp.CommError(f"{ranks!r}: the store at {host}:{port} "
                            f"({'started here' if starts else 'torchrun agent' if ranks.agent_store else 'rank 0'}"
                            f"'s) did not answer within {timeout_s} s: {e}") from None
    prefix = f"mp/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    return _Store(store, prefix)


def init(rank=None, world_size=None, local_rank=None, local_world_size=None, master_addr=None, master_port=None,
         data_plane="auto", timeout_s=300):
    """Joins this process's world. Collective: every rank calls it; a second
    call does nothing.

    With no arguments the launcher's environment says who this process is:
    torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT), then Open MPI's / PMI's, then Slurm's (srun); with none, a
    world of one. The arguments say it instead (a trainer that knows, such
    as Lightning). A contradictory environment, or a data plane whose world
    size is not the launcher's, is an mp.ConfigError naming the variables.
    data_plane: "auto" (MPI where MPI started the ranks or none did, else
    Gloo), "mpi" or "gloo". timeout_s bounds the wait for the other ranks
    at the store. Rank 0 prints which source it used and the data plane."""
    if _mp.initialized():
        return
    if data_plane not in ("auto", "mpi", "gloo"):
        raise _mp.ConfigError(f"mp.init(data_plane={data_plane!r}): expected 'auto', 'mpi' or 'gloo'")
    ranks = _mp.discover(-1 if rank is None else rank, -1 if world_size is None else world_size,
                         -1 if local_rank is None else local_rank, -1 if local_world_size is None else local_world_size,
                         master_addr or "", master_port or 0)
    use_mpi = data_plane == "mpi" or (data_plane == "auto" and ranks.uses_mpi)
    if not use_mpi and ranks.size < 0:
        raise _mp.ConfigError(f"{ranks!r}: only MPI knows the world size here; use data_plane='mpi'")
    if not use_mpi and ranks.size > 1 and not (ranks.master_addr and ranks.master_port > 0):
        raise _mp.ConfigError(f"{ranks!r}: {ranks.size} ranks meet through a store: set MASTER_ADDR and MASTER_PORT "
                              f"(or pass master_addr and master_port)")
    _mp.init(ranks, None if use_mpi else _open_store(ranks, timeout_s), use_mpi)
