"""transformers' modeling functions with attnlab's recurrences behind them (served by
:func:`attnlab.integrations.hybrid.use_kernels`): the gated delta rule (Gated DeltaNet, Kimi Delta Attention) and the
short causal convolution, and what every served function shares (:mod:`attnlab.integrations.ssd`'s too): the arguments
it refuses, its precision and the packed documents' offsets."""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..efficient import recurrence

__all__ = ["UnservedArgument", "causal_conv", "delta_rule", "packed_offsets", "refuse_packed_state", "refuse_unserved",
           "widened"]

# transformers' per-call keyword arguments that change nothing in a recurrence (the packing ones are read)
_HARMLESS = {"num_items_in_batch", "output_hidden_states", "output_attentions", "output_router_logits", "cu_seq_lens_k",
             "max_length_q", "max_length_k", "position_ids", "is_causal", "chunk_size", "use_cache", "return_dict",
             "cache_position"}


class UnservedArgument(ValueError):
    """A hybrid layer asked a served function for something attnlab does not compute."""


def refuse_unserved(fn: str, kwargs: dict) -> None:
    """:class:`UnservedArgument` naming every keyword argument of a call of the served ``fn`` that is set and changes
    what a recurrence computes (transformers' per-call arguments that change nothing pass)."""
    extra = sorted(k for k, v in kwargs.items() if v is not None and k not in _HARMLESS)
    if extra:
        raise UnservedArgument(f"attnlab's {fn} cannot serve {', '.join(extra)}: call use_kernels(model).restore() "
                               "to use transformers' own path")


def widened(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` in float32, as transformers' paths compute whatever the model's dtype, or in float64
    when ``like`` (the layer's input) is: a float64 model is a reference."""
    return t.to(torch.float64 if like.dtype == torch.float64 else torch.float32)


def packed_offsets(cu_seqlens, cu_seq_lens_q, seq_idx) -> torch.Tensor | None:
    """Packed documents' offsets from any of the three spellings (``seq_idx``: Mamba's document
    index per position, ``(1, N)``)."""
    cu = cu_seqlens if cu_seqlens is not None else cu_seq_lens_q
    if cu is None and seq_idx is not None:
        idx = seq_idx.reshape(-1)
        starts = torch.nonzero(idx[1:] != idx[:-1]).flatten() + 1
        cu = torch.cat([starts.new_zeros(1), starts, starts.new_full((1,), idx.numel())])
    return None if cu is None else cu.long()


def refuse_packed_state(fn: str, cu, initial_state, output_final_state) -> None:
    """:class:`UnservedArgument` when the served ``fn`` gets packed offsets ``cu`` and a state to start from or to
    return: packed documents are kept apart without a cache only."""
    if cu is not None and (initial_state is not None or output_final_state):
        raise UnservedArgument(f"attnlab's {fn} keeps packed documents apart without a cache, as transformers packs "
                               "its attention layers only then: call the model with use_cache=False")


def delta_rule(l2norm: Callable, name: str = "delta_rule") -> Callable:
    """The gated delta rule (per head: Gated DeltaNet; per channel: KDA) with fla's and transformers' arguments,
    ``(B, T, H, D)`` tensors, served by attnlab's chunkwise form (or one step of the recurrent one,
    :func:`~attnlab.efficient.recurrence.delta_token`, for a token decoded from a state); ``l2norm`` is the modeling
    module's own, so that the normalisation rounds as transformers' does. Value heads may outnumber key heads (Qwen's
    grouped values)."""

    def run(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
            use_qk_l2norm_in_kernel=False, cu_seqlens=None, scale=None, cu_seq_lens_q=None, **kwargs):
        refuse_unserved(name, kwargs)
        dtype, n = query.dtype, query.shape[1]
        cu = packed_offsets(cu_seqlens, cu_seq_lens_q, None)
        refuse_packed_state(name, cu, initial_state, output_final_state)
        state = None if initial_state is None else widened(initial_state, query)
        step = n == 1 and cu is None and state is not None  # decoding: one step, on (B, H, D) views
        q, k, v, b, gd = (widened(t[:, 0] if step else t.transpose(1, 2), query).contiguous()
                          for t in (query, key, value, beta, g))
        if use_qk_l2norm_in_kernel:
            q, k = l2norm(q, dim=-1, eps=1e-6), l2norm(k, dim=-1, eps=1e-6)
        if v.shape[1] != k.shape[1]:  # each key head serves H_v / H_k consecutive value heads
            q, k = (t.repeat_interleave(v.shape[1] // k.shape[1], dim=1) for t in (q, k))
        q = q * (q.shape[-1] ** -0.5 if scale is None else scale)
        if step:
            o, s = recurrence.delta_token(q, k, v, b, gd, state)
            return o[:, None].to(dtype), (s if output_final_state else None)
        o, s = recurrence.chunk_delta(q, k, v, b, gd, state=state, cu_seqlens=cu)
        return o.transpose(1, 2).to(dtype), (s if output_final_state else None)

    run.__name__ = run.__qualname__ = name
    return run


def causal_conv(hidden_states, weight, bias=None, activation=None, cu_seq_lens_q=None, seq_idx=None, **kwargs):
    """The depthwise causal convolution of the hybrid layers, ``(B, C, T)``, weight ``(C, K)``;
    with packed documents no position sees an earlier document's."""
    from transformers.activations import ACT2FN

    refuse_unserved("causal_conv1d_fn", kwargs)
    x = hidden_states.to(weight.dtype)
    out = recurrence.causal_conv(x, weight, bias, cu_seqlens=packed_offsets(None, cu_seq_lens_q, seq_idx))
    if activation is not None:
        out = ACT2FN[activation](out)
    return out.to(hidden_states.dtype)
