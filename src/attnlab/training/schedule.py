"""The order of the training examples and the learning rate of each step."""

from __future__ import annotations

import math

import torch

from .config import TrainConfig

__all__ = ["batch_indices", "learning_rate"]


def batch_indices(n: int, batch: int, seed: int, step: int) -> torch.Tensor:
    """The training examples of ``step``: a fixed permutation per epoch, cut in batches."""
    per_epoch = math.ceil(n / batch)
    epoch, i = divmod(step, per_epoch)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    return perm[i * batch : (i + 1) * batch]


def learning_rate(cfg: TrainConfig, step: int, total: int, spent: float = 0.0, budget: float | None = None,
                  warmup: int | None = None) -> float:
    """The learning rate of ``step`` of ``total``: linear warm-up, then cosine decay over the
    steps, or over ``budget`` seconds (default: ``cfg.seconds``; ``spent`` of them gone) when
    that is further along."""
    warmup = cfg.warmup if warmup is None else warmup
    budget = cfg.seconds if budget is None else budget
    if step < warmup:
        return cfg.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    if budget is not None:  # a time budget: anneal over the seconds, whichever ends first
        progress = max(progress, spent / budget)
    return cfg.lr * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
