"""How far each efficient variant is from exact softmax attention, across its budget.

For q, k, v of shape ``(1, H, N, D)`` (H = 4, D = 64) the error is the relative Frobenius norm
``|out - exact| / |exact|`` of the attention step's output, ``exact`` being dense softmax
attention on the same q, k, v, in float64. Inputs are Gaussian, with the queries and keys
scaled by ``temperature`` (1: diffuse attention, larger: peaked attention, where sparse and
hashed variants do better). Each budget is measured over ``seeds`` draws (random features,
hashes and projections are redrawn with the seed); the mean is reported. Sparse variants
(local, longformer, bigbird) are exact on their own pattern; their error here is the mass
of exact attention that falls outside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from .. import efficient
from .records import StudyRecord

__all__ = ["BUDGETS", "ApproxRecord", "run_approximation"]

H, D = 4, 64

BUDGETS: dict[str, tuple[str, list]] = {
    name: (b.sweep.label, list(b.sweep.values)) for name, b in efficient.budgets().items() if b.sweep is not None
}
"""The budget knob of each variant and the values measured (at N = 1024 by default): a view
of each variant's :attr:`attnlab.efficient.Budget.sweep`."""


@dataclass
class ApproxRecord(StudyRecord):
    """Mean relative Frobenius error of one variant at one budget value."""

    variant: str
    knob: str
    budget: int
    n: int
    temperature: float
    error: float
    seeds: int


def _options(variant: str, budget: int, n: int, seed: int) -> dict:
    return efficient.budget(variant).sweep_options(budget, n=n, seed=seed)


def run_approximation(
    n: int = 1024,
    variants: Iterable[str] | None = None,
    *,
    temperature: float = 1.0,
    seeds: int = 3,
    device: str | torch.device = "cpu",
    on_record: Callable[[ApproxRecord], None] | None = None,
) -> list[ApproxRecord]:
    """Measure every variant at every budget of :data:`BUDGETS` (capped at N) on ``device`` (inputs
    and weights drawn on the CPU, then moved: the same draws on every device)."""
    device = torch.device(device)
    variants = list(BUDGETS) if variants is None else list(variants)
    for v in variants:
        if v not in BUDGETS:
            raise ValueError(f"unknown variant {v!r}; expected some of {list(BUDGETS)}")
    out = []
    for v in variants:
        knob, values = BUDGETS[v]
        for budget in dict.fromkeys(min(b, n) for b in values):
            errs = []
            for seed in range(seeds):
                g = torch.Generator().manual_seed(seed)
                q, k, val = (torch.randn(1, H, n, D, generator=g, dtype=torch.float64).to(device) for _ in range(3))
                q, k = q * temperature**0.5, k * temperature**0.5
                exact = torch.nn.functional.scaled_dot_product_attention(q, k, val)
                torch.manual_seed(seed)
                m = efficient.create(v, embed_dim=H * D, num_heads=H,
                                     **_options(v, budget, n, seed)).double().to(device)
                with torch.no_grad():
                    approx = m.step(q, k, val).output
                errs.append(((approx - exact).norm() / exact.norm()).item())
            rec = ApproxRecord(v, knob, budget, n, temperature, sum(errs) / len(errs), seeds)
            out.append(rec)
            if on_record is not None:
                on_record(rec)
    return out
