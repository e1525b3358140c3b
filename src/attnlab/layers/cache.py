"""Caches for decoding a few tokens at a time: what one attention layer keeps of the tokens
it has seen, so that the next token costs one row of attention instead of the whole prefix.

* :class:`KVCache` — the keys and values of a self-attention layer. Unbounded, it grows
  (amortised, by doubling) and decoding with it equals recomputing the prefix. Bounded
  (``window=``), it keeps the first ``sinks`` tokens and the last ``window`` tokens in a ring
  buffer of constant size: with ``positions="absolute"`` that is exactly causal local
  attention (``local``: window ``w + 1``; ``longformer``: its global tokens as sinks); with
  ``positions="cache"`` it is StreamingLLM's cache (Xiao et al. 2023,
  https://arxiv.org/abs/2309.17453), whose rotation and bias encodings use a token's place in
  the cache instead of its place in the text, so that a stream may run past the longest
  position the model was trained on.
* :class:`StaticKV` — the keys and values of cross-attention, computed once from the encoder's
  output and reused at every step.
* :class:`RecurrentState` — the running sums of causal kernel attention (``linear``,
  ``performer``): "Transformers are RNNs" (Katharopoulos et al. 2020), a cache of constant size.

A cache is created by the layer that uses it (:meth:`attnlab.MultiHeadAttention.new_cache`) and
passed back to it: ``layer(x_new, cache=cache)``. Caches are for inference: they are written
in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..validate import int_at_least, positive_int

__all__ = ["KVCache", "RecurrentState", "StaticKV"]


class KVCache:
    """The keys and values one self-attention layer has seen, with their positions and padding.

    Args:
        window: keep only the last ``window`` tokens (the current one included) besides the
            sinks; None (default) keeps every token.
        sinks: with a window, also keep the first ``sinks`` tokens for ever (attention sinks).
        positions: ``"absolute"`` (default): a token's position is its index in the stream;
            ``"cache"`` (with a window): its index among the tokens the cache holds, sinks
            first (StreamingLLM), for rotation and bias encodings.

    Attributes:
        seen: tokens written so far (the absolute position of the next one).
        size: tokens held now (``seen``, or at most ``sinks + window``).
    """

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
            self.k, self.v, self.valid = self.k[index], self.v[index], self.valid[index]

    def _allocate(self, k: torch.Tensor, v: torch.Tensor, slots: int) -> None:
        b, g, _, d = k.shape
        new_k = k.new_zeros(b, g, slots, d)
        new_v = v.new_zeros(b, g, slots, v.shape[-1])
        new_valid = torch.zeros(b, slots, dtype=torch.bool, device=k.device)
        new_pos = torch.zeros(slots, dtype=torch.long, device=k.device)
        if self.k is not None:
            s = self.size
            new_k[:, :, :s], new_v[:, :, :s], new_valid[:, :s], new_pos[:s] = (
                self.k[:, :, :s], self.v[:, :, :s], self.valid[:, :s], self.slot_pos[:s])
        self.k, self.v, self.valid, self.slot_pos = new_k, new_v, new_valid, new_pos

    def _slots(self, pos: torch.Tensor) -> torch.Tensor:
        """The ring-buffer slot of absolute positions ``pos`` (bounded caches)."""
        s = self.sinks
        return torch.where(pos < s, pos, s + (pos - s) % self.window)

    def update(self, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None = None):
        """Write ``n`` new tokens' keys and values ``(B, G, n, D)`` and return what they attend to.

        Args:
            k, v: the new keys (after any rotation when positions are absolute) and values.
            valid: ``(B, n)`` bool, False for padding tokens (never attended to), or None.

        Returns:
            ``(keys, values, key_valid, key_positions)``: ``(B, G, S, D)``, ``(B, G, S, Dv)``,
            ``(B, S)`` bool and the keys' absolute positions ``(S,)``. For a bounded cache and
            ``n > 1`` they include the tokens the new ones push out (the caller's mask, from
            :meth:`mask`, hides what each query may not see).
        """
        b, _, n, _ = k.shape
        if self.k is not None and (self.k.shape[:2] != k.shape[:2] or self.k.shape[-1] != k.shape[-1]):
            raise ValueError(f"the cache holds keys of shape (B, G, ., D) = {tuple(self.k.shape)}, got new keys {tuple(k.shape)}")
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
            sl = slice(self.size, need)
            self.k[:, :, sl], self.v[:, :, sl], self.valid[:, sl], self.slot_pos[sl] = k, v, valid, new_pos
            self.size, self.seen = need, self.seen + n
            return self.k[:, :, :need], self.v[:, :, :need], self.valid[:, :need], self.slot_pos[:need]
        if self.k is None:
            self._allocate(k, v, self.sinks + self.window)
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
        slots = self._slots(pos)
        self.k.index_copy_(2, slots, k.to(self.k.dtype))
        self.v.index_copy_(2, slots, v.to(self.v.dtype))
        self.valid.index_copy_(1, slots, valid)
        self.slot_pos.index_copy_(0, slots, pos)
        self.seen = int(pos[-1]) + 1 if pos.numel() else self.seen
        self.size = min(self.seen, self.sinks + self.window)

    def mask(self, query_positions: torch.Tensor, key_positions: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor | None:
        """The bool mask of what each new query sees: earlier or equal keys, within the window or
        among the sinks, not padding: ``(B, 1, n, S)``, or ``(1, 1, n, S)`` when no held token is
        padding; None when that is every key."""
        qp, kp = query_positions[:, None], key_positions[None, :]
        if qp.shape[0] == 1 and not self.padded and (not self.bounded or kp.shape[1] <= self.sinks + self.window):
            return None  # one query at the end, nothing pushed out: every held key is visible
        allowed = kp <= qp
        if self.bounded:
            allowed = allowed & ((qp - kp < self.window) | (kp < self.sinks))
        if not self.padded:  # one (N, S) mask for the batch (the square causal one runs on the fused kernel's causal path)
            return allowed[None, None]
        return allowed[None, None] & key_valid[:, None, None, :]

    def cache_positions(self, key_positions: torch.Tensor, query_position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """StreamingLLM's positions (``positions="cache"``, one query): the keys' and the
        query's places in the cache, sinks first, then the window in stream order."""
        start = max(self.sinks, query_position - self.window + 1)  # the oldest window token the query sees
        def rank(p):
            return torch.where(p < self.sinks, p, self.sinks + (p - start))
        return rank(key_positions), rank(torch.tensor([query_position], device=key_positions.device))


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


@dataclass
class RecurrentState:
    """Causal kernel attention's running sums after ``seen`` tokens: ``s`` ``(B, H, F, Dv)``
    ``= sum_j phi(k_j) v_j^T``, ``z`` ``(B, H, F)`` ``= sum_j phi(k_j)``, and for exponential
    feature maps (Performer) ``shift`` ``(B, H, 1, 1)``, the running maximum of the keys'
    feature logits that both sums are scaled by (it cancels in the ratio).
    """

    s: torch.Tensor | None = None
    z: torch.Tensor | None = None
    shift: torch.Tensor | None = None
    seen: int = 0

    def nbytes(self) -> int:
        """Bytes held."""
        return sum(t.numel() * t.element_size() for t in (self.s, self.z, self.shift) if t is not None)

    def reset(self) -> None:
        """Forget every token."""
        self.s = self.z = self.shift = None
        self.seen = 0
