"""``tagging``: a label per vector (a word's part of speech, a node's class). Cross-entropy over
the scored positions (:data:`attnlab.models.base.IGNORE` elsewhere); metric: accuracy over them.
Graph tasks of this kind label nodes (:class:`attnlab.models.graph.NodeLabeler`)."""

from __future__ import annotations

import torch
from torch import nn

from ..models.base import IGNORE
from .base import Objective, register

__all__ = ["Tagging"]


@register("tagging")
class Tagging(Objective):
    """A label per vector: logits ``(B, N, L)`` (or ``(nodes, L)``), labels with ``IGNORE``."""

    def trim_labels(self, labels: torch.Tensor, keep: int) -> torch.Tensor:
        """Per-token labels keep the batch's ``keep`` columns."""
        return labels[:, :keep]

    def loss(self, model: nn.Module, inputs: dict, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy over the positions whose label is not ``IGNORE``."""
        logits = model(**inputs).output
        return nn.functional.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=IGNORE)
