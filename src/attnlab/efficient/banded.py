"""Banded (sliding-window) softmax attention on PyTorch's fused CPU flash kernel, without copying windows.

The sequence is cut into query blocks of ``blk`` positions. Query block ``t`` can only reach
the keys of blocks ``t - r .. t + r`` (``r = ceil(w / blk)``; ``t - r .. t`` when causal), a
contiguous run of ``R x blk`` keys. Those runs overlap, so rather than gathering them (R copies
of K and V), every block's keys are a *strided view* of the keys themselves: one ``as_strided``
tensor ``(blocks, heads, R x blk, D)`` whose block stride is ``blk`` rows. The fused flash
kernel (``aten::_scaled_dot_product_flash_attention_for_cpu``, the kernel behind
``F.scaled_dot_product_attention`` on CPU) reads q, k, v through their strides, so one call
computes every interior block with a single ``(blk, R x blk)`` band mask shared by all of them,
parallel over blocks and heads, in cache-sized tiles, keeping only the output and the row
log-sum-exp. Blocks at the two ends (whose windows reach past the sequence; their keys are
zero-padded copies of a few blocks) and, with key padding, every block run the same kernel with
their own masks, a few blocks at a time.

The backward pass is the kernel's own backward on the same views; the per-window key and value
gradients are folded back onto the sequence (R shifted adds), a few blocks at a time, so
training holds O(N x D) beyond the inputs, never an N x N tensor (nor an N x w one).

:func:`banded_flash_attention` returns ``None`` where this path does not apply (not a CPU tensor,
or a PyTorch without the kernel); :func:`attnlab.efficient.local.banded_attention` then falls
back to the gathered block-sparse engine (:mod:`attnlab.efficient.sparse`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["banded_flash_attention", "default_block"]

_FWD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_BWD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
_GROUP_ELEMENTS = 1 << 20  # per group of blocks: its mask, or its key-gradient windows, ~ 4 MiB in fp32


def default_block(window: int) -> int:
    """The query block of the flash path: 32 for w >= 128 (a block then wastes at most 31 keys
    on each side of its band), otherwise w/4 rounded up to a power of two, at least 8."""
    if window >= 128:
        return 32
    b = 8
    while b * 4 < window:
        b *= 2
    return b


class _Layout:
    """Block geometry: ``nb`` query blocks of ``blk``; windows of ``R`` blocks starting at block
    ``t`` of the keys padded with ``r`` blocks in front (and enough behind)."""

    def __init__(self, n: int, window: int, blk: int, causal: bool):
        self.n, self.window, self.blk, self.causal = n, window, blk, causal
        self.nb = -(-n // blk)
        self.r = -(-window // blk)
        self.R = self.r + 1 if causal else 2 * self.r + 1
        # interior blocks: every key of their window exists (no padding, no end)
        self.lo = self.r
        self.hi = max(self.lo, (n // blk) - (self.R - 1 - self.r))

    def offsets(self, device) -> torch.Tensor:
        """``(blk, R blk)``: key position minus query position inside a window."""
        qi = torch.arange(self.blk, device=device)[:, None]
        kj = torch.arange(self.R * self.blk, device=device)[None, :] - self.r * self.blk
        return kj - qi

    def band(self, device) -> torch.Tensor:
        off = self.offsets(device)
        return ((off <= 0) & (off >= -self.window)) if self.causal else (off.abs() <= self.window)


def _span(x: torch.Tensor, a: int, length: int) -> torch.Tensor:
    """Rows ``a .. a + length - 1`` of ``x`` ``(BH, N, D)``, zeros where they fall outside; a view
    (no copy) when they all exist."""
    n = x.shape[1]
    lo, hi = min(max(a, 0), n), max(min(a + length, n), 0)
    if lo == a and hi == a + length:
        return x[:, a : a + length]
    part = x[:, lo:hi] if hi > lo else x[:, :0]
    return F.pad(part, (0, 0, lo - a if hi > lo else length, a + length - hi if hi > lo else 0))


def _windows(x: torch.Tensor, g: int, stride_blocks: int, rows: int) -> torch.Tensor:
    """``(g, BH, rows, D)`` view of ``x`` ``(BH, L, D)``: window i starts at row ``i x stride_blocks``
    (overlapping when rows > stride); read by the kernel through its strides, never copied."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    s_h, s_n = x.stride(0), x.stride(1)
    return x.as_strided((g, x.shape[0], rows, x.shape[2]), (stride_blocks * s_n, s_h, s_n, 1), x.storage_offset())


def _run_inputs(q, k, v, lay: _Layout, t0: int, t1: int):
    """Query blocks t0..t1-1 and their key/value windows, as kernel views."""
    blk, g = lay.blk, t1 - t0
    qs = _span(q, t0 * blk, g * blk)
    a, length = (t0 - lay.r) * blk, (g + lay.R - 1) * blk
    ks, vs = _span(k, a, length), _span(v, a, length)
    return _windows(qs, g, blk, blk), _windows(ks, g, blk, lay.R * blk), _windows(vs, g, blk, lay.R * blk)


def _groups(lay: _Layout, bh: int, padded: bool) -> list[tuple[int, int, bool]]:
    """``(t0, t1, shared_mask)`` runs of blocks: the interior in one run with the shared band
    (unless keys are padded), the rest in groups whose masks stay small."""
    per = max(1, _GROUP_ELEMENTS // (bh * lay.blk * lay.R * lay.blk))
    runs: list[tuple[int, int, bool]] = []

    def split(a, b):
        for s in range(a, b, per):
            runs.append((s, min(b, s + per), False))

    if padded:
        split(0, lay.nb)
    else:
        split(0, min(lay.lo, lay.nb))
        if lay.hi > lay.lo:
            runs.append((lay.lo, lay.hi, True))
        split(max(lay.lo, lay.hi), lay.nb)
    return runs


def _group_mask(lay: _Layout, band: torch.Tensor, key_ok: torch.Tensor | None, t0: int, t1: int, dtype):
    """Float mask ``(g, BH or 1, blk, R blk)`` for blocks t0..t1-1 and the query rows without
    any key (``(g, BH or 1, blk)`` bool), whose mask is opened so the kernel sees no empty row."""
    dev = band.device
    blk, rb = lay.blk, lay.R * lay.blk
    start = (torch.arange(t0, t1, device=dev) - lay.r) * blk  # first key position of each window
    kpos = start[:, None] + torch.arange(rb, device=dev)  # (g, R blk)
    exists = (kpos >= 0) & (kpos < lay.n)
    qpos = torch.arange(t0 * blk, t1 * blk, device=dev).view(-1, blk)  # (g, blk)
    allowed = band[None] & exists[:, None, :]  # (g, blk, R blk)
    if key_ok is not None:  # (BH, padded length): key position p at index p + r blk
        ok = key_ok.unfold(1, rb, blk)[:, t0:t1]  # (BH, g, R blk)
        allowed = allowed[:, None] & ok.transpose(0, 1)[:, :, None, :]  # (g, BH, blk, R blk)
    else:
        allowed = allowed[:, None]
    dead = ~allowed.any(-1)  # (g, 1|BH, blk)
    dead = dead | (qpos >= lay.n)[:, None, :]  # queries past the end: discarded anyway
    allowed = allowed | dead[..., None]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill_(~allowed, float("-inf"))
    return mask, dead


def _shared_mask(lay: _Layout, device, dtype) -> torch.Tensor:
    band = lay.band(device)
    return torch.zeros(band.shape, dtype=dtype, device=device).masked_fill_(~band, float("-inf"))


class _BandedFlash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, lay: _Layout, key_ok, scale):
        b, h, n, d = q.shape
        dv, bh, blk = v.shape[-1], b * h, lay.blk
        q3, k3, v3 = q.reshape(bh, n, d), k.reshape(bh, n, d), v.reshape(bh, n, dv)  # views where the layout allows
        band = lay.band(q.device)
        shared = _shared_mask(lay, q.device, q.dtype)
        out = q.new_empty(lay.nb, blk, bh, dv).permute(0, 2, 1, 3)  # (nb, BH, blk, Dv); the heads of a position adjacent
        lse = None
        dead = torch.zeros(lay.nb, bh, blk, dtype=torch.bool, device=q.device)
        runs = _groups(lay, bh, key_ok is not None)
        for t0, t1, is_shared in runs:
            qv, kv, vv = _run_inputs(q3, k3, v3, lay, t0, t1)
            if is_shared:
                mask, gdead = shared, None
            else:
                mask, gdead = _group_mask(lay, band, key_ok, t0, t1, q.dtype)
            o, l = _FWD(qv, kv, vv, attn_mask=mask, scale=scale)
            if gdead is not None and gdead.any():
                o = o.masked_fill(gdead[..., None], 0.0)
                dead[t0:t1] |= gdead
            out[t0:t1] = o
            if lse is None:
                lse = l.new_empty(lay.nb, bh, blk)
            lse[t0:t1] = l
        ctx.save_for_backward(q, k, v, out, lse, dead, key_ok)
        ctx.lay, ctx.scale, ctx.runs = lay, scale, runs
        return out.permute(1, 0, 2, 3).reshape(b, h, lay.nb * blk, dv)[:, :, :n]

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, lse, dead, key_ok = ctx.saved_tensors
        lay, scale = ctx.lay, ctx.scale
        b, h, n, d = q.shape
        dv = v.shape[-1]
        bh, blk, R = b * h, lay.blk, lay.R
        q3, k3, v3 = q.reshape(bh, n, d), k.reshape(bh, n, d), v.reshape(bh, n, dv)
        go = F.pad(grad, (0, 0, 0, lay.nb * blk - n)).reshape(bh, lay.nb, blk, dv).transpose(0, 1)  # (nb, BH, blk, Dv)
        go = go.masked_fill(dead[..., None], 0.0)
        nkb = lay.nb + R - 1  # key blocks, r of them before position 0
        dq = torch.empty(lay.nb, bh, blk, d, dtype=q.dtype, device=q.device)
        dk = torch.zeros(bh, nkb, blk, d, dtype=k.dtype, device=k.device)
        dvv = torch.zeros(bh, nkb, blk, dv, dtype=v.dtype, device=v.device)
        band = lay.band(q.device)
        shared = _shared_mask(lay, q.device, q.dtype)
        per = max(1, _GROUP_ELEMENTS // (bh * R * blk * max(d, dv)))
        for t0, t1, is_shared in ctx.runs:
            for s0 in range(t0, t1, per):  # the interior run too, so the window gradients stay small
                s1 = min(t1, s0 + per)
                qv, kv, vv = _run_inputs(q3, k3, v3, lay, s0, s1)
                mask = shared if is_shared else _group_mask(lay, band, key_ok, s0, s1, q.dtype)[0]
                gq, gk, gv = _BWD(go[s0:s1], qv, kv, vv, out[s0:s1], lse[s0:s1], 0.0, False, attn_mask=mask, scale=scale)
                dq[s0:s1] = gq
                gk = gk.view(s1 - s0, bh, R, blk, d)
                gv = gv.view(s1 - s0, bh, R, blk, dv)
                for j in range(R):  # fold the overlapping windows back onto the keys
                    dk[:, s0 + j : s1 + j] += gk[:, :, j].transpose(0, 1)
                    dvv[:, s0 + j : s1 + j] += gv[:, :, j].transpose(0, 1)
        front = lay.r * blk
        dq = dq.transpose(0, 1).reshape(b, h, lay.nb * blk, d)[:, :, :n]
        dk = dk.view(b, h, nkb * blk, d)[:, :, front : front + n]
        dvv = dvv.view(b, h, nkb * blk, dv)[:, :, front : front + n]
        return dq, dk, dvv, None, None, None


def banded_flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    *,
    causal: bool = False,
    valid: torch.Tensor | None = None,
    block: int | None = None,
) -> torch.Tensor | None:
    """Exact sliding-window softmax attention via the fused CPU flash kernel (module docstring).

    Args:
        q, k: ``(B, H, N, D)``; v: ``(B, H, N, Dv)``.
        window: w >= 0; query i sees keys j with ``|i - j| <= w`` (``0 <= i - j <= w`` if causal).
        causal: the one-sided window.
        valid: ``(B, N)`` bool, False for padded keys; a query with no key left gets zeros.
        block: query block length (default :func:`default_block`).

    Returns:
        ``(B, H, N, Dv)``, or ``None`` where the kernel is not available for these inputs
        (non-CPU tensors, a PyTorch without it, an empty sequence).
    """
    if k.shape[2] != q.shape[2]:
        raise ValueError(
            f"this attention relates positions: it needs as many keys as queries, got N={q.shape[2]}, M={k.shape[2]}"
        )
    if _FWD is None or _BWD is None or q.device.type != "cpu" or q.shape[2] == 0:
        return None
    if q.dtype not in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        return None
    b, h, n, d = q.shape
    blk = min(default_block(window) if block is None else block, n)
    lay = _Layout(n, window, blk, causal)
    key_ok = None
    if valid is not None and not bool(valid.all()):
        front = lay.r * blk
        length = (lay.nb + lay.R - 1) * blk
        key_ok = F.pad(valid.to(torch.bool), (front, length - front - n))  # (B, padded length)
        key_ok = key_ok[:, None].expand(b, h, length).reshape(b * h, length)
    return _BandedFlash.apply(q, k, v, lay, key_ok, d**-0.5)
