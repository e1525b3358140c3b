"""transformers' mask interface (``AttentionMaskInterface``) for attnlab (registered by
:mod:`attnlab.integrations.transformers`): the mask a model builds, as an attnlab mask of positions
(:class:`ModelMask`), transformers' causal, bidirectional and sliding-window rules recognised as bands."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import masking_utils as hf_masks

from ..core.band import Band
from ..core.maskfn import Everything, FunctionMask, Mask
from ..core.masks import valid_keys

__all__ = ["ModelMask", "model_mask"]

class ModelMask(Mask):
    """The mask a transformers model builds, as an attnlab mask of positions (True = may attend).

    ``rule``: the position rule (transformers' causal, bidirectional and sliding-window functions are recognised as
    attnlab's :class:`~attnlab.core.band.Band` / full masks, so the core knows their tiles without evaluating a pair;
    any other function is evaluated as FlexAttention would), and ``flags`` ``(B, M)``: the real keys of a padded batch
    (None without padding). ``kind``: ``("full",)``, ``("band", lo, hi)`` (``lo <= kv - q' <= hi``, None = open, the
    last query on the last key) or ``("custom",)``. ``offset``: the position of the first key (a sliding-window cache
    drops the oldest keys). The dense form is computed once per size and shared by every layer."""

    ndim = 4  # what transformers asks of a prepared mask before handing it back (generate() with a static cache)

    def __init__(self, rule: Mask, kind: tuple, flags: torch.Tensor | None, offset: int = 0):
        self.kind, self.flags, self.offset = kind, flags, offset
        self.inner = rule if flags is None else valid_keys(flags) if kind == ("full",) else rule & valid_keys(flags)
        self.batch = None if flags is None else flags.shape[0]
        self.key_only = kind == ("full",) and flags is not None
        self._dense: dict = {}

    def __call__(self, b, h, q_idx, kv_idx):
        return self.inner(b, h, q_idx, kv_idx)

    def tiles(self, grid):
        return self.inner.tiles(grid)

    def bind(self, n, m):
        return self.inner.bind(n, m)

    def hidden_keys(self, m, device=None):
        return self.inner.hidden_keys(m, device)

    def is_causal(self, n, m):
        return self.inner.is_causal(n, m)

    def dense(self, n, m=None, *, batch=None, heads=None, device=None):
        key = (n, m, batch, heads, str(device))
        if key not in self._dense:
            self._dense[key] = self.inner.dense(n, m, batch=batch, heads=heads, device=device)
        return self._dense[key]

    def __repr__(self):
        return f"ModelMask({self.kind}, padding={self.flags is not None})"


def _cell(fn, factory: str, var: str):
    """The value ``var`` captured by the closure that transformers' ``factory`` returns, or None."""
    code = getattr(fn, "__code__", None)
    if code is None or not fn.__qualname__.startswith(f"{factory}.<locals>.") or var not in code.co_freevars:
        return None
    return fn.__closure__[code.co_freevars.index(var)].cell_contents


def _shape(fn) -> tuple | None:
    """``("full",)``, ``("band", lo, hi)`` for transformers' own position rules, None for another function."""
    if fn is hf_masks.causal_mask_function:
        return ("band", None, 0)
    if fn is hf_masks.bidirectional_mask_function:
        return ("full",)
    w = _cell(fn, "sliding_window_overlay", "sliding_window")
    if w is not None:
        return ("band", -(int(w) - 1), None)  # kv > q - w
    w = _cell(fn, "sliding_window_bidirectional_overlay", "sliding_window")
    if w is not None:
        return ("band", -int(w), int(w))
    parts = _cell(fn, "and_masks", "mask_functions")
    if parts is None:
        return None
    lo = hi = None
    for p in parts:
        s = _shape(p)
        if s is None:
            return None
        if s[0] == "band":
            lo = s[1] if lo is None else (lo if s[1] is None else max(lo, s[1]))
            hi = s[2] if hi is None else (hi if s[2] is None else min(hi, s[2]))
    return ("full",) if lo is None and hi is None else ("band", lo, hi)


def model_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
               mask_function=hf_masks.causal_mask_function, attention_mask: torch.Tensor | None = None,
               **_) -> ModelMask:
    """transformers' mask interface (``AttentionMaskInterface``): the :class:`ModelMask` of queries
    at positions ``q_offset ..`` and keys at ``kv_offset ..`` under ``mask_function``
    (``(b, h, q_idx, kv_idx) -> bool``, FlexAttention's signature: the same callable attnlab
    takes) and the 2-D padding ``attention_mask`` ``(B, kv_offset + kv_length)`` (1 = real)."""
    if isinstance(attention_mask, ModelMask):  # prepared once for a whole generation (a static cache): as it is
        return attention_mask
    q_offset, kv_offset = int(q_offset), int(kv_offset)
    flags = None
    if attention_mask is not None:
        a = attention_mask.to(torch.bool)
        if a.shape[-1] < kv_offset + kv_length:  # keys beyond the 2-D mask are not real (transformers pads with 0)
            a = F.pad(a, (0, kv_offset + kv_length - a.shape[-1]))
        a = a[:, kv_offset : kv_offset + kv_length]
        flags = None if bool(a.all()) else a.expand(batch_size, -1)
    shape = _shape(mask_function)
    if shape == ("full",):
        return ModelMask(Everything(), shape, flags, kv_offset)
    if shape is not None and q_offset - kv_offset == kv_length - q_length:  # the last query on the last key
        return ModelMask(Band(shape[1], shape[2], name="model"), shape, flags, kv_offset)

    def shifted(b, h, q_idx, kv_idx):
        return mask_function(b, h, q_idx + q_offset, kv_idx + kv_offset)

    return ModelMask(FunctionMask(shifted), ("custom",), flags, kv_offset)
