"""Scores that do not depend on the caller's random state: what a model draws at each call
(Reformer's rotations without a seed of its own) is drawn from the run's seed while a split is
scored, so ``train``'s test score and ``eval``'s are the same number in any process."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..devices import forked_rng

__all__ = ["drawn_from"]


@contextlib.contextmanager
def drawn_from(seed: int) -> Iterator[None]:
    """Inside, torch's generators (the CPU's, and CUDA's where in use) start from ``seed`` (an int);
    after, the caller's state is back."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    with forked_rng():
        torch.manual_seed(seed)
        yield
