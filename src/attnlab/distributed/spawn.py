"""Run a function on P fresh processes joined in one process group (what the tests and the ring
benchmark use on one machine; ``torchrun`` does the same for a training run)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = ["spawn"]


@dataclass(frozen=True)
class _Job:
    """What every spawned process of one :func:`spawn` call runs (pickled to each): ``fn(*args)`` in a
    ``backend`` process group of ``world`` ranks met through the file ``init``, the result saved under
    the folder ``out``, on ``threads`` torch threads."""

    fn: Callable
    world: int
    init: str
    out: str
    args: tuple
    backend: str
    threads: int


def _entry(rank: int, job: _Job) -> None:
    """One spawned process (a module-level target, so it pickles): ``job`` as rank ``rank``."""
    torch.set_num_threads(job.threads)
    dist.init_process_group(job.backend, init_method=f"file://{job.init}", rank=rank, world_size=job.world)
    try:
        result = job.fn(*job.args)
        tmp = Path(job.out) / f"{rank}.tmp"
        torch.save(result, tmp)
        os.replace(tmp, Path(job.out) / f"{rank}.pt")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable, world: int, *args, backend: str = "gloo", threads: int = 1) -> list:
    """``fn(*args)`` on ``world`` new processes (``spawn`` start method), ranks ``0..world-1`` of
    one ``backend`` process group; returns what each rank's call returned, in rank order.

    ``fn`` must be importable by name (a module-level function); its result travels back
    through ``torch.save``. An exception on any rank is raised here with that rank's traceback
    (``torch.multiprocessing.ProcessRaisedException``). ``threads``: torch threads per process.
    """
    import torch.multiprocessing as mp

    if not isinstance(world, int) or world < 1:
        raise ValueError(f"world must be a positive int, got {world!r}")
    with tempfile.TemporaryDirectory(prefix="attnlab-spawn-") as tmp:
        init = os.path.join(tmp, "init")
        job = _Job(fn, world, init, tmp, args, backend, threads)
        mp.start_processes(_entry, args=(job,), nprocs=world, start_method="spawn", join=True)
        return [torch.load(Path(tmp) / f"{r}.pt", weights_only=False) for r in range(world)]
