"""Sparse edge attention against the dense adjacency-masked reference (float64)."""

import pytest
import torch

from attnlab import attend, masks
from attnlab.core.graph import edge_attention


def _dense(q, k, v, edge_index):
    m = masks.graph(edge_index, q.shape[0]).dense(q.shape[0])
    def t(x):
        return x.transpose(0, 1)[None]

    return attend(t(q), t(k), t(v), mask=m).output[0].transpose(0, 1)


def _qkv(n, h=2, d=3, dv=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, h, dd, generator=g, dtype=torch.float64, requires_grad=True) for dd in (d, d, dv)]


@pytest.mark.parametrize("n,e,seed", [(1, 1, 0), (5, 8, 1), (12, 40, 2), (30, 200, 3)])
def test_sparse_equals_dense_mask_outputs_and_grads(n, e, seed):
    g = torch.Generator().manual_seed(seed)
    ei = torch.unique(torch.randint(0, n, (2, e), generator=g), dim=1)
    q, k, v = _qkv(n, seed=seed)
    ours, ref = edge_attention(q, k, v, ei).output, _dense(q, k, v, ei)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    w = torch.randn(ours.shape, generator=g, dtype=torch.float64)
    ga = torch.autograd.grad((ours * w).sum(), (q, k, v))
    gb = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(ga, gb):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_isolated_nodes_get_zero_output_and_zero_grads():
    q, k, v = _qkv(6)
    v.data[5] = float("nan")  # node 5 sends nothing: its NaN must not leak
    ei = torch.tensor([[0, 1, 2], [1, 2, 1]])  # nodes 0, 3, 4, 5 receive nothing
    out = edge_attention(q, k, v, ei).output
    assert torch.equal(out[[0, 3, 4, 5]], torch.zeros(4, 2, 4, dtype=torch.float64))
    assert not out.isnan().any()
    out.sum().backward()
    assert torch.equal(q.grad[[0, 3, 4, 5]], torch.zeros(4, 2, 3, dtype=torch.float64))
    torch.testing.assert_close(out[[1, 2]], _dense(q, k, v, ei)[[1, 2]])


def test_empty_edge_set_gives_zeros():
    q, k, v = _qkv(4)
    res = edge_attention(q, k, v, torch.zeros(2, 0, dtype=torch.long), return_weights=True)
    assert torch.equal(res.output, torch.zeros(4, 2, 4, dtype=torch.float64))
    assert res.weights.shape == (0, 2)


def test_weights_are_per_edge_in_input_order_and_sum_to_one_per_target():
    q, k, v = _qkv(5)
    ei = torch.tensor([[4, 0, 1, 2, 3, 0], [0, 1, 0, 0, 4, 4]])
    w = edge_attention(q, k, v, ei, return_weights=True).weights
    sums = torch.zeros(5, 2, dtype=torch.float64).index_add_(0, ei[1], w)
    torch.testing.assert_close(sums[[0, 1, 4]], torch.ones(3, 2, dtype=torch.float64))
    m = masks.graph(ei, 5).dense(5)
    def t(x):
        return x.transpose(0, 1)[None]

    dense_w = attend(t(q), t(k), t(v), mask=m, return_weights=True).weights[0]  # (H, N, N)
    torch.testing.assert_close(w, dense_w[:, ei[1], ei[0]].T)


def test_bias_and_edge_values_gradcheck():
    q, k, v = _qkv(6, h=2, d=2, dv=2)
    ei = torch.tensor([[0, 1, 2, 3, 4, 5, 1], [1, 2, 3, 4, 5, 0, 3]])
    bias = torch.randn(7, 2, dtype=torch.float64, requires_grad=True)
    ev = torch.randn(7, 2, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: edge_attention(*a[:3], ei, bias=a[3], edge_values=a[4]).output, (q, k, v, bias, ev))
    assert torch.autograd.gradcheck(lambda *a: edge_attention(*a[:3], ei, bias=a[3], return_weights=True).weights, (q, k, v, bias))


def test_duplicate_edges_count_twice():
    q, k, v = _qkv(3)
    once = torch.tensor([[0, 1], [2, 2]])
    twice = torch.tensor([[0, 0, 1], [2, 2, 2]])
    w = edge_attention(q, k, v, twice, return_weights=True).weights
    w1 = edge_attention(q, k, v, once, return_weights=True).weights
    assert not torch.allclose(w[2], w1[1])  # node 0's weight doubled relative to node 1's
    torch.testing.assert_close(w[0] / w[2], torch.exp((q[2] * (k[0] - k[1])).sum(-1) / 3**0.5), rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    "ei,msg",
    [
        (torch.tensor([[0, 5], [1, 2]]), r"\[0, 5\].*\[0, 3\]"),
        (torch.tensor([[-1], [0]]), r"\[-1, 0\]"),
        (torch.tensor([0, 1]), r"shape \(2, E\)"),
        (torch.tensor([[0.0], [1.0]]), "integer dtype"),
    ],
)
def test_bad_edge_index_raises_before_computing(ei, msg):
    q, k, v = _qkv(4)
    with pytest.raises((ValueError, TypeError), match=msg):
        edge_attention(q, k, v, ei)


def test_bad_shapes_raise():
    q, k, v = _qkv(4)
    ei = torch.tensor([[0], [1]])
    with pytest.raises(ValueError, match=r"\(N, H, D\)"):
        edge_attention(q[0], k, v, ei)
    with pytest.raises(ValueError, match="same N"):
        edge_attention(q, k[:3], v, ei)
    with pytest.raises(ValueError, match=r"bias must have shape \(E, H\)"):
        edge_attention(q, k, v, ei, bias=torch.zeros(2, 2, dtype=torch.float64))
    with pytest.raises(ValueError, match="edge_values"):
        edge_attention(q, k, v, ei, edge_values=torch.zeros(1, 2, 3, dtype=torch.float64))


def test_float32_follows_input_dtype():
    q, k, v = (t.detach().float() for t in _qkv(8))
    ei = torch.randint(0, 8, (2, 20), generator=torch.Generator().manual_seed(0))
    out = edge_attention(q, k, v, ei).output
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), edge_attention(q.double(), k.double(), v.double(), ei).output, rtol=1e-5, atol=1e-6)


def test_dropout_scales_kept_edges_and_gradcheck_with_a_fixed_mask():
    q, k, v = _qkv(6, h=2, d=2, dv=2)
    ei = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2], [1, 2, 3, 4, 5, 0, 3, 3]])
    full = edge_attention(q, k, v, ei, return_weights=True)
    torch.manual_seed(3)
    dropped = edge_attention(q, k, v, ei, dropout_p=0.5, return_weights=True)
    torch.testing.assert_close(dropped.weights, full.weights)  # weights are reported before dropout
    torch.manual_seed(3)
    keep = (torch.rand(8, 2) >= 0.5).double() * 2.0
    from attnlab.core.graph import _EdgeAttention, _Pattern

    pat = _Pattern(ei, 6)
    manual = torch.zeros(6, 2, 2, dtype=torch.float64).index_add_(
        0, ei[1], (full.weights * keep)[..., None] * v[ei[0]]
    )
    torch.testing.assert_close(dropped.output, manual)
    kp = keep[pat.order]
    def t(x):
        return x.transpose(0, 1).contiguous()

    assert torch.autograd.gradcheck(lambda a, b, c: _EdgeAttention.apply(t(a), t(b), t(c), None, None, pat, 0.7, kp)[0], (q, k, v))
    with pytest.raises(ValueError, match="dropout_p"):
        edge_attention(q, k, v, ei, dropout_p=1.0)
