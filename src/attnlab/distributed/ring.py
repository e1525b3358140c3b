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
sequence: nothing of size N, and scores only one chunk of tiles at a time.

The shard rule is a mask over global positions (any :mod:`attnlab.masks` rule: causal,
windows, documents, ...; plus key padding, flags that travel with the keys), so it holds for
any layout. Each pair of this rank's queries and one shard's keys is a block map of the rule
evaluated at their positions, computed by the same block-sparse engine as
:func:`attnlab.attend` (:mod:`attnlab.core.sparse`): tiles that the rule forbids are skipped,
tiles it allows entirely take no mask, and steps that no rank needs are not taken: with a
window and the contiguous layout only neighbouring ranks exchange shards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..core import masks
from ..core.amp import same_autocast_backward, same_autocast_forward
from ..core.attend import AttentionResult, learned_params
from ..core.blockmap import BlockMap, block_map
from ..core.maskfn import as_mask
from ..core.normalize import resolve_normalizer, softmax
from ..core.positioned import Positioned
from ..core.scores import Score, resolve_score
from ..core.sparse import FUSED, SparseSetup, chunk_limits, pad_inputs, sparse_backward, sparse_forward
from ..core.sparse_setup import stat_dtype
from ..validate import ArgumentTypeError, int_at_least, optional_int
from .context import RingContext, RingTimings, backend_of, check_group, gather_all

__all__ = ["RingContext", "RingTimings", "ring_attend", "rule_of"]


def rule_of(causal: bool = False, window: int | None = None):
    """The shard rule of ``causal`` / ``window`` as a mask over positions (None: every pair)."""
    if window is not None:
        return masks.window(window, causal=causal, align="top_left")
    return masks.causal(align="top_left") if causal else None


def _plan_of(ctx: RingContext, rule, batch: int, heads: int, block_size) -> _Plan:
    """The ring schedule and the block maps of a mask rule over global positions, kept in the
    context (every layer of a forward uses the same)."""
    key = (id(rule), batch, heads, block_size)
    # the rule kept alive with its key
    return ctx.cached(key, lambda: (rule, _Plan.make(ctx, rule, batch, heads, block_size)))[1]


@dataclass
class _Plan:
    """A ring schedule: ``rounds`` of ``(direction, hops)``, which shard pairs some tile of
    needs (``needed[r][j]``), and this rank's block map against each shard (None: not needed)."""

    rounds: list[tuple[int, int]]
    needed: list[list[bool]]
    maps: list[BlockMap | None]

    @classmethod
    def make(cls, ctx: RingContext, rule, batch: int, heads: int, block_size) -> _Plan:
        p, pos = ctx.world, ctx.positions
        c = pos.shape[1]
        total = p * c
        # a rule drawn for a size draws for the whole sequence
        bound = None if rule is None else as_mask(rule).bind(total, total)

        def pair(r, j, block):
            mk = None if bound is None else Positioned(bound, pos[r], pos[j])
            if ctx.key_valid is not None:
                flags = masks.valid_keys(ctx.key_valid[j].to(pos.device))
                mk = flags if mk is None else mk & flags
            return block_map(mk if mk is not None else masks.full(), c, c, batch=batch, heads=heads,
                             block_size=block, device=pos.device)

        # which shards some rank needs: one tile per pair of shards (the same verdict on every rank);
        # this rank's pairs in tiles, to compute
        needed = [[bool((pair(r, j, max(c, 1)).count > 0).any()) for j in range(p)] for r in range(p)]
        maps = []
        for j in range(p):
            bm = pair(ctx.rank, j, block_size) if needed[ctx.rank][j] else None
            maps.append(bm if bm is not None and bool((bm.count > 0).any()) else None)
        # the hops s (shard r - s reaching rank r) that some rank needs
        hops = [s for s in range(1, p) if any(needed[r][(r - s) % p] for r in range(p))]
        best = None
        # hops <= a go one way (receive from the left), the rest the other way; ties: one way
        for a in reversed(range(p)):
            fwd = max([s for s in hops if s <= a], default=0)
            back = max([p - s for s in hops if s > a], default=0)
            if best is None or fwd + back < best[0]:
                best = (fwd + back, fwd, back)
        _, fwd, back = best
        return cls([(d, n) for d, n in ((1, fwd), (-1, back)) if n], needed, maps)


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



def _heads(t: torch.Tensor, h: int) -> torch.Tensor:
    """Grouped keys or values ``(B, G, n, D)`` repeated to H heads (key head g serves query heads
    ``g H/G .. (g+1) H/G - 1``); unchanged when G = H."""
    return t if t.shape[1] == h else t.repeat_interleave(h // t.shape[1], dim=1)


def _sum_heads(t: torch.Tensor, g: int) -> torch.Tensor:
    """Gradients over H heads ``(B, H, n, D)`` summed back to the G key heads they came from."""
    b, h, n, d = t.shape
    return t if h == g else t.view(b, g, h // g, n, d).sum(2)


class _Setup:
    """The non-tensor arguments of one ring call, and one engine setup per shard."""

    def __init__(self, ctx: RingContext, plan: _Plan, score_fn, scale, timings, q, v, params, score_mod=None):
        self.ctx, self.plan, self.score_fn, self.scale, self.timings = ctx, plan, score_fn, scale, timings
        self.params, self.score_mod = params, score_mod
        self.fused = (FUSED and scale is not None and score_mod is None and q.device.type == "cpu"
                      and v.shape[-1] == q.shape[-1]
                      and q.dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16))
        self.b, self.h = q.shape[:2]

    def engine(self, j: int) -> SparseSetup | None:
        """The block-sparse setup of this rank's queries against shard j (None: not needed)."""
        bm = self.plan.maps[j]
        if bm is None:
            return None
        kind = "fused" if self.fused else "softmax"
        return SparseSetup(bm, bm.chunks(*chunk_limits(kind, bm, self.b, self.h, self.score_fn)), self.b, self.h,
                           self.score_fn, softmax, self.global_mod(j), self.scale, kind, params=self.params)

    def global_mod(self, j: int):
        """The score function on this rank's queries against shard j, called with global
        positions (the engine's indices are the shards' own: 0 .. c-1)."""
        if self.score_mod is None:
            return None
        mod, positions = self.score_mod, self.ctx.positions
        q_at, k_at = positions[self.ctx.rank], positions[j]

        def at_positions(s, b, h, q_idx, kv_idx):
            return mod(s, b, h, q_at.to(q_idx.device)[q_idx], k_at.to(kv_idx.device)[kv_idx])

        return at_positions


class _RingAttention(torch.autograd.Function):
    @staticmethod
    @same_autocast_forward
    def forward(ctx, setup: _Setup, q, k, v, *params):
        rc, plan = setup.ctx, setup.plan
        r = rc.rank
        st = stat_dtype(q.dtype)
        b, h, c, _ = q.shape  # k, v: G heads (grouped keys travel as they are)
        acc = torch.zeros(b * h, c, v.shape[-1], dtype=st, device=q.device)
        lse = torch.full((b * h, c), float("-inf"), dtype=st, device=q.device)

        def fold(j, kj, vj):
            eng = setup.engine(j)
            if eng is None:
                return
            t0 = time.perf_counter()
            qp, kp, vp = pad_inputs(eng, q, _heads(kj, h), _heads(vj, h))
            out_j, lse_j = sparse_forward(eng, qp, kp, vp)
            out_j, lse_j = out_j[:, :c].to(st), lse_j[:, :c]
            new = torch.logaddexp(lse, lse_j)
            safe = new.masked_fill(new == float("-inf"), 0.0)
            acc.mul_(torch.exp(lse - safe)[..., None]).add_(out_j * torch.exp(lse_j - safe)[..., None])
            lse.copy_(new)
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
        out = acc.to(v.dtype).view(b, h, c, -1)  # rows that see no key stayed 0
        ctx.setup = setup
        ctx.save_for_backward(q, k, v, out, lse, *params)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    @same_autocast_backward
    def backward(ctx, grad_out):
        q, k, v, out, lse, *params = ctx.saved_tensors
        setup: _Setup = ctx.setup
        rc, plan = setup.ctx, setup.plan
        r = rc.rank
        b, h, c, width = q.shape
        kv_heads = k.shape[1]
        do = grad_out.contiguous()
        dq = torch.zeros_like(q)
        dparams: list[torch.Tensor | None] = [None] * len(params)

        def grads(j, kj, vj):
            """This rank's queries' share of shard j's dk, dv (and its dq, score parameters)."""
            dk, dv = torch.zeros_like(kj), torch.zeros_like(vj)
            eng = setup.engine(j)
            if eng is None:
                return dk, dv
            t0 = time.perf_counter()
            qp, kp, vp = pad_inputs(eng, q, _heads(kj, h), _heads(vj, h))
            nq = qp.shape[1]
            pad_rows = lambda x: (torch.nn.functional.pad(x, (0, 0, 0, nq - c)) if x.dim() == 3  # noqa: E731
                                  else torch.nn.functional.pad(x, (0, nq - c)))
            need = (True, True, True, False)
            g_q, g_k, g_v, _, g_p = sparse_backward(eng, pad_rows(do.reshape(b * h, c, -1)), qp, kp, vp,
                                                    pad_rows(out.reshape(b * h, c, -1)), pad_rows(lse), None, need)
            dq.add_(g_q[:, :c].reshape(b, h, c, width))
            dk.add_(_sum_heads(g_k[:, :c].reshape(b, h, c, -1), kv_heads))
            dv.add_(_sum_heads(g_v[:, :c].reshape(b, h, c, -1), kv_heads))
            for i, g in enumerate(g_p):
                if g is not None:
                    dparams[i] = g if dparams[i] is None else dparams[i] + g
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
        return (None, dq, dk_own, dv_own, *[None if g is None else g.to(p_.dtype) for g, p_ in zip(dparams, params)])


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
    key_valid: torch.Tensor | None = None,
    causal: bool = False,
    window: int | None = None,
    score: str | Score = "scaled_dot",
    normalize: str = "softmax",
    dropout_p: float = 0.0,
    context: RingContext | None = None,
    block_size: int | None = None,
    timings: RingTimings | None = None,
    mask=None,
    score_mod=None,
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
        key_valid: ``(B, c)`` bool, True = a real key (False keys are never attended).
        causal: query i attends to keys j <= i (by position).
        window: attend only to keys with ``|i - j| <= window`` (``0 <= i - j <= window`` when
            causal).
        mask: the rule as a mask over global positions (:mod:`attnlab.masks`: documents,
            prefix-LM, dilated windows, ...), instead of ``causal`` / ``window``.
        score: a score whose ``pairwise`` acts on prepared vectors (any of
            :func:`attnlab.scores.names`; dot products take the matrix-product path).
        normalize: must be ``"softmax"``: the shards merge by log-sum-exp.
        dropout_p: must be 0 (no dropout on the weights under sequence parallelism).
        context: a :class:`RingContext` built once for many calls (then ``group``,
            ``positions`` and ``key_valid`` come from it).
        block_size: the tile of the block maps (default :data:`attnlab.masks.DEFAULT_BLOCK`). A
            dot-product score runs on PyTorch's fused CPU kernel; other scores write their scores
            out one chunk at a time.
        timings: a :class:`RingTimings` to add this call's compute and wait times to.
        score_mod: a score function ``(score, b, h, q_idx, kv_idx) -> score`` called with global
            positions (as :func:`attnlab.attend` calls it on the whole sequence); the tensors it
            learns get their gradients as there (each rank its queries' share).

    Returns:
        :class:`attnlab.AttentionResult`, ``output`` ``(B, H, c, Dv)`` (weights: None).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ArgumentTypeError(f"{name} must be a torch.Tensor (B, H|G, c, D), got {type(t).__name__}")
    if resolve_normalizer(normalize) is not softmax:
        raise ValueError("ring attention merges the shards by log-sum-exp, so it needs normalize='softmax'; "
                         f"got {normalize!r}")
    if dropout_p:
        raise ValueError("ring attention takes no dropout on the weights (dropout_p=0): drop the outputs instead")
    if window is not None:
        window = int_at_least("window", window, 0)
    if mask is not None and (causal or window is not None):
        raise ValueError("give the rule as mask= or as causal= / window=, not both")
    rule = rule_of(bool(causal), window) if mask is None else as_mask(mask)
    if score_mod is not None and not callable(score_mod):
        raise ArgumentTypeError("score_mod must be a callable (score, b, h, q_idx, kv_idx) -> score, got "
                                f"{type(score_mod).__name__}")
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
                   f"dividing H; got q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} {k.dtype}, v "
                   f"{tuple(v.shape)} {v.dtype}")
    if context is None:
        rank, world, _ = check_group(group, q.device)
        if positions is None:
            positions = torch.arange(rank * c, (rank + 1) * c, device=q.device)
        context = RingContext.build(positions, key_valid, group=group)
    elif positions is not None or key_valid is not None:
        raise ValueError("give positions and key_valid to RingContext.build, not with context=")
    else:
        check_group(context.group, q.device)
    if context.world > 1 and q.device.type != "cpu" and backend_of(context.group, q.device) == "gloo":
        raise ValueError(f"the gloo backend sends CPU tensors, but q is on {q.device}: use the nccl "
                         "backend for GPU tensors")
    if problem is None and context.positions.shape[1] != c:
        problem = f"the ring context holds {context.positions.shape[1]} positions per rank, but q holds {c}"
    if problem is None and context.key_valid is not None and context.key_valid.shape[1] != b:
        problem = f"key_valid has batch {context.key_valid.shape[1]}, q has {b}"
    code = _DTYPES.index(q.dtype) if q.dtype in _DTYPES else -1
    meta = torch.tensor([problem is not None, b, h, g, c, q.shape[3], k.shape[3], v.shape[3], code, bool(causal),
                         -1 if window is None else window, len(repr(rule)), score_mod is not None], dtype=torch.int64)
    every = gather_all(meta.to(q.device), context.group, context.world).cpu()
    bad = [r for r in range(context.world) if every[r, 0]]
    if bad:
        raise ValueError(problem or f"rank(s) {bad} of the sequence's group gave q, k, v shards that do not fit")
    if not bool((every == meta).all()):
        raise ValueError("the ranks disagree on their shards or the mask rule: (B, H, G, c, D, Dk, Dv, dtype, causal, "
                         "window, rule) (and whether a score function is given) per rank = "
                         + str(every[:, 1:].tolist()))
    score_fn = resolve_score(score)
    if g != h and type(score_fn).prepare is not Score.prepare:  # a score that prepares keys per head: H heads travel
        k, v = k.repeat_interleave(h // g, dim=1), v.repeat_interleave(h // g, dim=1)
    check = getattr(score_fn, "check", None)
    if check is not None:
        check(q, _heads(k, h))
    qp, kp = score_fn.prepare(q, k)  # per-vector work on this rank's shard; the prepared keys travel
    scale = score_fn.dot_scale(qp.shape[-1])
    plan = _plan_of(context, rule, b, h, block_size)
    params = learned_params(score_fn, score_mod, q.dtype, q.device)
    setup = _Setup(context, plan, score_fn, scale, timings, qp, v, params, score_mod)
    return AttentionResult(_RingAttention.apply(setup, qp.contiguous(), kp.contiguous(), v.contiguous(), *params), None)


_DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
