"""``classification``: one label per set (a sentence, an image, a clip, a graph). Cross-entropy;
metric: accuracy. Graph tasks of this kind label whole graphs (:class:`attnlab.models.graph.GraphPredictor`)."""

from __future__ import annotations

import torch
from torch import nn

from .base import Objective, register

__all__ = ["Classification"]


@register("classification")
class Classification(Objective):
    """One label per set: logits ``(B, L)``, labels ``(B,)``."""

    def loss(self, model: nn.Module, inputs: dict, labels: torch.Tensor) -> torch.Tensor:
        """Cross-entropy of the set's label."""
        return nn.functional.cross_entropy(model(**inputs).output, labels)
