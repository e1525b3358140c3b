"""The graph models: GraphTransformer (sparse = dense, batches, PyG Data), backbones and heads."""

import pytest
import torch

from attnlab.models.graph import GraphTransformer, segment_mean
from tests.helpers import random_graph as _graph

pyg_nn = pytest.importorskip("torch_geometric.nn")  # a dev dependency: installed by `make test`



def test_graph_transformer_sparse_equals_dense_and_takes_pyg_data():
    from torch_geometric.data import Data

    torch.manual_seed(0)
    x, ei, ea = _graph(unique=True, seed=5)
    sparse = GraphTransformer(8, 12, 3, 2, edge_dim=5).double()
    dense = GraphTransformer(8, 12, 3, 2, edge_dim=5, mode="dense").double()
    dense.load_state_dict(sparse.state_dict())
    torch.testing.assert_close(sparse(x, ei, ea).output, dense(x, ei, ea).output, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sparse(Data(x=x, edge_index=ei, edge_attr=ea)).output, sparse(x, ei, ea).output)


def test_disjoint_union_batches_graphs_independently():
    torch.manual_seed(0)
    model = GraphTransformer(8, 12, 3, 2).double().eval()
    x1, e1, _ = _graph(n=6, e=10, seed=6)
    x2, e2, _ = _graph(n=9, e=20, seed=7)
    both = model(torch.cat([x1, x2]), torch.cat([e1, e2 + 6], dim=1)).output
    torch.testing.assert_close(both[:6], model(x1, e1).output)
    torch.testing.assert_close(both[6:], model(x2, e2).output)
    pooled = segment_mean(both, torch.tensor([0] * 6 + [1] * 9), 3)
    torch.testing.assert_close(pooled[1], model(x2, e2).output.mean(0))
    assert torch.equal(pooled[2], torch.zeros(12, dtype=torch.float64))



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
    h = backbone(x, torch.zeros(2, 0, dtype=torch.long)).output
    pooled = torch.stack([h[:3].sum(0), h[3:].sum(0)])
    torch.testing.assert_close(summed(x, torch.zeros(2, 0, dtype=torch.long), batch=batch, num_graphs=2).output, summed.head(pooled))
    assert meaned(x, torch.zeros(2, 0, dtype=torch.long)).output.shape == (1, 1)  # no batch vector: one graph
