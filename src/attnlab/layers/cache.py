"""The caches of decoding a few tokens at a time (so that the next token costs one row of
attention instead of the whole prefix): data, tensors and the few operations on them, which the
layer that uses a cache reads and writes (:mod:`attnlab.layers.decoding` for
:class:`attnlab.MultiHeadAttention`; a sequence mixer its own):

* :class:`KVCache` — the keys and values of a self-attention layer. Unbounded, it grows (amortised, by doubling) and
  decoding with it equals recomputing the prefix. Bounded (``window=``), it keeps the first ``sinks`` tokens and the
  last ``window`` tokens in a ring buffer of constant size: with ``positions="absolute"`` that is exactly causal local
  attention (``local``: window ``w + 1``; ``longformer``: its global tokens as sinks); with ``positions="cache"`` it is
  StreamingLLM's cache (Xiao et al. 2023, https://arxiv.org/abs/2309.17453), whose rotation and bias encodings use a
  token's place in the cache instead of its place in the text, so that a stream may run past the longest position the
  model was trained on. What each new query sees (earlier keys, the window, the sinks, not padding) is a mask over the
  held keys' positions, the same kind of mask as any.
* :class:`ForgetKVCache` — a KVCache that also keeps each held key's cumulative log forget gate
  (the Forgetting Transformer, ``fox``), whose decay continues across calls.
* :class:`StaticKV` — cross-attention's keys and values, computed once from the encoder's output, reused at each step.
* the states of constant size (:mod:`attnlab.layers.state`): :class:`RecurrentState`, the running sums of causal kernel
  attention (``linear``, ``performer``; "Transformers are RNNs", Katharopoulos et al. 2020), and :class:`MatrixState`,
  the matrix state and short convolution of the gated linear-attention family.

A layer hands the cache to its step as the call's ``state`` (the step declares which it decodes with: its
``capabilities.cache``). A cache is created by the layer that uses it (``layer.new_cache()``) and passed back to it:
``layer(x_new, cache=cache)``. Caches are for inference: they are written in place.
"""

from __future__ import annotations

import torch

from ..core import masks
from ..core.positioned import Positioned
from ..validate import int_at_least, positive_int

__all__ = ["ForgetKVCache", "KVCache", "StaticKV"]


class KVCache:
    """The keys and values one self-attention layer has seen, with their positions and padding.

    Args:
        window: keep only the last ``window`` tokens (the current one included) besides the sinks; None (default) keeps
            every token.
        sinks: with a window, also keep the first ``sinks`` tokens for ever (attention sinks).
        positions: ``"absolute"`` (default): a token's position is its index in the stream; ``"cache"`` (with a window):
            its index among the tokens the cache holds, sinks first (StreamingLLM), for rotation and bias encodings.

    Attributes:
        seen: tokens written so far (the absolute position of the next one).
        size: tokens held now (``seen``, or at most ``sinks + window``).
    """

    # the buffers: allocated together on the first write (``_allocate``), None before it
    k: torch.Tensor | None
    v: torch.Tensor | None
    valid: torch.Tensor | None
    slot_pos: torch.Tensor | None

    def __init__(self, *, window: int | None = None, sinks: int = 0, positions: str = "absolute"):
        self.window = None if window is None else positive_int("window", window)
        self.sinks = int_at_least("sinks", sinks, 0)
        if positions not in ("absolute", "cache"):
            raise ValueError(f"positions must be 'absolute' or 'cache', got {positions!r}")
        if self.window is None and (self.sinks or positions == "cache"):
            raise ValueError("sinks and positions='cache' bound the cache: give a window too")
        self.positions = positions
        self.k = self.v = self.valid = self.slot_pos = None
        self.size = self.seen = 0
        self.padded = False  # some held token is padding: attention needs the valid mask

    @property
    def bounded(self) -> bool:
        """True when the cache keeps at most ``sinks + window`` tokens."""
        return self.window is not None

    @property
    def capacity(self) -> int:
        """The slots allocated now (``sinks + window`` once bounded)."""
        return 0 if self.k is None else self.k.shape[2]

    def nbytes(self) -> int:
        """Bytes held by the cache's tensors."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.valid, self.slot_pos) if t is not None)

    def reset(self) -> None:
        """Forget every token (the buffers are released)."""
        self.k = self.v = self.valid = self.slot_pos = None
        self.size = self.seen = 0
        self.padded = False

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (beam search: each new beam continues the row it came from)."""
        if self.k is not None:
            assert self.v is not None and self.valid is not None  # allocated with k
            self.k, self.v, self.valid = self.k[index], self.v[index], self.valid[index]

    # ------------------------------------------------------------------ storage
    def _allocate(self, k: torch.Tensor, v: torch.Tensor, slots: int) -> None:
        b, g, _, d = k.shape
        new_k = k.new_zeros(b, g, slots, d)
        new_v = v.new_zeros(b, g, slots, v.shape[-1])
        new_valid = torch.zeros(b, slots, dtype=torch.bool, device=k.device)
        new_pos = torch.zeros(slots, dtype=torch.long, device=k.device)
        if self.k is not None:
            assert self.v is not None and self.valid is not None and self.slot_pos is not None  # allocated with k
            s = self.size
            new_k[:, :, :s], new_v[:, :, :s], new_valid[:, :s], new_pos[:s] = (
                self.k[:, :, :s], self.v[:, :, :s], self.valid[:, :s], self.slot_pos[:s])
        self.k, self.v, self.valid, self.slot_pos = new_k, new_v, new_valid, new_pos

    def _slots(self, pos: torch.Tensor) -> torch.Tensor:
        """The ring-buffer slot of absolute positions ``pos`` (bounded caches)."""
        s = self.sinks
        assert self.window is not None  # bounded
        return torch.where(pos < s, pos, s + (pos - s) % self.window)

    def update(self, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None = None):
        """Write ``n`` new tokens' keys and values ``(B, G, n, D)`` and return what they attend to.

        Args:
            k, v: the new keys (after any rotation when positions are absolute) and values.
            valid: ``(B, n)`` bool, False for padding tokens (never attended to), or None.

        Returns:
            ``(keys, values, key_valid, key_positions)``: ``(B, G, S, D)``, ``(B, G, S, Dv)``, ``(B, S)`` bool and the
            keys' absolute positions ``(S,)``. For a bounded cache and ``n > 1`` they include the tokens the new ones
            push out (the caller's mask, from :meth:`mask`, hides what each query may not see).
        """
        b, _, n, _ = k.shape
        if self.k is not None and (self.k.shape[:2] != k.shape[:2] or self.k.shape[-1] != k.shape[-1]):
            raise ValueError(f"the cache holds keys of shape (B, G, ., D) = {tuple(self.k.shape)}, got new keys "
                             f"{tuple(k.shape)}")
        if valid is None:
            valid = torch.ones(b, n, dtype=torch.bool, device=k.device)
        if valid.shape != (b, n):
            raise ValueError(f"valid must have shape (B, n) = ({b}, {n}), got {tuple(valid.shape)}")
        self.padded = self.padded or not bool(valid.all())
        new_pos = torch.arange(self.seen, self.seen + n, device=k.device)
        if not self.bounded:
            need = self.size + n
            if self.k is None or need > self.capacity:
                self._allocate(k, v, max(need, 2 * self.capacity, 16))
            assert self.k is not None and self.v is not None and self.valid is not None and self.slot_pos is not None
            sl = slice(self.size, need)
            self.k[:, :, sl], self.v[:, :, sl], self.valid[:, sl], self.slot_pos[sl] = k, v, valid, new_pos
            self.size, self.seen = need, self.seen + n
            return self.k[:, :, :need], self.v[:, :, :need], self.valid[:, :need], self.slot_pos[:need]
        assert self.window is not None  # bounded
        if self.k is None:
            self._allocate(k, v, self.sinks + self.window)
        assert self.k is not None and self.v is not None and self.valid is not None and self.slot_pos is not None
        if n == 1:  # the new token takes the slot of the one it pushes out: the buffer is what it sees
            self._write(k, v, valid, new_pos)
            s = self.size
            return self.k[:, :, :s], self.v[:, :, :s], self.valid[:, :s], self.slot_pos[:s]
        s = self.size
        out = (torch.cat([self.k[:, :, :s], k], 2), torch.cat([self.v[:, :, :s], v], 2),
               torch.cat([self.valid[:, :s], valid], 1), torch.cat([self.slot_pos[:s], new_pos]))
        keep = (new_pos < self.sinks) | (new_pos >= self.seen + n - self.window)  # what survives this call
        self._write(k[:, :, keep], v[:, :, keep], valid[:, keep], new_pos[keep])
        return out

    def _write(self, k, v, valid, pos) -> None:
        assert self.k is not None and self.v is not None and self.valid is not None and self.slot_pos is not None
        assert self.window is not None  # only bounded caches write slots
        slots = self._slots(pos)
        self.k.index_copy_(2, slots, k.to(self.k.dtype))
        self.v.index_copy_(2, slots, v.to(self.v.dtype))
        self.valid.index_copy_(1, slots, valid)
        self.slot_pos.index_copy_(0, slots, pos)
        self.seen = int(pos[-1]) + 1 if pos.numel() else self.seen
        self.size = min(self.seen, self.sinks + self.window)

    def rule(self):
        """What a query sees, as a mask over positions: earlier or equal keys, within the window or among the sinks."""
        rule = masks.causal(align="top_left")
        if self.bounded:
            rule = rule & (masks.window(self.window - 1, causal=True, align="top_left") | _before(self.sinks))
        return rule

    def mask(self, query_positions: torch.Tensor, key_positions: torch.Tensor, key_valid: torch.Tensor):
        """The mask of what each new query sees: :meth:`rule` at the queries' and the held keys'
        positions (the keys in ring-buffer order), and no padding; None when that is every key."""
        if (query_positions.shape[0] == 1 and not self.padded
                and (self.window is None or key_positions.shape[0] <= self.sinks + self.window)):
            return None  # one query at the end, nothing pushed out: every held key is visible
        out = Positioned(self.rule(), query_positions, key_positions)
        return out & masks.valid_keys(key_valid) if self.padded else out

    def cache_positions(self, key_positions: torch.Tensor, query_position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """StreamingLLM's positions (``positions="cache"``, one query): the keys' and the
        query's places in the cache, sinks first, then the window in stream order."""
        assert self.window is not None  # positions="cache" comes with a window
        start = max(self.sinks, query_position - self.window + 1)  # the oldest window token the query sees
        def rank(p):
            return torch.where(p < self.sinks, p, self.sinks + (p - start))
        return rank(key_positions), rank(torch.tensor([query_position], device=key_positions.device))


class ForgetKVCache(KVCache):
    """A forgetting attention layer's cache (FoX, :class:`attnlab.efficient.ForgettingAttention`):
    every token's key and value, and beside each its cumulative log forget gate ``c`` ``(B, H, S)``.

    FoX adds ``c_i - c_j`` to the score of query ``i`` and key ``j``, ``c_t = sum_{l <= t} log f_l``;
    new tokens continue the sum from :attr:`total`, so each query scores the held keys as the whole
    sequence would (padding's ``log f`` is 0). Unbounded; the FoX mixer writes it (:meth:`write`).
    """

    c: torch.Tensor | None

    def __init__(self):
        super().__init__()
        self.c = None

    @property
    def total(self) -> torch.Tensor | None:
        """``(B, H)`` the running total ``c_{seen - 1} = sum_{l < seen} log f_l``, or None before the first token."""
        return None if self.c is None or not self.size else self.c[..., self.size - 1]

    def nbytes(self) -> int:
        return super().nbytes() + (0 if self.c is None else self.c.numel() * self.c.element_size())

    def reset(self) -> None:
        super().reset()
        self.c = None

    def reorder(self, index: torch.Tensor) -> None:
        super().reorder(index)
        if self.c is not None:
            self.c = self.c[index]

    def write(self, k: torch.Tensor, v: torch.Tensor, log_f: torch.Tensor, valid: torch.Tensor | None = None):
        """Write ``n`` new tokens and return what they attend to with the gates of both sides.

        Args:
            k, v: the new keys (rotated at their positions) and values ``(B, G, n, D)``.
            log_f: ``(B, H, n)`` their log forget gates (0 at padding).
            valid: ``(B, n)`` bool, False for padding tokens, or None.

        Returns:
            ``(keys, values, key_valid, key_positions, c)`` as :meth:`KVCache.update`, and ``c``
            ``(B, H, S)`` the held keys' cumulative gates; the new queries' are its last ``n``.
        """
        b, h, n = log_f.shape
        if log_f.shape[0] != k.shape[0] or log_f.shape[2] != k.shape[2]:
            raise ValueError(f"the gates (B, H, n) = {tuple(log_f.shape)} do not match the new keys {tuple(k.shape)}")
        if self.c is not None and self.c.shape[:2] != (b, h):
            raise ValueError(f"the cache holds gates of shape (B, H, .) = {tuple(self.c.shape)}, got new gates "
                             f"{tuple(log_f.shape)}")
        total = self.total
        c = log_f.cumsum(-1) if total is None else total[..., None].to(log_f.dtype) + log_f.cumsum(-1)  # (B, H, n)
        held = self.size
        keys, values, key_valid, kpos = self.update(k, v, valid)
        if self.c is None or self.c.shape[-1] < self.capacity:  # grown with the keys' buffer
            grown = log_f.new_zeros(b, h, self.capacity)
            if self.c is not None:
                grown[..., :held] = self.c[..., :held]
            self.c = grown
        self.c[..., held : self.size] = c
        return keys, values, key_valid, kpos, self.c[..., : self.size]


def _before(count: int):
    """Keys at positions ``< count`` (the sinks)."""
    from ..core.masks import SharedPrefix

    return SharedPrefix(count)


class StaticKV:
    """Cross-attention's keys and values, computed from the encoder's output on the first call
    and reused afterwards (the encoder's keys do not change while the decoder runs).

    Attributes:
        k, v: ``(B, G, M, D)`` once filled, else None.
    """

    def __init__(self):
        self.k = self.v = None

    def nbytes(self) -> int:
        """Bytes held."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v) if t is not None)

    def reset(self) -> None:
        """Forget the keys (for a new source)."""
        self.k = self.v = None

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index``."""
        if self.k is not None:
            self.k, self.v = self.k[index], self.v[index]
