"""What makes an attention step efficient, declared once per step beside its capabilities:
:class:`Budget` (the settings at short and long lengths) and :class:`Sweep` (its budget axis).
The arena, the scaling benchmark and the approximation table read them
(:func:`attnlab.efficient.budget`, :func:`attnlab.efficient.budgets`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["Budget", "Sweep"]


@dataclass(frozen=True)
class Sweep:
    """A variant's budget axis in the approximation table (:mod:`attnlab.studies.approximation`).

    Args:
        option: the option swept; None for a variant without a budget (one point, value 0).
        values: the values measured (the table caps them at N).
        label: the table's name for the axis, with the settings held fixed.
        fixed: the other options, held fixed along the axis.
        seeded: the variant draws random features, hashes or blocks: each draw passes ``seed=``.
    """

    option: str | None
    values: tuple[int, ...]
    label: str
    fixed: Mapping[str, object] = field(default_factory=dict)
    seeded: bool = False

    def __post_init__(self):
        object.__setattr__(self, "values", tuple(self.values))
        object.__setattr__(self, "fixed", MappingProxyType(dict(self.fixed)))

    def options(self, value: int, seed: int) -> dict:
        """The variant's options at one point ``value`` of the axis, for the draw ``seed``."""
        out = dict(self.fixed)
        if self.option is not None:
            out[self.option] = value
        if self.seeded:
            out["seed"] = seed
        return out


@dataclass(frozen=True)
class Budget:
    """What makes a variant efficient, in one place: read by the arena (``short``), the scaling
    benchmark (``long``) and the approximation table (``sweep``).

    Args:
        short: options at short lengths (the arena's tasks, 16-130 vectors): short windows and
            small budgets, so that the variant is cheaper than dense there and its trade-off shows.
        long: options at long lengths (the scaling benchmark, N in the thousands); None leaves
            the variant out of that benchmark (``dense_naive``: its N x N weights do not fit there).
        sweep: the budget axis of the approximation table; None leaves the variant out of it.
        max_len: the variant is built for a fixed longest sequence: the benchmarks pass
            ``max_len`` (their longest N) with ``long`` and ``sweep`` (the arena's models pass
            their own).
    """

    short: Mapping[str, object] = field(default_factory=dict)
    long: Mapping[str, object] | None = field(default_factory=dict)
    sweep: Sweep | None = None
    max_len: bool = False

    def __post_init__(self):
        object.__setattr__(self, "short", MappingProxyType(dict(self.short)))
        if self.long is not None:
            object.__setattr__(self, "long", MappingProxyType(dict(self.long)))

    def long_options(self, max_len: int) -> dict:
        """``long`` as keyword options for sequences up to ``max_len``."""
        if self.long is None:
            raise ValueError("this variant has no settings for long sequences (Budget.long is None)")
        out = dict(self.long)
        if self.max_len:
            out["max_len"] = max_len
        return out

    def sweep_options(self, value: int, *, n: int, seed: int) -> dict:
        """The options at point ``value`` of ``sweep`` for sequences of length ``n`` and the draw
        ``seed`` (``{}`` without a sweep)."""
        if self.sweep is None:
            return {}
        out = {"max_len": n} if self.max_len else {}
        out.update(self.sweep.options(value, seed))
        return out

