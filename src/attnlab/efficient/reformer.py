"""Reformer's LSH attention: shared QK, hashed into buckets, sorted, attended chunk by chunk (Kitaev et al. 2020)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..core.amp import same_autocast_backward, same_autocast_forward
from ..validate import positive_int
from .base import Budget, EfficientStep, Sweep, register

__all__ = ["ReformerAttention", "lsh_buckets", "SELF_LOGIT"]

SELF_LOGIT = -1e5
"""The score a query gives itself: it attends to itself only when nothing else is allowed (the paper, section 2.2)."""


def lsh_buckets(x: torch.Tensor, rotations: torch.Tensor) -> torch.Tensor:
    """Angular LSH: ``h_r(x) = argmax([x R_r ; -x R_r])`` for ``x`` ``(B, H, N, D)`` and one
    random rotation per hash round, ``rotations`` ``(R, D, nb/2)`` -> buckets ``(B, H, R, N)``.
    The projection runs in float32 or wider, also under autocast."""
    if rotations.dim() != 3 or rotations.shape[1] != x.shape[-1]:
        raise ValueError(f"rotations must have shape (R, {x.shape[-1]}, buckets/2), got {tuple(rotations.shape)}")
    # hashed in float32 at least, autocast or not: a bfloat16 product moves near-ties to other buckets (10 % error,
    # not 1 %)
    wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    with torch.autocast(x.device.type, enabled=False):
        proj = torch.einsum("bhnd,rdk->bhrnk", wide, rotations.to(wide.dtype))
    return torch.cat([proj, -proj], dim=-1).argmax(-1)


GROUP_ELEMENTS = 1 << 20
"""Scores one group of chunks holds (B x H x chunks x c x 2c): the working set of the LSH step."""


@dataclass(frozen=True)
class _Group:
    """One group of consecutive chunks of the sorted slots, as :meth:`_LSHChunks._inputs` cuts it:
    queries (= shared keys) ``q`` ``(B, H, g c, D)``, values ``v``, buckets ``b_q``, positions ``p_q``;
    the ``kv_*`` / ``*_kv`` fields are the same of the chunk before the first (None when there is
    one chunk); ``ok_kv``: (the group's, the chunk before's) key flags, or None without padding."""

    q: torch.Tensor
    kv_q: torch.Tensor | None
    v: torch.Tensor
    kv_v: torch.Tensor | None
    b_q: torch.Tensor
    b_kv: torch.Tensor | None
    p_q: torch.Tensor
    p_kv: torch.Tensor | None
    ok_kv: tuple[torch.Tensor, torch.Tensor | None] | None


def _chunk_group(grp: _Group, c: int, causal: bool):
    """LSH attention of consecutive chunks ``q`` ``(B, H, g c, D)`` over themselves and the chunk
    before each (``kv_*``: the chunk before the first, or None when there is one chunk): output
    ``(B, H, g c, Dv)`` and log-sum-exp ``(B, H, g c)`` (-inf for a row with no key)."""
    q, kv_q, v, kv_v, b_q, b_kv = grp.q, grp.kv_q, grp.v, grp.kv_v, grp.b_q, grp.b_kv
    p_q, p_kv, ok_kv = grp.p_q, grp.p_kv, grp.ok_kv
    b, h, length, d = q.shape
    g = length // c

    def with_prev(t, prev):  # (B, H, g, c, ...) with each chunk's predecessor after it: (B, H, g, 2c, ...)
        t = t.view(b, h, g, c, *t.shape[3:])
        if prev is None:
            return t
        before = torch.cat([prev.view(b, h, 1, c, *prev.shape[3:]), t[:, :, :-1]], dim=2)
        return torch.cat([t, before], dim=3)

    ck = with_prev(F.normalize(q, dim=-1), None if kv_q is None else F.normalize(kv_q, dim=-1))  # shared QK
    cv, cb, cp = with_prev(v, kv_v), with_prev(b_q, b_kv), with_prev(p_q, p_kv)
    s = (q * d**-0.5).view(b, h, g, c, d) @ ck.transpose(-2, -1)  # (B, H, g, c, c')
    s = s.float() if s.dtype in (torch.float16, torch.bfloat16) else s  # normalised in float32 at least
    forbidden = b_q.view(b, h, g, c, 1) != cb[..., None, :]  # another bucket (or round)
    if ok_kv is not None:
        forbidden = forbidden | ~with_prev(ok_kv[0], ok_kv[1])[..., None, :]
    if causal:
        forbidden = forbidden | (cp[..., None, :] > p_q.view(b, h, g, c, 1))
    # a query's own key is the same sorted slot: the diagonal of the chunk's own block
    own = torch.eye(c, dtype=torch.bool, device=q.device)
    own = F.pad(own, (0, cb.shape[-1] - c))
    s = torch.where(own, torch.where(forbidden, float("-inf"), SELF_LOGIT) if ok_kv is not None else SELF_LOGIT,
                    s.masked_fill(forbidden, float("-inf")))
    # (B, H, g, c): a row with no allowed key: weights 0, lse -inf, no NaN either way
    dead = (s == float("-inf")).all(-1)
    lse = torch.logsumexp(s.masked_fill(dead[..., None], 0.0), dim=-1).masked_fill(dead, float("-inf"))
    w = torch.exp(s - lse.masked_fill(dead, 0.0)[..., None])
    return (w.to(v.dtype) @ cv).view(b, h, length, -1), lse.view(b, h, length)


class _LSHChunks(torch.autograd.Function):
    """The chunks of the sorted slots attended a group at a time; the backward pass recomputes
    each group and adds its gradients into the slots it read, so the step holds one group's
    scores, however long the sequence (fewer, reused temporaries: no N-sized score tensor)."""

    @staticmethod
    @same_autocast_forward
    def forward(ctx, sq, sv, sb, pos, ok, c: int, causal: bool):
        b, h, length, _ = sq.shape
        nc = length // c
        per = max(1, GROUP_ELEMENTS // (b * h * c * 2 * c))
        ctx.groups = [(a, min(nc, a + per)) for a in range(0, nc, per)]
        ctx.c, ctx.causal = c, causal
        out = sv.new_empty(b, h, length, sv.shape[-1])
        lse = torch.empty(b, h, length, device=sq.device,
                          dtype=torch.float32 if sq.dtype in (torch.float16, torch.bfloat16) else sq.dtype)
        for a, z in ctx.groups:
            o, l_ = _chunk_group(_LSHChunks._inputs(sq, sv, sb, pos, ok, c, a=a, z=z), c, causal)
            out[:, :, a * c : z * c], lse[:, :, a * c : z * c] = o, l_
        ctx.save_for_backward(sq, sv, sb, pos, ok)
        return out, lse

    @staticmethod
    def _inputs(sq, sv, sb, pos, ok, c: int, *, a: int, z: int, leaf=None) -> _Group:
        """Chunks ``a .. z - 1``'s slots and the chunk before the first (chunk nc - 1 before chunk 0;
        none with one chunk)."""
        nc = sq.shape[2] // c
        rows = slice(a * c, z * c)
        prev = None if nc == 1 else slice(((a - 1) % nc) * c, ((a - 1) % nc) * c + c)
        take = (lambda t, r: t[:, :, r]) if leaf is None else leaf
        q, v = take(sq, rows), take(sv, rows)
        kv_q, kv_v = (None, None) if prev is None else (take(sq, prev), take(sv, prev))
        b_q, p_q = sb[:, :, rows], pos[:, :, rows]
        b_kv, p_kv = (None, None) if prev is None else (sb[:, :, prev], pos[:, :, prev])
        okk = None if ok is None else (ok[:, :, rows], None if prev is None else ok[:, :, prev])
        return _Group(q, kv_q, v, kv_v, b_q, b_kv, p_q, p_kv, okk)

    @staticmethod
    @torch.autograd.function.once_differentiable
    @same_autocast_backward
    def backward(ctx, do, dlse):
        sq, sv, sb, pos, ok = ctx.saved_tensors
        c = ctx.c
        dq, dv = torch.zeros_like(sq), torch.zeros_like(sv)
        for a, z in ctx.groups:
            leaves = []

            def leaf(t, r):
                x = t[:, :, r].detach().requires_grad_(True)
                leaves.append((t is sq, r, x))  # noqa: B023  (called in this iteration)
                return x

            with torch.enable_grad():
                o, l_ = _chunk_group(_LSHChunks._inputs(sq, sv, sb, pos, ok, c, a=a, z=z, leaf=leaf), c, ctx.causal)
                grads = torch.autograd.grad((o, l_), [x for *_, x in leaves],
                                            (do[:, :, a * c : z * c], dlse[:, :, a * c : z * c]), allow_unused=True)
            for (is_q, r, _), g in zip(leaves, grads):
                if g is not None:
                    (dq if is_q else dv)[:, :, r] += g
        return dq, dv, None, None, None, None, None


@register("reformer")
class ReformerAttention(EfficientStep):
    """LSH attention: queries attend to the keys hashed into their bucket, O(N c) per hash round.

    Kitaev et al. 2020, "Reformer" (https://arxiv.org/abs/2001.04451), section 2: keys are the
    normalised queries (shared QK: ``k_j = q_j / |q_j|``; the layer's key projection is not
    used), hashed by random rotations into ``num_buckets`` buckets; positions are sorted by
    (bucket, position) and cut into chunks of ``chunk_size``; each chunk attends to itself and
    the chunk before it, to the keys of the same bucket, never to itself unless nothing else
    is allowed (score :data:`SELF_LOGIT`). ``num_hashes`` rounds are combined with weights
    ``softmax`` of their log-normalisers (keys found in several rounds are not de-duplicated).
    With one bucket and one chunk it is exact dense attention over the shared-QK scores.
    Causal (``causal=True``), a query never sees a later key; but which earlier keys share its
    chunk follows the sort of the whole sequence, so a later token can change an earlier output
    (a prefix is not computed as it would be alone: no cached decoding).

    Args:
        embed_dim, num_heads, causal: see :class:`attnlab.efficient.EfficientStep`
            (self-attention only).
        num_buckets: even number of buckets (default 32).
        num_hashes: hash rounds (default 2).
        chunk_size: positions per chunk (default 64).
        seed: seed of the rotations (None: drawn from torch's global generator at every call).
    """

    budget = Budget(
        short={"num_buckets": 4, "chunk_size": 16},
        long={"num_buckets": 64, "num_hashes": 2, "chunk_size": 64, "seed": 0},
        sweep=Sweep("num_hashes", (1, 2, 4, 8), "hash rounds (16 buckets, chunk 64)",
                    fixed={"num_buckets": 16, "chunk_size": 64}, seeded=True),
    )

    # the key projection is never computed
    capabilities = EfficientStep.capabilities.with_changes(shared_qk=True, family="hashing")

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
        return (f"{super().extra_repr()}, num_buckets={self.num_buckets}, num_hashes={self.num_hashes}, "
                f"chunk_size={self.chunk_size}")

    def compute(self, q, k, v, valid):
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
        slot_ok = None
        if valid is not None or pad:
            ok = valid if valid is not None else torch.ones(b, n, dtype=torch.bool, device=dev)
            ok = F.pad(ok, (0, 1), value=False)[:, None].expand(b, h, n + 1)
            slot_ok = torch.gather(ok, 2, pos)  # (B, H, nc c): the key in this slot is real
        o, lse = _LSHChunks.apply(sq, sv, sb, pos, slot_ok, c, self.causal)  # (B, H, nc c, Dv), (B, H, nc c)
        # back to slot order (padding slots dropped), then the rounds combined
        idx = order[..., None].expand(-1, -1, -1, o.shape[-1])
        back = (o.new_zeros(b, h, total + 1, o.shape[-1]) if pad else torch.empty_like(o)).scatter(2, idx, o)
        back = back[:, :, :total]
        l_back = (lse.new_full((b, h, total + 1), float("-inf")) if pad
                  else lse.new_empty(b, h, total)).scatter(2, order, lse)[:, :, :total]
        back = back.view(b, h, rounds, n, -1)
        if rounds == 1:
            return back[:, :, 0]
        wts = torch.nan_to_num(torch.softmax(l_back.view(b, h, rounds, n), dim=2))  # (B, H, R, N); no key anywhere: 0
        return (back * wts[..., None].to(back.dtype)).sum(2)
