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
document alone). Under bfloat16 autocast the projections run in bfloat16 and the recurrence in
float32.
The methods are causal recurrences; ``causal=False`` (an encoder's default) runs the layer's
recurrence in both directions and adds the two, as Vision Mamba's bidirectional scan does (Zhu
et al. 2024, https://arxiv.org/abs/2401.09417): every query then sees every key. Decoding:
``new_cache()`` and ``layer(x_new, cache=cache)``, as for every layer; the cache holds the
``D x Dv`` state per head and the short convolution's last inputs, constant in the tokens seen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..core.amp import upcast
from ..core.attend import AttentionResult
from ..core.masks import key_padding_flags
from ..validate import choice, int_at_least, positive_int
from . import recurrence
from .base import EfficientAttention, key_padding

__all__ = ["GatedRecurrence", "HeadNorm", "MatrixState", "MODES", "inverse_softplus", "time_step_bias"]

MODES = ("chunk", "parallel", "recurrent")
"""The forms a layer computes with: chunkwise (training, the default), the quadratic parallel
form (the reference) and the token-by-token recurrence."""


@dataclass
class MatrixState:
    """What a gated linear-attention layer keeps for decoding: its state and its short
    convolution's last inputs, of a size that does not grow with the tokens seen.

    Attributes:
        state: ``(B, H, D, Dv)`` the matrix state ``S_t`` (None before the first token).
        conv: ``(B, K - 1, C)`` the last ``K - 1`` projections entering the short convolution
            (None without one, or before the first token).
        seen: tokens written so far (the position of the next one).
    """

    state: torch.Tensor | None = None
    conv: torch.Tensor | None = None
    seen: int = 0

    def nbytes(self) -> int:
        """Bytes held."""
        return sum(t.numel() * t.element_size() for t in (self.state, self.conv) if t is not None)

    def reset(self) -> None:
        """Forget every token."""
        self.state = self.conv = None
        self.seen = 0

    def reorder(self, index: torch.Tensor) -> None:
        """Keep the rows ``index`` (beam search)."""
        self.state = None if self.state is None else self.state.index_select(0, index)
        self.conv = None if self.conv is None else self.conv.index_select(0, index)


def inverse_softplus(x: torch.Tensor) -> torch.Tensor:
    """``y`` with ``softplus(y) = x`` (for initialising a time-step bias)."""
    return x + torch.log(-torch.expm1(-x))


def time_step_bias(num_heads: int, lo: float = 1e-3, hi: float = 0.1) -> torch.Tensor:
    """Mamba's initial time-step bias: ``softplus(bias)`` log-uniform in ``[lo, hi]`` per head."""
    dt = torch.exp(torch.rand(num_heads) * (math.log(hi) - math.log(lo)) + math.log(lo))
    return inverse_softplus(dt)


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

    def efficient(self, q, k, v, valid):
        raise ValueError(f"the {self.name!r} attention computes its gates from the layer's inputs: call the layer")

    # ---------------------------------------------------------------- the layer
    def new_cache(self, *, window=None, sinks=0, positions="absolute") -> MatrixState:
        """The decoding state (:class:`MatrixState`): constant size, equal to the full forward."""
        return self._recurrent_cache(window, sinks, positions, MatrixState)

    def check_cache(self, cache) -> None:
        if not isinstance(cache, MatrixState):
            raise ValueError(f"the {self.name!r} attention decodes with the cache its new_cache() makes, not this one")

    # the override narrows cache: this layer decodes with its own MatrixState only (check_cache refuses other caches)
    def forward(self, query, key=None, value=None, *, mask=None, bias=None, return_weights=False, positions=None,
                key_positions=None, cache: MatrixState | None = None) -> AttentionResult:  # type: ignore[override]
        """Self-attention of ``query`` ``(B, N, E)``; see :class:`GatedRecurrence` for masks and
        ``cache`` (decoding: ``query`` holds the new tokens, ``mask`` their key padding)."""
        if key is not None or value is not None:
            raise ValueError(f"the {self.name!r} attention is self-attention: pass neither key nor value")
        if return_weights:
            raise ValueError(f"the {self.name!r} attention never builds the N x M weights; use the 'dense' attention to get them")
        if bias is not None:
            raise ValueError(f"the {self.name!r} attention cannot add a score bias; use the 'dense' attention")
        if getattr(mask, "sharded_attend", None) is not None:
            raise ValueError(f"the {self.name!r} attention is not exact dense attention: ring attention (mask=ShardedMask) runs the "
                             "exact layers (dense, local, longformer, bigbird)")
        self._check_input("query", query, self.embed_dim, None)
        b, n, _ = query.shape
        if cache is not None:
            self.check_cache(cache)
            if not self.causal:
                raise ValueError(f"cached decoding needs a causal {self.name!r} attention (create it with causal=True)")
            if positions is not None or key_positions is not None:
                raise ValueError("with a cache the positions come from it: pass neither positions nor key_positions")
            valid = key_padding_flags(mask, b, n, query.device, refuse="with a cache, mask is the new tokens' key padding")
        else:
            segments = getattr(mask, "segments", None)
            if callable(segments) and not isinstance(mask, torch.Tensor):  # packed documents: each alone
                return AttentionResult(self._documents(query, mask))
            valid = key_padding(mask, b, n, self.name, query.device)
        if n == 0:
            return AttentionResult(query.new_zeros(b, 0, self.embed_dim))
        start = 0 if cache is None else cache.seen
        if positions is not None and key_positions is not None and not torch.equal(positions, key_positions):
            raise ValueError(f"the {self.name!r} attention is self-attention: its keys are its queries, so key_positions must "
                             "equal positions (or be left out)")
        given = positions if positions is not None else key_positions
        pos = torch.arange(start, start + n, device=query.device) if given is None else given
        x = query if valid is None else torch.where(valid[..., None], query, torch.zeros((), dtype=query.dtype, device=query.device))
        q, k, v, _ = self.project(x, positions=pos, key_positions=pos, rotate=False)
        k, v = self.repeat_kv(k, v)
        g, beta = self.gates(x)
        out, vf = self._direction(q, k, v, g, beta, valid, pos, cache)
        if not self.causal:  # the reverse scan: the same recurrence over the flipped sequence
            back, _ = self._direction(q.flip(2), k.flip(2), v.flip(2), None if g is None else g.flip(2),
                                      None if beta is None else beta.flip(2), None if valid is None else valid.flip(1),
                                      pos.flip(-1), None)
            out = out + back.flip(2)
        if cache is not None:
            cache.seen = start + n
        return AttentionResult(self.merge_heads(self.finish(out, x, vf)))

    def _documents(self, query, docs) -> torch.Tensor:
        if getattr(docs, "window", None) is not None or getattr(docs, "causal", self.causal) != self.causal:
            raise ValueError(f"the {self.name} layer (causal={self.causal}) attends packed documents with its own pattern: "
                             f"give Documents(causal={self.causal}) without a window")
        out = query.new_zeros(query.shape)
        for row, start, n in docs.segments(query.shape[1]):
            out[row, start : start + n] = self(query[row : row + 1, start : start + n]).output[0]
        return out

    def _direction(self, q, k, v, g, beta, valid, pos, cache):
        """One scan: convolution, feature maps, rotation, padding silenced, then the recurrence.
        Returns the heads' outputs and the values after the convolution."""
        keep = None if valid is None else valid[:, None, :, None]
        zero = torch.zeros((), dtype=q.dtype, device=q.device)
        if self.conv is not None:
            if keep is not None:  # a padded token enters the convolution as its zero padding does
                q, k, v = (torch.where(keep, t, zero) for t in (q, k, v))
            q, k, v = self._short_conv(q, k, v, cache)
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
        extra = {"chunk": self.chunk} if mode == "chunk" else {}
        # the recurrence in at least float32, as softmax's statistics (the gates were computed so: never rounded to bfloat16)
        with torch.autocast(q.device.type, enabled=False):
            out, state = fn(*(None if a is None else upcast(a) for a in args), state=None if state is None else upcast(state), **extra)
        if cache is not None:
            cache.state = state
        return out, v

    def _short_conv(self, q, k, v, cache):
        """The depthwise causal convolution of width K over the projected q, k, v (then SiLU, as
        in DeltaNet and Mamba-2), continuing the cache's last inputs when decoding."""
        b, n = q.shape[0], q.shape[2]
        widths = [t.shape[1] * t.shape[3] for t in (q, k, v)]
        flat = torch.cat([t.transpose(1, 2).reshape(b, n, -1) for t in (q, k, v)], -1)  # (B, N, C)
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
        heads = [t.shape[1] for t in (q, k, v)]
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
