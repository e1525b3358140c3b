"""The gated linear-attention family's layer: projections, short convolution, gates, the
recurrence (:mod:`attnlab.efficient.recurrence`) in one of its three forms, output norm and gate.

RetNet, GLA, DeltaNet, Gated DeltaNet and Mamba-2 differ in their gates and state update; the
layer around them is the same, and it is this class. A subclass says what its gates are
(:meth:`GatedRecurrence.gates`), how queries and keys are mapped (:meth:`GatedRecurrence.features`),
and what happens to the heads' outputs (:meth:`GatedRecurrence.finish`).

Masks, as everywhere in attnlab: key padding (a padded token writes nothing and decays nothing,
so the state passes it unchanged, wherever it is; with a short convolution, whose window counts
positions, padding must lie at the start or the end of a row, not between real tokens: it then
enters the convolution as the convolution's own zero padding) and packed documents (each
document alone: in the chunkwise form, every document in one call, the convolution and the
recurrence restarting at each; the reference forms run them one by one). Under bfloat16
autocast the projections run in bfloat16 and the recurrence in float32.
The methods are causal recurrences; ``causal=False`` (an encoder's default) runs the layer's
recurrence in both directions and adds the two, as Vision Mamba's bidirectional scan does (Zhu
et al. 2024, https://arxiv.org/abs/2401.09417): every query then sees every key. Decoding:
``new_cache()`` and ``layer(x_new, cache=cache)``, as for every layer; the cache holds the
``D x Dv`` state per head and the short convolution's last inputs, constant in the tokens seen.
"""

from __future__ import annotations

import itertools
import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from ..core.amp import upcast
from ..core.attend import AttentionResult
from ..layers.state import MatrixState
from ..layers.step import StepInputs
from ..validate import choice, int_at_least, positive_int
from . import recurrence
from .base import EfficientAttention, check_documents, check_step, documents, key_padding, per_document

__all__ = ["GatedRecurrence", "HeadNorm", "MatrixState", "MODES", "PaddingInsideWarning", "inverse_softplus", "time_step_bias"]

MODES = ("chunk", "parallel", "recurrent")
"""The forms a layer computes with: chunkwise (training, the default), the quadratic parallel
form (the reference) and the token-by-token recurrence."""


def inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    """``y`` with ``softplus(y) = x`` (for initialising a time-step bias)."""
    return x + torch.log(-torch.expm1(-x))


def time_step_bias(num_heads: int, lo: float = 1e-3, hi: float = 0.1) -> torch.Tensor:
    """Mamba's initial time-step bias: ``softplus(bias)`` log-uniform in ``[lo, hi]`` per head."""
    dt = torch.exp(torch.rand(num_heads) * (math.log(hi) - math.log(lo)) + math.log(lo))
    return inverse_softplus(dt)


class PaddingInsideWarning(UserWarning):
    """Key padding hides positions between real tokens of a layer with a short convolution: its
    window counts positions, so the real tokens after such a gap see the gap as zeros instead of
    the tokens before it, and the output differs from the row with those tokens removed."""


def _warn_if_padding_inside(valid: torch.Tensor, name: str) -> bool:
    """Warn (:class:`PaddingInsideWarning`) when ``valid`` ``(B, N)`` hides a position that has real
    tokens on both sides in its row; returns whether it did (a layer warns once)."""
    seen = valid.cumsum(1)  # real tokens up to and including each position
    inside = ~valid & (seen > 0) & (seen < seen[:, -1:])
    if not bool(inside.any()):
        return False
    warnings.warn(f"the {name!r} attention's short convolution counts positions: key padding between real tokens changes "
                  "the outputs after it against the row without those tokens; put the padding at the start or the end of "
                  "each row, or pack the pieces as documents (attnlab.masks.Documents)", PaddingInsideWarning, stacklevel=2)
    return True


class GatedRecurrence(EfficientAttention):
    """Base class of the gated linear-attention family (see the module's documentation).

    Args:
        embed_dim, num_heads, causal, positional (``rope`` or an input encoding), max_len,
            num_kv_heads, bias, head_mode: as for :class:`attnlab.efficient.EfficientAttention`.
            Grouped key / value heads share keys and values; the state and gates stay per head.
        chunk: positions per chunk of the chunkwise form.
        mode: ``"chunk"`` (default), ``"parallel"`` or ``"recurrent"`` (:data:`MODES`): equal in
            exact arithmetic; the last two are the reference and the RNN.
        conv_size: the short causal convolution over the projected q, k, v (0: none; the
            default is the paper's).
    """

    capabilities = EfficientAttention.capabilities.but(cache="matrix", needs_input=True, family="gated")
    delta: bool = False  # the delta rule (True) or a gated sum (False)
    default_conv: int = 0
    q_scale: bool = True  # q scaled by D^-1/2, as fla's kernels do

    def __init__(self, embed_dim: int, num_heads: int, *, chunk: int = recurrence.CHUNK, mode: str = "chunk",
                 conv_size: int | None = None, **options):
        super().__init__(embed_dim, num_heads, **options)
        self.chunk, self.mode = positive_int("chunk", chunk), choice("mode", mode, MODES)
        self.conv_size = k = int_at_least("conv_size", self.default_conv if conv_size is None else conv_size, 0)
        width = 3 * self.embed_dim  # q, k and v (keys and values repeated to H heads)
        self.conv = nn.Conv1d(width, width, k, groups=width, bias=False) if k else None

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, chunk={self.chunk}, mode={self.mode!r}, conv_size={self.conv_size}"

    # ---------------------------------------------------------------- what a subclass defines
    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(g, beta)`` from the inputs ``x`` ``(B, N, E)``: the log decay ``g`` ``(B, H, N)`` (per
        head) or ``(B, H, N, D)`` (per key channel) or None, and the write strength ``beta``
        ``(B, H, N)`` (the delta rule's learning rate; a gated sum's key scale) or None."""
        return None, None

    def features(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The queries' and keys' feature map (default: none)."""
        return q, k

    def finish(self, o: torch.Tensor, x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The heads' outputs ``o`` ``(B, H, N, Dv)`` after the recurrence, given the inputs and
        the values: output norm and gate (default: none)."""
        return o

    # ---------------------------------------------------------------- the step
    def attend_heads(self, q, k, v, *, mask=None, bias=None, score_mod=None, return_weights=False, state=None,
                     inputs: StepInputs | None = None) -> AttentionResult:
        """The gated recurrence on the projected heads (before the short convolution), its gates
        computed from ``inputs.x``, rope applied at ``inputs.positions`` after the convolution;
        ``state``: a :class:`MatrixState` when decoding (updated in place)."""
        check_step(self, mask, bias, score_mod, return_weights)
        if inputs is None:
            raise ValueError(f"the {self.name!r} attention computes its gates from the layer's inputs: call the layer")
        x, pos = inputs.x, inputs.positions
        b, n = x.shape[0], x.shape[1]
        if state is None and documents(mask):
            if self.mode == "chunk":  # every document in one call of the chunkwise form
                return AttentionResult(self._packed(q, k, v, x, mask))

            def run(q, k, v, x):  # the reference forms: each document alone
                return self.attend_heads(q, k, v, inputs=StepInputs(x, torch.arange(x.shape[1], device=x.device))).output

            return AttentionResult(per_document(self, run, mask, (q, k, v), x))
        valid = key_padding(mask, b, n, self.name, x.device)
        if valid is not None and self.conv is not None and state is None and not getattr(self, "_warned_padding", False) \
                and not torch.compiler.is_compiling():  # looked at until it warns once: no host sync after that, no graph break
            self._warned_padding = _warn_if_padding_inside(valid, self.name)
        if n == 0:
            return AttentionResult(q.new_zeros(b, self.num_heads, 0, self.head_dim))
        if valid is not None:
            x = torch.where(valid[..., None], x, torch.zeros((), dtype=x.dtype, device=x.device))
        return AttentionResult(self._both_ways(q, k, v, x, valid, pos, state))

    def _both_ways(self, q, k, v, x, valid, pos, state, cu=None):
        """The gates, the scan (and, not causal, the reverse scan over the flipped sequence, whose
        documents come in reverse order), then :meth:`finish`."""
        g, beta = self.gates(x)
        out, vf = self._direction(q, k, v, g, beta, valid, pos, state, cu)
        if not self.causal:  # the reverse scan: the same recurrence over the flipped sequence
            back, _ = self._direction(q.flip(2), k.flip(2), v.flip(2), None if g is None else g.flip(2),
                                      None if beta is None else beta.flip(2), None if valid is None else valid.flip(1),
                                      pos.flip(-1), None, None if cu is None else cu[-1] - cu.flip(0))
            out = out + back.flip(2)
        return self.finish(out, x, vf)

    def _packed(self, q, k, v, x, docs) -> torch.Tensor:
        """Packed documents in one call: every document of every row laid end to end in one row,
        the short convolution and the recurrence told where each starts (``cu_seqlens``), rope at
        the positions within each document; positions outside the documents give zeros."""
        check_documents(self, docs)
        b, n = x.shape[:2]
        segments = docs.segments(n)
        lengths = [length for _, _, length in segments]
        where = torch.cat([torch.arange(r * n + s, r * n + s + length, device=x.device) for r, s, length in segments])
        pos = torch.cat([torch.arange(length, device=x.device) for length in lengths])
        cu = torch.tensor([0, *itertools.accumulate(lengths)], device=x.device)
        pick = lambda t: t.transpose(0, 1).flatten(1, 2)[:, where][None]  # noqa: E731 - (B, H, N, D) -> (1, H, M, D)
        out = self._both_ways(pick(q), pick(k), pick(v), x.flatten(0, 1)[where][None], None, pos, None, cu)[0]  # (H, M, Dv)
        full = out.new_zeros(out.shape[0], b * n, out.shape[-1]).index_copy(1, where, out)
        return full.view(out.shape[0], b, n, -1).transpose(0, 1)

    def _direction(self, q, k, v, g, beta, valid, pos, cache, cu=None):
        """One scan: convolution, feature maps, rotation, padding silenced, then the recurrence
        (packed documents: ``cu`` their offsets in a row of one). Returns the heads' outputs and
        the values after the convolution."""
        keep = None if valid is None else valid[:, None, :, None]
        zero = torch.zeros((), dtype=q.dtype, device=q.device)
        if self.conv is not None:
            if keep is not None:  # a padded token enters the convolution as its zero padding does
                q, k, v = (torch.where(keep, t, zero) for t in (q, k, v))
            q, k, v = self._short_conv(q, k, v, cache, cu)
        q, k = self.features(q, k)
        pe = self.positional
        if pe is not None and pe.kind == "rotation":
            q, k = pe.rotate(q, k, pos, pos)
        if self.q_scale:
            q = q * self.head_dim ** -0.5
        if keep is not None:  # a padded token writes nothing and decays nothing
            q, k, v = (torch.where(keep, t, zero) for t in (q, k, v))
            g = None if g is None else torch.where(keep if g.dim() == 4 else keep[..., 0], g, 0.0)
            beta = None if beta is None else torch.where(keep[..., 0], beta, 0.0)
        if beta is not None and not self.delta:
            k = upcast(k) * beta[..., None]  # beta in its own float32: no rounding to the projections' bfloat16
        state = None if cache is None else cache.state
        mode = "recurrent" if cache is not None and q.shape[2] == 1 else self.mode
        if self.delta:
            args = (q, k, v, beta, g)
            fn = {"chunk": recurrence.chunk_delta, "parallel": recurrence.parallel_delta, "recurrent": recurrence.recurrent_delta}[mode]
        else:
            args = (q, k, v, g)
            fn = {"chunk": recurrence.chunk_gated, "parallel": recurrence.parallel_gated, "recurrent": recurrence.recurrent_gated}[mode]
        extra = {"chunk": self.chunk, "cu_seqlens": cu} if mode == "chunk" else {}
        # the recurrence in at least float32, as softmax's statistics (the gates were computed so: never rounded to bfloat16)
        with torch.autocast(q.device.type, enabled=False):
            out, state = fn(*(None if a is None else upcast(a) for a in args), state=None if state is None else upcast(state), **extra)
        if cache is not None:
            cache.state = state
        return out, v

    def _short_conv(self, q, k, v, cache, cu=None):
        """The depthwise causal convolution of width K over the projected q, k, v (then SiLU, as
        in DeltaNet and Mamba-2), continuing the cache's last inputs when decoding; packed
        documents (``cu``): none reads an earlier one's inputs."""
        b, n = q.shape[0], q.shape[2]
        widths = [t.shape[1] * t.shape[3] for t in (q, k, v)]
        flat = torch.cat([t.transpose(1, 2).reshape(b, n, -1) for t in (q, k, v)], -1)  # (B, N, C)
        if cu is not None:
            mixed = F.silu(recurrence.causal_conv(flat.transpose(1, 2), self.conv.weight[:, 0].to(flat.dtype), cu_seqlens=cu))
            return self._conv_heads(mixed.transpose(1, 2).contiguous(), widths, [t.shape[1] for t in (q, k, v)])
        before = None if cache is None else cache.conv
        if before is None:
            before = flat.new_zeros(b, self.conv_size - 1, flat.shape[-1])
        full = torch.cat([before.to(flat.dtype), flat], 1)  # (B, K - 1 + N, C)
        if cache is not None:
            cache.conv = full[:, full.shape[1] - (self.conv_size - 1):]
        # channels-first and contiguous: conv1d's CPU kernel is fastest so (forward and backward at
        # N = 16K: 0.16 s, against 0.20 s on a transposed view and 0.33 s as K shifted products)
        mixed = F.conv1d(full.transpose(1, 2).contiguous(), self.conv.weight.to(flat.dtype), groups=flat.shape[-1])
        mixed = F.silu(mixed).transpose(1, 2).contiguous()  # (B, N, C): each head's channels adjacent again
        return self._conv_heads(mixed, widths, [t.shape[1] for t in (q, k, v)])

    @staticmethod
    def _conv_heads(mixed, widths, heads):
        """``(B, N, C)`` back to q, k, v ``(B, H, N, D)``."""
        b, n = mixed.shape[:2]
        return tuple(part.view(b, n, h, -1).transpose(1, 2) for part, h in zip(mixed.split(widths, -1), heads))


class HeadNorm(nn.Module):
    """RMSNorm over each head's output, optionally gated by ``swish(x W_g)`` (fla's
    ``FusedRMSNormGated``; RetNet's group norm and swish gate)."""

    def __init__(self, embed_dim: int, num_heads: int, *, gate: bool, eps: float = 1e-6):
        super().__init__()
        self.num_heads = num_heads
        self.norm = nn.RMSNorm(embed_dim // num_heads, eps=eps)
        self.gate = nn.Linear(embed_dim, embed_dim, bias=False) if gate else None

    def forward(self, o: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        o = self.norm(o)
        if self.gate is None:
            return o
        b, n, _ = x.shape
        return o * F.silu(self.gate(x)).view(b, n, self.num_heads, -1).transpose(1, 2).to(o.dtype)
