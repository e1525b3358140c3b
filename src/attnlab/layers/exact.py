"""Exact attention as a step: :class:`DenseStep`, what :class:`attnlab.MultiHeadAttention` holds
unless it is given another (the registry's ``"dense"``)."""

from __future__ import annotations

from collections.abc import Callable

from ..core import scores as score_registry
from ..core.attend import AttentionResult, attend
from ..core.normalize import resolve_normalizer
from ..core.scores import Score, resolve_score
from ..validate import ArgumentTypeError, probability
from .budget import Budget
from .step import AttentionStep, StepCall

__all__ = ["DenseStep"]


class DenseStep(AttentionStep):
    """Exact attention on heads: :func:`attnlab.attend` with this step's score, normaliser and
    dropout, under any mask (block-sparse under a mask function), bias and score function; it
    decodes with any :class:`attnlab.layers.cache.KVCache` and takes grouped keys itself.

    Args:
        embed_dim, num_heads: E and H (the head width is E / H).
        score: a name from :func:`attnlab.scores.names` (learnable scores get one set of weights
            per head), a :class:`attnlab.Score` module or a callable ``(q, k) -> scores``.
        score_options: keyword options for a score built by name (``temperature=``, ``learnable=``, ``hidden_dim=``).
        normalize: ``"softmax"``, ``"relu"``, ``"sigmoid"`` or a callable ``(scores, mask) -> weights``.
        dropout: dropout on the attention weights, in training mode only.
        causal: query ``i`` sees keys ``j <= i`` only: ``masks.causal()`` joined to every call's
            mask (a decoding cache is causal already).
    """

    name = "dense"
    budget = Budget()  # exact: nothing to budget

    def __init__(self, embed_dim: int, num_heads: int, *, score: str | Score | Callable = "scaled_dot",
                 score_options: dict | None = None, normalize: str | Callable = "softmax", dropout: float = 0.0,
                 **options):
        super().__init__(embed_dim, num_heads, **options)
        probability("dropout", dropout)
        self.dropout = float(dropout)
        self.normalize = normalize
        resolve_normalizer(normalize)  # fail early on an unknown name
        if isinstance(score, str):
            self.score = score_registry.create(score, head_dim=self.head_dim, num_heads=self.num_heads,
                                               **(score_options or {}))
        else:
            if score_options:
                raise ArgumentTypeError("score_options apply only to a score given by name")
            self.score = resolve_score(score)
        self.score_name = score if isinstance(score, str) else type(self.score).__name__

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, score={self.score_name!r}, normalize={self.normalize!r}, "
                f"dropout={self.dropout}")

    def exact(self, q, k, v, call: StepCall, **options) -> AttentionResult:
        """:func:`attnlab.attend` with this step's score, normaliser and dropout and the call's
        mask, bias, score function and ``return_weights`` (``options`` replace any of them, or add
        ``block_size``)."""
        given = {"mask": call.mask, "score_mod": call.score_mod, "bias": call.bias,
                 "return_weights": call.return_weights, **options}
        return attend(q, k, v, score=self.score, normalize=self.normalize,
                      dropout_p=self.dropout if self.training else 0.0, **given)

    def attend(self, q, k, v, call: StepCall) -> AttentionResult:
        return self.exact(q, k, v, call)
