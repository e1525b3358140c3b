"""Score functions: ``score_mod(score, b, h, q_idx, kv_idx) -> score``, applied to each score before the mask and the normaliser.

FlexAttention's ``score_mod`` signature (``torch.nn.attention.flex_attention``), so the same
callables run on both; attnlab calls them with broadcasting index tensors on a block of scores
at a time, so a bias over all ``N x M`` pairs is never materialised. Every score function here
is a :class:`ScoreMod`: a callable that lists the tensors it learns (``params``), which
:func:`attnlab.attend` differentiates block by block.

* :func:`alibi` — ``s + m_h (j - i)`` (Press et al. 2022, https://arxiv.org/abs/2108.12409);
* :func:`softcap` — ``c tanh(s / c)`` (Gemma 2's logit soft-capping, https://arxiv.org/abs/2408.00118);
* :func:`offset_bias` — ``s + b_h(pos_j - pos_i)`` for any per-head function of the offset (the
  positional encodings ``alibi`` and ``relative`` give theirs through
  :meth:`attnlab.positional.PositionalEncoding.score_mod`);
* :func:`compose` — one after another.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

from ..validate import ArgumentTypeError, number_above, positive_int

__all__ = ["ScoreMod", "alibi", "compose", "offset_bias", "softcap"]


class ScoreMod:
    """A score function with the tensors it learns.

    Args:
        fn: ``(score, b, h, q_idx, kv_idx) -> score`` (broadcasting index tensors).
        params: tensors ``fn`` depends on that may need gradients.
        name: shown in ``repr``.
    """

    def __init__(self, fn: Callable, params: Iterable[torch.Tensor] = (), name: str = "score_mod"):
        if not callable(fn):
            raise ArgumentTypeError(f"a score function must be callable (score, b, h, q_idx, kv_idx) -> score, got {type(fn).__name__}")
        self.fn, self.params, self.name = fn, list(params), name

    def __call__(self, score, b, h, q_idx, kv_idx):
        return self.fn(score, b, h, q_idx, kv_idx)

    def __repr__(self) -> str:
        return f"{self.name}"


def compose(*mods) -> ScoreMod | None:
    """The score functions applied one after another (None ones skipped; none at all: None)."""
    present = [m for m in mods if m is not None]
    for m in present:
        if not callable(m):
            raise ArgumentTypeError(f"a score function must be callable, got {type(m).__name__}")
    if not present:
        return None
    if len(present) == 1:
        return present[0] if isinstance(present[0], ScoreMod) else ScoreMod(present[0])

    def run(score, b, h, q_idx, kv_idx):
        for m in present:
            score = m(score, b, h, q_idx, kv_idx)
        return score

    params = [p for m in present for p in (m.params if isinstance(m, ScoreMod) else getattr(m, "parameters", lambda: [])())]
    return ScoreMod(run, params, " + ".join(repr(m) for m in present))


def softcap(cap: float) -> ScoreMod:
    """Soft-capping ``c tanh(s / c)``: scores squashed smoothly into ``(-c, c)`` (Gemma 2 uses c = 50
    on attention logits). Differentiable; the identity in the limit ``c -> inf``."""
    c = number_above("cap", cap, 0)
    return ScoreMod(lambda s, b, h, q, kv: c * torch.tanh(s / c), name=f"softcap({c})")


def _at(pos: torch.Tensor | None, b, idx):
    """Position of index ``idx`` in row ``b``: ``idx`` itself, ``pos[idx]`` or ``pos[b, idx]``."""
    if pos is None:
        return idx
    pos = pos.to(idx.device)
    return pos[idx] if pos.dim() == 1 else pos[b, idx]


def offset_bias(head_bias: Callable, q_positions: torch.Tensor | None = None, kv_positions: torch.Tensor | None = None,
                *, params: Iterable[torch.Tensor] = (), name: str = "offset_bias") -> ScoreMod:
    """``s + head_bias(h, pos_j - pos_i)``: a per-head bias of the offset between a key's and a
    query's positions (``(N,)``, ``(B, N)`` per row, or None: the indices).

    Args:
        head_bias: ``(h, offsets) -> bias``, elementwise with broadcasting (``h`` an index tensor).
        params: the tensors ``head_bias`` learns (a relative bias table).
    """

    def fn(score, b, h, q_idx, kv_idx):
        off = _at(kv_positions, b, kv_idx) - _at(q_positions, b, q_idx)
        return score + head_bias(h, off).to(score.dtype)

    return ScoreMod(fn, params, name)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """The heads' slopes ``m_h``: a geometric sequence, float64 ``(H,)``.

    For H a power of two: ``m_h = 2^(-8 h / H)``, h = 1..H (8 heads: 1/2, 1/4, ..., 1/256).
    Otherwise, as in the paper's code: the slopes of the largest power of two ``P < H``, then
    every other slope of ``2 P`` heads (the odd-numbered ones) until there are H.
    """
    h = positive_int("num_heads", num_heads)

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    if h & (h - 1) == 0:
        return torch.tensor(power_of_two(h), dtype=torch.float64)
    p = 2 ** int(math.floor(math.log2(h)))
    return torch.tensor(power_of_two(p) + power_of_two(2 * p)[0::2][: h - p], dtype=torch.float64)


def alibi(num_heads: int, *, symmetric: bool = False, q_positions=None, kv_positions=None) -> ScoreMod:
    """ALiBi: ``s + m_h (j - i)`` with the heads' slopes :func:`alibi_slopes` (``-m_h |j - i|``
    when ``symmetric``, for attention without a causal mask)."""
    slopes = alibi_slopes(num_heads)

    def head_bias(h, off):
        m = slopes.to(off.device)[h]
        return m * (-off.abs() if symmetric else off)

    return offset_bias(head_bias, q_positions, kv_positions, name=f"alibi({num_heads}{', symmetric' if symmetric else ''})")
