"""Heads over token backbones, one per output kind: :class:`SequenceLabeler` (a label per
vector) and :class:`SetClassifier` (one label, or value, per set; mean or CLS pooling)."""

from __future__ import annotations

import torch
from torch import nn

from .base import CLS, PAD, Backbone, ModelOutput

__all__ = ["PairClassifier", "SequenceLabeler", "SetClassifier", "pool"]


class SequenceLabeler(nn.Module):
    """A label per vector: ``backbone`` then a linear layer at every position -> ``(B, N, L)``."""

    def __init__(self, backbone: Backbone, num_labels: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.embed_dim, num_labels)

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
        self.head = nn.Linear(backbone.embed_dim, num_labels)

    def forward(self, tokens: torch.Tensor, *, return_weights: bool = False) -> ModelOutput:
        """Logits ``(B, num_labels)`` (and the backbone's attention weights when asked)."""
        res = self.pooled(tokens, return_weights=return_weights)
        return ModelOutput(self.head(res.output), res.weights)

    def pooled(self, tokens: torch.Tensor, *, return_weights: bool = False) -> ModelOutput:
        """The pooled vector ``(B, embed_dim)`` of each sequence, before the head."""
        return pool(self.backbone, tokens, self.pooling, return_weights=return_weights)


def pool(backbone: Backbone, tokens: torch.Tensor, pooling: str, *, return_weights: bool = False) -> ModelOutput:
    """``backbone`` over token sequences ``(B, N)``, pooled to one vector ``(B, embed_dim)`` each:
    ``"mean"`` over real positions, or ``"cls"`` (a summary token put in front)."""
    if pooling == "cls":
        tokens = torch.cat([torch.full_like(tokens[:, :1], CLS), tokens], dim=1)
    pad = tokens == PAD
    res = backbone(tokens, pad, return_weights=return_weights)
    h = res.output
    if pooling == "cls":
        pooled = h[:, 0]
    else:
        keep = (~pad)[..., None].to(h.dtype)
        pooled = (h * keep).sum(1) / keep.sum(1).clamp_min(1.0)
    return ModelOutput(pooled, res.weights)


class PairClassifier(nn.Module):
    """A label per *pair* of sequences with a **two-tower** encoder (the Long Range Arena's
    retrieval model): each sequence is encoded alone by the same backbone and pooled
    (:class:`SetClassifier`'s pooling) to ``u`` and ``v``; the label comes from
    ``[u, v, u * v, u - v]`` through a small MLP. Nothing attends across the pair, so the
    length attention spans is one sequence's.

    Args:
        backbone: the encoder of both towers (shared weights). num_labels: classes.
        pooling: ``"mean"`` or ``"cls"`` (as :class:`SetClassifier`).
    """

    def __init__(self, backbone: Backbone, num_labels: int, *, pooling: str = "mean"):
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ValueError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        self.backbone, self.pooling = backbone, pooling
        embed_dim = backbone.embed_dim
        self.head = nn.Sequential(nn.Linear(4 * embed_dim, embed_dim), nn.GELU(), nn.Linear(embed_dim, num_labels))

    def encode(self, tokens: torch.Tensor, *, return_weights: bool = False) -> ModelOutput:
        """One tower: the pooled vector ``(B, embed_dim)`` of sequences ``(B, N)``."""
        return pool(self.backbone, tokens, self.pooling, return_weights=return_weights)

    def forward(self, tokens: torch.Tensor, *, return_weights: bool = False) -> ModelOutput:
        """Logits ``(B, num_labels)`` of pairs ``tokens`` ``(B, 2, N)`` (weights: the first tower's)."""
        if tokens.dim() != 3 or tokens.shape[1] != 2:
            raise ValueError(f"a pair model takes tokens of shape (B, 2, N), got {tuple(tokens.shape)}")
        both = self.encode(tokens.flatten(0, 1), return_weights=return_weights)  # the two towers in one batch
        u, v = both.output.unflatten(0, (tokens.shape[0], 2)).unbind(1)
        return ModelOutput(self.head(torch.cat([u, v, u * v, u - v], dim=-1)),
                           _first_tower(both.weights, tokens.shape[0]))


def _first_tower(weights, b: int):
    """The first tower's weights out of both towers' ``(2B, ...)`` (a tensor, or a list per block)."""
    if weights is None:
        return None
    if torch.is_tensor(weights):
        return weights.unflatten(0, (b, 2))[:, 0]
    return [_first_tower(w, b) for w in weights]

