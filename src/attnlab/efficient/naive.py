"""``dense_naive``: exact attention computed as it was before fused kernels, the N x N weights
materialised and kept for the backward pass: the memory baseline of the Long Range Arena."""

from __future__ import annotations

from ..core.attend import AttentionResult
from ..layers.exact import DenseStep
from ..layers.step import StepCall
from .base import Budget, register

__all__ = ["NaiveDenseAttention"]


@register("dense_naive")
class NaiveDenseAttention(DenseStep):
    """Dense attention the 2020 way: scores ``Q K^T`` for all ``N x M`` pairs, normalised, then
    ``weights @ V``, through plain autograd, which keeps every layer's ``(B, H, N, M)`` weights
    until the backward pass. It computes exactly what ``dense`` computes (every score,
    normaliser, mask and bias), only without PyTorch's fused kernel, which never holds the
    matrix; so its memory grows as N^2 where ``dense``'s grows as N. The Long Range Arena's
    memory column (Tay et al. 2021, Table 2: the Transformer against Linformer and the others at
    4K) compares against this, not against a fused kernel.

    Args: as for :class:`attnlab.layers.exact.DenseStep`.
    """

    capabilities = DenseStep.capabilities.with_changes(reference=True)  # a reference of 'dense': left out of the grids
    budget = Budget(long=None)  # the arena only: at the scaling benchmark's 16K-32K its weights do not fit

    def attend(self, q, k, v, call: StepCall) -> AttentionResult:
        res = self.exact(q, k, v, call, return_weights=True, block_size=(max(1, q.shape[2]), max(1, k.shape[2])))
        return res if call.return_weights else AttentionResult(res.output)
