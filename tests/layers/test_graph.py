"""GraphAttention (a layer, the peer of PyG's TransformerConv): parity with TransformerConv
with the same weights, attention weights, sparse = dense, isolated nodes, bad input."""

import pytest
import torch

from attnlab.layers.graph import GraphAttention
from attnlab.models.graph import GraphTransformer
from tests.helpers import random_graph as _graph

pyg_nn = pytest.importorskip("torch_geometric.nn")  # a dev dependency: installed by `make test`


@pytest.mark.parametrize(
    "options",
    [{}, {"edge_dim": 5}, {"edge_dim": 5, "beta": True}, {"concat": False}, {"root_weight": False}, {"bias": False}, {"heads": 1}],
)
def test_reproduces_transformer_conv_with_the_same_weights(options):
    torch.manual_seed(0)
    opts = {"heads": 3, **options}
    conv = pyg_nn.TransformerConv(8, 6, **opts).double()
    ours = GraphAttention.from_transformer_conv(conv)
    x, ei, ea = _graph()  # with duplicate edges and isolated nodes, as PyG takes them
    e = ea if "edge_dim" in options else None
    want = conv(x, ei, e)
    got = ours(x, ei, e).output
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    (got * want.detach()).sum().backward()
    (want * want.detach()).sum().backward()
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, dict(conv.named_parameters())[name].grad, rtol=1e-10, atol=1e-12)


def test_attention_weights_match_transformer_conv():
    torch.manual_seed(1)
    conv = pyg_nn.TransformerConv(8, 4, heads=2).double()
    ours = GraphAttention.from_transformer_conv(conv)
    x, ei, _ = _graph(seed=3)
    _, (ei_pyg, w_pyg) = conv(x, ei, return_attention_weights=True)
    w = ours(x, ei, return_weights=True).weights
    assert torch.equal(ei_pyg, ei)
    torch.testing.assert_close(w, w_pyg, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("edge_dim", [None, 5])
def test_sparse_equals_dense_mode(edge_dim):
    torch.manual_seed(0)
    x, ei, ea = _graph(unique=True, seed=4)
    sparse = GraphAttention(8, 6, 3, edge_dim=edge_dim, beta=True).double()
    dense = GraphAttention(8, 6, 3, edge_dim=edge_dim, beta=True, mode="dense").double()
    dense.load_state_dict(sparse.state_dict())
    e = ea if edge_dim else None
    (a, wa), (b, wb) = ((r.output, r.weights) for r in (sparse(x, ei, e, return_weights=True), dense(x, ei, e, return_weights=True)))
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(wa, wb, rtol=1e-12, atol=1e-12)


def test_isolated_node_keeps_only_its_root_term():
    layer = GraphAttention(8, 4, 2).double()
    x, _, _ = _graph(n=3)
    ei = torch.tensor([[0], [1]])
    out = layer(x, ei).output
    torch.testing.assert_close(out[2], layer.lin_skip(x[2]))


def test_bad_input_raises_clear_errors():
    layer = GraphAttention(8, 4, 2, edge_dim=3)
    x = torch.randn(5, 8)
    with pytest.raises(ValueError, match=r"\[0, 9\].*\[0, 4\]"):
        layer(x, torch.tensor([[0], [9]]), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="edge_attr must be given"):
        layer(x, torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match=r"edge_attr must be \(E, 3\)"):
        layer(x, torch.tensor([[0], [1]]), torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"x must be \(N, 8\)"):
        layer(torch.randn(5, 7), torch.tensor([[0], [1]]), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="mode"):
        GraphAttention(8, 4, mode="csr")
    with pytest.raises(ValueError, match="beta"):
        GraphAttention(8, 4, beta=True, root_weight=False)
    with pytest.raises(ValueError, match="divisible"):
        GraphTransformer(8, 10, 3)
    with pytest.raises(TypeError, match="TransformerConv"):
        GraphAttention.from_transformer_conv(torch.nn.Linear(2, 2))
