"""Ring attention equals single-process attention (outputs and gradients) with 2 and 4 gloo
processes; its layouts, schedules and refusals."""

import pytest
import torch

from attnlab.distributed import RingContext, plan_layout, ring_attend
from attnlab.distributed.ring import _Plan, rule_of
from attnlab.distributed.spawn import spawn

from . import workers

F64, F32 = torch.float64, torch.float32


def _cases():
    cases = []
    for layout in ("contiguous", "zigzag", "striped"):
        for causal, window, padding in ((False, None, False), (False, None, True), (True, None, False), (False, 3, False), (True, 5, True)):
            cases.append(dict(seed=len(cases), dtype=F64, b=2, h=2, n=24, d=4, causal=causal, window=window, padding=padding,
                              layout=layout, block_size=5))
    cases += [
        dict(seed=90, dtype=F32, b=2, h=4, g=2, n=32, d=8, causal=True, window=None, padding=True, layout="zigzag"),  # grouped keys
        dict(seed=95, dtype=F64, b=1, h=4, g=2, n=24, d=4, causal=False, window=None, padding=False, layout="contiguous", block_size=4),
        dict(seed=96, dtype=F64, b=2, h=4, g=1, n=24, d=4, causal=True, window=None, padding=True, layout="zigzag", score="callable"),
        dict(seed=91, dtype=F32, b=1, h=2, n=32, d=8, causal=False, window=6, padding=False, layout="contiguous"),
        dict(seed=92, dtype=F64, b=1, h=2, n=22, d=4, causal=True, window=None, padding=False, layout="zigzag", pad=True),
        dict(seed=93, dtype=F64, b=1, h=2, n=24, d=4, causal=False, window=None, padding=True, layout="contiguous", score="additive"),
        dict(seed=94, dtype=F64, b=1, h=2, n=24, d=4, causal=True, window=None, padding=False, layout="zigzag", score="cosine"),
        dict(seed=97, dtype=F64, b=2, h=2, n=24, d=4, causal=True, window=None, padding=True, layout="zigzag", score_mod="closure",
             block_size=5),  # a learnable bias table captured by a lambda: its gradient summed over the ranks equals attend's
    ]
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_ring_attention_equals_attend_on_the_whole_sequence(world):
    cases = _cases()
    per_rank = spawn(workers.exactness, world, cases)
    for i, case in enumerate(cases):
        worst = max(max(rank[i].values()) for rank in per_rank)
        tol = 1e-10 if case["dtype"] == F64 else 1e-5
        assert worst < tol, (world, case, [rank[i] for rank in per_rank])
    # the weighted scores' parameters got their gradients too, and so did the table the score function captures
    assert all("param0" in rank[-3] and "param0" in rank[-1] for rank in per_rank)


@pytest.mark.slow
def test_odd_and_six_process_rings_including_windows_that_travel_two_hops_each_way():
    cases = [dict(seed=70 + i, dtype=F64, b=1, h=2, n=24, d=4, causal=causal, window=window, padding=padding, layout=layout, block_size=3)
             for i, (causal, window, padding, layout) in enumerate([(False, 5, True, "contiguous"), (True, 6, False, "contiguous"),
                                                                      (True, None, True, "zigzag"), (False, None, False, "striped")])]
    lay = plan_layout(24, 6, "contiguous")
    assert _plan(_ctx(lay, 0), causal=False, window=5).rounds == [(1, 2), (-1, 2)]  # what the first case runs
    for world in (3, 6):
        per_rank = spawn(workers.exactness, world, cases)
        for i, case in enumerate(cases):
            assert max(max(rank[i].values()) for rank in per_rank) < 1e-10, (world, case)


def test_any_mask_over_global_positions_is_a_shard_rule():
    """Documents, prefix-LM, a dilated window, a window with global tokens: rules the ring never
    had before the masks became functions of positions, on every layout, with key padding."""
    cases = [dict(seed=80 + i, dtype=F64, b=2, h=2, n=24, d=4, causal=False, window=None, padding=padding, layout=layout, rule=rule,
                  block_size=4)
             for i, (rule, layout, padding) in enumerate([("documents", "contiguous", False), ("documents", "zigzag", True),
                                                           ("prefix_lm", "striped", False), ("dilated", "zigzag", True),
                                                           ("longformer", "contiguous", True)])]
    for rank in spawn(workers.exactness, 2, cases):
        for case, errs in zip(cases, rank):
            assert max(errs.values()) < 1e-10, (case, errs)


@pytest.mark.parametrize("causal,positional,layout", [(False, "sinusoidal", "contiguous"), (True, "rope", "zigzag"),
                                                      (True, "learned", "zigzag")])
@pytest.mark.slow
def test_a_sharded_encoder_step_equals_one_process(causal, positional, layout):
    for dtype, tol in ((F64, 1e-10), (F32, 1e-5)):
        for rank in spawn(workers.encoder_step, 2, dtype, causal, positional, layout):
            assert rank["out"] < tol and rank["loss"] < tol and rank["grads"] < tol, (dtype, rank)


def test_refusals_that_need_a_process_group():
    msgs = spawn(workers.errors, 2)
    for m in msgs:
        assert "same number of positions" in m["lengths"] and "[4, 5]" in m["lengths"]
        assert "disagree" in m["shapes"]
        assert "point-to-point" in m["backend"] and "ucc-without-p2p" in m["backend"]
        assert "positions per rank, but q holds 5" in m["context"] or "rank(s) [1]" in m["context"]
        assert "disagree" in m["rule"] and "causal" in m["rule"]
        assert "this rank's shards (B, H, c, D)" in m["keys"]
    assert "positions per rank, but q holds 5" in msgs[1]["context"] and "rank(s) [1]" in msgs[0]["context"]


def test_a_group_made_without_a_backend_name_reports_one_per_device(monkeypatch):
    from attnlab.distributed import ring

    monkeypatch.setattr(ring.dist, "get_backend", lambda group=None: "cpu:gloo,cuda:nccl")
    assert ring.backend_of(None, "cpu") == "gloo" and ring.backend_of(None, "cuda") == "nccl"


def test_refusals_without_a_process_group():
    q = torch.randn(1, 2, 4, 4)
    with pytest.raises(RuntimeError, match="torch.distributed initialised"):
        ring_attend(q, q, q)
    with pytest.raises(ValueError, match="normalize='softmax'"):
        ring_attend(q, q, q, normalize="relu")
    with pytest.raises(ValueError, match="no dropout"):
        ring_attend(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="window"):
        ring_attend(q, q, q, window=-1)
    with pytest.raises(TypeError, match=r"score_mod must be a callable \(score, b, h, q_idx, kv_idx\) -> score, got int"):
        ring_attend(q, q, q, score_mod=5)


def test_layouts_partition_the_positions():
    for kind in ("contiguous", "zigzag", "striped"):
        lay = plan_layout(24, 4, kind)
        assert sorted(lay.order().tolist()) == list(range(24))
    assert plan_layout(16, 4, "zigzag").positions(1).tolist() == [2, 3, 12, 13]
    assert plan_layout(16, 4, "striped").positions(1).tolist() == [1, 5, 9, 13]
    with pytest.raises(ValueError, match="does not divide into 4 equal shards.*multiple of 8.*pad it to 24"):
        plan_layout(22, 4, "zigzag")
    lay = plan_layout(22, 4, "zigzag", pad=True)
    assert (lay.length, lay.padded, lay.shard_len) == (22, 24, 6)
    with pytest.raises(ValueError, match="layout must be one of"):
        plan_layout(8, 2, "diagonal")


def _ctx(layout, rank):
    return RingContext(None, rank, layout.world, list(range(layout.world)), torch.stack([layout.positions(r) for r in range(layout.world)]))


def _plan(ctx, causal, window, block=None):
    """The ring plan of a causal / window rule (batch 1, one head)."""
    return _Plan.make(ctx, rule_of(causal, window), 1, 1, block)


def test_a_window_over_the_contiguous_layout_talks_to_the_neighbours_only():
    lay = plan_layout(64, 4, "contiguous")
    plan = _plan(_ctx(lay, 0), causal=False, window=5)
    assert plan.rounds == [(1, 1), (-1, 1)]  # one hop each way, not three
    assert _plan(_ctx(lay, 0), causal=True, window=5).rounds == [(1, 1)]
    assert _plan(_ctx(lay, 0), causal=False, window=None).rounds == [(1, 3)]
    assert _plan(_ctx(lay, 0), causal=False, window=40).rounds == [(1, 3)]


def _work(layout, causal):
    """Score elements each rank computes over the whole ring (tiles the rule forbids are skipped):
    the non-empty 8 x 8 tiles of its block maps."""
    out = []
    for r in range(layout.world):
        plan = _plan(_ctx(layout, r), causal=causal, window=None, block=8)
        out.append(sum(int(bm.count.sum()) * 64 for bm in plan.maps if bm is not None))
    return out


def test_zigzag_balances_causal_work_and_contiguous_does_not():
    n, p = 64, 4
    zig = _work(plan_layout(n, p, "zigzag"), causal=True)
    contiguous = _work(plan_layout(n, p, "contiguous"), causal=True)
    assert len(set(zig)) == 1  # every rank computes the same number of scores
    assert max(contiguous) == 5 * min(contiguous)  # the last rank: 3 full shards and its own causal third
    assert sum(zig) < n * n  # and skipped tiles save work overall


def test_bad_input_to_the_sharding_helpers():
    from attnlab.distributed import ShardedMask, parallelize, shard
    from attnlab.distributed.spawn import spawn as spawn_

    lay = plan_layout(8, 2)
    with pytest.raises(ValueError, match="rank must be in \\[0, 2\\), got 2"):
        lay.positions(2)
    with pytest.raises(ValueError, match="x has 7 positions along dim 1, the layout 8"):
        shard(torch.zeros(1, 7), lay, 0)
    padded = shard(torch.ones(1, 7), plan_layout(7, 2, pad=True), 1, fill=-1)
    assert padded.tolist() == [[1, 1, 1, -1]]  # the padding is filled, not invented from the data
    with pytest.raises(ValueError, match="world must be a positive int"):
        spawn_(print, 0)
    with pytest.raises(ValueError, match="sequence parallelism runs the 'transformer' token backbone"):
        parallelize(torch.nn.Linear(2, 2), None)
    with pytest.raises(ValueError, match="world \\(the number of ranks\\)"):
        plan_layout(8, 0)
    with pytest.raises(ValueError, match="sequence length must be a positive int"):
        plan_layout(0, 2)

    from attnlab import MultiHeadAttention, efficient

    ctx = _ctx(lay, 0)
    sharded = ShardedMask(ctx)
    x = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match="not exact dense attention"):
        efficient.create("linear", embed_dim=8, num_heads=2)(x, mask=sharded)
    with pytest.raises(RuntimeError, match="torch.distributed initialised"):  # a pattern is exact: it goes to the ring
        efficient.create("local", embed_dim=8, num_heads=2, window=2)(x, mask=sharded)
    with pytest.raises(ValueError, match="score function 'alibi.*' is built for one process's positions"):
        MultiHeadAttention(8, 2, positional="alibi")(x, mask=sharded)
    with pytest.raises(ValueError, match="dropout 0 under sequence parallelism"):
        MultiHeadAttention(8, 2, dropout=0.1).train()(x, mask=sharded)
    with pytest.raises(ValueError, match="takes self-attention alone"):
        MultiHeadAttention(8, 2)(x, x, mask=sharded)
    assert ShardedMask(ctx, length=7).encoding_positions.tolist() == [0, 1, 2, 3]
    assert ShardedMask(_ctx(lay, 1), length=7).encoding_positions.tolist() == [4, 5, 6, 6]  # padding held at N - 1


def test_plot_ring_refuses_an_empty_report(tmp_path):
    from attnlab.viz.ring import plot_ring

    with pytest.raises(ValueError, match="nothing to plot"):
        plot_ring({"records": []}, tmp_path / "x.png")
