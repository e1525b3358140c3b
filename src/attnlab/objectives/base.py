"""What an objective is: for one kind of output (a label per vector, one label per set, a value,
a new sequence), the loss of a batch and the metric of a split; and how examples become a batch.

An :class:`Objective` owns the training-side knowledge of its kind, so the training loop knows
no kind: it asks ``objectives.get(task)`` for the loss and the score. The model for a kind is
built by :func:`attnlab.models.build_model` from its head registry, the batch by :func:`collate`
from the task's input form. A new kind of output is one new module here: its objective
(``@register("<kind>")``) and, when no existing head fits, its head
(``@attnlab.models.register_head("<inputs>", "<kind>")``).
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.base import PAD
from ..registry import Registry
from ..tasks.base import Split, Task

__all__ = ["EVAL_TOKENS", "OBJECTIVES", "Objective", "batches", "collate", "create", "eval_batch_size", "get", "names",
           "register"]

OBJECTIVES: Registry = Registry("task kind")
"""Every objective by the task kind it serves (``Task.kind``)."""


def register(kind: str):
    """Class decorator: register an :class:`Objective` subclass for task kind ``kind``."""
    return OBJECTIVES.register(kind)


def names() -> list[str]:
    """The task kinds that have an objective."""
    return OBJECTIVES.names()


def create(kind: str) -> Objective:
    """A fresh objective for task kind ``kind``."""
    return OBJECTIVES.create(kind)


def get(task: Task) -> Objective:
    """The objective of ``task`` (by its ``kind``)."""
    return create(task.kind)


class Objective:
    """One kind of output: how token labels are trimmed with their batch, the loss, the metric.

    Subclasses set :attr:`kind` (by registering) and override :meth:`loss`; :meth:`score`
    defaults to the task's own ``correct`` counts (accuracy).
    """

    name = "objective"
    lower_is_better: bool = False
    """True for a metric that falls as the model improves (perplexity)."""

    def better(self, value: float, best: float | None) -> bool:
        """Whether ``value`` beats ``best`` (None: nothing yet); NaN (a diverged run) never does."""
        if value != value:
            return False
        return best is None or (value < best if self.lower_is_better else value > best)

    def trim_labels(self, labels: torch.Tensor, keep: int) -> torch.Tensor:
        """Token batches drop the padding columns every row shares (``keep`` remain); labels
        follow when they are per token. Default: labels are per example, unchanged."""
        return labels

    def loss(self, model: nn.Module, inputs: dict, labels: torch.Tensor) -> torch.Tensor:
        """The training loss of a batch."""
        raise NotImplementedError

    @torch.no_grad()
    def score(self, model: nn.Module, task: Task, split: str, batch_size: int | None = None) -> float:
        """The task's metric of ``model`` on a split (default: accuracy from ``task.correct``)."""
        model.eval()
        data = task.split(split)
        right = total = 0
        for inputs, labels in batches(self, task, data, batch_size, device=model_device(model)):
            c, t = task.correct(model(**inputs).output, labels)
            right, total = right + c, total + t
        return right / max(total, 1)


EVAL_TOKENS = 65536
"""Vectors per evaluation batch: at most 256 sequences, fewer when they are long (a 2000-token
sequence gets 32 a batch), so that a model that holds N x N weights (``dense_naive``) still fits."""


def eval_batch_size(data: Split) -> int:
    """Examples per evaluation batch of a split: ``min(256, EVAL_TOKENS / vectors per example)``."""
    return max(1, min(256, EVAL_TOKENS // _vectors_per_example(data)))


def _vectors_per_example(data: Split) -> int:
    t = data.tokens
    if t.dim() <= 1:
        return 1
    if t.dtype.is_floating_point:  # vectors (B, N, F), graphs (B, nodes, F), images (B, C, H, W)
        return int(t.shape[1]) if t.dim() == 3 else int(t.shape[-1] * t.shape[-2])
    return int(t[0].numel())  # token ids: (B, N), pairs (B, 2, N)


def batches(objective: Objective, task: Task, data: Split, batch_size: int | None = None, device=None):
    """The split in order, ``batch_size`` examples at a time (None: :func:`eval_batch_size`), as
    ``(inputs, labels)`` on ``device`` (None: where the split is)."""
    batch_size = batch_size or eval_batch_size(data)
    for i in range(0, len(data), batch_size):
        yield collate(task, data, torch.arange(i, min(i + batch_size, len(data))), objective, device=device)


def model_device(model: nn.Module) -> torch.device:
    """The device of a model's first parameter (the CPU for a model without any)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def collate(task: Task, data: Split, idx: torch.Tensor, objective: Objective | None = None,
            device=None) -> tuple[dict, torch.Tensor]:
    """The model's keyword inputs and the labels of examples ``idx`` of a split, on ``device``
    (None: where the split is).

    Tokens: ``{"tokens"}`` with the shared padding columns dropped (labels trimmed by the
    objective; pairs ``(B, 2, N)`` likewise). Vectors: ``{"x", "pad"}``. Images: ``{"x"}``. Graphs: one disjoint union,
    ``{"x", "edge_index", "edge_attr", "batch", "num_graphs"}`` (node ``tagging`` labels flattened
    to the real nodes).
    """
    inputs, labels = _collate(task, data, idx, objective or get(task))
    if device is None or torch.device(device) == labels.device:
        return inputs, labels
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}, labels.to(device)


def _collate(task: Task, data: Split, idx: torch.Tensor, objective: Objective) -> tuple[dict, torch.Tensor]:
    if task.inputs == "tokens":
        toks = data.tokens[idx]  # (B, N), or (B, 2, N) for pairs
        keep = max(int((toks != PAD).sum(-1).max()), 1) if toks.numel() else 1
        return {"tokens": toks[..., :keep]}, objective.trim_labels(data.labels[idx], keep)
    if task.inputs == "image":
        return {"x": data.tokens[idx]}, data.labels[idx]
    if task.inputs == "features":
        mask = data.mask[idx] if data.mask is not None else torch.ones(data.tokens[idx].shape[:2], dtype=torch.bool)
        keep = max(int(mask.sum(1).max()), 1) if mask.numel() else 1
        return {"x": data.tokens[idx][:, :keep], "pad": ~mask[:, :keep]}, data.labels[idx]
    ids = idx.tolist()
    mask = data.mask[idx]
    counts = mask.sum(1)
    offsets = torch.cumsum(counts, 0) - counts
    x = data.tokens[idx][mask]
    edge_index = torch.cat([data.edges[i] + int(o) for i, o in zip(ids, offsets)], dim=1)
    edge_attr = torch.cat([data.edge_attr[i] for i in ids]) if data.edge_attr is not None else None
    batch = torch.repeat_interleave(torch.arange(len(ids)), counts)
    labels = data.labels[idx][mask] if task.kind == "tagging" else data.labels[idx]
    return {"x": x, "edge_index": edge_index, "edge_attr": edge_attr, "batch": batch, "num_graphs": len(ids)}, labels
