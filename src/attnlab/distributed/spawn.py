"""Run a function on P fresh processes joined in one process group (what the tests and the ring
benchmark use on one machine; ``torchrun`` does the same for a training run)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = ["spawn"]


def _entry(rank: int, fn: Callable, world: int, init: str, out: str, args: tuple, backend: str, threads: int) -> None:
    torch.set_num_threads(threads)
    dist.init_process_group(backend, init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        result = fn(*args)
        tmp = Path(out) / f"{rank}.tmp"
        torch.save(result, tmp)
        os.replace(tmp, Path(out) / f"{rank}.pt")
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
        mp.start_processes(_entry, args=(fn, world, init, tmp, args, backend, threads), nprocs=world,
                           start_method="spawn", join=True)
        return [torch.load(Path(tmp) / f"{r}.pt", weights_only=False) for r in range(world)]
