"""Graph Transformer: self-attention restricted to a graph's edges is a graph neural network.

:class:`GraphAttention` is one attention layer over node vectors where node ``i`` attends only
to the sources of its incoming edges (Shi et al. 2021, "Masked Label Prediction",
https://arxiv.org/abs/2009.03509, eqs. 3-5; the layer PyTorch Geometric ships as
``TransformerConv``)::

    q_i = W_q x_i + b_q,   k_j = W_k x_j + b_k,   v_j = W_v x_j + b_v,   e_ij = W_e edge_attr_ij
    alpha_ij = softmax_{j -> i} ( <q_i, k_j + e_ij> / sqrt(C) )          per head, over i's in-edges
    out_i    = concat_h ( sum_j alpha_ij (v_j + e_ij) )  + W_r x_i  (root weight, optional)

With ``beta=True`` the root term is gated: ``b = sigmoid(w^T [out; r; out - r])``,
``out = b r + (1 - b) out``. Given the same weights the layer reproduces ``TransformerConv``
(:meth:`GraphAttention.from_transformer_conv` copies them).

``mode="sparse"`` (default) computes on ``edge_index`` with :func:`attnlab.core.graph.edge_attention`
(O(E) memory, no N x N tensor); ``mode="dense"`` builds the adjacency mask
(:func:`attnlab.masks.graph`) and calls :func:`attnlab.attend`: the textbook form, for small
graphs and for checking. They agree except on duplicated edges (sparse counts each copy).

Graphs are batched as one disjoint union (PyTorch Geometric's convention): node features
``(N, F)``, ``edge_index`` with offsets, and a ``batch`` vector ``(N,)`` giving each node's graph.
A node with no incoming edge receives zero attention output (then only its root / residual term).
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.attend import attend
from ..core.graph import check_edge_index, edge_attention
from ..core.masks import graph as graph_mask
from .heads import register, residual_blocks, run_residual

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


def _check_dim(name: str, val) -> int:
    if isinstance(val, bool) or not isinstance(val, int) or val < 1:
        raise ValueError(f"{name} must be a positive int, got {val!r}")
    return val


class GraphAttention(nn.Module):
    """One multi-head attention layer along edges (see the module docstring for the equations).

    Args:
        in_dim: F, the node feature width. head_dim: C, per head. num_heads: H.
        edge_dim: width of ``edge_attr`` (None: no edge features).
        concat: output ``(N, H C)``; False: the mean over heads, ``(N, C)``.
        root_weight: add ``W_r x_i`` (the node's own features; PyG's ``root_weight``).
        beta: gate the root term (PyG's ``beta``). bias: biases of the q, k, v, root projections.
        dropout: on the attention weights, in training.
        mode: ``"sparse"`` (on ``edge_index``) or ``"dense"`` (adjacency mask, N x N).
    """

    def __init__(
        self,
        in_dim: int,
        head_dim: int,
        num_heads: int = 1,
        *,
        edge_dim: int | None = None,
        concat: bool = True,
        root_weight: bool = True,
        beta: bool = False,
        bias: bool = True,
        dropout: float = 0.0,
        mode: str = "sparse",
    ):
        super().__init__()
        _check_dim("in_dim", in_dim), _check_dim("head_dim", head_dim), _check_dim("num_heads", num_heads)
        if edge_dim is not None:
            _check_dim("edge_dim", edge_dim)
        if mode not in ("sparse", "dense"):
            raise ValueError(f"mode must be 'sparse' or 'dense', got {mode!r}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        if beta and not root_weight:
            raise ValueError("beta gates the root term: it needs root_weight=True")
        self.in_dim, self.head_dim, self.num_heads = in_dim, head_dim, num_heads
        self.edge_dim, self.concat, self.mode, self.dropout = edge_dim, concat, mode, dropout
        out = head_dim * num_heads
        self.lin_query = nn.Linear(in_dim, out, bias=bias)
        self.lin_key = nn.Linear(in_dim, out, bias=bias)
        self.lin_value = nn.Linear(in_dim, out, bias=bias)
        self.lin_edge = nn.Linear(edge_dim, out, bias=False) if edge_dim is not None else None
        width = out if concat else head_dim
        self.lin_skip = nn.Linear(in_dim, width, bias=bias) if root_weight else None
        self.lin_beta = nn.Linear(3 * width, 1, bias=False) if beta else None

    @property
    def out_dim(self) -> int:
        """The output width: ``H C`` (concat) or ``C``."""
        return self.head_dim * (self.num_heads if self.concat else 1)

    @classmethod
    def from_transformer_conv(cls, conv) -> GraphAttention:
        """A layer holding a copy of the weights of a PyTorch Geometric ``TransformerConv``
        (same equations, same output); ``mode="sparse"``."""
        if getattr(conv, "lin_query", None) is None or isinstance(conv.in_channels, tuple) and conv.in_channels[0] != conv.in_channels[1]:
            raise TypeError("expected a torch_geometric.nn.TransformerConv with one input width")
        in_dim = conv.in_channels[0] if isinstance(conv.in_channels, tuple) else conv.in_channels
        layer = cls(
            in_dim, conv.out_channels, conv.heads, edge_dim=conv.edge_dim, concat=conv.concat,
            root_weight=conv.root_weight, beta=conv.beta, bias=conv.lin_query.bias is not None, dropout=conv.dropout,
        )
        theirs = dict(conv.named_parameters())
        for name, p in layer.named_parameters():  # (PyG keeps an unused lin_skip when root_weight=False)
            if name not in theirs or theirs[name].shape != p.shape:
                raise TypeError(f"TransformerConv has no parameter {name!r} of shape {tuple(p.shape)}")
            with torch.no_grad():
                p.copy_(theirs[name])
        return layer.to(next(conv.parameters()).dtype)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor | None = None, *, return_weights: bool = False):
        """Node outputs ``(N, out_dim)``; with ``return_weights`` the pair ``(output, weights)``,
        weights ``(E, H)`` per edge in ``edge_index`` order.

        Args:
            x: ``(N, F)`` node features. edge_index: ``(2, E)``, column ``(j, i)``: i attends to j.
            edge_attr: ``(E, edge_dim)``, required when the layer has ``edge_dim``.
        """
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.in_dim:
            raise ValueError(f"x must be (N, {self.in_dim}) node features, got {getattr(x, 'shape', type(x).__name__)}")
        n, h, c = x.shape[0], self.num_heads, self.head_dim
        edge_index = check_edge_index(edge_index, n)
        if (edge_attr is None) != (self.lin_edge is None):
            raise ValueError("edge_attr must be given exactly when the layer was built with edge_dim")
        if edge_attr is not None and (edge_attr.dim() != 2 or edge_attr.shape != (edge_index.shape[1], self.edge_dim)):
            raise ValueError(f"edge_attr must be (E, {self.edge_dim}) = {(edge_index.shape[1], self.edge_dim)}, got {tuple(edge_attr.shape)}")
        q = self.lin_query(x).view(n, h, c)
        k = self.lin_key(x).view(n, h, c)
        v = self.lin_value(x).view(n, h, c)
        e = self.lin_edge(edge_attr).view(-1, h, c) if edge_attr is not None else None
        drop = self.dropout if self.training else 0.0
        if self.mode == "sparse":
            bias = (q[edge_index[1]] * e).sum(-1) * c**-0.5 if e is not None else None
            res = edge_attention(q, k, v, edge_index, bias=bias, edge_values=e, dropout_p=drop, return_weights=return_weights)
            out, weights = res.output, res.weights
        else:
            out, weights = self._dense(q, k, v, e, edge_index, drop, return_weights)
        out = out.reshape(n, h * c) if self.concat else out.mean(1)
        if self.lin_skip is not None:
            r = self.lin_skip(x)
            if self.lin_beta is not None:
                b = torch.sigmoid(self.lin_beta(torch.cat([out, r, out - r], dim=-1)))
                out = b * r + (1 - b) * out
            else:
                out = out + r
        return (out, weights) if return_weights else out

    def _dense(self, q, k, v, e, edge_index, drop, return_weights):
        """The textbook form on the ``N x N`` adjacency mask."""
        n, h, c = q.shape
        mask = graph_mask(edge_index, n)
        bias = None
        if e is not None:  # per-edge key term as a dense score bias
            bias = q.new_zeros(h, n, n)
            bias[:, edge_index[1], edge_index[0]] = ((q[edge_index[1]] * e).sum(-1) * c**-0.5).transpose(0, 1)
        need_w = return_weights or e is not None or drop > 0
        res = attend(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], mask=mask, bias=bias, return_weights=need_w)
        if drop > 0:
            w = nn.functional.dropout(res.weights[0], drop)
            out = (w @ v.transpose(0, 1)).transpose(0, 1)
        else:
            out = res.output[0].transpose(0, 1)  # (N, H, C)
        weights = None
        if need_w:
            w_full = res.weights[0]  # (H, N, N)
            if e is not None:
                ev = q.new_zeros(n, n, h, c)
                ev[edge_index[1], edge_index[0]] = e
                w_use = nn.functional.dropout(w_full, drop) if drop > 0 else w_full
                out = out + torch.einsum("hij,ijhc->ihc", w_use, ev)
            weights = w_full[:, edge_index[1], edge_index[0]].transpose(0, 1)  # (E, H)
        return out, (weights if return_weights else None)


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
        raise TypeError(f"expected a graph with .x and .edge_index (a torch_geometric Data), got {type(data).__name__}")
    return x, ei, getattr(data, "edge_attr", None), getattr(data, "batch", None)


class GraphTransformer(nn.Module):
    """A stack of pre-norm blocks ``h + GraphAttention(LN h)``, ``h + FFN(LN h)`` over node vectors.

    Args:
        in_dim: node feature width. dim: model width (= heads x head width). num_heads, num_layers.
        edge_dim: edge feature width (None: none). ff_mult: FFN width / dim. dropout: in FFN and
            attention weights. mode: ``"sparse"`` or ``"dense"`` (see :class:`GraphAttention`).

    ``forward(x, edge_index, edge_attr=None)`` -> ``(N, dim)``; a PyTorch Geometric ``Data``
    is accepted in place of ``x`` (its ``x``, ``edge_index``, ``edge_attr`` are used).
    """

    def __init__(
        self, in_dim: int, dim: int = 64, num_heads: int = 4, num_layers: int = 2, *,
        edge_dim: int | None = None, ff_mult: int = 2, dropout: float = 0.0, mode: str = "sparse",
    ):
        super().__init__()
        _check_dim("dim", dim), _check_dim("num_heads", num_heads), _check_dim("num_layers", num_layers)
        if dim % num_heads:
            raise ValueError(f"dim ({dim}) must be divisible by num_heads ({num_heads})")
        self.dim = dim
        self.embed = nn.Linear(_check_dim("in_dim", in_dim), dim)
        self.attn = nn.ModuleList(
            GraphAttention(dim, dim // num_heads, num_heads, edge_dim=edge_dim, root_weight=False, dropout=dropout, mode=mode)
            for _ in range(num_layers)
        )
        self.norm1 = nn.ModuleList(nn.LayerNorm(dim) for _ in range(num_layers))
        self.norm2 = nn.ModuleList(nn.LayerNorm(dim) for _ in range(num_layers))
        self.ff = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, ff_mult * dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(ff_mult * dim, dim)) for _ in range(num_layers)
        )
        self.out_norm = nn.LayerNorm(dim)

    def forward(self, x, edge_index: torch.Tensor | None = None, edge_attr: torch.Tensor | None = None, *, return_weights: bool = False):
        """Node vectors ``(N, dim)``; with ``return_weights`` also the list of per-layer ``(E, H)`` weights."""
        if not isinstance(x, torch.Tensor):
            x, edge_index, edge_attr, _ = graph_inputs(x)
        if edge_index is None:
            raise ValueError("edge_index is required (or pass a torch_geometric Data)")
        h = self.embed(x)
        weights = []
        for attn, n1, n2, ff in zip(self.attn, self.norm1, self.norm2, self.ff):
            a = attn(n1(h), edge_index, edge_attr, return_weights=return_weights)
            if return_weights:
                a, w = a
                weights.append(w)
            h = h + a
            h = h + ff(n2(h))
        h = self.out_norm(h)
        return (h, weights) if return_weights else h


# ---------------------------------------------------------------------------------------------
# backbones and heads for graph tasks (``attnlab train --task karate|sbm|molecules``)


class GraphBackbone(nn.Module):
    """Base class of backbones over graphs: ``forward(x (N, F), edge_index, edge_attr) -> (N, dim)``.

    Args:
        feature_dim: F. dim: output width. edge_dim: edge feature width (None: none).

    Attributes:
        inputs: ``"graph"`` (what :func:`attnlab.models.build_model` checks against the task).
    """

    inputs = "graph"
    uses_attention = False

    def __init__(self, feature_dim: int, dim: int, edge_dim: int | None = None):
        super().__init__()
        self.feature_dim, self.dim, self.edge_dim = _check_dim("feature_dim", feature_dim), _check_dim("dim", dim), edge_dim


@register("graph_transformer")
class GraphTransformerBackbone(GraphBackbone):
    """A :class:`GraphTransformer`: attention along the edges (sparse, or ``mode="dense"``),
    edge features when the task has them."""

    attention_kind = "edges"

    def __init__(self, feature_dim: int, dim: int, edge_dim: int | None = None, *, num_heads: int = 4, num_layers: int = 2,
                 dropout: float = 0.0, mode: str = "sparse", ff_mult: int = 2):
        super().__init__(feature_dim, dim, edge_dim)
        self.net = GraphTransformer(feature_dim, dim, num_heads, num_layers, edge_dim=edge_dim, dropout=dropout, mode=mode, ff_mult=ff_mult)

    def forward(self, x, edge_index, edge_attr=None, *, return_weights: bool = False):
        return self.net(x, edge_index, edge_attr, return_weights=return_weights)


@register("node_mlp")
class NodeMLPBackbone(GraphBackbone):
    """Each node alone (edges ignored): ``num_layers`` residual MLP blocks; the baseline that
    shows what the edges add."""

    def __init__(self, feature_dim: int, dim: int, edge_dim: int | None = None, *, num_layers: int = 2, dropout: float = 0.0):
        super().__init__(feature_dim, dim, edge_dim)
        self.embed = nn.Linear(feature_dim, dim)
        self.blocks = residual_blocks(dim, num_layers, 2 * dim, dropout)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x, edge_index, edge_attr=None, *, return_weights: bool = False):
        h = run_residual(self.blocks, self.norm, self.embed(x))
        return (h, None) if return_weights else h


class NodeLabeler(nn.Module):
    """A label per node: a :class:`GraphBackbone`, then a linear layer -> ``(N, L)``."""

    def __init__(self, backbone: GraphBackbone, num_labels: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.dim, num_labels)

    def forward(self, x, edge_index, edge_attr=None, batch=None, num_graphs=None, *, return_weights: bool = False):
        """Logits ``(N, num_labels)`` (with ``return_weights``: and the per-layer edge weights)."""
        if return_weights:
            h, w = self.backbone(x, edge_index, edge_attr, return_weights=True)
            return self.head(h), w
        return self.head(self.backbone(x, edge_index, edge_attr))


class GraphPredictor(nn.Module):
    """One label (or value, ``num_labels=1``) per graph: node vectors pooled per graph of the
    batch (``pooling="mean"`` or ``"sum"``; a sum suits additive targets such as logP), then a
    two-layer MLP."""

    def __init__(self, backbone: GraphBackbone, num_labels: int, *, pooling: str = "mean"):
        super().__init__()
        if pooling not in ("mean", "sum"):
            raise ValueError(f"graph pooling must be 'mean' or 'sum', got {pooling!r}")
        self.backbone, self.pooling = backbone, pooling
        self.head = nn.Sequential(nn.Linear(backbone.dim, backbone.dim), nn.GELU(), nn.Linear(backbone.dim, num_labels))

    def forward(self, x, edge_index, edge_attr=None, batch=None, num_graphs=None, *, return_weights: bool = False):
        """Logits ``(G, num_labels)``; ``batch`` ``(N,)`` gives each node's graph (None: one graph)."""
        res = self.backbone(x, edge_index, edge_attr, return_weights=return_weights)
        h, w = res if return_weights else (res, None)
        if batch is None:
            batch = torch.zeros(h.shape[0], dtype=torch.long, device=h.device)
        g = int(num_graphs) if num_graphs is not None else int(batch.max()) + 1 if batch.numel() else 1
        pooled = segment_mean(h, batch, g)
        if self.pooling == "sum":
            pooled = pooled * torch.bincount(batch, minlength=g).to(h.dtype)[:, None]
        out = self.head(pooled)
        return (out, w) if return_weights else out
