"""Training on graph tasks: batching as a disjoint union, R^2, the default karate run."""

import pytest
import torch

from attnlab import tasks
from attnlab.training import TrainConfig, evaluate, make_batch, model_config, score, train


def test_graph_batch_is_a_disjoint_union_with_offsets():
    task = tasks.create("molecules", limit=30)
    data = task.split("train")
    idx = torch.tensor([3, 0, 7])
    inputs, labels = make_batch(task, data, idx)
    counts = [int(data.mask[i].sum()) for i in idx]
    assert inputs["x"].shape == (sum(counts), task.feature_dim)
    assert inputs["batch"].tolist() == [0] * counts[0] + [1] * counts[1] + [2] * counts[2]
    e = inputs["edge_index"]
    assert e.shape[1] == sum(data.edges[i].shape[1] for i in idx)
    assert (inputs["batch"][e[0]] == inputs["batch"][e[1]]).all()  # no edge crosses graphs
    first = data.edges[3].shape[1]
    assert torch.equal(e[:, first : first + data.edges[0].shape[1]], data.edges[0] + counts[0])
    assert torch.equal(labels, data.labels[idx]) and inputs["num_graphs"] == 3


class _Oracle(torch.nn.Module):
    """Predicts the label itself (or its mean) through the batch: for checking the R^2 metric."""

    def __init__(self, labels, mean_only=False):
        super().__init__()
        self.labels, self.mean_only, self.seen = labels, mean_only, 0

    def forward(self, x, edge_index, edge_attr=None, batch=None, num_graphs=None):
        y = self.labels[self.seen : self.seen + num_graphs]
        self.seen += num_graphs
        from attnlab.models import ModelOutput  # every model returns one (issue 14)

        return ModelOutput((torch.full_like(y, float(self.labels.mean())) if self.mean_only else y)[:, None])


def test_r2_is_one_for_the_truth_and_zero_for_the_mean():
    task = tasks.create("molecules", limit=60)
    y = task.split("val").labels
    assert score(_Oracle(y), task, "val", batch_size=2) == pytest.approx(1.0)
    assert score(_Oracle(y, mean_only=True), task, "val", batch_size=4) == pytest.approx(0.0, abs=1e-6)


def test_default_karate_run_reaches_90_percent_and_eval_reproduces_it(tmp_path):
    res = train(TrainConfig.for_task("karate"), tmp_path)
    assert res.attention == "edges" and res.model == "graph_transformer"
    assert res.value >= 0.9
    assert evaluate(tmp_path).value == res.value


def test_molecule_regression_learns(tmp_path):
    cfg = TrainConfig.for_task("molecules", task_options={"limit": 400}, steps=300, eval_every=100, embed_dim=32, num_layers=2)
    res = train(cfg, tmp_path)
    assert res.metric == "r2" and res.value > 0.5  # logP is nearly additive over atom types


def test_token_model_on_a_graph_task_is_refused():
    task = tasks.create("karate")
    with pytest.raises(ValueError, match="reads tokens, the task gives graph"):
        from attnlab.models import build_model

        build_model(model_config(TrainConfig.for_task("karate", model="transformer"), task))


def test_another_attention_drops_the_tasks_attention_options():
    cfg = TrainConfig.for_task("speech")
    # the attention options have their own typed field now (issue 14), not model_options["attention_options"]
    assert cfg.attention == "local" and cfg.attention_options == {"window": 16}
    dense = TrainConfig.for_task("speech", attention="dense")
    assert dense.attention == "dense" and dense.attention_options == {}
    mine = TrainConfig.for_task("speech", attention="performer", attention_options={"num_features": 32})
    assert mine.attention_options == {"num_features": 32}
    old_style = TrainConfig.for_task("speech", attention="performer", model_options={"attention_options": {"num_features": 32}})
    assert old_style.attention_options == {"num_features": 32} and old_style.model_options == {}


def test_pyg_data_objects_make_a_task_that_trains(tmp_path):
    from torch_geometric.data import Data

    from attnlab.tasks.graphs import task_from_graphs

    def graph(seed):
        g = torch.Generator().manual_seed(seed)
        n = int(torch.randint(5, 12, (1,), generator=g))
        ring = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])
        x = torch.randn(n, 3, generator=g)
        label = int(x[:, 0].sum() > 0)  # a graph-level label: the sign of a summed feature
        return Data(x=x, edge_index=torch.cat([ring, ring.flip(0)], 1), y=torch.tensor([label]))

    task = task_from_graphs([graph(i) for i in range(300)], [graph(i) for i in range(300, 364)], [graph(i) for i in range(364, 428)])
    assert task.kind == "classification" and task.num_labels == 2 and task.feature_dim == 3
    cfg = TrainConfig.for_task("karate", steps=150, batch_size=32, eval_every=50, pooling="sum", lr=3e-3)
    res = train(cfg, tmp_path, task=task)
    assert res.value >= 0.85
    assert evaluate(tmp_path, task=task).value == res.value
    nodes = task_from_graphs([Data(x=torch.randn(4, 2), edge_index=torch.tensor([[0, 1], [1, 2]]), y=torch.tensor([0, 1, -1, 1]))] * 2,
                             [Data(x=torch.randn(3, 2), edge_index=torch.zeros(2, 0, dtype=torch.long), y=torch.tensor([1, 0, 0]))],
                             [Data(x=torch.randn(3, 2), edge_index=torch.tensor([[2], [0]]), y=torch.tensor([0, 0, 1]))])
    assert nodes.kind == "tagging" and nodes.split("train").labels[0].tolist() == [0, 1, -100, 1]
    with pytest.raises(ValueError, match="has no .y"):
        task_from_graphs([Data(x=torch.randn(2, 2), edge_index=torch.zeros(2, 0, dtype=torch.long))], [], [])
