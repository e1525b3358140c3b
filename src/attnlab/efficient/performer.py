"""Performer: FAVOR+ positive orthogonal random features (Choromanski et al. 2021)."""

from __future__ import annotations

import math

import torch

from ..layers.state import RecurrentState
from ..validate import int_at_least, positive_int
from .base import Budget, EfficientStep, Sweep, register
from .kernel import CAUSAL_CHUNK, FeatureMap, chunked_kernel_attention, kernel_attention

__all__ = ["PerformerAttention", "orthogonal_gaussian", "favor_features"]


def orthogonal_gaussian(num_features: int, dim: int, *, generator=None, device=None,
                        dtype=torch.float32) -> torch.Tensor:
    """``(num_features, dim)`` random rows, orthogonal within each block of ``dim`` rows, with the
    norms of Gaussian vectors (chi-distributed with ``dim`` degrees of freedom): the "ORF" of
    the paper, section 3.3, an unbiased and lower-variance replacement for i.i.d. Gaussian rows."""
    blocks = []
    for start in range(0, num_features, dim):
        g = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        qmat, r = torch.linalg.qr(g)  # orthonormal columns
        qmat = qmat * torch.sign(torch.diagonal(r))  # the sign fix that makes Q uniform (Haar) over rotations
        blocks.append(qmat.T[: min(dim, num_features - start)])
    w = torch.cat(blocks, dim=0)  # (F, D) orthonormal rows per block
    norms = torch.randn(num_features, dim, generator=generator, dtype=torch.float64).norm(dim=-1, keepdim=True)
    return (w * norms).to(device=device, dtype=dtype)


def favor_features(x: torch.Tensor, w: torch.Tensor, *, is_query: bool) -> torch.Tensor:
    """Positive random features with ``phi(q) . phi(k)`` an unbiased estimate of ``exp(q . k / sqrt(D))``.

    ``phi(x) = exp(w_r . x' - |x'|^2 / 2) / sqrt(F)`` with ``x' = x / D^(1/4)`` (Choromanski et
    al. 2021, lemma 1). For numerical safety a constant is subtracted inside the exponent —
    per query row for queries, one per head for keys — which cancels in the attention's
    normalisation. Computed in float32 for half-precision inputs; the scalings are folded into
    ``w`` and into the exponent, so the ``(L, F)`` features cost one subtraction and one exp.

    Args:
        x: ``(B, H, L, D)``.
        w: ``(F, D)`` random projections.
        is_query: which stabiliser to use.
    """
    dtype = x.dtype
    work = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    x = x.to(work)
    scale = x.shape[-1] ** -0.25
    proj = x @ (w.to(work).T * scale)  # (B, H, L, F): w_r . x'
    sq = x.square().sum(-1, keepdim=True) * (0.5 * scale * scale)  # (B, H, L, 1): |x'|^2 / 2
    stab = proj.detach().amax(-1, keepdim=True) if is_query else proj.detach().amax(dim=(-2, -1), keepdim=True)
    return torch.exp(proj - (sq + stab + 0.5 * math.log(w.shape[0]))).to(dtype)


class _FavorMap(FeatureMap):
    """FAVOR+ for :func:`chunked_kernel_attention`: queries stabilised per row, keys by a running shift."""

    exponential = True

    def __init__(self, w: torch.Tensor):
        self.w = w

    def query(self, x):
        return favor_features(x, self.w, is_query=True)

    def key_logits(self, x):
        work = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype
        x = x.to(work)
        scale = x.shape[-1] ** -0.25
        proj = x @ (self.w.to(work).T * scale)  # (B, H, c, F)
        return proj - (x.square().sum(-1, keepdim=True) * (0.5 * scale * scale) + 0.5 * math.log(self.w.shape[0]))


@register("performer")
class PerformerAttention(EfficientStep):
    """Softmax attention estimated with FAVOR+ random features, in O(N F D).

    Choromanski et al. 2021, "Rethinking Attention with Performers"
    (https://arxiv.org/abs/2009.14794): ``exp(q . k / sqrt(D)) ~ phi(q) . phi(k)`` with positive
    orthogonal random features (:func:`favor_features`), then kernelised attention
    (:func:`attnlab.efficient.kernel.kernel_attention`); causal by running prefix sums.
    The error of the estimate shrinks as ``num_features`` grows.

    Args:
        embed_dim, num_heads, causal: see :class:`attnlab.efficient.EfficientStep`.
        num_features: F, random features per head dimension set (default ``int(D log D)``, the
            paper's choice).
        redraw_interval: in training mode, draw new features every this many forward calls
            (the paper's feature redrawing); 0 = never. :meth:`redraw` draws new ones now.
        seed: the seed of the first draw (None: from torch's global generator).
    """

    budget = Budget(
        short={"num_features": 64},
        long={"num_features": 256, "seed": 0},
        sweep=Sweep("num_features", (16, 64, 256, 1024), "features", seeded=True),
    )

    # decoding: FAVOR+'s running sums
    capabilities = EfficientStep.capabilities.with_changes(cache="recurrent", family="kernel")
    # buffers (registered in __init__; nn.Module's __getattr__ types them as Tensor | Module)
    features: torch.Tensor
    calls: torch.Tensor

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_features: int | None = None,
        redraw_interval: int = 1000,
        seed: int | None = None,
        **options,
    ):
        super().__init__(embed_dim, num_heads, **options)
        d = self.head_dim
        nf = max(1, int(d * math.log(d))) if num_features is None else num_features
        positive_int("num_features", nf)  # nf is num_features when given (the default is >= 1)
        int_at_least("redraw_interval", redraw_interval, 0)
        self.num_features, self.redraw_interval = nf, redraw_interval
        self._generator = None if seed is None else torch.Generator().manual_seed(seed)
        self.register_buffer("features", torch.empty(nf, d))
        self.register_buffer("calls", torch.zeros((), dtype=torch.long))
        self.redraw()

    def redraw(self) -> None:
        """Draw new random features (kept in the ``features`` buffer, saved with the weights)."""
        w = orthogonal_gaussian(self.num_features, self.head_dim, generator=self._generator)
        with torch.no_grad():
            self.features.copy_(w.to(self.features))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, num_features={self.num_features}, redraw_interval={self.redraw_interval}"

    def attend(self, q, k, v, call):
        """As :meth:`attnlab.efficient.EfficientStep.attend`; in training mode, every
        ``redraw_interval`` calls draw new features first (one draw per call, however many
        documents the call runs: packed documents run one per document length)."""
        if self.training and self.redraw_interval:
            if int(self.calls) and int(self.calls) % self.redraw_interval == 0:
                self.redraw()
            self.calls += 1
        return super().attend(q, k, v, call)

    def compute(self, q, k, v, valid):
        if not self.causal:
            return chunked_kernel_attention(_FavorMap(self.features), q, k, v, valid=valid, eps=1e-12)
        # causal: chunk after chunk with a running stabiliser, the same computation as decoding
        state, outs = RecurrentState(), []
        for a in range(0, q.shape[2], CAUSAL_CHUNK):
            e = a + CAUSAL_CHUNK
            outs.append(self._causal_chunk(q[:, :, a:e], k[:, :, a:e], v[:, :, a:e],
                                           None if valid is None else valid[:, a:e], state))
        return torch.cat(outs, dim=2)

    def _causal_chunk(self, q, k, v, valid, state: RecurrentState) -> torch.Tensor:
        """Causal FAVOR+ over consecutive tokens that continue ``state`` (updated in place).

        The keys' features are ``exp(logits - shift)`` with ``shift`` the running maximum of the
        keys' feature logits (per row and head): the sums are rescaled when it grows, so early keys
        never underflow against later, larger ones, and the epsilon is a floor, not a term, so the
        shift cancels exactly (decoding one token at a time gives the numbers of the whole layer)."""
        phi_q = favor_features(q, self.features, is_query=True)
        logits = _FavorMap(self.features).key_logits(k)  # (B, H, n, F)
        if valid is not None:
            logits = logits.masked_fill(~valid[:, None, :, None], float("-inf"))
        top = logits.amax(dim=(-2, -1), keepdim=True)  # (B, H, 1, 1); -inf where every new token is padding
        shift = top if state.shift is None else torch.maximum(state.shift, top)  # -inf: nothing real seen yet
        used = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
        phi_k = torch.exp(logits - used).to(q.dtype)
        sums = None
        if state.s is not None:
            assert state.z is not None and state.shift is not None  # written with s
            old = torch.where(torch.isfinite(state.shift), state.shift, used)  # a row with nothing seen has zero sums
            scale = torch.exp(old - used).to(q.dtype)  # <= 1: the old sums under the new shift
            sums = (state.s * scale, state.z * scale[..., 0])
        out, (state.s, state.z) = kernel_attention(phi_q, phi_k, v, causal=True, eps=1e-12, clamp=True, state=sums,
                                                   return_state=True)
        state.shift, state.seen = shift, state.seen + q.shape[2]
        return out

    def decode(self, q, k, v, state: RecurrentState, valid) -> torch.Tensor:
        return self._causal_chunk(q, k, v, valid, state)
