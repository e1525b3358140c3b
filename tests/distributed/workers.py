"""What each rank runs in the ring-attention tests (module-level, so spawned processes import it)."""

import torch
import torch.distributed as dist

from attnlab import attend, masks, scores
from attnlab.distributed import RingContext, plan_layout, ring_attend, shard


def half_dot(q, k):
    """A score given as a plain callable (not a dot product attnlab recognises)."""
    return 0.5 * q @ k.transpose(-1, -2)


def full_mask(n, causal, window, valid):
    """The dense (B, 1, N, N) mask of the rule, for the single-process reference."""
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    rule = torch.ones(n, n, dtype=torch.bool)
    if causal:
        rule &= j <= i
    if window is not None:
        rule &= (i - j).abs() <= window
    mask = rule[None, None]
    if valid is not None:
        mask = mask & valid[:, None, None, :]
    return mask


RULES = {
    "documents": lambda n: masks.Documents([5, 9, n - 14], causal=True),
    "prefix_lm": lambda n: masks.prefix_lm(7),
    "dilated": lambda n: masks.dilated_window(6, 2) & masks.causal(),
    "longformer": lambda n: masks.window(2) | masks.global_tokens([0, 11]),
}
"""Shard rules given as masks over global positions (ring_attend(mask=...))."""


def exactness(cases):
    """For each case: max |ring - attend| of the output and dq, dk, dv, on this rank's shard."""
    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for case in cases:
        torch.manual_seed(case["seed"])
        dtype = case["dtype"]
        b, h, g, n, d = case["b"], case["h"], case.get("g", case["h"]), case["n"], case["d"]
        q = torch.randn(b, h, n, d, dtype=dtype)
        k = torch.randn(b, g, n, d, dtype=dtype)
        v = torch.randn(b, g, n, d, dtype=dtype)
        grad = torch.randn(b, h, n, d, dtype=dtype)
        valid = None
        if case.get("padding"):
            lengths = torch.randint(1, n + 1, (b,))
            lengths[0] = n  # one full row, one padded
            valid = torch.arange(n)[None, :] < lengths[:, None]
        mask = full_mask(n, case["causal"], case["window"], valid)
        rule = RULES[case["rule"]](n) if case.get("rule") else None  # a mask over global positions
        if rule is not None:
            mask = rule.dense(n)[None, None] & mask
        device = case.get("device", "cpu")  # drawn on CPU, then moved: the same numbers on every device
        q, k, v, grad, mask = (t.to(device) for t in (q, k, v, grad, mask))
        valid = None if valid is None else valid.to(device)
        score = case.get("score", "scaled_dot")
        if score in ("additive", "bilinear", "cosine"):  # a score with weights: the same on every rank
            torch.manual_seed(99)
            score = scores.create(score, head_dim=d, num_heads=h).to(dtype).to(device)
        elif score == "callable":  # a plain function of q, k: autograd through it, grouped keys kept at G heads
            score = half_dot
        mod = None
        params = list(score.parameters()) if isinstance(score, torch.nn.Module) else []
        if case.get("score_mod") == "closure":  # a relative bias table captured by a lambda: FlexAttention's idiom
            torch.manual_seed(98)
            table = torch.randn(h, 2 * n - 1, dtype=dtype, device=device, requires_grad=True)
            mod = lambda s, b_, h_, qi, ki: s + table[h_, qi - ki + n - 1]  # noqa: E731, B023 (used in this iteration)
            params.append(table)
        # the reference: the whole sequence in this one process
        qf, kf, vf = (t.clone().requires_grad_(True) for t in (q, k, v))
        ref = attend(qf, kf, vf, mask=mask, score=score, score_mod=mod).output
        ref.backward(grad)
        ref_pgrads = [p.grad.clone() for p in params]
        for p in params:
            p.grad = None
        layout = plan_layout(n, world, case["layout"], pad=case.get("pad", False))
        ql, kl, vl = (shard(t, layout, rank, dim=2).clone().requires_grad_(True) for t in (q, k, v))
        vmask = None if valid is None else shard(valid, layout, rank, dim=1, fill=False)
        if layout.padded != n:
            vmask = shard(torch.ones(b, n, dtype=torch.bool, device=device) if valid is None else valid, layout, rank, dim=1, fill=False)
        ctx = RingContext.build(layout.positions(rank, device=device), vmask)
        rule_args = {"mask": rule} if rule is not None else {"causal": case["causal"], "window": case["window"]}
        res = ring_attend(ql, kl, vl, context=ctx, score=score, block_size=case.get("block_size"), score_mod=mod, **rule_args)
        res.output.backward(shard(grad, layout, rank, dim=2))
        pos = layout.positions(rank, device=device)
        real = pos < n  # padded positions have no reference
        errs = {}
        for name, mine, full in (("out", res.output, ref), ("dq", ql.grad, qf.grad), ("dk", kl.grad, kf.grad), ("dv", vl.grad, vf.grad)):
            errs[name] = float((mine.detach()[:, :, real] - full.detach()[:, :, pos[real]]).abs().max())
        for i, p in enumerate(params):  # each rank holds its queries' share of the weights' gradient
            total = p.grad.clone() if p.grad is not None else torch.zeros_like(p)
            dist.all_reduce(total)
            errs[f"param{i}"] = float((total - ref_pgrads[i]).abs().max())
        out.append(errs)
    return out


def encoder_step(dtype, causal, positional, layout_kind):
    """An Encoder's loss and parameter gradients on the whole sequence in this process, and
    sharded over the group (gradients averaged over the ranks): their largest differences."""
    from attnlab.distributed import ShardedMask, gather
    from attnlab.models import Encoder

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    b, n, e = 2, 21, 16  # 21 positions: padded to a multiple of the shards
    enc = Encoder(e, 4, 2, positional=positional, causal=causal, max_len=n).to(dtype)
    x = torch.randn(b, n, e, dtype=dtype)
    target = torch.randn(b, n, e, dtype=dtype)
    valid = torch.ones(b, n, dtype=torch.bool)
    valid[1, 13:] = False  # the second row is padded
    out = enc(x, mask=valid[:, None, None, :]).output
    loss = ((out - target) ** 2 * valid[..., None]).mean()
    loss.backward()
    ref = {k: p.grad.clone() for k, p in enc.named_parameters()}
    enc.zero_grad(set_to_none=True)
    layout = plan_layout(n, world, layout_kind, pad=True)
    ctx = RingContext.build(layout.positions(rank), shard(valid, layout, rank, fill=False))
    mine = enc(shard(x, layout, rank), mask=ShardedMask(ctx, length=n)).output
    full = gather(mine, layout)
    loss_sp = ((full - target) ** 2 * valid[..., None]).mean()
    loss_sp.backward()
    worst = 0.0
    for k, p in enc.named_parameters():
        g = p.grad.clone()
        dist.all_reduce(g)
        worst = max(worst, float((g / world - ref[k]).abs().max()))
    return {"loss": abs(float(loss_sp) - float(loss)), "grads": worst, "out": float((full - out).abs().max())}


def errors():
    """The messages of the refusals that need a live process group."""
    rank = dist.get_rank()
    msgs = {}
    q = torch.randn(1, 2, 4 + rank, 4)  # rank 1 holds more positions than rank 0
    try:
        ring_attend(q, q, q)
    except ValueError as err:
        msgs["lengths"] = str(err)
    q = torch.randn(1, 2 + 2 * rank, 4, 4)  # the ranks disagree on the heads
    try:
        ring_attend(q, q, q)
    except ValueError as err:
        msgs["shapes"] = str(err)
    q = torch.randn(1, 2, 4, 4)
    ctx = RingContext.build(torch.arange(rank * 4, rank * 4 + 4))
    try:  # one context for all, but rank 1's queries hold 5 positions
        ring_attend(torch.randn(1, 2, 4 + rank, 4), torch.randn(1, 2, 4 + rank, 4), torch.randn(1, 2, 4 + rank, 4), context=ctx)
    except ValueError as err:
        msgs["context"] = str(err)
    try:  # the ranks disagree on the rule
        ring_attend(q, q, q, context=ctx, causal=rank == 0)
    except ValueError as err:
        msgs["rule"] = str(err)
    try:  # keys of another length than the queries, on every rank
        ring_attend(q, q[:, :, :3], q)
    except ValueError as err:
        msgs["keys"] = str(err)
    import attnlab.distributed.ring as ring

    real = ring.dist.get_backend
    ring.dist.get_backend = lambda group=None: "ucc-without-p2p"
    try:
        q = torch.randn(1, 2, 4, 4)
        ring_attend(q, q, q)
    except RuntimeError as err:
        msgs["backend"] = str(err)
    finally:
        ring.dist.get_backend = real
    return msgs
