"""``retrieval``: are two documents related? Byte-level pairs of 1K-4K-byte windows of Python's
standard-library source, after the Long Range Arena's retrieval task (Tay et al. 2021, which
pairs 4K-byte papers of the ACL Anthology linked by a citation).

An example is two windows of ``length`` bytes each; the label is 1 when both come from the same
package (``asyncio``, ``email``, ... as in :mod:`attnlab.tasks.text`), 0 otherwise; half of
every split is each (chance 0.5). The task kind is ``pair``: the model is a **two-tower**
encoder (:class:`attnlab.models.PairClassifier`): each window is encoded alone by the same
encoder, and only the two pooled vectors meet, as ``[u, v, u * v, u - v]``, so the length that
attention must span is one document's, not two. Splits are drawn by file, as for ``text``:
no source file has windows in two splits (a test checks it).

``tokens`` of a split are ``(count, 2, length)``.
"""

from __future__ import annotations

import numpy as np
import torch

from .base import FIRST, Split, Task, register
from .text import package_data

__all__ = ["make_retrieval"]


def _pairs(rng: np.random.Generator, per_class: list[list[bytes]], count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` pairs (alternately related and not) of windows drawn from ``per_class``."""
    usable = [c for c, w in enumerate(per_class) if len(w) >= 2]
    present = [c for c, w in enumerate(per_class) if w]
    if not usable or len(present) < 2:
        raise ValueError("no package has two windows in a split; choose a shorter length")
    rows, labels = [], []
    for i in range(count):
        same = i % 2 == 0
        if same:
            c = usable[rng.integers(len(usable))]
            a, b = rng.choice(len(per_class[c]), size=2, replace=False)
            pair = (per_class[c][a], per_class[c][b])
        else:
            c1, c2 = rng.choice(present, size=2, replace=False)
            pair = (per_class[c1][rng.integers(len(per_class[c1]))], per_class[c2][rng.integers(len(per_class[c2]))])
        rows.append(np.stack([np.frombuffer(w, dtype=np.uint8) for w in pair]))
        labels.append(int(same))
    tokens = torch.from_numpy(np.stack(rows).astype(np.int64)) + FIRST
    return tokens, torch.tensor(labels, dtype=torch.long)


@register("retrieval", train_defaults={"steps": 1500, "batch_size": 8, "lr": 2e-3, "warmup": 20, "embed_dim": 64,
                                       "num_layers": 2, "pooling": "mean", "positional": "sinusoidal",
                                       "eval_every": 250})
def make_retrieval(size: int = 2000, seed: int = 0, length: int = 1024, classes: int = 6) -> Task:
    """The ``retrieval`` task: ``size`` training pairs of two ``length``-byte windows (see the
    module docstring); validation and test take ``size / 5`` pairs each (at least 100).

    Args:
        size: training pairs. seed: the draw of the windows and of the split.
        length: bytes per window. classes: the standard-library packages the windows come from.
    """
    present, rng, by_split, files_of = package_data("retrieval", size=size, seed=seed, length=length, classes=classes)
    splits = {}
    for name, per_class in by_split.items():
        if sum(1 for w in per_class if w) < 2:
            raise ValueError(f"length={length} leaves fewer than two packages with windows in the {name} split; "
                             "choose a shorter length")
        count = size if name == "train" else max(100, size // 5)
        splits[name] = Split(*_pairs(rng, per_class, count))
    return Task(
        name="retrieval", kind="pair", vocab_size=FIRST + 256, num_labels=2, metric="accuracy", splits=splits,
        options={"size": size, "seed": seed, "length": length, "classes": classes},
        label_names=["unrelated", "same package"], baseline={"chance": 0.5}, artifacts={"files": files_of},
    )
