"""Property tests over the mask library: every mask function of :data:`attnlab.masks.LIBRARY`
(alone, or combined with another by & or |) x every score x every normaliser, at random shapes
(N != M where the mask allows it) and random tile shapes, computed block-sparse, equals the
float64 reference under the same mask made dense (outputs and q, k, v gradients, < 1e-10);
and the block map of every mask has exactly the tile states its pairs give.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from attnlab import attend, masks, reference_attention
from attnlab.core import normalize as normalizers
from attnlab.core import scores
from attnlab.core.maskfn import EMPTY, FULL, PARTIAL


def _lengths(draw, b, m, low=0):
    return draw(st.lists(st.integers(low, m), min_size=b, max_size=b))


EXAMPLES = {
    # name -> (square: needs N = M, draw(draw, b, n, m) -> a mask)
    "full": (False, lambda d, b, n, m: masks.full()),
    "causal": (False, lambda d, b, n, m: masks.causal(align=d(st.sampled_from(["bottom_right", "top_left"])))),
    "window": (False, lambda d, b, n, m: masks.window(d(st.integers(0, 6)), causal=d(st.booleans()))),
    "dilated_window": (False, lambda d, b, n, m: masks.dilated_window(d(st.integers(0, 9)), d(st.integers(1, 3)), causal=d(st.booleans()))),
    "no_self": (False, lambda d, b, n, m: masks.no_self()),
    "padding": (False, lambda d, b, n, m: masks.padding(_lengths(d, b, m))),
    "valid_keys": (False, lambda d, b, n, m:
                   masks.valid_keys(torch.rand(b, m, generator=torch.Generator().manual_seed(d(st.integers(0, 99)))) > 0.3)),
    "prefix_lm": (False, lambda d, b, n, m: masks.prefix_lm(d(st.integers(0, m)) if d(st.booleans()) else _lengths(d, b, m))),
    "global_tokens": (False, lambda d, b, n, m: masks.global_tokens(d(st.integers(0, 3)) if d(st.booleans())
                                                                    else d(st.lists(st.integers(0, 20), max_size=3)))),
    "Documents": (True, lambda d, b, n, m: masks.Documents(_docs(d, b, n), causal=d(st.booleans()),
                                                           window=d(st.sampled_from([None, 0, 2])))),
    "block_table": (False, lambda d, b, n, m:
                    masks.block_table(torch.rand(4, 4, generator=torch.Generator().manual_seed(d(st.integers(0, 99)))) > 0.5,
                                      d(st.integers(1, 5)))),
    "random_blocks": (False, lambda d, b, n, m: masks.random_blocks(d(st.integers(0, 3)), d(st.integers(1, 5)), seed=d(st.integers(0, 9)),
                                                                    causal=d(st.booleans()))),
    "graph": (True, lambda d, b, n, m: masks.graph(torch.randint(0, max(n, 1), (2, 3 * n),
                                                                 generator=torch.Generator().manual_seed(d(st.integers(0, 99)))), n,
                                                    add_self_loops=d(st.booleans()))),
}


def _docs(draw, b, n):
    rows = []
    for _ in range(b):
        row, left = [], draw(st.integers(1, n)) if n else 0
        while left > 0:
            row.append(draw(st.integers(1, left)))
            left -= row[-1]
        rows.append(row or [1])
    return rows


def test_every_library_mask_has_an_example():
    assert sorted(EXAMPLES) == masks.names()


@st.composite
def mask_problems(draw):
    b, h = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    name = draw(st.sampled_from(masks.names()))
    square, make = EXAMPLES[name]
    n = draw(st.integers(1, 19))
    m = n if square else draw(st.integers(1, 19))
    mask = make(draw, b, n, m)
    other = draw(st.sampled_from([None, "and", "or"]))
    if other is not None:
        extra = masks.window(draw(st.integers(0, 4))) if draw(st.booleans()) else masks.padding(_lengths(draw, b, m))
        mask = mask & extra if other == "and" else mask | extra
    block = (draw(st.integers(1, 6)), draw(st.integers(1, 6)))
    return b, h, n, m, mask, block, draw(st.integers(0, 2**31 - 1))


@given(mask_problems(), st.sampled_from(scores.names()), st.sampled_from(normalizers.names()))
def test_every_mask_function_with_every_score_and_normaliser_equals_the_float64_reference(problem, score_name, norm):
    b, h, n, m, mask, block, seed = problem
    g = torch.Generator().manual_seed(seed)
    d = 4
    q, k, v = (torch.randn(b, h, x, d, generator=g, dtype=torch.float64, requires_grad=True) for x in (n, m, m))
    score = score_name
    if score_name in ("additive", "bilinear"):
        torch.manual_seed(seed % 1000)
        score = scores.create(score_name, head_dim=d, num_heads=h).double()
    dense = mask.dense(n, m, batch=b)
    ref, ref_w = reference_attention(q, k, v, score=score, normalize=norm, mask=dense)
    out = attend(q, k, v, score=score, normalize=norm, mask=mask, block_size=block, backend="chunked").output
    assert (out - ref).abs().max() < 1e-10, f"{mask!r} {score_name}/{norm} block {block}"
    upstream = torch.randn(out.shape, generator=g, dtype=torch.float64)
    if not ref.requires_grad:
        return
    got = torch.autograd.grad(out, (q, k, v), upstream, allow_unused=True)
    want = torch.autograd.grad(ref, (q, k, v), upstream, allow_unused=True)
    for what, a, r in zip("qkv", got, want):
        a = torch.zeros(1, dtype=torch.float64) if a is None else a
        r = torch.zeros(1, dtype=torch.float64) if r is None else r
        assert (a - r).abs().max() < 1e-10, f"grad {what}: {mask!r} {score_name}/{norm} block {block}"
    weights = attend(q, k, v, score=score, normalize=norm, mask=mask, block_size=block, return_weights=True).weights
    assert (weights - ref_w).abs().max() < 1e-10


@given(mask_problems())
def test_every_block_map_has_exactly_the_tile_states_of_its_pairs(problem):
    b, h, n, m, mask, (bq, bk), _ = problem
    bm = masks.block_map(mask, n, m, batch=b, heads=h, block_size=(bq, bk))
    dense = mask.dense(n, m, batch=b, heads=h)
    dense = dense.reshape((1,) * (4 - dense.dim()) + tuple(dense.shape)).expand(b, h, n, m)
    nq, nk = bm.shape
    got = bm.rows(0, nq).expand(b, h, nq, nk)
    for i in range(nq):
        for j in range(nk):
            tile = dense[:, :, i * bq : (i + 1) * bq, j * bk : (j + 1) * bk]
            want = torch.where(tile.all(-1).all(-1), FULL, torch.where(tile.any(-1).any(-1), PARTIAL, EMPTY))
            assert torch.equal(got[:, :, i, j], want.to(torch.uint8)), (mask, i, j)
