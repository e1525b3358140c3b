"""Score functions ``score(q, k)``: how relevant key ``k_j`` is to query ``q_i`` (alpha_{i,j}).

Plain scores are functions of ``q`` and ``k`` alone:

* :func:`dot` — ``q . k``;
* :func:`scaled_dot` — ``q . k / sqrt(D)`` (Vaswani et al. 2017, https://arxiv.org/abs/1706.03762), the default;
* :func:`cosine` — ``cos(q, k) / tau`` with a temperature ``tau``.

Learnable scores are small modules holding their own weights:

* :class:`Additive` — ``v^T tanh(W_q q + W_k k)`` (Bahdanau et al. 2015, https://arxiv.org/abs/1409.0473);
* :class:`Bilinear` — ``q^T W k`` (Luong et al. 2015 "general", https://arxiv.org/abs/1508.04025).

Every score is also a :class:`Score` module with two stages, so that ``attend`` does per-row
work once and per-pair work block by block: ``prepare(q, k)`` transforms queries and keys
(normalising them, projecting them) and ``pairwise(q', k')`` forms the ``(…, N, M)`` scores.
A score whose ``pairwise`` is a plain scaled dot product reports its scale through
:meth:`Score.dot_scale`, which lets ``attend`` hand it to PyTorch's fused kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..registry import Registry
from ..validate import ArgumentTypeError, number_above, positive_int

__all__ = [
    "dot",
    "scaled_dot",
    "cosine",
    "Score",
    "Dot",
    "ScaledDot",
    "Cosine",
    "Additive",
    "Bilinear",
    "CallableScore",
    "SCORES",
    "create",
    "names",
    "resolve_score",
    "COSINE_EPS",
]

COSINE_EPS = 1e-12
"""Norms below this are clamped before dividing, as in :func:`torch.nn.functional.normalize`."""


def dot(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Dot-product scores ``q_i . k_j``: ``(…, N, D) x (…, M, D) -> (…, N, M)``."""
    return q @ k.transpose(-2, -1)


def scaled_dot(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Scaled dot-product scores ``q_i . k_j / sqrt(D)``: ``(…, N, D) x (…, M, D) -> (…, N, M)``."""
    return (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1])) if q.shape[-1] else dot(q, k)


def cosine(q: torch.Tensor, k: torch.Tensor, temperature: float = 0.1) -> torch.Tensor:
    """Cosine-similarity scores ``cos(q_i, k_j) / temperature`` in ``[-1/t, 1/t]``.

    Norms are clamped at :data:`COSINE_EPS`, so a zero vector scores 0 against everything.
    A temperature below 1 sharpens the distribution (Swin-v2 uses learnable ``t`` near 0.1).
    """
    return dot(F.normalize(q, dim=-1, eps=COSINE_EPS), F.normalize(k, dim=-1, eps=COSINE_EPS)) / temperature


class Score(nn.Module):
    """Base class of scores: ``forward(q, k) = pairwise(*prepare(q, k))``, shapes
    ``(B, H, N, D) x (B, H, M, D) -> (B, H, N, M)``.

    Subclass it for a custom score; ``attend`` also takes any plain callable ``(q, k) -> scores``.
    """

    #: temporary elements created per (query, key) pair by :meth:`pairwise`; ``attend`` sizes
    #: its query blocks by it.
    pair_cost: int = 1

    def check(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """Raise ValueError if ``q`` ``(B, H, N, D)`` and ``k`` ``(B, H, M, D_k)`` do not fit this score.

        Default: nothing to check (a custom score checks its own inputs)."""

    def prepare(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-vector work done once for all pairs (normalise, project). Default: identity."""
        return q, k

    def pairwise(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """Scores of prepared queries ``(…, N, D')`` against prepared keys ``(…, M, D')``."""
        raise NotImplementedError

    def dot_scale(self, head_dim: int) -> float | None:
        """``s`` if ``pairwise(q, k) == s * q @ k^T`` for prepared ``q`` of width ``head_dim``, else None."""
        return None

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return self.pairwise(*self.prepare(q, k))


def _check_same_width(score: Score, q: torch.Tensor, k: torch.Tensor) -> None:
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"{type(score).__name__} score needs q and k of the same last dimension D, "
            f"got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )


def _check_weight(score: Score, name: str, x: torch.Tensor, weight: torch.Tensor) -> None:
    heads, width = weight.shape[0], weight.shape[-2]
    if x.shape[-1] != width:
        raise ValueError(
            f"{type(score).__name__} score was built for {name} of last dimension {width}, "
            f"got {name} of shape {tuple(x.shape)}"
        )
    if heads != 1 and (x.dim() < 3 or x.shape[-3] != heads):
        raise ValueError(
            f"{type(score).__name__} score was built for {heads} heads, got {name} of shape {tuple(x.shape)} "
            "(expected (B, H, N, D))"
        )


class Dot(Score):
    """Dot-product score ``q . k`` (module form of :func:`dot`)."""

    def check(self, q, k):
        _check_same_width(self, q, k)

    def pairwise(self, q, k):
        return dot(q, k)

    def dot_scale(self, head_dim):
        return 1.0


class ScaledDot(Score):
    """Scaled dot-product score ``q . k / sqrt(D)`` (module form of :func:`scaled_dot`)."""

    check = Dot.check

    def pairwise(self, q, k):
        return scaled_dot(q, k)

    def dot_scale(self, head_dim):
        return 1.0 / math.sqrt(head_dim) if head_dim else 1.0


class Cosine(Score):
    """Cosine score ``cos(q, k) / tau`` (module form of :func:`cosine`).

    Args:
        temperature: ``tau`` (> 0), default 0.1.
        learnable: learn ``log tau`` as a parameter (one per head when ``num_heads`` > 1).
        num_heads: heads H for a learnable per-head temperature.
    """

    def __init__(self, temperature: float = 0.1, *, learnable: bool = False, num_heads: int = 1):
        super().__init__()
        number_above("cosine temperature", temperature, 0)
        log_t = torch.full((num_heads, 1, 1), math.log(float(temperature)), dtype=torch.float64)
        if learnable:
            self.log_temperature = nn.Parameter(log_t.to(torch.get_default_dtype()))
        else:  # float64, so that a fixed temperature is exact for float64 inputs too (cast per call)
            self.register_buffer("log_temperature", log_t, persistent=False)

    def check(self, q, k):
        _check_same_width(self, q, k)
        heads = self.log_temperature.shape[0]
        if heads != 1 and (q.dim() < 3 or q.shape[-3] != heads):
            raise ValueError(f"Cosine score was built for {heads} heads, got q of shape {tuple(q.shape)}")

    @property
    def temperature(self) -> torch.Tensor:
        """The temperature ``tau``, shape ``(H, 1, 1)``."""
        return self.log_temperature.exp()

    def prepare(self, q, k):
        inv_t = (-self.log_temperature).exp().to(q)  # (H, 1, 1) broadcasts over (B, H, N, D)
        return F.normalize(q, dim=-1, eps=COSINE_EPS) * inv_t, F.normalize(k, dim=-1, eps=COSINE_EPS)

    def pairwise(self, q, k):
        return dot(q, k)

    def dot_scale(self, head_dim):
        return 1.0


class Additive(Score):
    """Additive (Bahdanau) score ``v^T tanh(W_q q + W_k k)``, one set of weights per head.

    Per pair it builds a hidden vector of width ``hidden_dim``, so ``attend`` processes fewer
    queries per block for it.

    Args:
        head_dim: D, the width of q and k.
        hidden_dim: A, the width of the tanh layer (default ``head_dim``).
        num_heads: H; weights have a leading head axis (1 = shared by all heads).
    """

    def __init__(self, head_dim: int, hidden_dim: int | None = None, *, num_heads: int = 1):
        super().__init__()
        d = positive_int("head_dim", head_dim)
        a = positive_int("hidden_dim", hidden_dim if hidden_dim is not None else head_dim)
        h = positive_int("num_heads", num_heads)
        self.w_q = nn.Parameter(torch.empty(h, d, a))  # (H, D, A)
        self.w_k = nn.Parameter(torch.empty(h, d, a))  # (H, D, A)
        self.v = nn.Parameter(torch.empty(h, a, 1))  # (H, A, 1)
        self.pair_cost = a
        self.reset_parameters()

    def reset_parameters(self) -> None:
        d, a = self.w_q.shape[-2:]
        nn.init.uniform_(self.w_q, -1 / math.sqrt(d), 1 / math.sqrt(d))
        nn.init.uniform_(self.w_k, -1 / math.sqrt(d), 1 / math.sqrt(d))
        nn.init.uniform_(self.v, -1 / math.sqrt(a), 1 / math.sqrt(a))

    def check(self, q, k):
        _check_weight(self, "q", q, self.w_q)
        _check_weight(self, "k", k, self.w_k)

    def prepare(self, q, k):
        return q @ self.w_q, k @ self.w_k  # (B, H, N, A), (B, H, M, A)

    def pairwise(self, q, k):
        hidden = torch.tanh(q.unsqueeze(-2) + k.unsqueeze(-3))  # (B, H, N, M, A)
        return (hidden @ self.v.unsqueeze(-3)).squeeze(-1)  # (B, H, N, M)


class Bilinear(Score):
    """Bilinear score ``q^T W k`` with a learned ``W`` per head.

    ``W`` starts as ``I / sqrt(D)``, so a fresh bilinear score equals :func:`scaled_dot`.

    Args:
        head_dim: D, the width of q (and of k unless ``key_dim`` is given).
        key_dim: width of k, if it differs.
        num_heads: H; ``W`` has shape ``(H, D, D_k)`` (1 = shared by all heads).
    """

    def __init__(self, head_dim: int, *, key_dim: int | None = None, num_heads: int = 1):
        super().__init__()
        d = positive_int("head_dim", head_dim)
        dk = positive_int("key_dim", key_dim if key_dim is not None else head_dim)
        h = positive_int("num_heads", num_heads)
        self.weight = nn.Parameter(torch.empty(h, d, dk))  # (H, D, D_k)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        d, dk = self.weight.shape[-2:]
        with torch.no_grad():
            self.weight.zero_()
            self.weight[:, range(min(d, dk)), range(min(d, dk))] = 1.0 / math.sqrt(d)

    def check(self, q, k):
        _check_weight(self, "q", q, self.weight)
        _check_weight(self, "k", k, self.weight.transpose(-2, -1))

    def prepare(self, q, k):
        return q @ self.weight, k  # (B, H, N, D_k): q^T W, then a dot product with k

    def pairwise(self, q, k):
        return dot(q, k)

    def dot_scale(self, head_dim):
        return 1.0


class CallableScore(Score):
    """Wraps a user's callable ``(q, k) -> (…, N, M)`` scores."""

    def __init__(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        super().__init__()
        self.fn = fn

    def pairwise(self, q, k):
        return self.fn(q, k)


SCORES: Registry = Registry("score")
"""Every score by name: the plain ones (no weights) and the learnable ones."""
for _name, _cls in {"dot": Dot, "scaled_dot": ScaledDot, "cosine": Cosine, "additive": Additive,
                    "bilinear": Bilinear}.items():
    SCORES.add(_name, _cls)
_PLAIN = ("dot", "scaled_dot", "cosine")
_LEARNABLE = ("additive", "bilinear")
_SINGLETONS: dict[str, Score] = {}


def names() -> list[str]:
    """Names accepted wherever a score is chosen by name."""
    return SCORES.names()


def _unknown(name) -> ValueError:
    return ValueError(f"unknown score {name!r}; expected one of {names()} or a callable (q, k) -> scores")


def create(name: str, *, head_dim: int, num_heads: int = 1, **options) -> Score:
    """A fresh :class:`Score` module by name, sized for ``num_heads`` heads of width ``head_dim``.

    ``options`` go to the class (``temperature=`` and ``learnable=`` for cosine,
    ``hidden_dim=`` for additive, ``key_dim=`` for bilinear).
    """
    if name not in SCORES:
        raise _unknown(name)
    cls = SCORES.get(name)
    if name in _LEARNABLE:
        return cls(head_dim, num_heads=num_heads, **options)
    if name == "cosine":
        return cls(num_heads=num_heads if options.get("learnable") else 1, **options)
    if options:
        raise ArgumentTypeError(f"score {name!r} takes no options, got {sorted(options)}")
    return cls()


def resolve_score(score) -> Score:
    """The :class:`Score` for ``attend(score=...)``: a name of a plain score, a :class:`Score`
    module, or a callable ``(q, k) -> (…, N, M)``."""
    if isinstance(score, Score):
        return score
    if isinstance(score, str):
        if score in _PLAIN:
            if score not in _SINGLETONS:
                _SINGLETONS[score] = SCORES.get(score)()
            return _SINGLETONS[score]
        if score in _LEARNABLE:
            raise ValueError(
                f"score {score!r} has learnable weights, so attend() cannot build it from its name; "
                f"pass a module such as attnlab.{SCORES.get(score).__name__}(head_dim), "
                f"or use MultiHeadAttention(score={score!r})"
            )
        raise _unknown(score)
    if callable(score):
        return CallableScore(score)
    raise ArgumentTypeError(f"score must be a name, a Score module or a callable, got {type(score).__name__}")
