"""``pair``: one label per *pair* of sequences (are two documents related?), the Long Range
Arena's retrieval kind. Tokens ``(B, 2, N)``; the model is a two-tower
:class:`attnlab.models.PairClassifier`. Cross-entropy; metric: accuracy over pairs."""

from __future__ import annotations

from .base import register
from .classification import Classification

__all__ = ["PairClassification"]


@register("pair")
class PairClassification(Classification):
    """A label per pair: logits ``(B, L)`` from :class:`attnlab.models.PairClassifier`, labels
    ``(B,)``; the loss and the accuracy of :class:`Classification`, over pairs."""
