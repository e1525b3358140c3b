"""Mask functions against their definitions, written out element by element."""

import pytest
import torch

from attnlab import masks


def by_rule(n, m, rule):
    return torch.tensor([[rule(i, j) for j in range(m)] for i in range(n)], dtype=torch.bool).reshape(n, m)


@pytest.mark.parametrize("n,m", [(5, 5), (3, 6), (6, 3), (1, 1), (0, 4), (4, 0)])
def test_causal_bottom_right_alignment(n, m):
    assert torch.equal(masks.causal().dense(n, m), by_rule(n, m, lambda i, j: j <= i + (m - n)))


@pytest.mark.parametrize("n,m", [(5, 5), (3, 6), (6, 3)])
def test_causal_top_left_alignment_matches_sdpa_is_causal(n, m):
    assert torch.equal(masks.causal(align="top_left").dense(n, m), by_rule(n, m, lambda i, j: j <= i))
    # and it is what scaled_dot_product_attention(is_causal=True) computes
    q, k, v = torch.randn(1, 1, n, 4), torch.randn(1, 1, m, 4), torch.randn(1, 1, m, 4)
    if n <= m:  # SDPA gives NaN for rows with no key; compare where defined
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        b = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=masks.causal(align="top_left").dense(n, m))
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("w", [0, 1, 3, 10])
@pytest.mark.parametrize("n,m", [(7, 7), (4, 7)])
def test_window_two_sided_and_one_sided(n, m, w):
    s = m - n
    assert torch.equal(masks.window(w).dense(n, m), by_rule(n, m, lambda i, j: abs(i + s - j) <= w))
    assert torch.equal(masks.window(w, causal=True).dense(n, m), by_rule(n, m, lambda i, j: 0 <= i + s - j <= w))


def test_window_as_wide_as_the_sequence_allows_everything_and_causal_window_limit():
    assert masks.window(5).dense(6).all()
    assert torch.equal(masks.window(5, causal=True).dense(6), masks.causal().dense(6))


def test_padding_mask_shape_and_values():
    mk = masks.padding([3, 0, 5]).dense(5, 5)
    assert mk.shape == (3, 1, 1, 5)
    assert torch.equal(mk[:, 0, 0], by_rule(3, 5, lambda b, j: j < [3, 0, 5][b]))
    assert masks.padding(torch.tensor([2, 4])).dense(4).shape == (2, 1, 1, 4)


def test_graph_mask_edges_point_from_source_to_target():
    edge_index = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]])  # 0->1, 1->2, 2->0, 2->1
    mk = masks.graph(edge_index, 4).dense(4)
    expected = torch.zeros(4, 4, dtype=torch.bool)
    for j, i in edge_index.T.tolist():
        expected[i, j] = True  # node i attends to node j
    assert torch.equal(mk, expected)
    assert not mk[3].any()  # an isolated node attends to nothing
    assert torch.equal(masks.graph(edge_index, 4, add_self_loops=True).dense(4), expected | torch.eye(4, dtype=torch.bool))


def test_full_allows_every_pair():
    assert torch.equal(masks.full().dense(3, 5), by_rule(3, 5, lambda i, j: True))
    assert masks.full().dense(4).shape == (4, 4)


def test_no_self_and_combinators():
    assert torch.equal(masks.no_self().dense(4), ~torch.eye(4, dtype=torch.bool))
    c = masks.and_masks(masks.causal(), masks.no_self()).dense(4)
    assert torch.equal(c, by_rule(4, 4, lambda i, j: j < i))
    assert not c[0].any()  # the first query has no allowed key left
    o = masks.or_masks(masks.causal(), masks.window(1)).dense(4)
    assert torch.equal(o, by_rule(4, 4, lambda i, j: j <= i + 1))
    assert masks.and_masks(None, masks.causal()) is not None
    assert masks.or_masks(None, masks.causal()) is None  # None = everything allowed
    both = masks.and_masks(masks.padding([2, 3]), masks.causal()).dense(3)
    assert both.shape == (2, 1, 3, 3)
    # the operators are the combinators, and tensors combine with mask functions
    assert torch.equal((masks.causal() & ~masks.window(0)).dense(4), c)
    assert torch.equal((masks.causal() | masks.window(1)).dense(4), o)
    assert torch.equal((masks.causal() & torch.eye(4, dtype=torch.bool)).dense(4), torch.eye(4, dtype=torch.bool))
    # bool tensors alone combine into a tensor, as before
    t = masks.and_masks(masks.causal().dense(4), masks.no_self().dense(4))
    assert isinstance(t, torch.Tensor) and torch.equal(t, c)


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda: masks.window(-1), ValueError, "w (window half-width) must be >= 0"),
        (lambda: masks.window(1.5), TypeError, "must be an int"),
        (lambda: masks.causal().dense(-2), ValueError, "n must be >= 0"),
        (lambda: masks.causal(align="middle"), ValueError, "align must be"),
        (lambda: masks.graph(torch.tensor([[0, 5], [1, 2]]), 4), ValueError, "expected them in [0, 3]"),
        (lambda: masks.graph(torch.tensor([[0, -1], [1, 2]]), 4), ValueError, "expected them in [0, 3]"),
        (lambda: masks.graph(torch.tensor([0, 1, 2]), 4), ValueError, "shape (2, E)"),
        (lambda: masks.graph(torch.tensor([[0.0], [1.0]]), 4), TypeError, "integer dtype"),
        (lambda: masks.graph([[0], [1]], 4), TypeError, "torch.Tensor"),
        (lambda: masks.padding([3, 7]).dense(5, 5), ValueError, "lengths must lie in [0, m=5]"),
        (lambda: masks.padding(torch.tensor([1.0, 2.0])), TypeError, "integer dtype"),
        (lambda: masks.padding(torch.tensor([[1, 2]])), ValueError, "1-D"),
        (lambda: masks.and_masks(torch.ones(2, 2)), TypeError, "torch.bool"),
        (lambda: masks.full().dense(3, -1), ValueError, "m must be >= 0"),
        (lambda: masks.or_masks(masks.causal().dense(3), masks.causal().dense(4)), ValueError, "do not broadcast"),
    ],
)
def test_bad_input_raises_clear_errors(call, exc, words):
    with pytest.raises(exc) as info:
        call()
    assert words in str(info.value)


def test_valid_key_flags_shapes_and_errors():
    from attnlab.masks import padding, valid_key_flags

    flags = valid_key_flags(padding([3, 1]), 2, 4)
    assert flags.tolist() == [[True, True, True, False], [True, False, False, False]]
    assert valid_key_flags(padding([3, 1]).dense(4, 4), 2, 4).tolist() == flags.tolist()
    assert valid_key_flags(torch.tensor([[True, False]]), 3, 2).shape == (3, 2)  # one row broadcast to the batch
    assert valid_key_flags(None, 2, 4) is None
    with pytest.raises(TypeError, match="bool tensor"):
        valid_key_flags(torch.ones(2, 4), 2, 4)
    with pytest.raises(ValueError, match=r"\(2, 1, 1, 4\).*got shape \(4, 4\); use it otherwise"):
        valid_key_flags(torch.ones(4, 4, dtype=torch.bool), 2, 4, refuse="use it otherwise")
    with pytest.raises(ValueError, match="key-padding mask.*causal.*use it otherwise"):
        valid_key_flags(masks.causal(), 2, 4, refuse="use it otherwise")


def test_a_mask_function_that_returns_integers_is_refused_wherever_it_is_evaluated():
    """``(q >= k).int()`` is no mask (True = may attend is a bool): block map, dense form, both
    backends of attend and the layer refuse it naming the dtype; the bool form is causal."""
    import attnlab
    from attnlab import attend

    def as_int(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx).int()

    q = torch.randn(2, 2, 6, 4, dtype=torch.float64)
    layer = attnlab.MultiHeadAttention(8, 2).double()
    calls = [lambda: masks.block_map(as_int, 6), lambda: masks.as_mask(as_int).dense(6),
             lambda: attend(q, q, q, mask=as_int, backend="chunked"), lambda: attend(q, q, q, mask=as_int),
             lambda: layer(torch.randn(2, 6, 8, dtype=torch.float64), mask=as_int),
             lambda: masks.block_map(lambda b, h, q_idx, kv_idx: (q_idx >= kv_idx).float(), 6)]
    for call in calls:
        with pytest.raises(TypeError, match=r"a mask function must return bool \(True = this query may attend to this key\); "
                                            r"(as_int|<lambda>) returned torch\.(int32|float32): return the comparison itself"):
            call()

    def as_bool(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    assert torch.equal(masks.as_mask(as_bool).dense(6), masks.causal().dense(6))
    assert (attend(q, q, q, mask=as_bool, backend="chunked").output - attend(q, q, q, mask=masks.causal()).output).abs().max() < 1e-12


def test_a_mask_function_deciding_with_python_if_is_answered_with_how_to_write_it():
    """vmap cannot decide a Python `if` on position tensors: the message says to write a tensor expression (torch.where)."""
    from attnlab import attend

    def with_if(b, h, q_idx, kv_idx):
        if q_idx >= kv_idx:
            return torch.tensor(True)
        return torch.tensor(False)

    q = torch.randn(1, 1, 8, 4)
    with pytest.raises(ValueError, match=r"mask function with_if decides with Python control flow.*torch\.where\(cond, a, b\)"):
        attend(q, q, q, mask=with_if)
    written = attend(q, q, q, mask=lambda b, h, q_idx, kv_idx: torch.where(q_idx >= kv_idx, True, False)).output
    assert torch.equal(written, attend(q, q, q, mask=masks.causal()).output)
