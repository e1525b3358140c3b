"""The gated linear-attention family's layer: projections, short convolution, gates, the
recurrence (:mod:`attnlab.efficient.recurrence`) in one of its three forms, output norm and gate.

The family's mixers differ in their gates and state update; the layer around them is the same,
and it is this class (a :class:`attnlab.layers.mixer.SequenceMixer`). A subclass says what its gates are
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
from ..layers.mixer import SequenceMixer, Tokens
from ..layers.state import MatrixState
from ..validate import choice, int_at_least, positive_int
from . import chunking, recurrence
from .base import check_documents, per_document
from .scan import Cut, Pass, Pieces, ScanSegment, ScanView, scan_positions

__all__ = ["GatedRecurrence", "HeadNorm", "MatrixState", "MODES", "PaddingInsideWarning", "inverse_softplus",
           "time_step_bias"]

CONV_PRODUCTS_MAX = 2 ** 23
"""The short convolution of a window of at most this many elements (``B x positions x 3E``: a
segment, :data:`attnlab.efficient.chunking.SEGMENT`) is computed as K shifted products in the
positions' own layout, which saves ``conv1d``'s two transposes; a longer window by ``conv1d``, which
is faster once the window no longer fits the cache (``benchmarks/results/short-convolution-*``)."""

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
    warnings.warn(f"the {name!r} attention's short convolution counts positions: key padding between real tokens "
                  "changes the outputs after it against the row without those tokens; put the padding at the start or "
                  "the end of each row, or pack the pieces as documents (attnlab.masks.Documents)",
                  PaddingInsideWarning, stacklevel=2)
    return True


class GatedRecurrence(SequenceMixer):
    """Base class of the gated linear-attention family's mixers (see the module's documentation).

    Options beside every mixer's (:class:`attnlab.layers.mixer.SequenceMixer`: ``positional``
    such as ``rope`` or an input encoding, grouped key / value heads that share keys and values
    while the state and gates stay per head):

    Args:
        embed_dim: E, the width of the layer's input: H heads of ``D = E / H`` channels, each
            head's state ``D x D``.
        num_heads: H, each with its own state and gates.
        causal: the recurrence runs forward: query ``i`` sees keys ``j <= i``, and the layer
            decodes from its state (``new_cache()``); False (an encoder's default) runs it in
            both directions and adds the two, every query seeing every key.
        chunk: positions per chunk of the chunkwise form.
        segment: positions per segment of the chunkwise form (default: the variant's,
            :data:`attnlab.efficient.chunking.SEGMENT` unless it says otherwise): under autograd
            the backward keeps the projections and the state entering each segment, and computes
            the segment's gates, convolution, features and chunks again; 0: one segment, everything
            kept for the backward (memory linear in N with a larger slope).
        mode: ``"chunk"`` (default), ``"parallel"`` or ``"recurrent"`` (:data:`MODES`): equal in
            exact arithmetic; the last two are the reference and the RNN.
        conv_size: the width of the short causal convolution over the projected q, k, v (0:
            none; default: the width in the variant's paper, :attr:`default_conv_size`).
    """

    capabilities = SequenceMixer.capabilities.with_changes(cache="matrix", family="gated")
    no_cache_reason = "its state is causal"
    delta: bool = False  # the delta rule (True) or a gated sum (False)
    decay_per_channel: bool = False  # the log decay is (B, H, N, D) (GLA, KDA), else (B, H, N) or none
    default_conv_size: int = 0
    """``conv_size``'s default (the variant's paper's; ``attnlab list variants NAME`` shows it)."""
    q_scale: bool = True  # q scaled by D^-1/2, as fla's kernels do
    finish_reads_values: bool = False  # finish receives the values after the convolution (else None: not kept)
    default_segment: int = chunking.SEGMENT
    """``segment``'s default (``attnlab list variants NAME`` shows it)."""

    def __init__(self, embed_dim: int, num_heads: int, *, chunk: int = recurrence.CHUNK, segment: int | None = None,
                 mode: str = "chunk", conv_size: int | None = None, **options):
        super().__init__(embed_dim, num_heads, **options)
        self.chunk, self.mode = positive_int("chunk", chunk), mode
        segment = int_at_least("segment", self.default_segment if segment is None else segment, 0)
        self.segment = segment or None  # None: one segment
        self.conv_size = k = int_at_least("conv_size", self.default_conv_size if conv_size is None else conv_size, 0)
        width = 3 * self.embed_dim  # q, k and v (keys and values repeated to H heads)
        self.conv = nn.Conv1d(width, width, k, groups=width, bias=False) if k else None

    @property
    def mode(self) -> str:
        """The form the layer computes with (:data:`MODES`); set to another, checked."""
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        self._mode = choice("mode", mode, MODES)

    def extra_repr(self) -> str:
        """The mixer's forms and sizes, in its ``repr``."""
        return (f"{super().extra_repr()}, chunk={self.chunk}, segment={self.segment or 0}, mode={self.mode!r}, "
                f"conv_size={self.conv_size}")

    # ---------------------------------------------------------------- what a subclass defines
    def gates(self, x: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(g, beta)`` from the inputs ``x`` ``(B, N, E)``: the log decay ``g`` ``(B, H, N)`` (per
        head) or ``(B, H, N, D)`` (per key channel, :attr:`decay_per_channel`) or None, and the
        write strength ``beta`` ``(B, H, N)`` (the delta rule's learning rate; a gated sum's key
        scale) or None. Position by position (the mixer calls it on each segment of positions)."""
        return None, None

    def features(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The queries' and keys' feature map (default: none)."""
        return q, k

    def finish(self, o: torch.Tensor, x: torch.Tensor, v: torch.Tensor | None) -> torch.Tensor:
        """The heads' outputs ``o`` ``(B, H, N, Dv)`` after the recurrence, given the inputs and
        the values after the convolution (where :attr:`finish_reads_values`, else None): output
        norm and gate (default: none)."""
        return o

    # ---------------------------------------------------------------- the mixer
    def mix(self, q, k, v, tokens: Tokens, *, bias=None, return_weights: bool = False) -> AttentionResult:
        """The gated recurrence on the projected heads (before the short convolution), its gates
        computed from ``tokens.x``, rope applied at ``tokens.positions`` after the convolution;
        ``tokens.cache``: a :class:`MatrixState` when decoding (updated in place). Packed documents:
        in the chunkwise form every document in one call, in the reference forms one by one."""
        tokens.check_heads(self.name, q, k, v)
        docs = tokens.documents
        if tokens.cache is None and docs is not None and self._mode != "chunk":
            def run(q, k, v, x, at):  # the reference forms: each document alone, at its tokens' positions
                return self.mix(q, k, v, Tokens(x, at)).output

            return AttentionResult(per_document(self, run, docs, (q, k, v), tokens.x, tokens.positions))
        out = self.recur(q, k, v, tokens, both_ways=not self.causal)
        if tokens.cache is not None:
            tokens.cache.seen += q.shape[2]
        return AttentionResult(self.finish(*out) if q.shape[2] else out[0])  # no positions: nothing to finish

    def recur(self, q, k, v, tokens: Tokens, *, both_ways: bool):
        """The scan(s) and what :meth:`finish` reads: ``(out, x, values)``, the heads' outputs
        ``(B, H, N, Dv)``, the input with its padding zeroed and the values after the convolution
        (where :attr:`finish_reads_values`, else None); ``both_ways``: add the scan from the last
        position to the first. Packed documents: the chunkwise form (see :meth:`mix`)."""
        x, state, docs = tokens.x, tokens.cache, tokens.documents
        b, n = x.shape[0], x.shape[1]
        if state is None and docs is not None:
            return self._packed(q, k, v, Tokens(x, tokens.positions, docs), both_ways)
        valid = tokens.valid_keys(self.name)
        # looked at until it warns once: no host sync after that, no graph break
        if valid is not None and self.conv is not None and state is None \
                and not getattr(self, "_warned_padding", False) and not torch.compiler.is_compiling():
            self._warned_padding = _warn_if_padding_inside(valid, self.name)
        if n == 0:
            return q.new_zeros(b, self.num_heads, 0, self.head_dim), x, (v if self.finish_reads_values else None)
        if valid is not None:
            x = torch.where(valid[..., None], x, torch.zeros((), dtype=x.dtype, device=x.device))
        mode = "recurrent" if state is not None and n == 1 else self._mode
        c = recurrence.chunk_length(self.chunk, n, per_channel=self.decay_per_channel)
        out, vf = self._both_ways(q, k, v, Pass(x, valid, tokens.positions, state, None, mode, c, both_ways))
        return out, x, vf

    def _both_ways(self, q, k, v, run: Pass):
        """The scan (and, ``run.both_ways``, the reverse scan from the last position to the first,
        whose documents come in reverse order). The projections and the inputs are cut once at
        every position where a segment of either scan (or the convolution's window before it)
        begins or ends (:class:`Cut`): both scans read the same pieces, so that the backward sums
        their gradients in place, one set of pieces; each segment computes its gates from its
        inputs (:meth:`gates` is position-wise), so that they too are computed again in the
        backward instead of kept. Returns the heads' outputs and the values after the convolution
        (where :attr:`finish_reads_values`, else None)."""
        n = q.shape[2]
        # the positions before a segment its convolution reads
        halo = self.conv_size - 1 if self.conv is not None else 0
        cu = run.cu
        scans = [(False, cu)]
        if run.both_ways:  # the reverse scan: the same recurrence from the last position to the first
            scans.append((True, None if cu is None else cu[-1] - cu.flip(0)))
        bounds = [chunking.segment_bounds(n, run.chunk, self.segment if run.mode == "chunk" else None, offsets)
                  for _, offsets in scans]
        points = [n - halo] if run.cache is not None else []
        for (reverse, _), segments in zip(scans, bounds):
            points += [n - p if reverse else p for a, b in segments for p in (a, b, a - halo)]
        cut = Cut(n, points)
        pieces = Pieces(q.split(cut.sizes, 2), k.split(cut.sizes, 2), v.split(cut.sizes, 2), run.x.split(cut.sizes, 1))
        outs = [self._direction(ScanView(cut, reverse), pieces, run, offsets, segments)
                for (reverse, offsets), segments in zip(scans, bounds)]
        out, vf = outs[0]
        if len(outs) > 1:
            out = out + outs[1][0].flip(2)
        return out, vf

    def _packed(self, q, k, v, tokens: Tokens, both_ways: bool):
        """Packed documents (``tokens.mask``) in one call: every document of every row laid end to end in one row,
        the short convolution and the recurrence told where each starts (``cu_seqlens``), rope at the tokens'
        positions (by default the mask's: within each document); positions outside the documents give zeros."""
        x, docs = tokens.x, tokens.mask
        check_documents(self, docs)
        b, n = x.shape[:2]
        segments = docs.segments(n)
        lengths = [length for _, _, length in segments]
        where = torch.cat([torch.arange(r * n + s, r * n + s + length, device=x.device) for r, s, length in segments])
        pos = tokens.positions.expand(b, n).flatten()[where]
        cu = torch.tensor([0, *itertools.accumulate(lengths)], device=x.device)
        pick = lambda t: t.transpose(0, 1).flatten(1, 2)[:, where][None]  # noqa: E731 - (B, H, N, D) -> (1, H, M, D)
        xs = x.flatten(0, 1)[where][None]
        run = Pass(xs, None, pos, None, cu, self._mode, recurrence.chunk_length(self.chunk, int(where.numel()),
                                                               per_channel=self.decay_per_channel), both_ways)
        out, vf = self._both_ways(pick(q), pick(k), pick(v), run)

        def spread(t):  # (1, H, M, D) -> (B, H, N, D), zeros outside the documents
            t = t[0]
            full = t.new_zeros(t.shape[0], b * n, t.shape[-1]).index_copy(1, where, t)
            return full.view(t.shape[0], b, n, -1).transpose(0, 1)

        return spread(out), x, (None if vf is None else spread(vf))

    def _direction(self, scan: ScanView, pieces: Pieces, run: Pass, cu, bounds):
        """One scan over the projections q, k, v ``(B, H, N, D)`` and the gates, read from their
        ``pieces`` by ``scan`` (its ``reverse``: from the last position to the first; packed
        documents: ``cu`` their offsets in the scan's order, a row of one): convolution, feature
        maps, rotation, padding silenced, then the recurrence in ``run.mode``. The chunkwise form
        runs it in the segments ``bounds`` (:func:`~attnlab.efficient.chunking.segmented`):
        under autograd the backward keeps the projections and the state entering each segment,
        and computes the segment's convolution, features and chunks again. Returns the heads'
        outputs, in the scan's order, and the values after the convolution where
        :attr:`finish_reads_values` and the scan is forward (else None)."""
        q, v = pieces.q[0], pieces.v[0]
        n = sum(t.shape[2] for t in pieces.q)
        halo = self.conv_size - 1 if self.conv is not None else 0
        cache = None if scan.reverse else run.cache
        before = None if cache is None else cache.conv
        if halo and cache is not None:  # the convolution's last inputs, for the next call
            cache.conv = self._conv_inputs(scan, pieces, run.valid, before, (n - halo, n))
        values = self.finish_reads_values and not scan.reverse
        step = ScanSegment(self, scan, pieces, run, before, cu if run.mode == "chunk" else None)
        state = None if cache is None else cache.state
        if len(bounds) > 1:
            if state is None:  # zeros, one per row, or one per document when packed
                rows = q.shape[0] if cu is None else cu.numel() - 1
                state = q.new_zeros(rows, self.num_heads, q.shape[-1], v.shape[-1], dtype=upcast(q).dtype)
            result = chunking.segmented(step, n, chunk=run.chunk, state=state, cu_seqlens=cu, segment=self.segment)
        else:
            result = step(0, n, state, cu)
        if cache is not None:
            cache.state = result[1]
        return result[0], (result[2] if values else None)

    def _conv_inputs(self, scan: ScanView, pieces: Pieces, valid, before, span: tuple[int, int]):
        """The convolution's inputs at positions ``span = [a, b)`` of the scan, ``(B, b - a, C)``:
        q, k, v (cut by ``scan``) side by side, each head's channels adjacent, padded tokens zeroed
        (they enter as the convolution's zero padding does), positions before the first from
        ``before`` (the cache's last inputs) or zeros."""
        a, b = span
        start = max(a, 0)
        parts = [scan.read(t, start, b) for t in (pieces.q, pieces.k, pieces.v)]
        if valid is not None:
            keep = scan_positions(valid, start, b, 1, scan.reverse)[:, None, :, None]
            zero = torch.zeros((), dtype=parts[0].dtype, device=parts[0].device)
            parts = [torch.where(keep, t, zero) for t in parts]
        flat = torch.cat([t.transpose(1, 2).reshape(t.shape[0], b - start, -1) for t in parts], -1)  # (B, b - start, C)
        if a < 0:
            lead = (flat.new_zeros(flat.shape[0], -a, flat.shape[-1]) if before is None
                    else before[:, before.shape[1] + a:].to(flat.dtype))
            flat = torch.cat([lead, flat], 1)
        return flat

    def short_conv(self, scan: ScanView, pieces: Pieces, valid, before, span: tuple[int, int], cu=None):
        """The depthwise causal convolution of width K over the projected q, k, v (then SiLU, as
        in DeltaNet and Mamba-2) at positions ``span = [a, b)`` of the scan, reading the K - 1
        positions before ``a`` (before the first: the cache's last inputs when decoding, else
        zeros); packed documents (``cu``): none reads an earlier one's inputs. Returns q, k, v
        ``(B, H, b - a, D)``."""
        a, b = span
        assert self.conv is not None  # called where the mixer has a convolution
        widths = [t[0].shape[1] * t[0].shape[3] for t in (pieces.q, pieces.k, pieces.v)]
        heads = [t[0].shape[1] for t in (pieces.q, pieces.k, pieces.v)]
        if cu is not None:
            start = max(a - (self.conv_size - 1), 0)
            flat = self._conv_inputs(scan, pieces, valid, None, (start, b))
            offsets = (cu - start).clamp(0, b - start)  # the documents' starts in the window
            mixed = F.silu(recurrence.causal_conv(flat.transpose(1, 2), self.conv.weight[:, 0].to(flat.dtype),
                                                  cu_seqlens=offsets))
            mixed = mixed[..., a - start:].transpose(1, 2).contiguous()
        else:
            # (B, K - 1 + b - a, C)
            full = self._conv_inputs(scan, pieces, valid, before, (a - (self.conv_size - 1), b))
            weight = self.conv.weight[:, 0]  # (C, K)
            if full.numel() <= CONV_PRODUCTS_MAX:  # K shifted products, in the positions' own layout, at least float32
                wide, n = upcast(full), b - a
                mixed = wide[:, :n] * weight[:, 0].to(wide.dtype)
                for j in range(1, self.conv_size):
                    mixed = torch.addcmul(mixed, wide[:, j:j + n], weight[:, j].to(wide.dtype))
                mixed = F.silu(mixed).to(full.dtype)
            else:  # channels-first and contiguous: conv1d's CPU kernel is fastest so on a long window, ahead of a
                # transposed view and of K shifted products (benchmarks/results/short-convolution-*)
                mixed = F.conv1d(full.transpose(1, 2).contiguous(), self.conv.weight.to(full.dtype),
                                 groups=full.shape[-1])
                mixed = F.silu(mixed).transpose(1, 2).contiguous()  # (B, b - a, C): each head's channels adjacent
        rows, n = mixed.shape[:2]  # (B, b - a, C) back to q, k, v (B, H, b - a, D)
        return tuple(part.view(rows, n, h, -1).transpose(1, 2) for part, h in zip(mixed.split(widths, -1), heads))


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
