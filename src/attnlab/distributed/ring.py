"""Ring attention: exact attention over a sequence sharded across the ranks of a process group.

Each rank holds its shard of the queries, keys and values (``c = N / P`` positions). The key /
value shards travel around the ring, one hop per step (point-to-point ``isend`` / ``irecv``
of torch.distributed, the next shard in flight while the current one is computed on); each
rank folds every shard into its queries' output with the online-softmax rule (Milakov &
Gimelshein 2018; Liu et al. 2023, Ring Attention, https://arxiv.org/abs/2310.01889)::

    m' = max(m, m_j)      l' = l e^{m - m'} + l_j e^{m_j - m'}      o' = o e^{m - m'} + o_j e^{m_j - m'}

and ends with ``out = o / l`` and the log-sum-exp ``lse = m + log l`` of every query row.
The backward pass is a ring too: the key / value shards travel again, each rank adds its
queries' share of ``dk``, ``dv`` to accumulators that travel with them and finally return
to the shard's owner (FlashAttention's backward per tile: ``P = exp(S - lse)``,
``dV = P^T dO``, ``dS = P (dO V^T - rowsum(dO O))``). Memory per rank is O(N / P) in the
sequence: nothing of size N, and scores only one tile of ``block`` rows at a time.

Masks are rules on positions, so they hold for any layout: key padding (flags that travel
with the keys), causal (``j <= i``) and windows (``|i - j| <= w``, or ``0 <= i - j <= w``
causal). Tiles that the rule forbids entirely are skipped, tiles it allows entirely take no
mask, and steps that no rank needs are not taken: with a window and the contiguous layout
only neighbouring ranks exchange shards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from ..core.attend import AttentionResult
from ..core.normalize import resolve_normalizer, softmax
from ..core.scores import Score, resolve_score
from ..validate import int_at_least, optional_int

__all__ = ["RingContext", "RingTimings", "ring_attend"]

TILE = 2048
"""The default side of a tile of queries x keys."""

P2P_BACKENDS = ("gloo", "nccl", "mpi", "xccl")
"""Backends with the point-to-point ``isend`` / ``irecv`` the ring needs."""


@dataclass
class RingTimings:
    """Where a rank's ring-attention time went, summed over calls (forward and backward).

    Attributes:
        compute: seconds computing tiles. wait: seconds blocked on a shard still in flight (the
            communication that overlapping did not hide). sent: bytes this rank sent.
        steps: ring steps taken.
    """

    compute: float = 0.0
    wait: float = 0.0
    sent: int = 0
    steps: int = 0


def _backend(group, device="cpu") -> str:
    """The backend that carries ``device``'s tensors in ``group`` (a group made without naming a
    backend reports one per device: ``"cpu:gloo,cuda:nccl"``)."""
    name = str(dist.get_backend(group))
    if ":" in name:
        per_device = dict(part.split(":", 1) for part in name.split(","))
        return per_device.get(torch.device(device).type, name)
    return name


def _check_group(group, device="cpu") -> tuple[int, int, list[int]]:
    if not (dist.is_available() and dist.is_initialized()):
        raise RuntimeError("ring attention needs torch.distributed initialised: start with torchrun, or call "
                           "torch.distributed.init_process_group first")
    backend = _backend(group, device)
    if backend not in P2P_BACKENDS:
        raise RuntimeError(f"ring attention needs point-to-point send / receive, which the {backend!r} backend lacks; "
                           f"use one of {', '.join(P2P_BACKENDS)}")
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    ranks = [dist.get_global_rank(group, r) for r in range(world)] if group is not None else list(range(world))
    return rank, world, ranks


def _all_gather(t: torch.Tensor, group, world: int) -> torch.Tensor:
    """Every rank's ``t`` stacked (on CPU under gloo, which gathers CPU tensors; on ``t``'s device otherwise)."""
    if _backend(group, t.device) == "gloo":
        t = t.cpu()
    out = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(out, t.contiguous(), group=group)
    return torch.stack(out)


@dataclass
class RingContext:
    """What every ring-attention call over one sharded sequence shares: the group, every
    shard's positions and key flags. Build it once per forward with :meth:`build` and pass it
    to each layer's :func:`ring_attend` (it costs three small all-gathers: sizes, positions,
    key flags).

    Attributes:
        group: the process group (None: the default group). rank, world: this rank's index in
            it and its size; ranks: the global rank of each member.
        positions: ``(P, c)`` int64, the positions every rank holds.
        key_valid: ``(P, B, c)`` bool, True = a real key, or None when no key is padding.
    """

    group: object
    rank: int
    world: int
    ranks: list[int]
    positions: torch.Tensor
    key_valid: torch.Tensor | None = None
    _plans: dict = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, positions: torch.Tensor, key_valid: torch.Tensor | None = None, *, group=None) -> "RingContext":
        """Gather every rank's ``positions`` ``(c,)`` and key flags ``(B, c)`` (True = real key;
        None: no padding on this rank). Every rank of ``group`` must call it."""
        rank, world, ranks = _check_group(group)
        problem = None  # checked here, raised on every rank together (a rank raising alone leaves the others waiting)
        if not isinstance(positions, torch.Tensor) or positions.dim() != 1 or positions.dtype not in (torch.int32, torch.int64):
            problem = ("positions must be an int tensor of shape (c,), got "
                       f"{tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__}")
            positions = torch.zeros(0, dtype=torch.int64)
        elif key_valid is not None and (not isinstance(key_valid, torch.Tensor) or key_valid.dtype != torch.bool or key_valid.dim() != 2
                                        or key_valid.shape[1] != positions.shape[0]):
            problem = (f"key_padding must be a bool tensor (B, c) = (B, {positions.shape[0]}), True = a real key; got "
                       f"{tuple(key_valid.shape) if isinstance(key_valid, torch.Tensor) else type(key_valid).__name__}"
                       + (f" of dtype {key_valid.dtype}" if isinstance(key_valid, torch.Tensor) else ""))
        c = positions.shape[0]
        b = -1 if key_valid is None or problem else key_valid.shape[0]
        meta = _all_gather(torch.tensor([c, b, problem is not None], dtype=torch.int64, device=positions.device), group, world)
        bad = [r for r in range(world) if meta[r, 2]]
        if bad:
            raise ValueError(problem or f"rank(s) {bad} of the sequence's group gave positions or key_padding that do not fit")
        if bool((meta[:, 0] != c).any()):
            raise ValueError(f"every rank must hold the same number of positions; they hold {meta[:, 0].tolist()} "
                             "(pad the sequence to a multiple of the ranks: attnlab.distributed.plan_layout(pad=True))")
        batches = {int(x) for x in meta[:, 1] if x >= 0}
        if len(batches) > 1:
            raise ValueError(f"the ranks' key_padding disagree on the batch size: {sorted(batches)}")
        pos = _all_gather(positions.to(torch.int64), group, world)
        valid = None
        if batches:
            bsz = batches.pop()
            mine = key_valid if key_valid is not None else torch.ones(bsz, c, dtype=torch.bool, device=positions.device)
            valid = _all_gather(mine.to(torch.uint8), group, world).bool()
            if bool(valid.all()):
                valid = None
        return cls(group, rank, world, ranks, pos, valid)

    def plan(self, causal: bool, window: int | None) -> "_Plan":
        """The ring schedule for a mask rule (cached: every layer of a forward uses the same)."""
        key = (causal, window)
        if key not in self._plans:
            self._plans[key] = _Plan.make(self, causal, window)
        return self._plans[key]


def _runs(pos: torch.Tensor) -> list[tuple[int, int]]:
    """Index ranges of ``pos`` holding consecutive positions; one range for the whole shard
    when there are more than two (a striped shard: its tiles are masked)."""
    if pos.numel() == 0:
        return []
    breaks = (torch.nonzero(pos[1:] - pos[:-1] != 1).flatten() + 1).tolist()
    if len(breaks) > 1:
        return [(0, pos.numel())]
    edges = [0, *breaks, pos.numel()]
    return list(zip(edges[:-1], edges[1:]))


def _needed(qpos: torch.Tensor, kpos: torch.Tensor, causal: bool, window: int | None) -> bool:
    """Whether any query at ``qpos`` may see any key at ``kpos`` under the rule."""
    if not causal and window is None:
        return True
    ks = torch.sort(kpos).values
    if causal:  # the latest key at or before each query
        i = torch.searchsorted(ks, qpos, right=True) - 1
        ok = i >= 0
        if window is not None:
            ok &= (qpos - ks[i.clamp(min=0)]) <= window
        return bool(ok.any())
    i = torch.searchsorted(ks, qpos).clamp(max=ks.numel() - 1)  # the nearest keys on either side
    j = (i - 1).clamp(min=0)
    near = torch.minimum((ks[i] - qpos).abs(), (ks[j] - qpos).abs())
    return bool((near <= window).any())


@dataclass
class _Plan:
    """A ring schedule: ``rounds`` of ``(direction, hops)`` and which shard pairs to compute."""

    causal: bool
    window: int | None
    rounds: list[tuple[int, int]]
    needed: list[list[bool]]  # needed[r][j]: rank r's queries see some key of shard j

    @classmethod
    def make(cls, ctx: RingContext, causal: bool, window: int | None) -> "_Plan":
        p, pos = ctx.world, ctx.positions
        needed = [[_needed(pos[r], pos[j], causal, window) for j in range(p)] for r in range(p)]
        # the hops s (shard r - s reaching rank r) that some rank needs
        hops = [s for s in range(1, p) if any(needed[r][(r - s) % p] for r in range(p))]
        best = None
        for a in reversed(range(p)):  # hops <= a go one way (receive from the left), the rest the other way; ties: one way
            fwd = max([s for s in hops if s <= a], default=0)
            back = max([p - s for s in hops if s > a], default=0)
            if best is None or fwd + back < best[0]:
                best = (fwd + back, fwd, back)
        _, fwd, back = best
        rounds = [(d, n) for d, n in ((1, fwd), (-1, back)) if n]
        return cls(causal, window, rounds, needed)


def _split(runs: list[tuple[int, int]], side: int) -> list[tuple[int, int]]:
    return [(a, min(a + side, b)) for start, b in runs for a in range(start, b, side)]


def _tiles(ctx: RingContext, plan: _Plan, r: int, j: int, side: int, device):
    """The tiles (at most ``side`` x ``side``) of rank r's queries x shard j's keys: ``(row
    slice, col slice, mask or None, diagonal)``, masks ``(B|1, 1, rows, cols)`` bool, diagonal:
    the mask is exactly ``j <= i`` over the same positions; tiles the rule forbids entirely are
    left out."""
    qpos, kpos = ctx.positions[r].to(device), ctx.positions[j].to(device)
    valid = None if ctx.key_valid is None else ctx.key_valid[j].to(device)
    for qa, qb in _runs(qpos):
        for ka, kb in _split(_runs(kpos), side):
            kp = kpos[ka:kb]
            kmin, kmax = int(kp.min()), int(kp.max())
            kv = None if valid is None else valid[:, ka:kb]
            if kv is not None and bool(kv.all()):
                kv = None
            if kv is not None and not bool(kv.any()):
                continue
            for a in range(qa, qb, side):
                b = min(a + side, qb)
                qp = qpos[a:b]
                qmin, qmax = int(qp.min()), int(qp.max())
                rule, diagonal = None, False
                if plan.causal or plan.window is not None:
                    lo = qmin - kmax  # smallest i - j in the tile
                    hi = qmax - kmin  # largest i - j
                    w = plan.window
                    if plan.causal:
                        full = lo >= 0 and (w is None or hi <= w)
                        empty = hi < 0 or (w is not None and lo > w)
                    else:
                        full = lo >= -w and hi <= w
                        empty = lo > w or hi < -w
                    if empty:
                        continue
                    if not full:
                        d = qp[:, None] - kp[None, :]  # (rows, cols): i - j
                        rule = (d >= 0) if plan.causal else torch.ones_like(d, dtype=torch.bool)
                        if w is not None:
                            rule &= d.abs() <= w
                        if not bool(rule.any()):
                            continue
                        diagonal = plan.causal and w is None and kv is None and torch.equal(qp, kp)
                        rule = rule[None, None]
                mask = rule
                if kv is not None:
                    pad = kv[:, None, None, :]  # (B, 1, 1, cols)
                    mask = pad if mask is None else mask & pad
                yield slice(a, b), slice(ka, kb), mask, diagonal


class _Ring:
    """One ring pass's communication: send to ``rank + d``, receive from ``rank - d``."""

    def __init__(self, ctx: RingContext, timings: RingTimings | None):
        self.ctx, self.timings = ctx, timings

    def post(self, send: torch.Tensor | None, recv_like: torch.Tensor | None, to: int, frm: int, tag: int):
        """Start sending ``send`` to group rank ``to`` and receiving a tensor like ``recv_like``
        from ``frm``, as one batch (nccl needs a send and a receive posted together, or two
        ranks sending to each other wait forever); returns what :meth:`wait` takes."""
        ctx, ops, buf = self.ctx, [], None
        if send is not None:
            ops.append(dist.P2POp(dist.isend, send, ctx.ranks[to % ctx.world], ctx.group, tag))
            if self.timings is not None:
                self.timings.sent += send.numel() * send.element_size()
        if recv_like is not None:
            buf = torch.empty_like(recv_like)
            ops.append(dist.P2POp(dist.irecv, buf, ctx.ranks[frm % ctx.world], ctx.group, tag))
        return dist.batch_isend_irecv(ops), buf, send  # the tensor sent stays referenced until waited on

    def wait(self, posted) -> torch.Tensor | None:
        works, buf, _ = posted
        t0 = time.perf_counter()
        for w in works:
            w.wait()
        if self.timings is not None:
            self.timings.wait += time.perf_counter() - t0
        return buf


def _pack(*ts: torch.Tensor) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in ts])


def _unpack(flat: torch.Tensor, *likes: torch.Tensor) -> list[torch.Tensor]:
    out, at = [], 0
    for t in likes:
        out.append(flat[at : at + t.numel()].view(t.shape))
        at += t.numel()
    return out


_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FLASH_CPU_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
"""PyTorch's fused CPU attention kernel, which returns each row's log-sum-exp and takes it back
for the backward pass: what an unmasked (or plain causal) tile runs on, on CPU."""

SCORE_ELEMENTS = 1 << 18
"""Scores written out at once (B x H x rows x keys) by a tile that needs a mask or a non-dot score."""


def _rows_of(mask: torch.Tensor, sub: slice, rs: slice) -> torch.Tensor:
    """Rows ``sub`` (inside the tile's rows ``rs``) of a tile mask ``(B|1, 1, rows|1, cols)``."""
    if mask.shape[-2] == 1:
        return mask
    return mask[..., sub.start - rs.start : sub.stop - rs.start, :]


class _Setup:
    """The non-tensor arguments of one ring call."""

    def __init__(self, ctx, plan, score_fn, scale, side, timings, q, v):
        self.ctx, self.plan, self.score_fn, self.scale, self.side, self.timings = ctx, plan, score_fn, scale, side, timings
        # the fused kernel: a plain scaled dot product on CPU in float32 / float64
        self.fused = (scale is not None and q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64)
                      and v.shape[-1] == q.shape[-1] and _FLASH_CPU is not None and _FLASH_CPU_BACKWARD is not None)
        self.pairs = q.shape[0] * q.shape[1] * max(int(getattr(score_fn, "pair_cost", 1)), 1)

    def row_chunks(self, rs: slice, cs: slice) -> list[slice]:
        """Rows ``rs`` cut so that a chunk's scores against keys ``cs`` hold about :data:`SCORE_ELEMENTS`."""
        step = max(1, SCORE_ELEMENTS // (self.pairs * (cs.stop - cs.start)))
        return [slice(a, min(a + step, rs.stop)) for a in range(rs.start, rs.stop, step)]

    def scores(self, q, k):
        if self.scale is not None:
            return (q * self.scale) @ k.transpose(-1, -2)  # (B, H, rows, cols); scaled first, for half precision
        return self.score_fn.pairwise(q, k)


def _heads(t: torch.Tensor, h: int) -> torch.Tensor:
    """Grouped keys or values ``(B, G, n, D)`` repeated to H heads (key head g serves query heads
    ``g H/G .. (g+1) H/G - 1``); unchanged when G = H."""
    return t if t.shape[1] == h else t.repeat_interleave(h // t.shape[1], dim=1)


def _sum_heads(t: torch.Tensor, g: int) -> torch.Tensor:
    """Gradients over H heads ``(B, H, n, D)`` summed back to the G key heads they came from."""
    b, h, n, d = t.shape
    return t if h == g else t.view(b, g, h // g, n, d).sum(2)


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, setup: _Setup, q, k, v, *params):
        rc, plan = setup.ctx, setup.plan
        r, dev = rc.rank, q.device
        st = _stat_dtype(q.dtype)
        b, h, c, _ = q.shape  # k, v: G heads (grouped keys travel as they are)
        acc = torch.zeros(b, h, c, v.shape[-1], dtype=st, device=dev)
        mx = torch.full((b, h, c), float("-inf"), dtype=st, device=dev)
        den = torch.zeros(b, h, c, dtype=st, device=dev)

        def merge(rs, m_t, den_t, acc_t):
            """Fold a tile's max, denominator and weighted values into rows ``rs``."""
            m_new = torch.maximum(mx[:, :, rs], m_t)
            safe = m_new.masked_fill(m_new == float("-inf"), 0.0)
            corr, corr_t = torch.exp(mx[:, :, rs] - safe), torch.exp(m_t - safe)
            den[:, :, rs] = den[:, :, rs] * corr + den_t * corr_t
            acc[:, :, rs] = acc[:, :, rs] * corr[..., None] + acc_t * corr_t[..., None]
            mx[:, :, rs] = m_new

        def fold(j, kj, vj):
            if not plan.needed[r][j]:
                return
            t0 = time.perf_counter()
            for rs, cs, mask, diagonal in _tiles(rc, plan, r, j, setup.side, dev):
                if setup.fused and (mask is None or diagonal):  # PyTorch's kernel: output and log-sum-exp of the tile
                    out_t, lse_t = _FLASH_CPU(q[:, :, rs], _heads(kj[:, :, cs], h), _heads(vj[:, :, cs], h), 0.0, diagonal, scale=setup.scale)
                    merge(rs, lse_t, torch.ones_like(lse_t), out_t)
                    continue
                for sub in setup.row_chunks(rs, cs):
                    s = setup.scores(q[:, :, sub], _heads(kj[:, :, cs], h)).to(st)
                    if mask is not None:
                        s = s.masked_fill(~_rows_of(mask, sub, rs), float("-inf"))
                    m_t = s.amax(-1)
                    p = torch.exp(s - m_t.masked_fill(m_t == float("-inf"), 0.0)[..., None])
                    merge(sub, m_t, p.sum(-1), (p.to(vj.dtype) @ _heads(vj[:, :, cs], h)).to(st))
            if setup.timings is not None:
                setup.timings.compute += time.perf_counter() - t0

        ring = _Ring(rc, setup.timings)
        own = _pack(k, v)
        rounds = plan.rounds
        posted = ring.post(own, own, r + rounds[0][0], r - rounds[0][0], tag=_tag(0, 1, 0)) if rounds else None
        fold(r, k, v)  # this rank's own shard, while the first one travels
        for rnd, (d, hops) in enumerate(rounds):
            if rnd:
                posted = ring.post(own, own, r + d, r - d, tag=_tag(rnd, 1, 0))
            for t in range(1, hops + 1):
                held = ring.wait(posted)
                if t < hops:  # the next shard travels while this one is computed on
                    posted = ring.post(held, held, r + d, r - d, tag=_tag(rnd, t + 1, 0))
                kj, vj = _unpack(held, k, v)
                fold((r - d * t) % rc.world, kj, vj)
                if setup.timings is not None:
                    setup.timings.steps += 1
        lse = mx + torch.log(den)  # -inf for a row that sees no key
        out = torch.where(den[..., None] > 0, acc / den.clamp(min=torch.finfo(st).tiny)[..., None], 0.0).to(v.dtype)
        ctx.setup = setup
        ctx.save_for_backward(q, k, v, out, lse, *params)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out):
        q, k, v, out, lse, *params = ctx.saved_tensors
        setup: _Setup = ctx.setup
        rc, plan = setup.ctx, setup.plan
        r, dev = rc.rank, q.device
        st = _stat_dtype(q.dtype)
        need_params = ctx.needs_input_grad[4:]
        generic = setup.scale is None
        h, kv_heads = q.shape[1], k.shape[1]
        do = grad_out.contiguous()
        delta = (do.to(st) * out.to(st)).sum(-1)  # (B, H, c): rowsum(dO * O)
        lse_safe = lse.masked_fill(lse == float("-inf"), 0.0)
        dq = torch.zeros_like(q, dtype=st)
        dparams: list[torch.Tensor | None] = [None] * len(params)

        def tile_grads(rs, cs, mask, kj, vj, dk, dv):
            """Rows ``rs`` x keys ``cs``, scores written out: FlashAttention's backward for one tile."""
            qt, kt, vt = q[:, :, rs], _heads(kj[:, :, cs], h), _heads(vj[:, :, cs], h)
            if generic:  # autograd through the score; the keys' leaf keeps their G heads
                with torch.enable_grad():
                    qt = qt.detach().requires_grad_(True)
                    kt = kj[:, :, cs].detach().requires_grad_(True)
                    s_graph = setup.score_fn.pairwise(qt, _heads(kt, h))
                s = s_graph.detach().to(st)
            else:
                s = setup.scores(qt, kt).to(st)
            p = torch.exp(s - lse_safe[:, :, rs, None])
            if mask is not None:
                p = p.masked_fill(~mask, 0.0)
            dot = do[:, :, rs].to(st)
            dv[:, :, cs] += _sum_heads(p.transpose(-1, -2) @ dot, kv_heads)
            ds = p * (dot @ vt.to(st).transpose(-1, -2) - delta[:, :, rs, None])
            if not generic:
                dq[:, :, rs] += (ds @ kt.to(st)) * setup.scale
                dk[:, :, cs] += _sum_heads(ds.transpose(-1, -2) @ qt.to(st), kv_heads) * setup.scale
                return
            wrt = [qt, kt] + [p_ for p_, need in zip(params, need_params) if need]
            gs = torch.autograd.grad(s_graph, wrt, ds.to(s_graph.dtype), allow_unused=True)
            if gs[0] is not None:
                dq[:, :, rs] += gs[0]
            if gs[1] is not None:
                dk[:, :, cs] += gs[1]
            it = iter(gs[2:])
            for i, need in enumerate(need_params):
                if need:
                    g = next(it)
                    if g is not None:
                        dparams[i] = g if dparams[i] is None else dparams[i] + g

        def grads(j, kj, vj):
            """This rank's queries' share of shard j's dk, dv (and its dq, score parameters)."""
            dk = torch.zeros_like(kj, dtype=st)
            dv = torch.zeros_like(vj, dtype=st)
            if not plan.needed[r][j]:
                return dk, dv
            t0 = time.perf_counter()
            for rs, cs, mask, diagonal in _tiles(rc, plan, r, j, setup.side, dev):
                if setup.fused and (mask is None or diagonal):  # PyTorch's kernel, given the whole row's output and lse
                    g_q, g_k, g_v = _FLASH_CPU_BACKWARD(do[:, :, rs], q[:, :, rs], _heads(kj[:, :, cs], h), _heads(vj[:, :, cs], h),
                                                       out[:, :, rs], lse[:, :, rs], 0.0, diagonal, scale=setup.scale)
                    dq[:, :, rs] += g_q
                    dk[:, :, cs] += _sum_heads(g_k, kv_heads)
                    dv[:, :, cs] += _sum_heads(g_v, kv_heads)
                    continue
                for sub in setup.row_chunks(rs, cs):
                    tile_grads(sub, cs, None if mask is None else _rows_of(mask, sub, rs), kj, vj, dk, dv)
            if setup.timings is not None:
                setup.timings.compute += time.perf_counter() - t0
            return dk, dv

        ring = _Ring(rc, setup.timings)
        own = _pack(k, v)
        rounds = plan.rounds
        kv_posted = ring.post(own, own, r + rounds[0][0], r - rounds[0][0], tag=_tag(0, 1, 0)) if rounds else None
        dk_own, dv_own = grads(r, k, v)  # this rank's queries against its own shard, while the first one travels
        acc_like = _pack(dk_own, dv_own)
        for rnd, (d, hops) in enumerate(rounds):
            if rnd:
                kv_posted = ring.post(own, own, r + d, r - d, tag=_tag(rnd, 1, 0))
            acc_in = None
            for t in range(1, hops + 1):
                j = (r - d * t) % rc.world
                held = ring.wait(kv_posted)
                if t < hops:
                    kv_posted = ring.post(held, held, r + d, r - d, tag=_tag(rnd, t + 1, 0))
                kj, vj = _unpack(held, k, v)
                dk_j, dv_j = grads(j, kj, vj)
                acc = _pack(dk_j, dv_j)
                if t > 1:  # shard j's accumulators from the rank that held it one step ago
                    acc = acc + ring.wait(acc_in)
                if t < hops:  # on to the next holder, and the accumulators of the next shard in, as one batch
                    acc_in = ring.post(acc, acc_like, r + d, r - d, tag=_tag(rnd, t + 1, 1))
                else:  # the last holder hands the accumulators back to the shard's owner
                    back = ring.wait(ring.post(acc, acc_like, r - d * hops, r + d * hops, tag=_tag(rnd, 0, 2)))
                    dk_back, dv_back = _unpack(back, dk_own, dv_own)
                    dk_own, dv_own = dk_own + dk_back, dv_own + dv_back
                if setup.timings is not None:
                    setup.timings.steps += 1
        return (None, dq.to(q.dtype), dk_own.to(k.dtype), dv_own.to(v.dtype),
                *[None if g is None else g.to(p_.dtype) for g, p_ in zip(dparams, params)])


def _tag(rnd: int, step: int, kind: int) -> int:
    """A message tag unique within one ring call: (round, step, kind) -> int."""
    return (rnd * 1_000_000 + step) * 4 + kind


def ring_attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    group=None,
    positions: torch.Tensor | None = None,
    key_padding: torch.Tensor | None = None,
    causal: bool = False,
    window: int | None = None,
    score: str | Score = "scaled_dot",
    normalize: str = "softmax",
    dropout_p: float = 0.0,
    context: RingContext | None = None,
    block_size: int | None = None,
    timings: RingTimings | None = None,
) -> AttentionResult:
    """Exact softmax attention of this rank's queries over the keys of every rank (ring attention).

    Every rank of ``group`` calls it at once with its shard; the result equals
    ``attnlab.attend`` on the whole sequence, restricted to this rank's queries, forward and
    backward (``dq``, ``dk``, ``dv`` land on the shard that holds them).

    Args:
        q: ``(B, H, c, D)`` this rank's queries (c positions; the same c on every rank).
        k: ``(B, G, c, D)`` this rank's keys, G dividing H (grouped keys travel as G heads and
            are repeated to H per tile, unless the score prepares keys per head).
        v: ``(B, G, c, Dv)`` this rank's values.
        group: the process group of the sequence's shards (None: the default group).
        positions: ``(c,)`` the positions this rank holds (default: the contiguous layout,
            ``rank c .. rank c + c - 1``); see :class:`attnlab.distributed.SequenceLayout`.
        key_padding: ``(B, c)`` bool, True = a real key (False keys are never attended).
        causal: query i attends to keys j <= i (by position).
        window: attend only to keys with ``|i - j| <= window`` (``0 <= i - j <= window`` when
            causal).
        score: a score whose ``pairwise`` acts on prepared vectors (any of
            :func:`attnlab.scores.names`; dot products take the matrix-product path).
        normalize: must be ``"softmax"``: the shards merge by log-sum-exp.
        dropout_p: must be 0 (no dropout on the weights under sequence parallelism).
        context: a :class:`RingContext` built once for many calls (then ``group``,
            ``positions`` and ``key_padding`` come from it).
        block_size: the side of a tile (queries x keys; default :data:`TILE`, at most half a
            shard). Unmasked and plain causal tiles of a dot-product score run on PyTorch's
            fused CPU kernel; other tiles write their scores out :data:`SCORE_ELEMENTS` at a time.
        timings: a :class:`RingTimings` to add this call's compute and wait times to.

    Returns:
        :class:`attnlab.AttentionResult`, ``output`` ``(B, H, c, Dv)`` (weights: None).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor (B, H|G, c, D), got {type(t).__name__}")
    if resolve_normalizer(normalize) is not softmax:
        raise ValueError(f"ring attention merges the shards by log-sum-exp, so it needs normalize='softmax'; got {normalize!r}")
    if dropout_p:
        raise ValueError("ring attention takes no dropout on the weights (dropout_p=0): drop the outputs instead")
    if window is not None:
        window = int_at_least("window", window, 0)
    optional_int("block_size", block_size)
    # the shapes are checked here and the verdict shared, so that every rank raises together
    problem = None
    if any(t.dim() != 4 or not t.is_floating_point() for t in (q, k, v)):
        problem = (f"q, k, v must be floating-point tensors (B, H|G, c, D); got q {tuple(q.shape)} {q.dtype}, "
                   f"k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}")
        q = k = v = q.new_zeros(1, 1, 0, 1, dtype=torch.float32)
    b, h, c, _ = q.shape
    g = k.shape[1]
    if problem is None and (k.shape[0] != b or v.shape[:3] != (b, g, c) or k.shape[2] != c or g == 0 or h % g
                            or not (q.dtype == k.dtype == v.dtype)):
        problem = (f"q, k, v must be this rank's shards (B, H, c, D), (B, G, c, D), (B, G, c, Dv) of one dtype with G "
                   f"dividing H; got q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, v {tuple(v.shape)} {v.dtype}")
    if context is None:
        rank, world, _ = _check_group(group, q.device)
        if positions is None:
            positions = torch.arange(rank * c, (rank + 1) * c, device=q.device)
        context = RingContext.build(positions, key_padding, group=group)
    elif positions is not None or key_padding is not None:
        raise ValueError("give positions and key_padding to RingContext.build, not with context=")
    else:
        _check_group(context.group, q.device)
    if context.world > 1 and q.device.type != "cpu" and _backend(context.group, q.device) == "gloo":
        raise ValueError(f"the gloo backend sends CPU tensors, but q is on {q.device}: use the nccl backend for GPU tensors")
    if problem is None and context.positions.shape[1] != c:
        problem = f"the ring context holds {context.positions.shape[1]} positions per rank, but q holds {c}"
    if problem is None and context.key_valid is not None and context.key_valid.shape[1] != b:
        problem = f"key_padding has batch {context.key_valid.shape[1]}, q has {b}"
    code = _DTYPES.index(q.dtype) if q.dtype in _DTYPES else -1
    meta = torch.tensor([problem is not None, b, h, g, c, q.shape[3], k.shape[3], v.shape[3], code, bool(causal),
                         -1 if window is None else window], dtype=torch.int64)
    every = _all_gather(meta.to(q.device), context.group, context.world).cpu()
    bad = [r for r in range(context.world) if every[r, 0]]
    if bad:
        raise ValueError(problem or f"rank(s) {bad} of the sequence's group gave q, k, v shards that do not fit")
    if not bool((every == meta).all()):
        raise ValueError("the ranks disagree on their shards or the mask rule: (B, H, G, c, D, Dk, Dv, dtype, causal, window) per rank = "
                         + str(every[:, 1:].tolist()))
    score_fn = resolve_score(score)
    if g != h and type(score_fn).prepare is not Score.prepare:  # a score that prepares keys per head: H heads travel
        k, v = k.repeat_interleave(h // g, dim=1), v.repeat_interleave(h // g, dim=1)
    check = getattr(score_fn, "check", None)
    if check is not None:
        check(q, _heads(k, h))
    qp, kp = score_fn.prepare(q, k)  # per-vector work on this rank's shard; the prepared keys travel
    scale = score_fn.dot_scale(qp.shape[-1])
    side = min(block_size or TILE, -(-c // 2))  # at most half a shard: zig-zag's chunks, a causal diagonal's quarters
    plan = context.plan(bool(causal), window)
    params = [p for p in score_fn.parameters() if p.requires_grad] if isinstance(score_fn, torch.nn.Module) and scale is None else []
    setup = _Setup(context, plan, score_fn, scale, side, timings, qp, v)
    return AttentionResult(_RingAttention.apply(setup, qp.contiguous(), kp.contiguous(), v.contiguous(), *params), None)


_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
