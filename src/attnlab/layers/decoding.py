"""How a :class:`attnlab.MultiHeadAttention` reads and writes the cache it is given: the caches
are data (:mod:`attnlab.layers.cache`, :mod:`attnlab.layers.state`: tensors and the few
operations on them), and the layer, through :func:`begin` and :func:`attend`, decides what a call
attends with.

* no cache: the call's own keys (``key``, ``value``, or the query for self-attention), positions
  given, or the mask's (packed documents restart them, a shard holds its own), or the layer's;
* a :class:`~attnlab.layers.cache.KVCache`: the new tokens after the held ones, their keys and
  values written, what each new query sees a mask over the held keys' positions (StreamingLLM's
  cache positions: one query at a time);
* a :class:`~attnlab.layers.cache.StaticKV`: cross-attention's keys, projected on the first call;
* a state of constant size (:class:`~attnlab.layers.state.RecurrentState`): handed to the step as
  its call's ``state``, which the step updates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core import spanning
from ..core.attend import AttentionResult
from ..core.masks import positions_of, valid_key_flags
from ..validate import ArgumentTypeError
from .cache import KVCache, StaticKV
from .padding import silence_padding
from .state import ConstantSizeState
from .step import StepCall

__all__ = ["LayerInputs", "attend", "begin", "new_tokens", "refuse_given", "seen_positions"]


@dataclass
class LayerInputs:
    """What one forward call attends with, once the cache is read: the inputs (padding rows
    silenced), the query and key positions, the mask, the key padding of new tokens (caches),
    whether rotation happens at projection, and keys already projected (a filled cross-attention
    cache)."""

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
    return valid_key_flags(mask, b, n, query.device, refuse=refuse)


def begin(layer, cache, query, key, value, *, mask, positions, key_positions, bias, return_weights) -> LayerInputs:
    """What ``layer``'s call attends with, given ``cache`` (None: the call's own keys); the cache's kind is checked."""
    if cache is None:
        return _own_keys(layer, query, key, value, mask=mask, positions=positions, key_positions=key_positions,
                         bias=bias, return_weights=return_weights)
    if isinstance(cache, StaticKV):
        return _cross(layer, cache, query, key, value, mask=mask, given=(positions, key_positions, bias))
    if not isinstance(cache, (KVCache, ConstantSizeState)):
        raise ArgumentTypeError(f"cache must come from new_cache() or new_cross_cache(), got {type(cache).__name__}")
    constant = isinstance(cache, ConstantSizeState)
    valid = new_tokens(layer, query, key, value, mask, positions, key_positions, bias, refuse=(
        "with a cache, mask is the new tokens' key padding (" + ("causal order is the state's)" if constant else
                                                                 "causal order and the cache's window are applied "
                                                                 "by the cache)")))
    layer.check_cache(cache)
    if constant and return_weights:
        raise ValueError(f"{type(layer).__name__} decodes with a state of constant size: it has no attention weights "
                         "to return")
    streaming = isinstance(cache, KVCache) and cache.positions == "cache"
    if streaming and query.shape[1] > 1 and return_weights:
        raise ValueError("a cache with positions='cache' returns weights one token at a time: feed one token per call")
    pos = seen_positions(cache.seen, query.shape[1], query.device)
    # absolute positions: the new keys are rotated once, as they enter; cache positions: at each step
    return LayerInputs(query, None, None, pos, pos, None, valid, rotate=not streaming)


def _own_keys(layer, query, key, value, *, mask, positions, key_positions, bias, return_weights) -> LayerInputs:
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
    return LayerInputs(query, key, value, qpos, kpos, mask)


def _cross(layer, cache: StaticKV, query, key, value, *, mask, given) -> LayerInputs:
    refuse_given(*given)
    if layer.positional is not None:
        raise ValueError("a cross-attention cache needs a layer without a positional encoding (positions belong to "
                         "the decoder)")
    layer.check_input("query", query, layer.embed_dim, None)
    if cache.k is None:
        if key is None:
            raise ValueError("the first call with an empty cross-attention cache needs the key (the encoder's output)")
        value = key if value is None else value
        cache.k, cache.v = layer.key_heads(key, value, query.shape[0])
    if query.shape[0] != cache.k.shape[0]:
        raise ValueError(f"the cross-attention cache holds keys of {cache.k.shape[0]} row(s), the query has "
                         f"{query.shape[0]} (reorder() the cache to follow the rows)")
    return LayerInputs(query, None, None, None, None, mask, kv=(cache.k, cache.v))


def attend(layer, cache, q, k, v, inputs: LayerInputs, score_mod, *, bias, return_weights) -> AttentionResult:
    """``layer``'s step on the heads of a call :func:`begin` prepared, the cache read and written."""
    if cache is None:
        return layer.step(q, k, v, StepCall(inputs.mask, bias, score_mod, return_weights))
    if isinstance(cache, StaticKV):  # held keys: nothing to write
        return layer.step(q, k, v, StepCall(mask=inputs.mask, return_weights=return_weights))
    if isinstance(cache, ConstantSizeState):  # the step updates the state; the layer counts the tokens
        seen = cache.seen
        mask = None if inputs.valid is None else inputs.valid[:, None, None, :]
        res = layer.step(q, k, v, StepCall(mask=mask, state=cache))
        cache.seen = seen + q.shape[2]
        return res
    if cache.positions == "cache":  # StreamingLLM: each query ranks the held keys from its own window
        outs = [_streaming(layer, cache, (q[:, :, i : i + 1], k[:, :, i : i + 1], v[:, :, i : i + 1]),
                           None if inputs.valid is None else inputs.valid[:, i : i + 1], return_weights)
                for i in range(q.shape[2])]
        return AttentionResult(torch.cat([o.output for o in outs], 2), outs[0].weights if len(outs) == 1 else None)
    keys, values, key_valid, kpos = cache.update(k, v, inputs.valid)
    assert inputs.qpos is not None  # begin() gives the new tokens' positions
    mod = layer.score_mod(inputs.qpos, kpos)
    return layer.step(q, keys, values, StepCall(state=cache, mask=cache.mask(inputs.qpos, kpos, key_valid),
                                                          score_mod=mod, return_weights=return_weights))


def _streaming(layer, cache: KVCache, heads, valid, return_weights) -> AttentionResult:
    q, k, v = heads
    qpos = cache.seen
    keys, values, key_valid, kpos = cache.update(k, v, valid)
    bk, bq = cache.cache_positions(kpos, qpos)
    pe = layer.positional
    if pe is not None and pe.kind == "rotation":
        q, keys = pe.rotate(q, keys, bq, bk)
    mod = layer.score_mod(bq, bk)
    qp = torch.tensor([qpos], device=q.device)
    return layer.step(q, keys, values, StepCall(state=cache, mask=cache.mask(qp, kpos, key_valid),
                                                          score_mod=mod, return_weights=return_weights))
