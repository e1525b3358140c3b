"""Heads over token backbones, one per output kind: :class:`SequenceLabeler` (a label per
vector) and :class:`SetClassifier` (one label, or value, per set; mean or CLS pooling)."""

from __future__ import annotations

import torch
from torch import nn

from .base import CLS, PAD, Backbone, ModelOutput

__all__ = ["SequenceLabeler", "SetClassifier"]


class SequenceLabeler(nn.Module):
    """A label per vector: ``backbone`` then a linear layer at every position -> ``(B, N, L)``."""

    def __init__(self, backbone: Backbone, num_labels: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.dim, num_labels)

    def forward(self, tokens: torch.Tensor, *, return_weights: bool = False) -> ModelOutput:
        """Logits ``(B, N, num_labels)`` (and the backbone's attention weights when asked)."""
        res = self.backbone(tokens, tokens == PAD, return_weights=return_weights)
        return ModelOutput(self.head(res.output), res.weights)


class SetClassifier(nn.Module):
    """One label (or value, ``num_labels=1`` for regression) per set.

    Args:
        backbone: the vectors. num_labels: classes (1: a single value).
        pooling: ``"mean"`` over real positions, or ``"cls"``: a summary token (id 1) is put in
            front of every sequence and its output vector is classified.
    """

    def __init__(self, backbone: Backbone, num_labels: int, *, pooling: str = "mean"):
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        self.backbone, self.pooling = backbone, pooling
        self.head = nn.Linear(backbone.dim, num_labels)

    def forward(self, tokens: torch.Tensor, *, return_weights: bool = False) -> ModelOutput:
        """Logits ``(B, num_labels)`` (and the backbone's attention weights when asked)."""
        if self.pooling == "cls":
            tokens = torch.cat([torch.full_like(tokens[:, :1], CLS), tokens], dim=1)
        pad = tokens == PAD
        res = self.backbone(tokens, pad, return_weights=return_weights)
        h = res.output
        if self.pooling == "cls":
            pooled = h[:, 0]
        else:
            keep = (~pad)[..., None].to(h.dtype)
            pooled = (h * keep).sum(1) / keep.sum(1).clamp_min(1.0)
        return ModelOutput(self.head(pooled), res.weights)
