"""Gated DeltaProduct (Siems et al. 2025): several delta-rule steps per token, a product of Householders."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..core import masks
from ..core.amp import upcast
from ..core.attend import AttentionResult
from ..layers.mixer import Tokens
from ..validate import positive_int
from . import recurrence
from .base import Budget, per_document, register
from .gated import GatedRecurrence, HeadNorm, time_step_bias

__all__ = ["DeltaProductAttention"]


@register("deltaproduct")
class DeltaProductAttention(GatedRecurrence):
    """``S_t = (prod_{j=n_h..1} (I - beta_{t,j} k_{t,j} k_{t,j}^T)) alpha_t S_{t-1} + writes``, ``o_t = S_t^T q_t``.

    Siems et al. 2025, "DeltaProduct: Improving State-Tracking in Linear RNNs via Householder
    Products" (https://arxiv.org/abs/2502.10297), gated form: each token takes ``n_h``
    (``num_householder``) delta-rule steps on the state, with its own keys, values and write
    strengths, ``S <- S + beta_{t,j} k_{t,j} (v_{t,j} - S^T k_{t,j})^T``, after the token's decay
    ``alpha_t = exp(-exp(A_h) softplus(x_t W_a + dt_h))`` (Gated DeltaNet's); the query reads the
    state after the last step. The state transition is a product of ``n_h`` generalised
    Householder matrices: with ``beta = 2 sigmoid(x W_beta)`` in ``(0, 2)`` its eigenvalues
    reach into ``(-1, 1)`` (the paper's negative eigenvalues, which state tracking needs).
    ``n_h = 1`` is Gated DeltaNet with that ``beta``.

    As fla's ``GatedDeltaProduct``: q and k through SiLU and L2 normalisation, q scaled by
    ``D^-1/2``, the heads' outputs RMS-normalised and gated by ``swish(x W_g)``. The first step's
    key and value are the layer's projections, the other ``n_h - 1`` come from projections of
    this mixer's own (``extra_keys``, ``extra_values``). The steps are laid end to end, ``n_h``
    positions per token, and computed by the gated family's scan (:meth:`GatedRecurrence.recur`,
    causal, no convolution) with the decay on each token's first position and the query on its
    last (fla's fused recurrent layout): its input is the layer's ``x`` with the one-hot sub-step
    index appended, from which :meth:`gates` gives ``beta`` of that sub-step and the token's decay
    on its first sub-step alone. What
    differs from fla's layer: no short convolution (fla convolves each projection over the
    tokens); the projections take ``bias=`` as every attnlab layer. Bidirectional
    (``causal=False``): the same recurrence run again from the last token to the first (each
    token's steps in their order) and the two added before the output norm, as the family does.

    Args:
        embed_dim, num_heads, causal: as for every mixer.
        num_householder: ``n_h``, the delta-rule steps per token (default 2, fla's).
        chunk, segment, mode: the gated family's forms (:class:`attnlab.efficient.GatedRecurrence`).
    """

    capabilities = GatedRecurrence.capabilities.with_changes(family="householder")
    budget = Budget()  # not an approximation of softmax: not in the approximation table
    delta = True

    def __init__(self, embed_dim: int, num_heads: int, *, causal: bool = False, num_householder: int = 2,
                 chunk: int = recurrence.CHUNK, segment: int | None = None, mode: str = "chunk", **options):
        super().__init__(embed_dim, num_heads, causal=causal, chunk=chunk, segment=segment, mode=mode, conv_size=0,
                         **options)
        e, h = self.embed_dim, self.num_heads
        self.num_householder = n = positive_int("num_householder", num_householder)
        self.beta_proj = nn.Linear(e, n * h, bias=False)  # beta_{t,j}, one per sub-step and head
        self.decay_proj = nn.Linear(e, h, bias=False)  # Gated DeltaNet's decay, once per token
        self.log_rate = nn.Parameter(torch.empty(h).uniform_(1, 16).log())
        self.time_bias = nn.Parameter(time_step_bias(h))
        self.extra_keys = nn.Linear(e, (n - 1) * e, bias=False) if n > 1 else None
        self.extra_values = nn.Linear(e, (n - 1) * e, bias=False) if n > 1 else None
        self.out_norm = HeadNorm(e, h, gate=True)

    def extra_repr(self) -> str:
        """As the family's, with ``num_householder``."""
        return f"{super().extra_repr()}, num_householder={self.num_householder}"

    def features(self, q, k):
        """SiLU, then L2 normalisation of q and k (no short convolution)."""
        return F.normalize(F.silu(q), dim=-1), F.normalize(F.silu(k), dim=-1)

    def gates(self, x):
        """``beta`` of each sub-step and the token's decay on its first, from ``x`` with the one-hot sub-step index."""
        b, n, _ = x.shape
        x, sub = x[..., : self.embed_dim], upcast(x[..., self.embed_dim :])  # (B, n, E), one-hot (B, n, n_h)
        beta = 2 * torch.sigmoid(upcast(self.beta_proj(x))).view(b, n, self.num_householder, self.num_heads)
        beta = (beta * sub[..., None]).sum(2)  # the sub-step's: eigenvalues 1 - beta in (-1, 1)
        dt = F.softplus(upcast(self.decay_proj(x)) + self.time_bias)
        g = -self.log_rate.exp() * dt * sub[..., :1]  # the token's decay on its first sub-step
        return g.transpose(1, 2), beta.transpose(1, 2)

    def _steps(self, q, k, v, x):
        """q, k, v ``(B, H, N, D)`` and x ``(B, N, E)`` laid out as ``n_h`` sub-steps per token:
        ``(B, H, N n_h, D)`` (q on each token's last sub-step, zeros before) and x with the
        one-hot sub-step index appended, ``(B, N n_h, E + n_h)``."""
        n_h, (b, h, n, d) = self.num_householder, q.shape
        ks, vs = [k], [v]
        if n_h > 1:
            for proj, out in ((self.extra_keys, ks), (self.extra_values, vs)):
                out += list(proj(x).view(b, n, n_h - 1, h, d).permute(2, 0, 3, 1, 4).unbind(0))
        # (B, H, N, n_h, D) -> sub-steps in order
        lay = lambda ts: torch.stack(ts, 3).reshape(b, h, n * n_h, d)  # noqa: E731
        qs = [torch.zeros_like(q)] * (n_h - 1) + [q]
        sub = torch.eye(n_h, dtype=x.dtype, device=x.device).expand(b, n, n_h, n_h)
        xs = torch.cat([x[:, :, None].expand(b, n, n_h, x.shape[-1]), sub], -1).reshape(b, n * n_h, x.shape[-1] + n_h)
        return lay(qs), lay(ks), lay(vs), xs

    def _scan(self, q, k, v, tokens: Tokens, valid, *, reverse: bool):
        """One causal scan of the sub-steps (``reverse``: over the tokens from the last to the
        first, each token's steps in their order), its outputs per token ``(B, H, N, D)``."""
        x, pos, cache = tokens.x, tokens.positions, None if reverse else tokens.cache
        if reverse:
            q, k, v, x, pos = q.flip(2), k.flip(2), v.flip(2), x.flip(1), pos.flip(-1)
            valid = None if valid is None else valid.flip(1)
        n_h = self.num_householder
        qs, ks, vs, xs = self._steps(q, k, v, x)
        mask = None if valid is None else masks.valid_keys(valid.repeat_interleave(n_h, 1))
        out = self.recur(qs, ks, vs, Tokens(xs, pos.repeat_interleave(n_h, -1), mask, cache), both_ways=False)[0]
        out = out[:, :, n_h - 1 :: n_h]  # each token's last sub-step, where its query reads
        return out.flip(2) if reverse else out

    def mix(self, q, k, v, tokens: Tokens, *, bias=None, return_weights: bool = False) -> AttentionResult:
        """The causal scan of the sub-steps (and, bidirectional, the scan from the last token to the
        first), then the output norm; packed documents each alone, padded tokens silent."""
        tokens.check_heads(self.name, q, k, v)
        docs, x = tokens.documents, tokens.x
        if tokens.cache is None and docs is not None:  # each document alone
            def run(q, k, v, x, at):  # at its tokens' positions
                return self.mix(q, k, v, Tokens(x, at)).output

            return AttentionResult(per_document(self, run, docs, (q, k, v), x, tokens.positions))
        valid = tokens.valid_keys(self.name)
        if x.shape[1] == 0:
            return AttentionResult(q.new_zeros(q.shape))
        if valid is not None:
            x = torch.where(valid[..., None], x, torch.zeros((), dtype=x.dtype, device=x.device))
            tokens = Tokens(x, tokens.positions, tokens.mask, tokens.cache)
        out = self._scan(q, k, v, tokens, valid, reverse=False)
        if not self.causal:
            out = out + self._scan(q, k, v, tokens, valid, reverse=True)
        if tokens.cache is not None:
            tokens.cache.seen += q.shape[2]
        return AttentionResult(self.out_norm(out, x))
