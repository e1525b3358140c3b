"""Reformer's LSH attention: shared QK, hashed into buckets, sorted, attended chunk by chunk (Kitaev et al. 2020)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import EfficientAttention, register_attention

__all__ = ["ReformerAttention", "lsh_buckets", "SELF_LOGIT"]

SELF_LOGIT = -1e5
"""The score a query gives itself: it attends to itself only when nothing else is allowed (the paper, section 2.2)."""


def lsh_buckets(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Angular LSH: ``h(x) = argmax([x R ; -x R])`` for ``x`` ``(B, H, N, D)`` and ``R`` ``(D, nb/2)`` -> ``(B, H, N)``."""
    proj = x @ rotations.to(x.dtype)
    return torch.cat([proj, -proj], dim=-1).argmax(-1)


@register_attention("reformer")
class ReformerAttention(EfficientAttention):
    """LSH attention: queries attend to the keys hashed into their bucket, O(N c) per hash round.

    Kitaev et al. 2020, "Reformer" (https://arxiv.org/abs/2001.04451), section 2: keys are the
    normalised queries (shared QK: ``k_j = q_j / |q_j|``; the layer's key projection is not
    used), hashed by random rotations into ``num_buckets`` buckets; positions are sorted by
    (bucket, position) and cut into chunks of ``chunk_size``; each chunk attends to itself and
    the chunk before it, to the keys of the same bucket, never to itself unless nothing else
    is allowed (score :data:`SELF_LOGIT`). ``num_hashes`` rounds are combined with weights
    ``softmax`` of their log-normalisers (keys found in several rounds are not de-duplicated).
    With one bucket and one chunk it is exact dense attention over the shared-QK scores.

    Args:
        embed_dim, num_heads, causal, ...: see :class:`attnlab.efficient.EfficientAttention`
            (self-attention only).
        num_buckets: even number of buckets (default 32).
        num_hashes: hash rounds (default 2).
        chunk_size: positions per chunk (default 64).
        seed: seed of the rotations (None: drawn from torch's global generator at every call).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_buckets: int = 32,
        num_hashes: int = 2,
        chunk_size: int = 64,
        seed: int | None = None,
        **options,
    ):
        for name, val in (("num_buckets", num_buckets), ("num_hashes", num_hashes), ("chunk_size", chunk_size)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"{name} must be a positive int, got {val!r}")
        if num_buckets > 1 and num_buckets % 2:
            raise ValueError(f"num_buckets must be 1 or even (buckets come in +/- pairs), got {num_buckets}")
        super().__init__(embed_dim, num_heads, **options)
        self.num_buckets, self.num_hashes, self.chunk_size, self.seed = num_buckets, num_hashes, chunk_size, seed

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_buckets={self.num_buckets}, num_hashes={self.num_hashes}, chunk_size={self.chunk_size}"

    def efficient(self, q, k, v, valid):
        b, h, n, d = q.shape
        if k.shape[2] != n:
            raise ValueError(f"reformer attention shares queries and keys: it needs N = M, got N={n}, M={k.shape[2]}")
        dev = q.device
        keys = F.normalize(q, dim=-1)  # shared QK
        gen = None if self.seed is None else torch.Generator().manual_seed(self.seed)
        c = min(self.chunk_size, n)
        nc = -(-n // c)
        pad = nc * c - n
        outs, lses = [], []
        for _ in range(self.num_hashes):
            if self.num_buckets == 1:
                buckets = torch.zeros(b, h, n, dtype=torch.long, device=dev)
            else:
                rot = torch.randn(d, self.num_buckets // 2, generator=gen).to(dev)
                buckets = lsh_buckets(keys.detach(), rot)  # (B, H, N)
            pos = torch.arange(n, device=dev).expand(b, h, n)
            order = torch.argsort(buckets * n + pos, dim=-1)  # sort by (bucket, position)
            if pad:  # padding slots at the end: bucket -1 (matches nothing), position n (after all)
                order = torch.cat([order, order.new_full((b, h, pad), n)], dim=-1)
            qx, kx, vx = (F.pad(t, (0, 0, 0, 1)) for t in (q, keys, v))  # index n = a zero row
            bx = F.pad(buckets, (0, 1), value=-1)
            okx = F.pad(valid if valid is not None else torch.ones(b, n, dtype=torch.bool, device=dev), (0, 1), value=False)
            gather = lambda t: torch.gather(t, 2, order[..., None].expand(-1, -1, -1, t.shape[-1]))  # noqa: E731
            sq, sk, sv = gather(qx), gather(kx), gather(vx)  # (B, H, nc c, D)
            sb = torch.gather(bx, 2, order)  # (B, H, nc c)
            sok = torch.gather(okx[:, None].expand(b, h, n + 1), 2, order)
            sq = sq.view(b, h, nc, c, d)

            def with_prev(t):  # each chunk with the chunk before it (none when there is one chunk)
                t = t.view(b, h, nc, c, *t.shape[3:])
                return t if nc == 1 else torch.cat([t, t.roll(1, dims=2)], dim=3)

            ck, cv, cb, cpos, cok = with_prev(sk), with_prev(sv), with_prev(sb), with_prev(order), with_prev(sok)
            qb_, qpos = sb.view(b, h, nc, c), order.view(b, h, nc, c)
            s = (sq @ ck.transpose(-2, -1)) * d**-0.5  # (B, H, nc, c, c')
            allowed = (qb_[..., :, None] == cb[..., None, :]) & cok[..., None, :]
            if self.causal:
                allowed &= cpos[..., None, :] <= qpos[..., :, None]
            s = s.masked_fill(~allowed, float("-inf"))
            s = torch.where(cpos[..., None, :] == qpos[..., :, None], torch.where(allowed, SELF_LOGIT, s), s)
            s = s.float() if s.dtype in (torch.float16, torch.bfloat16) else s  # normalised in float32 at least
            lse = torch.logsumexp(s, dim=-1, keepdim=True)  # (B, H, nc, c, 1)
            w = torch.exp(s - lse.masked_fill(~torch.isfinite(lse), 0.0)).to(v.dtype)
            o = (w @ cv).view(b, h, nc * c, -1)
            # back to the original order (padding slots dropped)
            back = torch.zeros(b, h, n + 1, o.shape[-1], dtype=o.dtype, device=dev).scatter(
                2, order[..., None].expand(-1, -1, -1, o.shape[-1]), o
            )[:, :, :n]
            l_back = torch.full((b, h, n + 1), float("-inf"), dtype=lse.dtype, device=dev).scatter(
                2, order, lse.view(b, h, nc * c)
            )[:, :, :n]
            outs.append(back)
            lses.append(l_back)
        if len(outs) == 1:
            return outs[0]
        lse = torch.stack(lses)  # (R, B, H, N)
        wts = torch.nan_to_num(torch.softmax(lse, dim=0))  # a query with no key in any round: zeros
        return (torch.stack(outs) * wts[..., None].to(outs[0].dtype)).sum(0)
