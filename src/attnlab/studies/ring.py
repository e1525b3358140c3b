"""Sequence parallelism on one machine: peak memory per rank and time per training step of an
Encoder against the sequence length, for P = 1 (one process, the plain layer) and P = 2, 4
processes holding 1/P of the sequence each (ring attention over gloo on loopback).

Every configuration runs in fresh processes (:func:`attnlab.distributed.spawn.spawn`). With
``memory_cap`` each process may allocate at most that many bytes beyond what it held after
start-up (``setrlimit(RLIMIT_DATA)``; the allocator then refuses): a length that needs more
than the cap fails, and is recorded as such.
"""

from __future__ import annotations

import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..profiling import peak_bytes
from .records import StudyRecord

__all__ = ["RingRecord", "run"]


@dataclass
class RingRecord(StudyRecord):
    """One (processes, length): ``seconds`` per forward + backward step (median, the slowest
    rank), ``peak_bytes`` of tensors per rank (the largest rank), the communication share of the
    step (time blocked on shards in flight / step time, mean over ranks), ``status`` ``"ok"`` or
    ``"out of memory"`` (under ``memory_cap`` bytes per process; 0: no cap), ``"process died"``
    (under the cap, outside Python) or ``"skipped"`` (P ran out of memory at a shorter length)."""

    processes: int
    length: int
    status: str
    seconds: float | None
    peak_bytes: int | None
    comm_share: float | None
    compute_share: float | None
    sent_bytes: int | None
    memory_cap: int
    dim: int  # the encoder's embed_dim, num_heads and num_layers, under the keys of the JSON files already written
    heads: int
    layers: int
    causal: bool
    repeats: int


@dataclass(frozen=True)
class _Setup:
    """What every (processes, length) of one run shares: the encoder (``embed_dim``, ``num_heads``,
    ``num_layers``, ``causal``), the timed steps per configuration (``repeats``) and the bytes each
    process may allocate beyond its start-up (``memory_cap``; 0: no cap). Module-level and frozen:
    it travels to the spawned ranks pickled."""

    embed_dim: int
    num_heads: int
    num_layers: int
    causal: bool
    repeats: int
    memory_cap: int


def _data_bytes() -> int:
    with open("/proc/self/status") as f:
        return int(re.search(r"VmData:\s+(\d+) kB", f.read()).group(1)) * 1024


def _rank_step(length: int, setup: _Setup) -> dict:
    """One rank's measurements (run under spawn): a warm-up and timed steps (under the cap), then
    the peak tensor bytes of one more step."""
    import torch.distributed as dist

    from ..distributed import RingContext, RingTimings, ShardedMask, plan_layout
    from ..models import Encoder

    embed_dim, causal, repeats, memory_cap = setup.embed_dim, setup.causal, setup.repeats, setup.memory_cap
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    enc = Encoder(embed_dim, setup.num_heads, setup.num_layers, causal=causal)
    layout = plan_layout(length, world, "zigzag" if causal else "contiguous", pad=True)
    x = torch.randn(1, layout.shard_len, embed_dim)
    timings = RingTimings()
    if world > 1:
        ctx = RingContext.build(layout.positions(rank))
        mask = ShardedMask(ctx, timings=timings)
    else:
        mask = None

    def step():
        enc.zero_grad(set_to_none=True)
        enc(x, mask=mask).output.square().mean().backward()

    import resource

    limit = resource.getrlimit(resource.RLIMIT_DATA)
    # the steps run under the cap; the profiled one after it is lifted (the profiler's own memory is not the model's)
    if memory_cap:
        resource.setrlimit(resource.RLIMIT_DATA, (_data_bytes() + memory_cap, limit[1]))
    step()  # warm-up (and the first to run out of memory under a cap)
    seconds, waits, computes = [], [], []
    for _ in range(repeats):
        dist.barrier()
        before = (timings.wait, timings.compute)
        t0 = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - t0)
        waits.append(timings.wait - before[0])
        computes.append(timings.compute - before[1])
    resource.setrlimit(resource.RLIMIT_DATA, limit)
    dist.barrier()
    peak = peak_bytes(step)
    return {"seconds": seconds, "wait": waits, "compute": computes, "peak": peak, "sent": timings.sent}


def run(lengths=(1024, 2048, 4096, 8192), processes=(1, 2, 4), *, embed_dim: int = 64, num_heads: int = 4,
        num_layers: int = 2, causal: bool = False, repeats: int = 3, memory_cap: int = 0, threads: int = 1,
        on_record: Callable | None = None) -> list[RingRecord]:
    """Measure each (P, length), P in ``processes`` (fresh processes each time); a length that
    ran out of memory at some P is not tried at longer lengths for that P."""
    from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

    from ..distributed.spawn import spawn

    setup = _Setup(embed_dim, num_heads, num_layers, causal, repeats, memory_cap)
    records, failed = [], set()
    for n in lengths:
        for p in processes:
            status, ranks = "ok", None
            if p in failed:
                status = "skipped"  # it ran out of memory at a shorter length
            else:
                try:
                    ranks = spawn(_rank_step, p, n, setup, threads=threads)
                except ProcessRaisedException as err:
                    if not memory_cap or ("can't allocate memory" not in str(err) and "MemoryError" not in str(err)):
                        raise
                    status = "out of memory"
                    failed.add(p)
                except ProcessExitedException:  # killed outside Python (an allocation in C++ under the cap)
                    if not memory_cap:
                        raise
                    status = "process died"
                    failed.add(p)
            rec = _record(p, n, status, ranks, setup)
            records.append(rec)
            if on_record is not None:
                on_record(rec)
    return records


def _record(p, n, status, ranks, setup: _Setup) -> RingRecord:
    shared = (setup.memory_cap, setup.embed_dim, setup.num_heads, setup.num_layers, setup.causal, setup.repeats)
    if ranks is None:
        return RingRecord(p, n, status, None, None, None, None, None, *shared)
    # a step ends when its slowest rank does
    steps = [max(r["seconds"][i] for r in ranks) for i in range(setup.repeats)]
    sec = statistics.median(steps)
    comm = statistics.mean(sum(r["wait"]) / sum(r["seconds"]) for r in ranks)
    comp = statistics.mean(sum(r["compute"]) / sum(r["seconds"]) for r in ranks)
    peaks = [r["peak"] for r in ranks if r["peak"] is not None]
    return RingRecord(p, n, status, sec, max(peaks) if peaks else None, comm, comp,
                      max(r["sent"] for r in ranks) // (setup.repeats + 2), *shared)
