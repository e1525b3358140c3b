"""Linear attention ("Transformers are RNNs", Katharopoulos et al. 2020), with its recurrent form."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..layers.state import RecurrentState
from .base import Budget, EfficientStep, Sweep, register
from .kernel import FeatureMap, chunked_kernel_attention, kernel_attention

__all__ = ["LinearAttention", "elu_feature_map"]


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """``phi(x) = elu(x) + 1``: positive, so the normaliser never vanishes."""
    return F.elu(x) + 1.0


class _EluMap(FeatureMap):
    def query(self, x):
        return elu_feature_map(x)

    key = query


@register("linear")
class LinearAttention(EfficientStep):
    """``b_i = phi(q_i)^T sum_j phi(k_j) v_j^T / phi(q_i)^T sum_j phi(k_j)``, ``phi = elu + 1``.

    Katharopoulos et al. 2020 (https://arxiv.org/abs/2006.16236): replacing
    ``exp(q . k)`` by ``phi(q) . phi(k)`` lets the key-value products be summed once, O(N)
    instead of O(N^2). Causal, the sums run over ``j <= i`` and the layer is an RNN whose
    state is ``(S, z)``: decoding with :meth:`new_cache` costs the same for every token,
    ``S_t = S_{t-1} + phi(k_t) v_t^T``, ``z_t = z_{t-1} + phi(k_t)``,
    ``b_t = phi(q_t)^T S_t / (phi(q_t)^T z_t)``.

    Args:
        embed_dim, num_heads, causal: see :class:`attnlab.efficient.EfficientStep`.
        eps: added to the normaliser.
    """

    budget = Budget(sweep=Sweep(None, (0,), "(none)"))  # no knob: one cost, O(N D^2)
    # decoding: the recurrent state (S, z), equal to the parallel causal layer at a cost per token independent of the
    # length
    capabilities = EfficientStep.capabilities.with_changes(cache="recurrent", family="kernel")

    def __init__(self, embed_dim: int, num_heads: int, *, eps: float = 1e-6, **options):
        super().__init__(embed_dim, num_heads, **options)
        self.eps = float(eps)

    def compute(self, q, k, v, valid):
        if not self.causal:
            return chunked_kernel_attention(_EluMap(), q, k, v, valid=valid, eps=self.eps)
        phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
        if valid is not None:
            phi_k = phi_k * valid[:, None, :, None]
        return kernel_attention(phi_q, phi_k, v, causal=self.causal, eps=self.eps)

    def decode(self, q, k, v, state: RecurrentState, valid) -> torch.Tensor:
        phi_q, phi_k = elu_feature_map(q), elu_feature_map(k)
        if valid is not None:
            phi_k = phi_k * valid[:, None, :, None]
        sums = None
        if state.s is not None:
            assert state.z is not None  # written with s
            sums = (state.s, state.z)
        out, (state.s, state.z) = kernel_attention(phi_q, phi_k, v, causal=True, eps=self.eps, state=sums,
                                                   return_state=True)
        return out
