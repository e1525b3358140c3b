"""Graph tasks: node vectors whose edges say who may attend to whom.

* ``karate`` — Zachary's karate club (networkx's bundled copy): 34 members, 78 friendships,
  which of the two factions each member joined after the split. Node features: one-hot
  identity (transductive: one graph, the splits are disjoint sets of labelled nodes).
* ``sbm`` — node classification on generated stochastic-block-model graphs (networkx), the
  "contextual" form: each node's features are its block's mean vector plus Gaussian noise, so
  a node alone is ambiguous and its neighbours (mostly of its own block) resolve it. Train,
  validation and test are different graphs.
* ``molecules`` — the ~5000 NCI molecules RDKit ships (``rdkit/Data/NCI/first_5K.smi``) as
  graphs of atoms and bonds. Atom features: the element one-hot (the lecture's encoding), plus
  degree, attached hydrogens, formal charge and aromaticity; bond features: single / double /
  triple / aromatic. Targets, computed by RDKit: ``logp`` (Crippen logP, regression), ``tpsa``
  (topological polar surface area, regression), ``alert`` (matches a PAINS or Brenk
  structural-alert filter, classification).

* ``graph_files`` — the user's own graph: edge list, node features and node labels as text files.

Edges are listed in both directions (undirected graphs); ``edges[:, e] = (j, i)`` lets node
``i`` attend to node ``j``.
"""

from __future__ import annotations

import os

import torch

from ..core.graph import check_edge_index
from ..extras import require
from ..validate import int_at_least
from .base import IGNORE, Split, Task, register, split_sizes

__all__ = ["ELEMENTS", "graph_files", "karate", "molecules", "sbm"]

ELEMENTS = ("C", "N", "O", "S", "F", "Cl", "Br", "I", "P", "B", "Si", "Se", "Na", "K", "Sn", "Hg", "As")
"""Elements with their own one-hot column in ``molecules``; every other element shares one."""

_BONDS = ("SINGLE", "DOUBLE", "TRIPLE", "AROMATIC")


def _both_ways(edges: list[tuple[int, int]]) -> torch.Tensor:
    if not edges:
        return torch.zeros(2, 0, dtype=torch.long)
    e = torch.tensor(edges, dtype=torch.long).T
    return torch.cat([e, e.flip(0)], dim=1)


@register("karate", train_defaults={"model": "graph_transformer", "steps": 150, "batch_size": 1, "lr": 5e-3,
                                    "embed_dim": 32, "num_layers": 2, "warmup": 10, "eval_every": 10, "patience": None},
          baseline_model="node_mlp")
def karate(seed: int = 0, train_per_class: int = 8, val_per_class: int = 3) -> Task:
    """Zachary's karate club: which faction each member joins (2 classes, 34 nodes).

    Args:
        seed: which members are labelled for training and validation.
        train_per_class, val_per_class: labelled members per faction; the rest are the test set.
    """
    nx = require("networkx", "graphs", "the graph tasks")

    int_at_least("train_per_class", train_per_class, 1), int_at_least("val_per_class", val_per_class, 1)
    g = nx.karate_club_graph()
    n = g.number_of_nodes()
    names = sorted({g.nodes[i]["club"] for i in g.nodes})
    y = torch.tensor([names.index(g.nodes[i]["club"]) for i in range(n)])
    if min(int((y == c).sum()) for c in range(2)) <= train_per_class + val_per_class:
        raise ValueError(f"train_per_class + val_per_class must leave test members in each faction (the smaller has "
                         f"{int((y == 0).sum().min())})")
    gen = torch.Generator().manual_seed(seed)
    part = torch.zeros(n, dtype=torch.long)  # 0 train, 1 val, 2 test
    part[:] = 2
    for c in range(2):
        idx = (y == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=gen)]
        part[idx[:train_per_class]] = 0
        part[idx[train_per_class : train_per_class + val_per_class]] = 1
    x = torch.eye(n)[None]  # (1, N, N): one-hot identity
    edges = _both_ways(list(g.edges()))
    splits = {}
    for k, name in enumerate(("train", "val", "test")):
        labels = torch.where(part == k, y, torch.full_like(y, IGNORE))[None]
        splits[name] = Split(x, labels, torch.ones(1, n, dtype=torch.bool), [edges])
    test_y = y[part == 2]
    majority = max(float((test_y == c).float().mean()) for c in range(2))
    return Task("karate", "tagging", 0, 2, "accuracy", splits,
                {"seed": seed, "train_per_class": train_per_class, "val_per_class": val_per_class},
                label_names=names, baseline={"majority": majority}, inputs="graph", feature_dim=n)


@register("sbm", train_defaults={"model": "graph_transformer", "steps": 600, "batch_size": 8, "lr": 2e-3,
                                 "embed_dim": 64, "num_layers": 2, "eval_every": 100}, baseline_model="node_mlp")
def sbm(
    size: int = 64, seed: int = 0, nodes: int = 100, blocks: int = 4, p_in: float = 0.1, p_out: float = 0.01,
    signal: float = 1.0, dim: int = 16,
) -> Task:
    """Contextual stochastic block model: classify each node's block.

    Args:
        size: training graphs (validation and test: ``size / 8``, at least 64... see
            :func:`attnlab.tasks.base.split_sizes`; here at least 8 each).
        seed: the generator's.
        nodes: per graph. blocks: classes, equal-sized blocks. p_in, p_out: edge probability
            inside a block and across blocks. signal: length of each block's mean feature
            vector (noise is N(0, 1) per coordinate). dim: feature width.
    """
    nx = require("networkx", "graphs", "the graph tasks")

    int_at_least("nodes", nodes, 2), int_at_least("blocks", blocks, 2), int_at_least("dim", dim, 1)
    if not (0 <= p_out <= 1 and 0 <= p_in <= 1):
        raise ValueError(f"p_in and p_out must be probabilities, got {p_in!r}, {p_out!r}")
    sizes = split_sizes(size)
    sizes = {k: (v if k == "train" else max(8, v // 8)) for k, v in sizes.items()}
    gen = torch.Generator().manual_seed(seed)
    means = torch.randn(blocks, dim, generator=gen)
    means = means / means.norm(dim=1, keepdim=True) * signal
    per = [nodes // blocks + (1 if b < nodes % blocks else 0) for b in range(blocks)]
    probs = [[p_in if a == b else p_out for b in range(blocks)] for a in range(blocks)]
    y = torch.cat([torch.full((c,), b) for b, c in enumerate(per)])
    splits = {}
    count = 0
    for name, s in sizes.items():
        xs, es = [], []
        for _ in range(s):
            g = nx.stochastic_block_model(per, probs, seed=seed * 1_000_003 + count)
            count += 1
            es.append(_both_ways(list(g.edges())))
            xs.append(means[y] + torch.randn(nodes, dim, generator=gen))
        splits[name] = Split(torch.stack(xs), y.expand(s, nodes).clone(), torch.ones(s, nodes, dtype=torch.bool), es)
    return Task("sbm", "tagging", 0, blocks, "accuracy", splits,
                {"size": size, "seed": seed, "nodes": nodes, "blocks": blocks, "p_in": p_in, "p_out": p_out,
                 "signal": signal, "dim": dim},
                label_names=[f"block {b}" for b in range(blocks)], baseline={"majority": max(per) / nodes},
                inputs="graph", feature_dim=dim)


def _nci_path() -> str:
    require("rdkit", "molecules", "the molecules task (RDKit's bundled NCI molecules)")
    from rdkit import RDConfig

    return os.path.join(RDConfig.RDDataDir, "NCI", "first_5K.smi")


def _atom_features(atom) -> list[float]:
    sym = atom.GetSymbol()
    onehot = [0.0] * (len(ELEMENTS) + 1)
    onehot[ELEMENTS.index(sym) if sym in ELEMENTS else len(ELEMENTS)] = 1.0
    deg = [0.0] * 6
    deg[min(atom.GetDegree(), 5)] = 1.0
    hs = [0.0] * 5
    hs[min(atom.GetTotalNumHs(), 4)] = 1.0
    charge = atom.GetFormalCharge()
    return onehot + deg + hs + [float(charge < 0), float(charge > 0), float(atom.GetIsAromatic())]


ATOM_DIM = len(ELEMENTS) + 1 + 6 + 5 + 3
BOND_DIM = len(_BONDS)


def _molecule_graphs(limit: int | None, alerts: bool):
    """(features, edges, edge_attr, logp, tpsa, alert) of every parseable molecule of the file."""
    require("rdkit", "molecules", "the molecules task (RDKit's bundled NCI molecules)")
    from rdkit import Chem, RDLogger
    from rdkit.Chem import Crippen, FilterCatalog, rdMolDescriptors

    RDLogger.DisableLog("rdApp.*")
    catalog = None
    if alerts:  # matching the catalogs is most of the cost: only when asked
        params = FilterCatalog.FilterCatalogParams()
        params.AddCatalog(FilterCatalog.FilterCatalogParams.FilterCatalogs.PAINS)
        params.AddCatalog(FilterCatalog.FilterCatalogParams.FilterCatalogs.BRENK)
        catalog = FilterCatalog.FilterCatalog(params)
    out = []
    with open(_nci_path()) as fh:
        for line in fh:
            if limit is not None and len(out) >= limit:
                break
            smiles = line.split()[0] if line.strip() else ""
            mol = Chem.MolFromSmiles(smiles) if smiles else None
            if mol is None or mol.GetNumAtoms() == 0:
                continue
            x = torch.tensor([_atom_features(a) for a in mol.GetAtoms()])
            pairs, attrs = [], []
            for b in mol.GetBonds():
                pairs.append((b.GetBeginAtomIdx(), b.GetEndAtomIdx()))
                kind = str(b.GetBondType())
                attrs.append([float(kind == t) for t in _BONDS])
            edges = _both_ways(pairs)
            ea = torch.tensor(attrs + attrs).reshape(-1, BOND_DIM)
            out.append((x, edges, ea, Crippen.MolLogP(mol), rdMolDescriptors.CalcTPSA(mol),
                        catalog is not None and catalog.HasMatch(mol)))
    return out


@register("molecules", train_defaults={"model": "graph_transformer", "steps": 3000, "batch_size": 64, "lr": 1e-3,
                                       "embed_dim": 64, "num_layers": 3, "pooling": "sum", "eval_every": 250},
          baseline_model="node_mlp")
def molecules(target: str = "logp", seed: int = 0, limit: int | None = None) -> Task:
    """RDKit's ~5000 NCI molecules as atom graphs; predict ``target`` (see the module docstring).

    Args:
        target: ``"logp"`` or ``"tpsa"`` (regression, labels standardised on the training split;
            metric R^2) or ``"alert"`` (PAINS/Brenk match, classification; metric accuracy).
        seed: the random 80 / 10 / 10 split. limit: use only the first ``limit`` molecules.
    """
    if target not in ("logp", "tpsa", "alert"):
        raise ValueError(f"target must be 'logp', 'tpsa' or 'alert', got {target!r}")
    if limit is not None:
        int_at_least("limit", limit, 10)
    mols = _molecule_graphs(limit, alerts=target == "alert")
    perm = torch.randperm(len(mols), generator=torch.Generator().manual_seed(seed)).tolist()
    n_val = n_test = max(1, len(mols) // 10)
    parts = {"test": perm[:n_test], "val": perm[n_test : n_test + n_val], "train": perm[n_test + n_val :]}
    col = {"logp": 3, "tpsa": 4, "alert": 5}[target]
    width = max(m[0].shape[0] for m in mols)
    if target == "alert":
        kind, metric, num_labels = "classification", "accuracy", 2
        raw = torch.tensor([int(m[col]) for m in mols])
        train_y = raw[parts["train"]]
        baseline = {"majority": max(float((raw[parts["test"]] == c).float().mean()) for c in range(2))}
        labels = raw
    else:
        kind, metric, num_labels = "regression", "r2", 1
        raw = torch.tensor([float(m[col]) for m in mols], dtype=torch.float64)
        train_y = raw[parts["train"]]
        mean, std = float(train_y.mean()), float(train_y.std())
        labels = ((raw - mean) / std).float()
        baseline = {"mean": 0.0, "label_mean": mean, "label_std": std}
    splits = {}
    for name in ("train", "val", "test"):
        idx = parts[name]
        x = torch.zeros(len(idx), width, ATOM_DIM)
        mask = torch.zeros(len(idx), width, dtype=torch.bool)
        for r, i in enumerate(idx):
            n = mols[i][0].shape[0]
            x[r, :n], mask[r, :n] = mols[i][0], True
        splits[name] = Split(x, labels[idx], mask, [mols[i][1] for i in idx], [mols[i][2] for i in idx])
    return Task("molecules", kind, 0, num_labels, metric, splits, {"target": target, "seed": seed, "limit": limit},
                label_names=["no alert", "alert"] if target == "alert" else [target], baseline=baseline,
                inputs="graph", feature_dim=ATOM_DIM, edge_dim=BOND_DIM)


def _read_rows(path: str, what: str) -> list[list[str]]:
    from pathlib import Path

    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the {what} file {p}: {e}") from None
    rows = []
    for no, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            rows.append((no, line.replace(",", " ").split()))
    return rows


@register("graph_files", train_defaults={"model": "graph_transformer", "steps": 300, "batch_size": 1, "lr": 5e-3,
                                         "embed_dim": 64, "num_layers": 2, "warmup": 20,
                                         "eval_every": 20, "patience": None},
          baseline_model="node_mlp", files=("edges", "features", "labels"))
def graph_files(edges: str = "", features: str = "", labels: str = "", seed: int = 0, directed: bool = False) -> Task:
    """The user's own graph for node classification, from three text files.

    * ``edges``: one edge per line, ``source target`` (node ids ``0 .. N-1``, space or comma
      separated; ``#`` starts a comment). Undirected unless ``directed`` (then ``j i`` lets
      node ``i`` attend to ``j``).
    * ``features``: line ``k`` holds node ``k``'s feature vector (numbers; N lines).
    * ``labels``: line ``k`` holds node ``k``'s label (any string), or ``?`` for unlabelled.

    The labelled nodes are shuffled with ``seed`` and cut 70 / 15 / 15 into train / val / test.
    Errors name the file and the line. (A PyTorch Geometric ``Data`` is taken directly by
    :class:`attnlab.models.GraphTransformer`.)

    Args:
        edges: the edge list file. features: the node features file. labels: the node labels file.
        seed: the shuffle of the labelled nodes into train / val / test.
        directed: read each edge one way only (default: both ways).
    """
    if not (edges and features and labels):
        raise ValueError("graph_files needs edges=, features= and labels= files (--task-option edges=PATH ...)")
    feats = []
    for no, row in _read_rows(features, "features"):
        try:
            feats.append([float(v) for v in row])
        except ValueError:
            raise ValueError(f"{features} line {no}: expected numbers, got {' '.join(row)!r}") from None
        if len(feats[-1]) != len(feats[0]):
            raise ValueError(f"{features} line {no}: {len(feats[-1])} numbers, the first line has {len(feats[0])}")
    n = len(feats)
    if n == 0:
        raise ValueError(f"{features} holds no node")
    names_raw = [row[0] for _, row in _read_rows(labels, "labels")]
    if len(names_raw) != n:
        raise ValueError(f"{labels} has {len(names_raw)} labels, {features} has {n} nodes: one line per node")
    pairs = []
    for no, row in _read_rows(edges, "edges"):
        try:
            a, b = (int(v) for v in row)
        except ValueError:
            raise ValueError(f"{edges} line {no}: expected two node ids, got {' '.join(row)!r}") from None
        if not (0 <= a < n and 0 <= b < n):
            raise ValueError(f"{edges} line {no}: node ids must be in [0, {n - 1}], got {a} {b}")
        pairs.append((a, b))
    edge_index = ((torch.tensor(pairs, dtype=torch.long).T if pairs else torch.zeros(2, 0, dtype=torch.long))
                  if directed else _both_ways(pairs))
    names = sorted({s for s in names_raw if s != "?"})
    if len(names) < 2:
        raise ValueError(f"{labels} needs at least two distinct labels, got {names}")
    y = torch.tensor([names.index(s) if s != "?" else IGNORE for s in names_raw])
    known = (y != IGNORE).nonzero().flatten()
    known = known[torch.randperm(len(known), generator=torch.Generator().manual_seed(seed))]
    if len(known) < 3:
        raise ValueError(f"{labels} has {len(known)} labelled nodes; at least 3 are needed (train, val, test)")
    n_val = n_test = max(1, round(0.15 * len(known)))
    parts = {"test": known[:n_test], "val": known[n_test : n_test + n_val], "train": known[n_test + n_val :]}
    x = torch.tensor(feats)[None]
    splits = {}
    for name, idx in parts.items():
        lab = torch.full((1, n), IGNORE, dtype=torch.long)
        lab[0, idx] = y[idx]
        splits[name] = Split(x, lab, torch.ones(1, n, dtype=torch.bool), [edge_index])
    test_y = y[parts["test"]]
    majority = max(float((test_y == c).float().mean()) for c in range(len(names)))
    return Task("graph_files", "tagging", 0, len(names), "accuracy", {k: splits[k] for k in ("train", "val", "test")},
                {"edges": edges, "features": features, "labels": labels, "seed": seed, "directed": directed},
                label_names=names, baseline={"majority": majority}, inputs="graph", feature_dim=x.shape[2])


def task_from_graphs(train: list, val: list, test: list, *, name: str = "graphs", kind: str | None = None) -> Task:
    """A task from graph objects with ``x`` ``(N, F)``, ``edge_index`` ``(2, E)``, ``y`` and
    optionally ``edge_attr`` ``(E, edge_dim)`` — PyTorch Geometric ``Data`` objects, taken as they are.

    ``y`` with one entry per node makes a node-labelling (``tagging``) task (entries < 0 are
    unlabelled); one entry per graph, an integer one makes ``classification``, a float one
    ``regression`` (R^2; not rescaled). Train with ``attnlab.training.train(cfg, out, task=...)``.
    """
    splits_in = {"train": list(train), "val": list(val), "test": list(test)}
    for split, graphs in splits_in.items():
        if not graphs:
            raise ValueError(f"the {split} split holds no graph")
        for i, g in enumerate(graphs):
            for attr in ("x", "edge_index", "y"):
                if getattr(g, attr, None) is None:
                    raise ValueError(f"{split} graph {i} has no .{attr} (expected x, edge_index, y, "
                                     "optional edge_attr)")
    first = splits_in["train"][0]
    node_level = first.y.numel() == first.x.shape[0] and first.x.shape[0] > 1
    if kind is None:
        kind = "tagging" if node_level else ("regression" if first.y.is_floating_point() else "classification")
    if kind not in ("tagging", "classification", "regression"):
        raise ValueError(f"kind must be tagging, classification or regression, got {kind!r}")
    feat, edim = first.x.shape[1], (first.edge_attr.shape[1] if getattr(first, "edge_attr", None) is not None else None)
    labels_seen: set[int] = set()
    splits = {}
    for split, graphs in splits_in.items():
        width = max(g.x.shape[0] for g in graphs)
        x = torch.zeros(len(graphs), width, feat)
        mask = torch.zeros(len(graphs), width, dtype=torch.bool)
        edges, attrs = [], []
        ys = torch.full((len(graphs), width), IGNORE, dtype=torch.long) if kind == "tagging" else []
        for i, g in enumerate(graphs):
            n = g.x.shape[0]
            if g.x.shape[1] != feat:
                raise ValueError(f"{split} graph {i}: {g.x.shape[1]} node features, the first training "
                                 f"graph has {feat}")
            x[i, :n], mask[i, :n] = g.x.float(), True
            edges.append(check_edge_index(g.edge_index, n))
            ea = getattr(g, "edge_attr", None)
            if (ea is None) != (edim is None):
                raise ValueError(f"{split} graph {i}: every graph must have edge_attr, or none")
            if ea is not None:
                attrs.append(ea.float().reshape(edges[-1].shape[1], edim))
            if kind == "tagging":
                y = g.y.long().flatten()
                ys[i, :n] = torch.where(y < 0, torch.full_like(y, IGNORE), y)
                labels_seen |= set(y[y >= 0].tolist())
            else:
                ys.append(g.y.flatten()[0])
        labels = ys if kind == "tagging" else torch.stack(ys)
        if kind == "classification":
            labels = labels.long()
            labels_seen |= set(labels.tolist())
        elif kind == "regression":
            labels = labels.float()
        splits[split] = Split(x, labels, mask, edges, attrs if edim is not None else None)
    num_labels = 1 if kind == "regression" else max(labels_seen) + 1
    return Task(name, kind, 0, num_labels, "r2" if kind == "regression" else "accuracy", splits, {}, inputs="graph",
                feature_dim=feat, edge_dim=edim)
