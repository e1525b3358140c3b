"""Graph Transformer: self-attention restricted to a graph's edges is a graph neural network.

Each block is a :class:`attnlab.layers.graph.GraphAttention` (re-exported here; the equations
of Shi et al. 2021 and PyG's ``TransformerConv``, sparse on ``edge_index`` or dense with the
adjacency mask) and a feed-forward layer, pre-norm and residual.

Graphs are batched as one disjoint union (PyTorch Geometric's convention): node features
``(N, F)``, ``edge_index`` with offsets, and a ``batch`` vector ``(N,)`` giving each node's graph.
A node with no incoming edge receives zero attention output (then only its root / residual term).
"""

from __future__ import annotations

import torch
from torch import nn

from ..layers.graph import GraphAttention
from ..validate import ArgumentTypeError, positive_int
from .base import ModelOutput, register, residual_blocks, run_residual

__all__ = [
    "GraphAttention",
    "GraphBackbone",
    "GraphPredictor",
    "GraphTransformer",
    "GraphTransformerBackbone",
    "NodeLabeler",
    "NodeMLPBackbone",
    "graph_inputs",
    "segment_mean",
]


def segment_mean(x: torch.Tensor, batch: torch.Tensor, num_graphs: int) -> torch.Tensor:
    """Mean of the node rows ``x`` ``(N, E)`` of each graph -> ``(G, E)`` (a graph with no node: 0)."""
    total = x.new_zeros(num_graphs, x.shape[1]).index_add_(0, batch, x)
    count = torch.bincount(batch, minlength=num_graphs).clamp_min(1).to(x.dtype)
    return total / count[:, None]


def graph_inputs(data) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``(x, edge_index, edge_attr, batch)`` from a PyTorch Geometric ``Data`` / ``Batch`` (or
    any object with those attributes); ``edge_attr`` and ``batch`` may be None."""
    x = getattr(data, "x", None)
    ei = getattr(data, "edge_index", None)
    if x is None or ei is None:
        raise ArgumentTypeError("expected a graph with .x and .edge_index (a torch_geometric Data), got "
                                f"{type(data).__name__}")
    return x, ei, getattr(data, "edge_attr", None), getattr(data, "batch", None)


class GraphTransformer(nn.Module):
    """A stack of pre-norm blocks ``h + GraphAttention(LN h)``, ``h + FFN(LN h)`` over node vectors.

    Args:
        in_dim: node feature width. embed_dim: model width (= heads x head width). num_heads, num_layers.
        edge_dim: edge feature width (None: none). ff_mult: FFN width / embed_dim. dropout: in FFN and
            attention weights. mode: ``"sparse"`` or ``"dense"`` (see :class:`GraphAttention`).

    ``forward(x, edge_index, edge_attr=None)`` -> ``(N, embed_dim)``; a PyTorch Geometric ``Data``
    is accepted in place of ``x`` (its ``x``, ``edge_index``, ``edge_attr`` are used).
    """

    def __init__(
        self, in_dim: int, embed_dim: int = 64, num_heads: int = 4, num_layers: int = 2, *,
        edge_dim: int | None = None, ff_mult: int = 2, dropout: float = 0.0, mode: str = "sparse",
    ):
        super().__init__()
        positive_int("embed_dim", embed_dim), positive_int("num_heads", num_heads)
        positive_int("num_layers", num_layers)
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        self.embed_dim = embed_dim
        self.embed = nn.Linear(positive_int("in_dim", in_dim), embed_dim)
        self.attn = nn.ModuleList(
            GraphAttention(embed_dim, embed_dim // num_heads, num_heads, edge_dim=edge_dim, root_weight=False,
                           dropout=dropout, mode=mode)
            for _ in range(num_layers)
        )
        self.norm1 = nn.ModuleList(nn.LayerNorm(embed_dim) for _ in range(num_layers))
        self.norm2 = nn.ModuleList(nn.LayerNorm(embed_dim) for _ in range(num_layers))
        self.ff = nn.ModuleList(
            nn.Sequential(nn.Linear(embed_dim, ff_mult * embed_dim), nn.GELU(), nn.Dropout(dropout),
                          nn.Linear(ff_mult * embed_dim, embed_dim))
            for _ in range(num_layers)
        )
        self.out_norm = nn.LayerNorm(embed_dim)

    def forward(self, x, edge_index: torch.Tensor | None = None, edge_attr: torch.Tensor | None = None, *,
                return_weights: bool = False):
        """Node vectors ``(N, embed_dim)``; with ``return_weights`` also the list of per-layer ``(E, H)`` weights."""
        if not isinstance(x, torch.Tensor):
            x, edge_index, edge_attr, _ = graph_inputs(x)
        if edge_index is None:
            raise ValueError("edge_index is required (or pass a torch_geometric Data)")
        h = self.embed(x)
        weights = []
        for attn, n1, n2, ff in zip(self.attn, self.norm1, self.norm2, self.ff):
            a = attn(n1(h), edge_index, edge_attr, return_weights=return_weights)
            weights.append(a.weights)
            h = h + a.output
            h = h + ff(n2(h))
        return ModelOutput(self.out_norm(h), weights if return_weights else None)


# ---------------------------------------------------------------------------------------------
# backbones and heads for graph tasks (``attnlab train --task karate|sbm|molecules``)


class GraphBackbone(nn.Module):
    """Base class of backbones over graphs: ``forward(x (N, F), edge_index, edge_attr) -> (N, embed_dim)``.

    Args:
        feature_dim: F. embed_dim: output width. edge_dim: edge feature width (None: none).

    Attributes:
        inputs: ``"graph"`` (what :func:`attnlab.models.build_model` checks against the task).
    """

    inputs = "graph"
    uses_attention = False

    def __init__(self, feature_dim: int, embed_dim: int, edge_dim: int | None = None):
        super().__init__()
        self.feature_dim = positive_int("feature_dim", feature_dim)
        self.embed_dim = positive_int("embed_dim", embed_dim)
        self.edge_dim = edge_dim


@register("graph_transformer")
class GraphTransformerBackbone(GraphBackbone):
    """A :class:`GraphTransformer`: attention along the edges (sparse, or ``mode="dense"``),
    edge features when the task has them."""

    attention_kind = "edges"

    def __init__(self, feature_dim: int, embed_dim: int, edge_dim: int | None = None, *, num_heads: int = 4,
                 num_layers: int = 2, dropout: float = 0.0, mode: str = "sparse", ff_mult: int = 2):
        super().__init__(feature_dim, embed_dim, edge_dim)
        self.net = GraphTransformer(feature_dim, embed_dim, num_heads, num_layers, edge_dim=edge_dim, dropout=dropout,
                                    mode=mode, ff_mult=ff_mult)

    def forward(self, x, edge_index, edge_attr=None, *, return_weights: bool = False):
        return self.net(x, edge_index, edge_attr, return_weights=return_weights)


@register("node_mlp")
class NodeMLPBackbone(GraphBackbone):
    """Each node alone (edges ignored): ``num_layers`` residual MLP blocks; the baseline that
    shows what the edges add."""

    def __init__(self, feature_dim: int, embed_dim: int, edge_dim: int | None = None, *, num_layers: int = 2,
                 dropout: float = 0.0):
        super().__init__(feature_dim, embed_dim, edge_dim)
        self.embed = nn.Linear(feature_dim, embed_dim)
        self.blocks = residual_blocks(embed_dim, num_layers, 2 * embed_dim, dropout)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x, edge_index, edge_attr=None, *, return_weights: bool = False):
        return ModelOutput(run_residual(self.blocks, self.norm, self.embed(x)))


class NodeLabeler(nn.Module):
    """A label per node: a :class:`GraphBackbone`, then a linear layer -> ``(N, L)``."""

    def __init__(self, backbone: GraphBackbone, num_labels: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.embed_dim, num_labels)

    def forward(self, x, edge_index, edge_attr=None, batch=None, num_graphs=None, *, return_weights: bool = False):
        """Logits ``(N, num_labels)`` (with ``return_weights``: and the per-layer edge weights)."""
        res = self.backbone(x, edge_index, edge_attr, return_weights=return_weights)
        return ModelOutput(self.head(res.output), res.weights)


class GraphPredictor(nn.Module):
    """One label (or value, ``num_labels=1``) per graph: node vectors pooled per graph of the
    batch (``pooling="mean"`` or ``"sum"``; a sum suits additive targets such as logP), then a
    two-layer MLP."""

    def __init__(self, backbone: GraphBackbone, num_labels: int, *, pooling: str = "mean"):
        super().__init__()
        if pooling not in ("mean", "sum"):
            raise ValueError(f"graph pooling must be 'mean' or 'sum', got {pooling!r}")
        self.backbone, self.pooling = backbone, pooling
        self.head = nn.Sequential(nn.Linear(backbone.embed_dim, backbone.embed_dim), nn.GELU(),
                                  nn.Linear(backbone.embed_dim, num_labels))

    def forward(self, x, edge_index, edge_attr=None, batch=None, num_graphs=None, *, return_weights: bool = False):
        """Logits ``(G, num_labels)``; ``batch`` ``(N,)`` gives each node's graph (None: one graph)."""
        res = self.backbone(x, edge_index, edge_attr, return_weights=return_weights)
        h = res.output
        if batch is None:
            batch = torch.zeros(h.shape[0], dtype=torch.long, device=h.device)
        g = int(num_graphs) if num_graphs is not None else int(batch.max()) + 1 if batch.numel() else 1
        pooled = segment_mean(h, batch, g)
        if self.pooling == "sum":
            pooled = pooled * torch.bincount(batch, minlength=g).to(h.dtype)[:, None]
        return ModelOutput(self.head(pooled), res.weights)
