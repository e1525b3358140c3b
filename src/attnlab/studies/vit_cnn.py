"""CNN against self-attention as the training data grow (``attnlab compare vit-cnn``).

For every training fraction of the ``digits`` task and every seed, each model is trained with
the task's defaults (:data:`attnlab.training.TASK_DEFAULTS`, early stopping on the validation
split) and scored on the same fixed test split. The lecture's claim: a CNN (self-attention with
a fixed, small receptive field) is better with little data; self-attention, which learns its
receptive field, catches up or overtakes as data grow — on large data sets (ViT needed ~100M
images to beat ResNets). This measures where that stands at this data scale.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from .records import StudyRecord

__all__ = ["CompareRecord", "run"]


@dataclass
class CompareRecord(StudyRecord):
    """One training run: ``model`` at ``fraction`` of the training split (``train_size`` images)."""

    model: str
    fraction: float
    train_size: int
    seed: int
    accuracy: float
    seconds: float
    steps: int


def run(
    fractions: Iterable[float] = (0.05, 0.1, 0.25, 0.5, 1.0),
    models: Iterable[str] = ("vit", "cnn"),
    *,
    seeds: Iterable[int] = (0,),
    steps: int | None = None,
    device: str = "cpu",
    on_record: Callable[[CompareRecord], None] | None = None,
    on_step: Callable[[str, float, int, int, int], None] | None = None,
) -> list[CompareRecord]:
    """Train every model at every training fraction and seed; test accuracy of each.

    Args:
        fractions: shares of the digits training split, in (0, 1].
        models: backbone names that read images (``vit``, ``pixels``, ``cnn``).
        seeds: each seed draws its own training subset and initial weights.
        steps: optimizer steps per run (default: the task's).
        device: where every run trains (:attr:`attnlab.training.TrainConfig.device`).
        on_record: called after each run. on_step: ``(model, fraction, seed, step, total)``.
    """
    from .. import tasks as task_registry
    from ..models.base import BACKBONES
    from ..training import TrainConfig, train

    models, fractions, seeds = list(models), [float(f) for f in fractions], list(seeds)
    for m in models:
        if getattr(BACKBONES.get(m), "inputs", "tokens") != "image":
            raise ValueError(f"model {m!r} does not read images; expected some of vit, pixels, cnn")
    for f in fractions:
        if not 0 < f <= 1:
            raise ValueError(f"fractions must be in (0, 1], got {f}")
    records = []
    for seed in seeds:
        for f in fractions:
            size = len(task_registry.create("digits", seed=seed, train_fraction=f).split("train"))
            for m in models:
                cfg = TrainConfig.for_task("digits", model=m, seed=seed, steps=steps,
                                           task_options={"seed": seed, "train_fraction": f}, device=str(device))
                with tempfile.TemporaryDirectory() as tmp:
                    res = train(cfg, tmp, on_step=((lambda s, t, loss, m=m, f=f, seed=seed: on_step(m, f, seed, s, t))
                                                   if on_step else None))
                rec = CompareRecord(m, f, size, seed, res.value, res.seconds, res.steps)
                records.append(rec)
                if on_record is not None:
                    on_record(rec)
    return records
