"""Normalisers: turn a row of scores ``s_{i,.}`` into attention weights ``a'_{i,.}``.

Each normaliser takes ``scores`` of shape ``(…, N, M)`` and an optional boolean ``mask``
broadcastable to it (True = may attend) and returns weights of the same shape. Masked-out
pairs get weight exactly 0 (whatever their score, NaN included), and a row with no allowed key
gets all-zero weights and zero gradients, never NaN.

* :func:`softmax` (default) — ``exp(s_ij) / sum_j' exp(s_ij')`` over the allowed keys; rows sum to 1.
* :func:`relu` — ``max(s_ij, 0) / n_i``, where ``n_i`` is the number of keys row ``i`` may attend
  to (``M`` without a mask). Dividing by the sequence length is the scaling of Wortsman et al.
  2023 (https://arxiv.org/abs/2309.08586); counting only allowed keys keeps it right under
  padding and causal masks. Rows need not sum to 1.
* :func:`sigmoid` — ``sigmoid(s_ij - log n_i)``, with ``n_i`` as above: the ``b = -log n`` bias of
  Ramapuram et al. 2024 (https://arxiv.org/abs/2409.04431), which keeps the row sum near the
  softmax's scale at initialisation. Rows need not sum to 1.

Half-precision scores are normalised in float32 and the weights cast back.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..registry import Registry
from ..validate import ArgumentTypeError
from .amp import upcast

__all__ = ["softmax", "relu", "sigmoid", "NORMALIZERS", "create", "names", "resolve_normalizer"]


def _allowed_count(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor | float:
    """Number of allowed keys per row, shape broadcastable to ``(…, N, 1)``, at least 1."""
    if mask is None:
        return float(max(scores.shape[-1], 1))
    return mask.sum(-1, keepdim=True).clamp_min(1).to(upcast(scores).dtype)


def softmax(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the allowed keys of each row; an all-masked row gives zeros."""
    s = upcast(scores)
    if mask is None:
        return torch.softmax(s, dim=-1).to(scores.dtype)
    row_ok = mask.any(-1, keepdim=True)  # (…, N, 1)
    s = s.masked_fill(~mask, float("-inf"))
    all_ok = bool(row_ok.all())
    if not all_ok:
        # a row with no allowed key: finite zeros in, zeros out, so no NaN forward or backward
        s = s.masked_fill(~row_ok, 0.0)
    w = torch.softmax(s, dim=-1)
    if not all_ok:
        w = w.masked_fill(~row_ok, 0.0)
    return w.to(scores.dtype)


def relu(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """ReLU attention ``max(s, 0) / n_i`` (``n_i`` = allowed keys of row ``i``)."""
    s = upcast(scores)
    w = torch.relu(s) / _allowed_count(s, mask)
    if mask is not None:
        w = torch.where(mask, w, torch.zeros((), dtype=w.dtype, device=w.device))
    return w.to(scores.dtype)


def sigmoid(scores: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Sigmoid attention ``sigmoid(s - log n_i)`` (``n_i`` = allowed keys of row ``i``)."""
    s = upcast(scores)
    n = _allowed_count(s, mask)
    w = torch.sigmoid(s - (math.log(n) if isinstance(n, float) else torch.log(n)))
    if mask is not None:
        w = torch.where(mask, w, torch.zeros((), dtype=w.dtype, device=w.device))
    return w.to(scores.dtype)


NORMALIZERS: Registry = Registry("normaliser")
"""Every normaliser ``(scores, mask) -> weights`` by name."""
for _fn in (softmax, relu, sigmoid):
    NORMALIZERS.add(_fn.__name__, _fn)


def names() -> list[str]:
    """Names accepted wherever a normaliser is chosen by name."""
    return NORMALIZERS.names()


def create(name: str) -> Callable:
    """The normaliser ``name`` (a function ``(scores, mask) -> weights``; nothing to build)."""
    return NORMALIZERS.get(name)


def resolve_normalizer(normalize) -> Callable:
    """The function for ``attend(normalize=...)``: a name, or a callable ``(scores, mask) -> weights``."""
    if isinstance(normalize, str):
        if normalize in NORMALIZERS:
            return NORMALIZERS.get(normalize)
        raise ValueError(f"unknown normaliser {normalize!r}; expected one of {names()} or a callable (scores, mask) -> "
                         "weights")
    if callable(normalize):
        return normalize
    raise ArgumentTypeError(f"normalize must be a name or a callable, got {type(normalize).__name__}")
