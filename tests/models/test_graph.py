"""GraphAttention: parity with PyTorch Geometric's TransformerConv, sparse = dense, the model."""

import pytest
import torch

from attnlab.models.graph import GraphAttention, GraphTransformer, segment_mean

pyg_nn = pytest.importorskip("torch_geometric.nn")  # a dev dependency: installed by `make test`


def _graph(n=20, e=70, edge_dim=5, seed=0, unique=False):
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    if unique:
        ei = torch.unique(ei, dim=1)
    x = torch.randn(n, 8, generator=g, dtype=torch.float64)
    ea = torch.randn(ei.shape[1], edge_dim, generator=g, dtype=torch.float64)
    return x, ei, ea


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
    got = ours(x, ei, e)
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
    _, w = ours(x, ei, return_weights=True)
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
    a, wa = sparse(x, ei, e, return_weights=True)
    b, wb = dense(x, ei, e, return_weights=True)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(wa, wb, rtol=1e-12, atol=1e-12)


def test_graph_transformer_sparse_equals_dense_and_takes_pyg_data():
    from torch_geometric.data import Data

    torch.manual_seed(0)
    x, ei, ea = _graph(unique=True, seed=5)
    sparse = GraphTransformer(8, 12, 3, 2, edge_dim=5).double()
    dense = GraphTransformer(8, 12, 3, 2, edge_dim=5, mode="dense").double()
    dense.load_state_dict(sparse.state_dict())
    torch.testing.assert_close(sparse(x, ei, ea), dense(x, ei, ea), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sparse(Data(x=x, edge_index=ei, edge_attr=ea)), sparse(x, ei, ea))


def test_disjoint_union_batches_graphs_independently():
    torch.manual_seed(0)
    model = GraphTransformer(8, 12, 3, 2).double().eval()
    x1, e1, _ = _graph(n=6, e=10, seed=6)
    x2, e2, _ = _graph(n=9, e=20, seed=7)
    both = model(torch.cat([x1, x2]), torch.cat([e1, e2 + 6], dim=1))
    torch.testing.assert_close(both[:6], model(x1, e1))
    torch.testing.assert_close(both[6:], model(x2, e2))
    pooled = segment_mean(both, torch.tensor([0] * 6 + [1] * 9), 3)
    torch.testing.assert_close(pooled[1], model(x2, e2).mean(0))
    assert torch.equal(pooled[2], torch.zeros(12, dtype=torch.float64))


def test_isolated_node_keeps_only_its_root_term():
    layer = GraphAttention(8, 4, 2).double()
    x, _, _ = _graph(n=3)
    ei = torch.tensor([[0], [1]])
    out = layer(x, ei)
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


def test_graph_inputs_and_heads_refuse_bad_input():
    from attnlab.models.graph import GraphPredictor, GraphTransformerBackbone, graph_inputs

    with pytest.raises(TypeError, match="expected a graph with .x and .edge_index"):
        graph_inputs(object())
    with pytest.raises(ValueError, match="edge_index is required"):
        GraphTransformer(8, 12, 3)(torch.randn(3, 8))
    with pytest.raises(ValueError, match="graph pooling must be 'mean' or 'sum'"):
        GraphPredictor(GraphTransformerBackbone(8, 12), 2, pooling="max")


def test_sum_pooling_is_mean_times_node_count():
    from attnlab.models.graph import GraphPredictor, NodeMLPBackbone

    torch.manual_seed(0)
    backbone = NodeMLPBackbone(4, 8).double().eval()
    summed, meaned = GraphPredictor(backbone, 1, pooling="sum").double(), GraphPredictor(backbone, 1).double()
    x, batch = torch.randn(7, 4, dtype=torch.float64), torch.tensor([0, 0, 0, 1, 1, 1, 1])
    h = backbone(x, torch.zeros(2, 0, dtype=torch.long))
    pooled = torch.stack([h[:3].sum(0), h[3:].sum(0)])
    torch.testing.assert_close(summed(x, torch.zeros(2, 0, dtype=torch.long), batch=batch, num_graphs=2), summed.head(pooled))
    assert meaned(x, torch.zeros(2, 0, dtype=torch.long)).shape == (1, 1)  # no batch vector: one graph
