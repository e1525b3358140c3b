"""Image tasks: ``digits``, scikit-learn's bundled 8x8 handwritten digits (1797 images, 10 classes).

Images are ``(1, 8, 8)`` with grey levels 0..16 scaled to [0, 1]. A fixed, stratified test
split (20 %) and validation split (10 %) are drawn once from ``seed``; ``train_fraction`` keeps
that fraction of the remaining training images (stratified, at least one per class), for the
data-size comparison of CNN and self-attention (``attnlab compare vit-cnn``). The models read
the images whole: ``vit`` cuts them into patches, ``pixels`` attends over single pixels,
``cnn`` convolves (:mod:`attnlab.models.vectors`).
"""

from __future__ import annotations

import torch

from .base import Split, Task, register

__all__ = ["digits"]


def _stratified(y: torch.Tensor, fraction: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices (taken, rest): ``fraction`` of each class (at least one), drawn with ``gen``."""
    take, rest = [], []
    for c in torch.unique(y).tolist():
        idx = (y == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=gen)]
        k = max(1, round(fraction * len(idx)))
        take.append(idx[:k])
        rest.append(idx[k:])
    return torch.cat(take).sort().values, torch.cat(rest).sort().values


@register("digits", train_defaults={"model": "vit", "steps": 2000, "batch_size": 64, "lr": 2e-3, "embed_dim": 64,
                                    "num_layers": 3, "eval_every": 200, "weight_decay": 0.05}, baseline_model="cnn")
def digits(seed: int = 0, train_fraction: float = 1.0) -> Task:
    """scikit-learn's 8x8 digits as ``(1, 8, 8)`` images (see the module docstring).

    Args:
        seed: the test / validation split and the training subset.
        train_fraction: in (0, 1], the share of the training images to keep.
    """
    from ..extras import require

    load_digits = require("sklearn.datasets", "digits", "the digits task (scikit-learn's bundled images)").load_digits

    if isinstance(train_fraction, bool) or not isinstance(train_fraction, (int, float)) or not 0 < train_fraction <= 1:
        raise ValueError(f"train_fraction must be in (0, 1], got {train_fraction!r}")
    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32)[:, None] / 16.0  # (S, 1, 8, 8)
    y = torch.tensor(data.target, dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    test, rest = _stratified(y, 0.2, gen)
    val_in_rest, train_in_rest = _stratified(y[rest], 0.125, gen)
    val, train = rest[val_in_rest], rest[train_in_rest]
    if train_fraction < 1:
        keep, _ = _stratified(y[train], float(train_fraction), gen)
        train = train[keep]
    splits = {name: Split(x[idx], y[idx]) for name, idx in (("train", train), ("val", val), ("test", test))}
    test_y = y[test]
    majority = max(float((test_y == c).float().mean()) for c in range(10))
    return Task("digits", "classification", 0, 10, "accuracy", splits, {"seed": seed, "train_fraction": train_fraction},
                label_names=[str(d) for d in range(10)], baseline={"majority": majority}, inputs="image", feature_dim=1)
