"""MultiHeadAttention's interop with PyTorch's own layer and its weight conversions:
``torch.nn.MultiheadAttention`` both ways, and grouped-query conversion by mean-pooling (the methods of
:class:`attnlab.MultiHeadAttention` call these)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from ..core.normalize import resolve_normalizer, softmax
from ..core.scores import ScaledDot
from ..validate import ArgumentTypeError, positive_int

__all__ = ["grouped", "from_torch", "to_torch"]


def grouped(layer, num_kv_heads: int):
    """See :meth:`attnlab.MultiHeadAttention.grouped`."""
    g = positive_int("num_kv_heads", num_kv_heads)
    if layer.head_mode != "split" or layer.num_kv_heads != layer.num_heads:
        raise ValueError("grouped() converts a layer with head_mode='split' and one key / value head per query head")
    if layer.num_heads % g:
        raise ValueError(f"num_kv_heads must divide num_heads, got num_kv_heads={g} and num_heads={layer.num_heads}")
    if layer.capabilities.shared_qk and g != layer.num_heads:
        raise ValueError(f"{type(layer).__name__} derives its keys from the queries: it takes no num_kv_heads")
    new = copy.deepcopy(layer)
    new.clear_step_hooks()  # the copy is a new layer: hooks stay with the one they were registered on
    new.num_kv_heads = g
    r, d = layer.num_heads // g, layer.head_dim
    for name in ("k_proj", "v_proj"):
        old = getattr(layer, name)
        lin = nn.Linear(old.in_features, g * d, bias=old.bias is not None, device=old.weight.device,
                        dtype=old.weight.dtype)
        with torch.no_grad():
            lin.weight.copy_(old.weight.view(g, r, d, old.in_features).mean(1).reshape(g * d, old.in_features))
            if old.bias is not None:
                lin.bias.copy_(old.bias.view(g, r, d).mean(1).reshape(g * d))
        setattr(new, name, lin)
    return new


def from_torch(cls, m: nn.MultiheadAttention):
    """See :meth:`attnlab.MultiHeadAttention.from_torch`."""
    if not isinstance(m, nn.MultiheadAttention):
        raise ArgumentTypeError(f"from_torch expects a torch.nn.MultiheadAttention, got {type(m).__name__}")
    if m.bias_k is not None or m.add_zero_attn:
        raise ValueError("from_torch does not support add_bias_kv=True or add_zero_attn=True")
    has_bias = m.in_proj_bias is not None
    new = cls(m.embed_dim, m.num_heads, kdim=m.kdim, vdim=m.vdim, bias=has_bias, dropout=m.dropout)
    new = new.to(device=m.out_proj.weight.device, dtype=m.out_proj.weight.dtype)
    e = m.embed_dim
    with torch.no_grad():
        if m.in_proj_weight is not None:  # one packed projection (query, key and value of the same width)
            wq, wk, wv = m.in_proj_weight.split(e, dim=0)
        else:
            wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
        for lin, w in ((new.q_proj, wq), (new.k_proj, wk), (new.v_proj, wv)):
            lin.weight.copy_(w)
        new.out_proj.weight.copy_(m.out_proj.weight)
        if has_bias:
            for lin, b in zip((new.q_proj, new.k_proj, new.v_proj), m.in_proj_bias.split(e)):
                lin.bias.copy_(b)
            new.out_proj.bias.copy_(m.out_proj.bias)
    return new


def to_torch(layer) -> nn.MultiheadAttention:
    """See :meth:`attnlab.MultiHeadAttention.to_torch`."""
    same_math = type(layer.step.score) is ScaledDot and resolve_normalizer(layer.step.normalize) is softmax
    if layer.num_kv_heads != layer.num_heads:
        raise ValueError("to_torch needs one key / value head per query head (torch.nn.MultiheadAttention has no "
                         "grouped heads)")
    if layer.step.causal:
        raise ValueError("to_torch: the layer is causal (causal=True), which a torch.nn.MultiheadAttention does not "
                         "hold: give the torch layer is_causal=True with a causal attn_mask at each call")
    if layer.head_mode != "split" or not same_math or layer.positional is not None:
        raise ValueError(
            "to_torch needs head_mode='split', score='scaled_dot', normalize='softmax' and no positional "
            f"encoding, got head_mode={layer.head_mode!r}, score={layer.step.score_name!r}, "
            f"normalize={layer.step.normalize!r}, "
            f"positional={None if layer.positional is None else layer.positional.name!r}"
        )
    has_bias = layer.q_proj.bias is not None
    ref = layer.out_proj.weight
    m = nn.MultiheadAttention(
        layer.embed_dim,
        layer.num_heads,
        dropout=layer.step.dropout,
        bias=has_bias,
        kdim=layer.kdim,
        vdim=layer.vdim,
        batch_first=True,
        device=ref.device,
        dtype=ref.dtype,
    )
    with torch.no_grad():
        ws = (layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight)
        if m.in_proj_weight is not None:  # one packed projection (query, key and value of the same width)
            m.in_proj_weight.copy_(torch.cat(ws, dim=0))
        else:
            for dst, w in zip((m.q_proj_weight, m.k_proj_weight, m.v_proj_weight), ws):
                dst.copy_(w)
        m.out_proj.weight.copy_(layer.out_proj.weight)
        if has_bias:
            m.in_proj_bias.copy_(torch.cat([layer.q_proj.bias, layer.k_proj.bias, layer.v_proj.bias]))
            m.out_proj.bias.copy_(layer.out_proj.bias)
    return m
