"""Where a layer's keys come from: the keys of the call itself, or a cache for decoding a few
tokens at a time (so that the next token costs one row of attention instead of the whole prefix).

:meth:`attnlab.MultiHeadAttention.forward` runs one path whatever it is given: ``begin`` (what
the call attends with: its inputs, the positions of queries and keys, the mask), the layer's
projections, then ``attend``. The source is :data:`NO_CACHE` (the call's own keys) or a cache:

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

A decoding source hands the layer's step itself as its call's ``state`` (the step declares which it decodes with: its
``capabilities.cache``). A cache is created by the layer that uses it (:meth:`attnlab.MultiHeadAttention.new_cache`)
and passed back to it: ``layer(x_new, cache=cache)``. Caches are for inference: they are written in place.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core import masks, spanning
from ..core.attend import AttentionResult
from ..core.masks import key_padding_flags, positions_of
from ..core.positioned import Positioned
from ..validate import ArgumentTypeError, int_at_least, positive_int
from .padding import silence_padding
from .step import StepCall

__all__ = ["Call", "ForgetKVCache", "KVCache", "NO_CACHE", "NoCache", "StaticKV", "new_tokens", "refuse_given",
           "seen_positions"]


@dataclass
class Call:
    """What one forward call attends with: the inputs (padding rows silenced), the query and key
    positions, the mask, the key padding of new tokens (caches), whether rotation happens at
    projection, and keys already projected (a filled cross-attention cache)."""

    query: torch.Tensor
    key: torch.Tensor | None
    value: torch.Tensor | None
    qpos: torch.Tensor | None
    kpos: torch.Tensor | None
    mask: object = None
    valid: torch.Tensor | None = None
    rotate: bool = True
    kv: tuple | None = None


def seen_positions(seen: int, n: int, device) -> torch.Tensor:
    """The positions ``seen .. seen + n - 1`` of ``n`` new tokens after ``seen``."""
    return torch.arange(seen, seen + n, device=device)


def refuse_given(positions, key_positions, bias) -> None:
    """Refuse what a cache decides itself: the positions, and a score bias."""
    if positions is not None or key_positions is not None:
        raise ValueError("with a cache the positions come from it: pass neither positions nor key_positions")
    if bias is not None:
        raise ValueError("a score bias cannot be combined with a cache "
                         "(a bias encoding is applied by the layer itself)")


class NoCache:
    """The call's own keys (``key``, ``value``, or the query for self-attention): positions given,
    or the mask's (packed documents restart them, a shard holds its own), or the layer's defaults."""

    def begin(self, layer, query, key, value, *, mask, positions, key_positions, bias, return_weights) -> Call:
        n, m = query.shape[1], (query if key is None else key).shape[1]
        if mask is not None:  # padding silenced, the positions a mask gives
            if spanning.spans(mask) and (key is not None or value is not None or bias is not None or return_weights):
                raise ValueError("a sharded sequence (mask=ShardedMask) takes self-attention alone: no key, value, "
                                 "bias or return_weights (the mask knows every shard's positions)")
            query, key, value = silence_padding(query, key, value, mask)
            if positions is None and key_positions is None:
                positions = key_positions = positions_of(mask, n, query.device)
        qpos, kpos = None, None
        if layer.positional is not None or positions is not None or key_positions is not None:
            qpos, kpos = layer.positions(n, m, positions, key_positions, query.device)
        return Call(query, key, value, qpos, kpos, mask)

    def attend(self, layer, q, k, v, call: Call, score_mod, *, bias, return_weights) -> AttentionResult:
        return layer.attention_step(q, k, v, StepCall(call.mask, bias, score_mod, return_weights))


NO_CACHE = NoCache()
"""The source of a call without a cache."""


def new_tokens(layer, query, key, value, mask, positions, key_positions, bias, refuse: str):
    """Check a decoding call's new tokens (self-attention, no positions or bias given) and
    return their key padding ``(B, n)`` bool, or None; ``refuse``: the error for another mask."""
    refuse_given(positions, key_positions, bias)
    if key is not None or value is not None:
        raise ValueError("a self-attention cache takes the new tokens as query only "
                         "(key and value come from the cache)")
    layer.check_input("query", query, layer.embed_dim, None)
    if layer.kdim != layer.embed_dim or layer.vdim != layer.embed_dim:
        raise ValueError("cached self-attention needs kdim = vdim = embed_dim")
    b, n, _ = query.shape
    return key_padding_flags(mask, b, n, query.device, refuse=refuse)


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

    # ------------------------------------------------------------------ a forward call
    def begin(self, layer, query, key, value, *, mask, positions, key_positions, bias, return_weights) -> Call:
        valid = new_tokens(layer, query, key, value, mask, positions, key_positions, bias, refuse=(
            "with a cache, mask is the new tokens' key padding (causal order and the cache's window are applied by the "
            "cache)"))
        layer.check_cache(self)
        if self.positions == "cache" and query.shape[1] > 1 and return_weights:
            raise ValueError("a cache with positions='cache' returns weights one token at a time: feed one token per "
                             "call")
        pos = seen_positions(self.seen, query.shape[1], query.device)
        # absolute positions: the new keys are rotated once, as they enter; cache positions: at each step
        return Call(query, None, None, pos, pos, None, valid, rotate=self.positions == "absolute")

    def attend(self, layer, q, k, v, call: Call, score_mod, *, bias, return_weights) -> AttentionResult:
        if self.positions == "cache":  # StreamingLLM: each query ranks the held keys from its own window
            outs = [self._streaming(layer, q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1],
                                    None if call.valid is None else call.valid[:, i : i + 1], return_weights)
                    for i in range(q.shape[2])]
            return AttentionResult(torch.cat([o.output for o in outs], 2), outs[0].weights if len(outs) == 1 else None)
        keys, values, key_valid, kpos = self.update(k, v, call.valid)
        assert call.qpos is not None  # begin() gives the new tokens' positions
        mod = layer.score_mod(call.qpos, kpos)
        return layer.attention_step(q, keys, values, StepCall(state=self, mask=self.mask(call.qpos, kpos, key_valid),
                                                              score_mod=mod, return_weights=return_weights))

    def _streaming(self, layer, q, k, v, valid, return_weights) -> AttentionResult:
        qpos = self.seen
        keys, values, key_valid, kpos = self.update(k, v, valid)
        bk, bq = self.cache_positions(kpos, qpos)
        pe = layer.positional
        if pe is not None and pe.kind == "rotation":
            q, keys = pe.rotate(q, keys, bq, bk)
        mod = layer.score_mod(bq, bk)
        qp = torch.tensor([qpos], device=q.device)
        return layer.attention_step(q, keys, values, StepCall(state=self, mask=self.mask(qp, kpos, key_valid),
                                                              score_mod=mod, return_weights=return_weights))

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

    def begin(self, layer, query, key, value, *, mask, positions, key_positions, bias, return_weights) -> Call:
        refuse_given(positions, key_positions, bias)
        if layer.positional is not None:
            raise ValueError("a cross-attention cache needs a layer without a positional encoding (positions belong to "
                             "the decoder)")
        layer.check_input("query", query, layer.embed_dim, None)
        if self.k is None:
            if key is None:
                raise ValueError("the first call with an empty cross-attention cache needs the key (the encoder's "
                                 "output)")
            value = key if value is None else value
            self.k, self.v = layer.key_heads(key, value, query.shape[0])
        if query.shape[0] != self.k.shape[0]:
            raise ValueError(f"the cross-attention cache holds keys of {self.k.shape[0]} row(s), the query has "
                             f"{query.shape[0]} (reorder() the cache to follow the rows)")
        return Call(query, None, None, None, None, mask, kv=(self.k, self.v))

    def attend(self, layer, q, k, v, call: Call, score_mod, *, bias, return_weights) -> AttentionResult:
        # held keys: no state to write
        return layer.attention_step(q, k, v, StepCall(mask=call.mask, return_weights=return_weights))


def source_of(cache):
    """The source of a forward call: ``cache``, or :data:`NO_CACHE`."""
    if cache is None:
        return NO_CACHE
    if not callable(getattr(cache, "begin", None)) or not callable(getattr(cache, "attend", None)):
        raise ArgumentTypeError(f"cache must come from new_cache() or new_cross_cache(), got {type(cache).__name__}")
    return cache


__all__ += ["source_of"]
