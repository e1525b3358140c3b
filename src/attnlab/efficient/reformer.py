"""Reformer's LSH attention: shared QK, hashed into buckets, sorted, attended chunk by chunk (Kitaev et al. 2020)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..validate import positive_int
from .base import Budget, EfficientAttention, Sweep, register

__all__ = ["ReformerAttention", "lsh_buckets", "SELF_LOGIT"]

SELF_LOGIT = -1e5
"""The score a query gives itself: it attends to itself only when nothing else is allowed (the paper, section 2.2)."""


def lsh_buckets(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Angular LSH: ``h_r(x) = argmax([x R_r ; -x R_r])`` for ``x`` ``(B, H, N, D)`` and one
    random rotation per hash round, ``rotations`` ``(R, D, nb/2)`` -> buckets ``(B, H, R, N)``."""
    if rotations.dim() != 3 or rotations.shape[1] != x.shape[-1]:
        raise ValueError(f"rotations must have shape (R, {x.shape[-1]}, buckets/2), got {tuple(rotations.shape)}")
    proj = torch.einsum("bhnd,rdk->bhrnk", x, rotations.to(x.dtype))
    return torch.cat([proj, -proj], dim=-1).argmax(-1)


@register("reformer")
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

    budget = Budget(
        short={"num_buckets": 4, "chunk_size": 16},
        long={"num_buckets": 64, "num_hashes": 2, "chunk_size": 64, "seed": 0},
        sweep=Sweep("num_hashes", (1, 2, 4, 8), "hash rounds (16 buckets, chunk 64)", fixed={"num_buckets": 16, "chunk_size": 64}, seeded=True),
    )

    uses_keys = False  # shared QK: the key projection is never computed

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
            positive_int(name, val)
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
        rounds = self.num_hashes
        # all hash rounds in one sequence of R x N slots: bucket ids are offset by round, so
        # sorting by (round, bucket, position) keeps rounds apart and one pass serves them all
        if self.num_buckets == 1:
            buckets = torch.arange(rounds, device=dev).repeat_interleave(n).expand(b, h, rounds * n)
        else:
            gen = None if self.seed is None else torch.Generator().manual_seed(self.seed)
            rot = torch.randn(rounds, d, self.num_buckets // 2, generator=gen).to(device=dev, dtype=q.dtype)
            buckets = lsh_buckets(q.detach(), rot)  # (B, H, R, N); the hash of q / |q| is the hash of q
            buckets = (buckets + torch.arange(rounds, device=dev)[:, None] * self.num_buckets).flatten(2)  # (B, H, R N)
        total = rounds * n
        c = min(self.chunk_size, total)
        nc = -(-total // c)
        pad = nc * c - total
        slot = torch.arange(total, device=dev)
        order = torch.argsort(buckets * total + slot, dim=-1)  # (B, H, R N): slots sorted by (round, bucket, position)
        if pad:  # padding slots at the end: index R N, in no bucket, never valid
            order = torch.cat([order, order.new_full((b, h, pad), total)], dim=-1)
            buckets = F.pad(buckets, (0, 1), value=-1)
        pos = torch.where(order < total, order % n, n)  # (B, H, nc c): the position of each sorted slot
        qx, vx = (F.pad(q, (0, 0, 0, 1)), F.pad(v, (0, 0, 0, 1))) if pad else (q, v)
        sq = torch.gather(qx, 2, pos[..., None].expand(-1, -1, -1, d))  # (B, H, nc c, D)
        sv = torch.gather(vx, 2, pos[..., None].expand(-1, -1, -1, vx.shape[-1]))
        sb = torch.gather(buckets, 2, order)  # (B, H, nc c)
        sk = F.normalize(sq, dim=-1)  # shared QK: the keys are the normalised queries

        def with_prev(t):  # each chunk with the chunk before it (none when there is one chunk)
            t = t.view(b, h, nc, c, *t.shape[3:])
            return t if nc == 1 else torch.cat([t, t.roll(1, dims=2)], dim=3)  # (B, H, nc, 2c, ...)

        ck, cv, cb, cpos = with_prev(sk), with_prev(sv), with_prev(sb), with_prev(pos)
        s = (sq * d**-0.5).view(b, h, nc, c, d) @ ck.transpose(-2, -1)  # (B, H, nc, c, c')
        qpos = pos.view(b, h, nc, c, 1)
        forbidden = sb.view(b, h, nc, c, 1) != cb[..., None, :]  # another bucket (or round)
        slot_ok = None
        if valid is not None or pad:
            ok = valid if valid is not None else torch.ones(b, n, dtype=torch.bool, device=dev)
            ok = F.pad(ok, (0, 1), value=False)[:, None].expand(b, h, n + 1)
            slot_ok = torch.gather(ok, 2, pos)  # (B, H, nc c): the key in this slot is real
            forbidden = forbidden | ~with_prev(slot_ok)[..., None, :]
        if self.causal:
            forbidden = forbidden | (cpos[..., None, :] > qpos)
        s = s.masked_fill(forbidden, float("-inf"))
        # a query's own key is the same sorted slot: the diagonal of the chunk's own block
        own = torch.full((b, h, nc, c), SELF_LOGIT, dtype=s.dtype, device=dev)
        if slot_ok is not None:
            own = own.masked_fill(~slot_ok.view(b, h, nc, c), float("-inf"))
        s[..., :c].diagonal(dim1=-2, dim2=-1).copy_(own)
        s = s.float() if s.dtype in (torch.float16, torch.bfloat16) else s  # normalised in float32 at least
        lse = torch.logsumexp(s, dim=-1)  # (B, H, nc, c)
        w = torch.softmax(s, dim=-1)
        if valid is not None or pad or self.causal:  # a row with no allowed key: zeros, not NaN
            w = torch.nan_to_num(w)
        o = (w.to(v.dtype) @ cv).view(b, h, nc * c, -1)
        # back to slot order (padding slots dropped), then the rounds combined
        idx = order[..., None].expand(-1, -1, -1, o.shape[-1])
        back = (o.new_zeros(b, h, total + 1, o.shape[-1]) if pad else torch.empty_like(o)).scatter(2, idx, o)[:, :, :total]
        l_back = (lse.new_full((b, h, total + 1), float("-inf")) if pad else lse.new_empty(b, h, total)).scatter(
            2, order, lse.view(b, h, nc * c)
        )[:, :, :total]
        back = back.view(b, h, rounds, n, -1)
        if rounds == 1:
            return back[:, :, 0]
        wts = torch.nan_to_num(torch.softmax(l_back.view(b, h, rounds, n), dim=2))  # (B, H, R, N); no key anywhere: 0
        return (back * wts[..., None].to(back.dtype)).sum(2)
