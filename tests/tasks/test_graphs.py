"""Graph tasks: labels and edges against their sources (networkx, RDKit)."""

from pathlib import Path

import pytest
import torch

from attnlab import tasks
from attnlab.tasks import IGNORE
from attnlab.tasks.graphs import ATOM_DIM, BOND_DIM, ELEMENTS


def test_karate_is_zacharys_club_with_disjoint_node_splits():
    import networkx as nx

    g = nx.karate_club_graph()
    task = tasks.create("karate", seed=3)
    tr, va, te = (task.split(s) for s in ("train", "val", "test"))
    assert task.kind == "tagging" and task.inputs == "graph" and task.num_labels == 2
    edges = tr.edges[0]
    assert edges.shape == (2, 2 * g.number_of_edges())
    assert {tuple(e) for e in edges.T.tolist()} == {(a, b) for a, b in g.edges()} | {(b, a) for a, b in g.edges()}
    labelled = [(s.labels[0] != IGNORE) for s in (tr, va, te)]
    assert torch.equal(labelled[0].long() + labelled[1].long() + labelled[2].long(), torch.ones(34, dtype=torch.long))
    assert int(labelled[0].sum()) == 16 and int(labelled[1].sum()) == 6
    full = torch.stack([s.labels[0] for s in (tr, va, te)]).max(0).values
    assert [task.label_names[int(c)] for c in full] == [g.nodes[i]["club"] for i in range(34)]
    with pytest.raises(ValueError, match="test members"):
        tasks.create("karate", train_per_class=15, val_per_class=2)


def test_sbm_labels_are_blocks_and_edges_mostly_inside_blocks():
    task = tasks.create("sbm", size=16, nodes=40, blocks=4, p_in=0.3, p_out=0.02)
    tr = task.split("train")
    assert tr.tokens.shape == (16, 40, 16) and len(tr.edges) == 16
    y = tr.labels[0]
    assert torch.equal(y, torch.arange(4).repeat_interleave(10))
    e = torch.cat(tr.edges, dim=1)
    inside = float((y[e[0]] == y[e[1]]).float().mean())
    assert inside > 0.7  # expected 0.3*9 / (0.3*9 + 0.02*30) = 0.82
    # features: block mean + N(0, 1): the class means separate
    means = torch.stack([tr.tokens[:, y == b].mean((0, 1)) for b in range(4)])
    assert float((means.norm(dim=1) - 1.0).abs().max()) < 0.2
    with pytest.raises(ValueError, match="probabilities"):
        tasks.create("sbm", p_in=1.5)


def test_molecules_match_rdkit():
    from rdkit import Chem
    from rdkit.Chem import Crippen

    from attnlab.tasks.graphs import _nci_path

    task = tasks.create("molecules", limit=40)
    assert task.kind == "regression" and task.metric == "r2" and task.edge_dim == BOND_DIM and task.feature_dim == ATOM_DIM
    smiles = [line.split()[0] for line in Path(_nci_path()).read_text().splitlines()[:40]]
    mols = [Chem.MolFromSmiles(s) for s in smiles]
    logp = torch.tensor([Crippen.MolLogP(m) for m in mols], dtype=torch.float64)
    perm = torch.randperm(40, generator=torch.Generator().manual_seed(0)).tolist()
    test_idx = perm[:4]
    mean, std = task.baseline["label_mean"], task.baseline["label_std"]
    te = task.split("test")
    torch.testing.assert_close(te.labels.double() * std + mean, logp[test_idx], rtol=1e-5, atol=1e-5)
    m = mols[test_idx[0]]
    n = m.GetNumAtoms()
    assert int(te.mask[0].sum()) == n and te.edges[0].shape == (2, 2 * m.GetNumBonds())
    elements = [ELEMENTS.index(a.GetSymbol()) for a in m.GetAtoms()]
    assert te.tokens[0, :n, : len(ELEMENTS) + 1].argmax(1).tolist() == elements
    tr = task.split("train")
    assert abs(float(tr.labels.mean())) < 1e-5 and abs(float(tr.labels.std()) - 1) < 1e-5


def test_molecule_alerts_are_rdkits_filter_matches():
    from rdkit import Chem
    from rdkit.Chem import FilterCatalog

    from attnlab.tasks.graphs import _nci_path

    task = tasks.create("molecules", target="alert", limit=30)
    assert task.kind == "classification" and task.num_labels == 2
    params = FilterCatalog.FilterCatalogParams()
    params.AddCatalog(FilterCatalog.FilterCatalogParams.FilterCatalogs.PAINS)
    params.AddCatalog(FilterCatalog.FilterCatalogParams.FilterCatalogs.BRENK)
    cat = FilterCatalog.FilterCatalog(params)
    smiles = [line.split()[0] for line in Path(_nci_path()).read_text().splitlines()[:30]]
    want = torch.tensor([int(cat.HasMatch(Chem.MolFromSmiles(s))) for s in smiles])
    perm = torch.randperm(30, generator=torch.Generator().manual_seed(0)).tolist()
    assert torch.equal(task.split("train").labels, want[perm[6:]])
    with pytest.raises(ValueError, match="target must be"):
        tasks.create("molecules", target="solubility")


def _write_graph(tmp_path, edges="0 1\n", feats=None, labels=None):
    (tmp_path / "e.txt").write_text(edges)
    (tmp_path / "f.txt").write_text(feats if feats is not None else "1 0\n0 1\n1 1\n")
    (tmp_path / "l.txt").write_text(labels if labels is not None else "a\nb\na\n")
    return {"edges": str(tmp_path / "e.txt"), "features": str(tmp_path / "f.txt"), "labels": str(tmp_path / "l.txt")}


def test_graph_files_reads_a_users_graph_and_learns_it(tmp_path):
    from attnlab.training import TrainConfig, train

    # two rings of 12 nodes joined by one edge; features are one-hot identities, so a test
    # node's label can only come from its labelled neighbours, through the edges
    edges = [(i, (i + 1) % 12) for i in range(12)] + [(12 + i, 12 + (i + 1) % 12) for i in range(12)] + [(0, 12)]
    edges += [(i, (i + 3) % 12) for i in range(12)] + [(12 + i, 12 + (i + 3) % 12) for i in range(12)]
    feats = "\n".join(" ".join("1" if j == i else "0" for j in range(24)) for i in range(24))
    labels = "\n".join(["left"] * 12 + ["right"] * 12)
    labels = labels.replace("left\nleft", "left\n?", 1)  # node 1 unlabelled
    files = _write_graph(tmp_path, "# a comment\n" + "\n".join(f"{a},{b}" for a, b in edges), feats, labels)
    task = tasks.create("graph_files", **files)
    assert task.num_labels == 2 and task.label_names == ["left", "right"] and task.feature_dim == 24
    assert task.split("train").edges[0].shape == (2, 2 * len(edges))
    counted = sum(int((task.split(s).labels != IGNORE).sum()) for s in ("train", "val", "test"))
    assert counted == 23  # the "?" node is in no split
    res = train(TrainConfig.for_task("graph_files", task_options=files, steps=150), tmp_path / "run")
    assert res.value == 1.0  # 3 test nodes
    mlp = train(TrainConfig.for_task("graph_files", task_options=files, steps=150, model="node_mlp"), tmp_path / "mlp")
    assert mlp.value <= 0.75  # without the edges an unseen identity says nothing

@pytest.mark.parametrize(
    "kw,msg",
    [
        ({"edges": "0 7\n"}, r"e.txt line 1: node ids must be in \[0, 2\]"),
        ({"edges": "0 x\n"}, "e.txt line 1: expected two node ids"),
        ({"feats": "1 0\n0\n1 1\n"}, "f.txt line 2: 1 numbers, the first line has 2"),
        ({"feats": "1 0\nq 1\n1 1\n"}, "f.txt line 2: expected numbers"),
        ({"labels": "a\nb\n"}, "2 labels.*3 nodes"),
        ({"labels": "a\na\na\n"}, "two distinct labels"),
    ],
)
def test_graph_files_errors_name_file_and_line(tmp_path, kw, msg):
    with pytest.raises(ValueError, match=msg):
        tasks.create("graph_files", **_write_graph(tmp_path, **kw))
    with pytest.raises(ValueError, match="needs edges="):
        tasks.create("graph_files")
