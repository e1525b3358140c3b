"""Attention along the edges of a graph, computed sparsely: the graph *is* the mask.

Node ``i`` attends to node ``j`` only when the edge ``j -> i`` exists (``edge_index[:, e] =
(j, i)``: source first, target second, PyTorch Geometric's ``source_to_target`` flow, and the
convention of :func:`attnlab.masks.graph`). For every target node ``i`` and head ``h``::

    s_e       = scale * <q_i, k_j> + bias_e                  for each edge e = (j -> i)
    alpha_e   = exp(s_e) / sum_{e' into i} exp(s_e')         (softmax over i's incoming edges)
    out_i     = sum_{e into i} alpha_e * (v_j + edge_values_e)

This is :func:`attnlab.attend` with the mask ``masks.graph(edge_index, N)``, but it costs
O(E) time and memory instead of O(N^2): the scores are a sampled dense-dense product (SDDMM,
``torch.sparse.sampled_addmm``) on the sparsity pattern of the graph, the mix is a sparse-dense
product (SpMM) per head, and the softmax is a segment reduction over each node's edges. Neither
an ``N x N`` tensor nor an ``(E, H, D)`` gather of queries or keys is built (only the optional
per-edge terms are per edge by nature). The backward pass is written out the same way.

A node with no incoming edge (isolated, or only sending) gets a zero output and zero
gradients, the mask convention of :func:`attnlab.attend`. A duplicated edge is counted twice
(each listed edge is one term of the softmax, as in PyTorch Geometric); the dense mask would
count it once.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

from ..validate import ArgumentTypeError, probability
from .amp import same_autocast_backward, same_autocast_forward

__all__ = ["EdgeAttentionResult", "check_edge_index", "edge_attention"]


@dataclass
class EdgeAttentionResult:
    """What :func:`edge_attention` returns.

    Attributes:
        output: ``(N, H, Dv)``.
        weights: ``(E, H)``, the softmax weight of every edge in the order of ``edge_index``,
            when ``return_weights=True``; else ``None``.
    """

    output: torch.Tensor
    weights: torch.Tensor | None = None


def check_edge_index(edge_index, num_nodes: int) -> torch.Tensor:
    """Validate ``edge_index`` ``(2, E)`` (integer node indices in ``[0, num_nodes)``) and
    return it as ``int64``; raises ``TypeError``/``ValueError`` naming what came."""
    if not isinstance(edge_index, torch.Tensor):
        raise ArgumentTypeError(f"edge_index must be a torch.Tensor of shape (2, E), got {type(edge_index).__name__}")
    if edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool or edge_index.is_complex():
        raise ArgumentTypeError(f"edge_index must have an integer dtype, got {edge_index.dtype}")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"edge_index must have shape (2, E), got {tuple(edge_index.shape)}")
    if edge_index.numel():
        lo, hi = int(edge_index.min()), int(edge_index.max())
        if lo < 0 or hi >= num_nodes:
            raise ValueError(
                f"edge_index holds node indices in [{lo}, {hi}], expected them in [0, {num_nodes - 1}] "
                f"(num_nodes={num_nodes})"
            )
    return edge_index.long()


class _Pattern:
    """The graph's sparsity pattern in CSR form, rows = targets, and its transpose (rows =
    sources) as a permutation of the same edges."""

    def __init__(self, edge_index: torch.Tensor, n: int):
        src, dst = edge_index[0], edge_index[1]
        self.n = n
        self.order = torch.argsort(dst * n + src, stable=True)  # edges sorted by target, then source
        self.src, self.dst = src[self.order], dst[self.order]
        counts = torch.bincount(self.dst, minlength=n)
        self.crow = torch.zeros(n + 1, dtype=torch.long, device=src.device)
        self.crow[1:] = counts.cumsum(0)
        self.counts = counts
        self.t_order = torch.argsort(self.src * n + self.dst, stable=True)  # sorted edges -> source-major
        tcounts = torch.bincount(self.src, minlength=n)
        self.tcrow = torch.zeros(n + 1, dtype=torch.long, device=src.device)
        self.tcrow[1:] = tcounts.cumsum(0)
        self.tcol = self.dst[self.t_order]

    def csr(self, values: torch.Tensor) -> torch.Tensor:
        """``(N, N)`` CSR matrix with ``values`` (E,) at (target, source)."""
        return torch.sparse_csr_tensor(self.crow, self.src, values, (self.n, self.n), check_invariants=False)

    def csr_t(self, values: torch.Tensor) -> torch.Tensor:
        """The transpose: ``(N, N)`` CSR with ``values`` (E, in target-major order) at (source, target)."""
        return torch.sparse_csr_tensor(self.tcrow, self.tcol, values[self.t_order], (self.n, self.n),
                                       check_invariants=False)

    def segment_sum(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of per-edge rows ``x`` (E, ...) over each target's edges -> (N, ...)."""
        out = x.new_zeros((self.n,) + x.shape[1:])
        return out.index_add_(0, self.dst, x)

    def sddmm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Per edge and head ``<a[target], b[source]>``: a, b ``(H, N, D)`` -> ``(E, H)``."""
        pat = self.csr(a.new_zeros(self.src.shape[0]))
        cols = [torch.sparse.sampled_addmm(pat, a[h], b[h].transpose(0, 1), beta=0.0).values()
                for h in range(a.shape[0])]
        return torch.stack(cols, dim=1)

    def spmm(self, w: torch.Tensor, x: torch.Tensor, transpose: bool = False) -> torch.Tensor:
        """Per head ``W_h @ x_h`` with ``W_h`` the pattern holding ``w[:, h]``: w ``(E, H)``, x
        ``(H, N, D)`` -> ``(H, N, D)`` (``transpose``: ``W_h^T @ x_h``)."""
        make = self.csr_t if transpose else self.csr
        return torch.stack([torch.sparse.mm(make(w[:, h].contiguous()), x[h]) for h in range(x.shape[0])])


def _softmax(s: torch.Tensor, pat: _Pattern) -> torch.Tensor:
    """Softmax of edge scores ``(E, H)`` over each target's edges."""
    if s.shape[0] == 0:
        return s
    m = torch.full((pat.n, s.shape[1]), float("-inf"), dtype=s.dtype, device=s.device)
    m = m.scatter_reduce(0, pat.dst[:, None].expand_as(s), s, reduce="amax", include_self=True)
    p = torch.exp(s - m[pat.dst])
    return p / pat.segment_sum(p)[pat.dst]


class _EdgeAttention(torch.autograd.Function):
    """Forward and backward of sparse edge attention on a :class:`_Pattern` (edges target-major)."""

    @staticmethod
    @same_autocast_forward
    def forward(ctx, q, k, v, bias, ev, pat: _Pattern, scale: float, keep):
        # q, k: (H, N, D); v: (H, N, Dv); bias: (E, H) or None; ev: (E, H, Dv) or None;
        # keep: (E, H) dropout multipliers (0 or 1 / (1 - p)) or None
        s = pat.sddmm(q, k) * scale
        if bias is not None:
            s = s + bias
        alpha = _softmax(s, pat)  # (E, H)
        used = alpha if keep is None else alpha * keep
        out = pat.spmm(used, v)  # (H, N, Dv)
        if ev is not None:
            out = out + pat.segment_sum(used[..., None] * ev).transpose(0, 1)
        ctx.save_for_backward(q, k, v, ev, alpha, keep)
        ctx.pat, ctx.scale, ctx.has_bias = pat, scale, bias is not None
        return out, alpha

    @staticmethod
    @same_autocast_backward
    def backward(ctx, g, g_alpha):
        q, k, v, ev, alpha, keep = ctx.saved_tensors
        pat, scale = ctx.pat, ctx.scale
        used = alpha if keep is None else alpha * keep
        g = g.contiguous()
        d_alpha = pat.sddmm(g, v)  # (E, H): <g_i, v_j>
        if ev is not None:
            gt = g.transpose(0, 1)[pat.dst]  # (E, H, Dv)
            d_alpha = d_alpha + (gt * ev).sum(-1)
        if keep is not None:
            d_alpha = d_alpha * keep
        if g_alpha is not None:
            d_alpha = d_alpha + g_alpha
        ds = alpha * (d_alpha - pat.segment_sum(alpha * d_alpha)[pat.dst])  # softmax backward, (E, H)
        dq = pat.spmm(ds, k) * scale if ctx.needs_input_grad[0] else None
        dk = pat.spmm(ds, q, transpose=True) * scale if ctx.needs_input_grad[1] else None
        dv = pat.spmm(used, g, transpose=True) if ctx.needs_input_grad[2] else None
        dbias = ds if ctx.has_bias and ctx.needs_input_grad[3] else None
        dev = used[..., None] * gt if ev is not None and ctx.needs_input_grad[4] else None
        return dq, dk, dv, dbias, dev, None, None, None


def edge_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    edge_index: torch.Tensor,
    *,
    scale: float | None = None,
    bias: torch.Tensor | None = None,
    edge_values: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    return_weights: bool = False,
) -> EdgeAttentionResult:
    """Softmax attention of every node over its incoming edges, sparse (see the module docstring).

    Args:
        q: ``(N, H, D)`` queries, one per node. k: ``(N, H, D)`` keys. v: ``(N, H, Dv)`` values.
        edge_index: ``(2, E)`` integer, column ``(j, i)`` = edge ``j -> i``: node ``i`` attends to ``j``.
        scale: multiplies ``<q_i, k_j>`` (default ``1 / sqrt(D)``).
        bias: ``(E, H)`` added to each edge's score (edge features projected to a score term).
        edge_values: ``(E, H, Dv)`` added to the source's value on each edge (PyG's
            ``TransformerConv`` adds its projected edge features to keys and values).
        dropout_p: dropout on the edge weights (pass it only in training).
        return_weights: also return the ``(E, H)`` softmax weights (before dropout), in
            ``edge_index`` order.

    Returns:
        :class:`EdgeAttentionResult`; ``output`` ``(N, H, Dv)``.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a (N, H, D) tensor, got {getattr(t, 'shape', type(t).__name__)}")
    n, h, d = q.shape
    if k.shape != q.shape or v.shape[:2] != (n, h):
        raise ValueError(f"q, k must be (N, H, D) and v (N, H, Dv) with the same N, H; got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    edge_index = check_edge_index(edge_index, n)
    e = edge_index.shape[1]
    if bias is not None and bias.shape != (e, h):
        raise ValueError(f"bias must have shape (E, H) = {(e, h)}, got {tuple(bias.shape)}")
    if edge_values is not None and edge_values.shape != (e, h, v.shape[2]):
        raise ValueError(f"edge_values must have shape (E, H, Dv) = {(e, h, v.shape[2])}, got "
                         f"{tuple(edge_values.shape)}")
    probability("dropout_p", dropout_p)
    scale = d**-0.5 if scale is None else float(scale)
    pat = _Pattern(edge_index.to(q.device), n)
    order = pat.order
    b = bias[order] if bias is not None else None
    ev = edge_values[order] if edge_values is not None else None
    keep = None
    if dropout_p > 0:
        # drawn in edge order
        keep = ((torch.rand(e, h, device=q.device) >= dropout_p).to(q.dtype) / (1.0 - dropout_p))[order]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*[Ss]parse CSR tensor support is in beta.*")
        out, alpha = _EdgeAttention.apply(
            q.transpose(0, 1).contiguous(), k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous(), b, ev, pat,
            scale, keep
        )
    weights = None
    if return_weights:
        weights = torch.empty_like(alpha).index_copy_(0, order, alpha)  # back to edge_index order
    return EdgeAttentionResult(out.transpose(0, 1), weights)
