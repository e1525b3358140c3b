"""Mamba-2's SSD (the mixers of Mamba-2 and Falcon-H1) on attnlab's gated recurrence, as gated linear attention
(served by :func:`attnlab.integrations.hybrid.use_kernels`): mamba-ssm's chunked scan and its one-token state update."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..efficient import recurrence
from .adapters import packed_offsets, refuse_packed_state, refuse_unserved, widened

__all__ = ["ssd_scan", "ssd_step"]


def _ssd_inputs(hidden_states, dt, a, b, c, *, dt_bias, dt_softplus, dt_limit):
    """SSD as gated linear attention: the query ``C``, key ``B`` (a group shared by H / G heads),
    value ``dt x`` and log decay ``dt A``, ``(B, H, T, ...)`` in float32."""
    heads = hidden_states.shape[2]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = widened(torch.clamp(dt, min=dt_limit[0], max=dt_limit[1]), hidden_states)  # (B, T, H)
    x = widened(hidden_states, hidden_states)
    q, k = (widened(t, hidden_states).repeat_interleave(heads // t.shape[2], dim=2).transpose(1, 2).contiguous()
            for t in (c, b))
    v = (x * dt[..., None]).transpose(1, 2).contiguous()
    return x, q, k, v, (widened(a, hidden_states)[:, None] * dt.transpose(1, 2)).contiguous()


def ssd_scan(hidden_states, dt, A, B, C, chunk_size=256, D=None, dt_bias=None, initial_states=None, dt_softplus=False,
             dt_limit=(0.0, float("inf")), return_final_states=False, z=None, seq_idx=None, cu_seqlens=None,
             cu_seq_lens_q=None, **kwargs):
    """Mamba-2's chunked scan (mamba-ssm's ``mamba_chunk_scan_combined`` arguments): ``x``
    ``(B, T, H, P)``, ``B``/``C`` ``(B, T, G, N)`` with G groups and state width N, the state
    ``(B, H, P, N)``; served by :func:`~attnlab.efficient.recurrence.chunk_gated`."""
    refuse_unserved("mamba_chunk_scan_combined", kwargs)
    x, q, k, v, g = _ssd_inputs(hidden_states, dt, A, B, C, dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit)
    cu = packed_offsets(cu_seqlens, cu_seq_lens_q, seq_idx)
    refuse_packed_state("mamba_chunk_scan_combined", cu, initial_states, return_final_states)
    state = None if initial_states is None else widened(initial_states, hidden_states).transpose(-1, -2)
    o, s = recurrence.chunk_gated(q, k, v, g, state=state, cu_seqlens=cu)
    y = o.transpose(1, 2).contiguous()  # the mixers view it
    if D is not None:
        y = y + widened(D, hidden_states)[:, None] * x
    if z is not None:  # mamba-ssm's gate
        y = y * F.silu(widened(z, hidden_states))
    return (y, s.transpose(-1, -2)) if return_final_states else y


def ssd_step(state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, z=None, **kwargs):
    """One decoding step of Mamba-2 (mamba-ssm's ``selective_state_update``): ``x`` ``(B, H, P)``, ``dt``, ``dt_bias``
    and ``D`` repeated over P and ``A`` over ``(P, N)`` as the mixers give them, ``B``/``C`` ``(B, G, N)``; ``state``
    ``(B, H, P, N)`` updated in place; served by :func:`~attnlab.efficient.recurrence.gated_token`."""
    refuse_unserved("selective_state_update", kwargs)
    x, heads = widened(hidden_states, hidden_states), hidden_states.shape[1]
    dt = dt[..., 0] + (0 if dt_bias is None else dt_bias[:, 0].to(dt.dtype))
    dt = widened(F.softplus(dt) if dt_softplus else dt, hidden_states)  # (B, H)
    q, k = (widened(t, hidden_states).repeat_interleave(heads // t.shape[1], dim=1) for t in (C, B))
    a = widened(A[:, 0, 0], hidden_states)
    o, s = recurrence.gated_token(q, k, x * dt[..., None], a * dt, widened(state, hidden_states).transpose(-1, -2))
    state.copy_(s.transpose(-1, -2).to(state.dtype))
    out = o + (0 if D is None else x * widened(D, hidden_states))
    if z is not None:
        out = out * F.silu(widened(z, hidden_states))
    return out.to(hidden_states.dtype)
