"""The decoding states of constant size: what a recurrent step or mixer keeps between calls,
data the layer reads and writes (:mod:`attnlab.layers.decoding`; a mixer its own).

* :class:`RecurrentState` — the running sums of causal kernel attention (``linear``,
  ``performer``): "Transformers are RNNs" (Katharopoulos et al. 2020).
* :class:`MatrixState` — the gated linear-attention family's matrix state ``S_t`` and its short
  convolution's last inputs (the mixers that declare ``cache="matrix"``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cache import ForgetKVCache, KVCache
from .step import check_decodes

__all__ = ["ConstantSizeState", "MatrixState", "RecurrentState", "check_kind", "make_cache"]


class ConstantSizeState:
    """What both decoding states of constant size share: the tokens seen, and their bytes."""

    seen: int

    def _tensors(self) -> tuple:
        raise NotImplementedError

    def nbytes(self) -> int:
        """Bytes held."""
        return sum(t.numel() * t.element_size() for t in self._tensors() if t is not None)


@dataclass
class RecurrentState(ConstantSizeState):
    """Causal kernel attention's running sums after ``seen`` tokens: ``s`` ``(B, H, F, Dv)``
    ``= sum_j phi(k_j) v_j^T``, ``z`` ``(B, H, F)`` ``= sum_j phi(k_j)``, and for exponential
    feature maps (Performer) ``shift`` ``(B, H, 1, 1)``, the running maximum of the keys'
    feature logits that both sums are scaled by (it cancels in the ratio).
    """

    s: torch.Tensor | None = None
    z: torch.Tensor | None = None
    shift: torch.Tensor | None = None
    seen: int = 0

    def _tensors(self) -> tuple:
        return self.s, self.z, self.shift

    def reset(self) -> None:
        """Forget every token."""
        self.s = self.z = self.shift = None
        self.seen = 0


@dataclass
class MatrixState(ConstantSizeState):
    """What a gated linear-attention layer keeps for decoding: its state and its short
    convolution's last inputs, of a size that does not grow with the tokens seen.

    Attributes:
        state: ``(B, H, D, Dv)`` the matrix state ``S_t`` (None before the first token).
        conv: ``(B, K - 1, C)`` the last ``K - 1`` projections entering the short convolution
            (None without one, or before the first token).
        seen: tokens written so far (the position of the next one).
    """

    state: torch.Tensor | None = None
    conv: torch.Tensor | None = None
    seen: int = 0

    def _tensors(self) -> tuple:
        return self.state, self.conv

    def reset(self) -> None:
        """Forget every token."""
        self.state = self.conv = None
        self.seen = 0

    def reorder(self, index: torch.Tensor) -> None:
        """Keep the rows ``index`` (beam search)."""
        self.state = None if self.state is None else self.state.index_select(0, index)
        self.conv = None if self.conv is None else self.conv.index_select(0, index)


def make_cache(step, window, sinks: int, positions: str):
    """The cache of the kind ``step`` declares (``capabilities.cache``): see
    :meth:`attnlab.MultiHeadAttention.new_cache`."""
    check_decodes(step)
    kind = step.capabilities.cache
    if kind == "kv":
        return KVCache(window=window, sinks=sinks, positions=positions)
    if kind == "forget":
        if window is not None or sinks or positions != "absolute":
            raise ValueError(f"the {step.name!r} attention's cache holds every token with its cumulative forget gate: "
                             "pass no window, sinks or positions")
        return ForgetKVCache()
    if kind == "window":
        if window is not None or sinks or positions != "absolute":
            raise ValueError(f"the {step.name!r} attention's cache is its own window: pass no window, sinks or "
                             "positions")
        own_window, own_sinks = step.cache_bounds()
        return KVCache(window=own_window, sinks=own_sinks)
    if window is not None or sinks or positions != "absolute":
        raise ValueError(f"the {step.name!r} attention's cache is its state, already of constant size: "
                         "pass no window, sinks or positions")
    return RecurrentState() if kind == "recurrent" else MatrixState()


def check_kind(step, cache) -> None:
    """Refuse a cache other than the kind :func:`make_cache` makes for ``step``: see
    :meth:`attnlab.MultiHeadAttention.check_cache`."""
    check_decodes(step)
    kind = step.capabilities.cache
    if kind == "kv" and isinstance(cache, KVCache) and not isinstance(cache, ForgetKVCache):
        return
    if kind == "window" and isinstance(cache, KVCache):
        want = make_cache(step, None, 0, "absolute")
        if (cache.window, cache.sinks, cache.positions) == (want.window, want.sinks, want.positions):
            return
    if kind == "forget" and isinstance(cache, ForgetKVCache):
        return
    if kind in ("recurrent", "matrix") and isinstance(cache, RecurrentState if kind == "recurrent" else MatrixState):
        return
    got = {RecurrentState: "a recurrent state", MatrixState: "a matrix state",
           ForgetKVCache: "a forget-gate cache"}.get(type(cache), type(cache).__name__)
    raise ValueError(f"the {step.name!r} attention decodes with the cache its new_cache() makes, not this one ({got})")
