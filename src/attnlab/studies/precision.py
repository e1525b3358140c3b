"""Float32 against bfloat16 mixed precision: training steps per second of every attention variant
at long lengths, and the share of this machine's peak each reaches, side by side in one process.

The model is the arena's long task (:data:`attnlab.arena.PRESETS` ``quick``, ``text``): byte
tokens, a ``transformer`` classifier with sinusoidal positions, of width ``embed_dim``, ``num_heads`` heads
and ``num_layers`` blocks, each variant with its arena options (:data:`attnlab.arena.presets.VARIANT_OPTIONS`).
For each length N the batch holds ``tokens`` tokens in all (8 sequences of 1K, the text task's
batch; 2 of 4K). One training step is the
arena's: forward, loss, backward, gradient clipping and an AdamW update, under
:func:`attnlab.training.precision.autocast`. Both precisions of a (variant, N) are timed
round-robin (:func:`attnlab.profiling.round_robin`), so machine noise hits them alike; FLOPs per
step are counted once (:func:`attnlab.profiling.count_flops`, the same in both precisions), and the
fraction of peak is over :func:`attnlab.profiling.peak_flops` in the step's own precision.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from ..profiling import count_flops, peak_flops, round_robin
from .records import StudyRecord

__all__ = ["Record", "peaks", "run"]

PRECISIONS = ("fp32", "bf16")


@dataclass
class Record(StudyRecord):
    """One (variant, N, precision): median seconds per training step, steps/s, FLOPs per step,
    achieved FLOP/s and its fraction of the peak in this precision; ``speedup``: the fp32 step's
    time over this one's (1 for fp32)."""

    variant: str
    n: int
    batch: int
    precision: str
    seconds: float | None
    steps_per_second: float | None
    flops_per_step: int
    flop_rate: float | None
    peak_fraction: float | None
    speedup: float | None
    repeats: int
    note: str | None = None


def peaks(device: str = "cpu") -> dict[str, float]:
    """This machine's peak FLOP/s per precision on ``device`` (:func:`attnlab.profiling.peak_flops`)."""
    return {"fp32": peak_flops("float32", device), "bf16": peak_flops("bfloat16", device)}


def _step(variant: str, n: int, batch: int, *, embed_dim: int, num_heads: int, num_layers: int,
          precision: str, device: str | torch.device = "cpu") -> tuple[Callable[[], None], Callable[[], int]]:
    """A training step of the arena's text model at length ``n`` on ``device`` (weights and batch
    drawn on the CPU, then moved) and a counter of its FLOPs."""
    from ..arena.presets import VARIANT_OPTIONS
    from ..models import ModelConfig, build_model
    from ..models.base import FIRST
    from ..models.config import AttentionSpec, PositionalSpec
    from ..training.precision import autocast

    torch.manual_seed(0)
    cfg = ModelConfig(kind="classification", model="transformer", num_labels=8, embed_dim=embed_dim,
                      num_layers=num_layers, num_heads=num_heads, vocab_size=FIRST + 256,
                      attention=AttentionSpec(variant, dict(VARIANT_OPTIONS.get(variant, {}))),
                      positional=PositionalSpec("sinusoidal"), max_len=n + 1)
    model = build_model(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(FIRST, FIRST + 256, (batch, n), generator=gen).to(device)
    labels = torch.randint(0, 8, (batch,), generator=gen).to(device)

    def loss():
        with autocast(precision, device):
            return torch.nn.functional.cross_entropy(model(tokens).output.float(), labels)

    def step():
        opt.zero_grad(set_to_none=True)
        loss().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    def flops() -> int:
        n_ = count_flops(lambda: loss().backward())
        model.zero_grad(set_to_none=True)
        return n_

    return step, flops


def run(variants: Iterable[str], lengths: Iterable[int], *, tokens: int = 8192, embed_dim: int = 64, num_heads: int = 4,
        num_layers: int = 1, min_repeats: int = 3, target_seconds: float = 4.0,
        skip: Callable[[str, int], str | None] = lambda v, n: None, device: str | torch.device = "cpu",
        on_record: Callable[[Record], None] | None = None) -> list[Record]:
    """Records for every variant and length, fp32 and bf16 (``skip(variant, n)``: a reason to leave
    a cell out, recorded as its note), on ``device`` (each step timed between synchronisations on
    a GPU; the share of that device's peak)."""
    device = torch.device(device)
    peak = peaks(str(device))
    records = []
    for n in lengths:
        batch = max(1, tokens // n)
        for v in variants:
            reason = skip(v, n)
            if reason:
                for p in PRECISIONS:
                    records.append(Record(v, n, batch, p, None, None, 0, None, None, None, 0, reason))
                    if on_record:
                        on_record(records[-1])
                continue
            steps = {p: _step(v, n, batch, embed_dim=embed_dim, num_heads=num_heads, num_layers=num_layers, precision=p,
                              device=device) for p in PRECISIONS}
            flops = steps["fp32"][1]()
            times = round_robin({p: s for p, (s, _) in steps.items()}, min_repeats, target_seconds, device=device)
            median = {p: statistics.median(t[1:] or t) for p, t in times.items()}
            for p in PRECISIONS:
                rate = flops / median[p]
                records.append(Record(v, n, batch, p, median[p], 1 / median[p], flops, rate, rate / peak[p],
                                      median["fp32"] / median[p], len(times[p]) - 1))
                if on_record:
                    on_record(records[-1])
    return records
