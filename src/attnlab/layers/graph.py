"""Graph attention as a layer: :class:`GraphAttention`, one multi-head attention layer along a
graph's edges, the peer of PyTorch Geometric's ``TransformerConv`` (Shi et al. 2021, "Masked
Label Prediction", https://arxiv.org/abs/2009.03509, eqs. 3-5)::

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
A node with no incoming edge receives zero attention output (then only its root term).
"""

from __future__ import annotations

import torch
from torch import nn

from ..core.attend import AttentionResult, attend
from ..core.graph import check_edge_index, edge_attention
from ..core.masks import graph as graph_mask
from ..validate import ArgumentTypeError, positive_int

__all__ = ["GraphAttention"]


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
        positive_int("in_dim", in_dim), positive_int("head_dim", head_dim), positive_int("num_heads", num_heads)
        if edge_dim is not None:
            positive_int("edge_dim", edge_dim)
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
        if (getattr(conv, "lin_query", None) is None
                or isinstance(conv.in_channels, tuple) and conv.in_channels[0] != conv.in_channels[1]):
            raise ArgumentTypeError("expected a torch_geometric.nn.TransformerConv with one input width")
        in_dim = conv.in_channels[0] if isinstance(conv.in_channels, tuple) else conv.in_channels
        layer = cls(
            in_dim, conv.out_channels, conv.heads, edge_dim=conv.edge_dim, concat=conv.concat,
            root_weight=conv.root_weight, beta=conv.beta, bias=conv.lin_query.bias is not None, dropout=conv.dropout,
        )
        theirs = dict(conv.named_parameters())
        for name, p in layer.named_parameters():  # (PyG keeps an unused lin_skip when root_weight=False)
            if name not in theirs or theirs[name].shape != p.shape:
                raise ArgumentTypeError(f"TransformerConv has no parameter {name!r} of shape {tuple(p.shape)}")
            with torch.no_grad():
                p.copy_(theirs[name])
        return layer.to(next(conv.parameters()).dtype)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor | None = None, *,
                return_weights: bool = False) -> AttentionResult:
        """An :class:`attnlab.AttentionResult`: ``output`` the node outputs ``(N, out_dim)``,
        ``weights`` ``(E, H)`` per edge in ``edge_index`` order when asked (else None).

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
            raise ValueError(f"edge_attr must be (E, {self.edge_dim}) = {(edge_index.shape[1], self.edge_dim)}, "
                             f"got {tuple(edge_attr.shape)}")
        q = self.lin_query(x).view(n, h, c)
        k = self.lin_key(x).view(n, h, c)
        v = self.lin_value(x).view(n, h, c)
        e = None
        if edge_attr is not None:
            assert self.lin_edge is not None  # checked above: edge_attr is given exactly when the layer has edge_dim
            e = self.lin_edge(edge_attr).view(-1, h, c)
        drop = self.dropout if self.training else 0.0
        if self.mode == "sparse":
            bias = (q[edge_index[1]] * e).sum(-1) * c**-0.5 if e is not None else None
            res = edge_attention(q, k, v, edge_index, bias=bias, edge_values=e, dropout_p=drop,
                                 return_weights=return_weights)
            out, weights = res.output, res.weights
        else:
            out, weights = self._dense(q, k, v, e, edge_index, drop=drop, return_weights=return_weights)
        out = out.reshape(n, h * c) if self.concat else out.mean(1)
        if self.lin_skip is not None:
            r = self.lin_skip(x)
            if self.lin_beta is not None:
                b = torch.sigmoid(self.lin_beta(torch.cat([out, r, out - r], dim=-1)))
                out = b * r + (1 - b) * out
            else:
                out = out + r
        return AttentionResult(out, weights if return_weights else None)

    def _dense(self, q, k, v, e, edge_index, *, drop, return_weights):
        """The textbook form on the ``N x N`` adjacency mask."""
        n, h, c = q.shape
        mask = graph_mask(edge_index, n).dense(n)
        bias = None
        if e is not None:  # per-edge key term as a dense score bias
            bias = q.new_zeros(h, n, n)
            bias[:, edge_index[1], edge_index[0]] = ((q[edge_index[1]] * e).sum(-1) * c**-0.5).transpose(0, 1)
        need_w = return_weights or e is not None or drop > 0
        res = attend(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], mask=mask, bias=bias,
                     return_weights=need_w)
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
