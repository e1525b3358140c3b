"""The gated family's scan, piece by piece: where a mixer's projections are cut
(:class:`Cut`, read forwards or backwards through a :class:`ScanView`), what one call's scans
share (:class:`Pass`), and one segment of positions from a state (:class:`ScanSegment`:
convolution, features, rotation, gates, padding, then the recurrence of
:mod:`attnlab.efficient.recurrence` in one of its forms). :class:`attnlab.efficient.GatedRecurrence`
runs them; :func:`~attnlab.efficient.chunking.segmented` calls a :class:`ScanSegment` per segment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..core.amp import upcast
from . import recurrence

__all__ = ["DELTA_FORMS", "GATED_FORMS", "Cut", "Pass", "Pieces", "ScanView", "ScanSegment", "scan_positions"]

DELTA_FORMS = {"chunk": recurrence.chunk_delta, "parallel": recurrence.parallel_delta,
               "recurrent": recurrence.recurrent_delta}
"""The delta rule's three forms by name (:data:`attnlab.efficient.gated.MODES`)."""
GATED_FORMS = {"chunk": recurrence.chunk_gated, "parallel": recurrence.parallel_gated,
               "recurrent": recurrence.recurrent_gated}
"""The gated sum's three forms by name."""


def scan_positions(t: torch.Tensor, a: int, b: int, dim: int, reverse: bool) -> torch.Tensor:
    """Positions ``[a, b)`` of a scan along ``dim`` of ``t`` (a view); ``reverse``: of the scan from
    the last position to the first (positions ``[N - b, N - a)`` of ``t``, flipped: a copy)."""
    if reverse:
        return t.narrow(dim, t.shape[dim] - b, b - a).flip(dim)
    return t.narrow(dim, a, b - a)


class Cut:
    """Where tensors of ``n`` positions are cut once, at the positions ``points``: ``t.split(cut.sizes, dim)``
    gives the pieces between them (one ``torch.split``, whose backward gathers the pieces' gradients in one
    concatenation, where a slice per segment would give autograd a full-size zero gradient per segment)."""

    def __init__(self, n: int, points):
        self.n = n
        self.points = sorted({0, n, *(min(max(p, 0), n) for p in points)})
        self.index = {p: i for i, p in enumerate(self.points)}
        self.sizes = [b - a for a, b in zip(self.points, self.points[1:])]


@dataclass(frozen=True)
class ScanView:
    """A scan's view of a :class:`Cut`: ``reverse``, from the last position to the first."""

    cut: Cut
    reverse: bool

    def read(self, pieces: tuple[torch.Tensor, ...], a: int, b: int, dim: int = 2) -> torch.Tensor:
        """Positions ``[a, b)`` of the scan from a tensor's ``pieces`` (where the cut has points),
        its positions along ``dim``."""
        cut = self.cut
        if self.reverse:
            a, b = cut.n - b, cut.n - a
        parts = pieces[cut.index[a]:cut.index[b]]
        if self.reverse:
            parts = tuple(t.flip(dim) for t in reversed(parts))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


@dataclass
class Pass:
    """What the scans of one call share: the input ``x`` ``(B, N, E)`` (padding zeroed) that the
    gates read, the real tokens ``valid`` ``(B, N)`` or None, the positions rope reads, the decoding
    ``cache`` (a :class:`MatrixState`) or None, the packed documents' offsets ``cu`` or None, the
    form ``mode``, the positions per chunk ``chunk``, and ``both_ways``: add the reverse scan."""

    x: torch.Tensor
    valid: torch.Tensor | None
    positions: torch.Tensor
    cache: Any
    cu: torch.Tensor | None
    mode: str
    chunk: int
    both_ways: bool


@dataclass
class Pieces:
    """q, k, v and the input x cut at a :class:`Cut`'s points (tuples of views)."""

    q: tuple
    k: tuple
    v: tuple
    x: tuple


@dataclass(frozen=True, eq=False)
class ScanSegment:
    """Positions ``[a, b)`` of one scan from a state (``step(a, b, state, cu_part)``, what
    :func:`~attnlab.efficient.chunking.segmented` calls per segment): convolution, features,
    rotation, scaling, gates, padding silenced, then the recurrence in the pass's form. ``before``: the
    convolution's inputs before the first position (a cache's), or None; ``cu``: the packed documents' offsets in the
    scan's order, or None."""

    mixer: Any
    scan: ScanView
    pieces: Pieces
    run: Pass
    before: torch.Tensor | None
    cu: torch.Tensor | None

    def __call__(self, a: int, b: int, state, cu_part):
        m, scan, p, run = self.mixer, self.scan, self.pieces, self.run
        if m.conv is not None and m.conv_size > 1:
            qs, ks, vs = m.short_conv(scan, p, run.valid, self.before, (a, b), self.cu)
        else:
            qs, ks, vs = (scan.read(t, a, b) for t in (p.q, p.k, p.v))
        qs, ks = m.features(qs, ks)
        pe = m.positional
        if pe is not None and pe.kind == "rotation":
            at = scan_positions(run.positions, a, b, run.positions.dim() - 1, scan.reverse)
            qs, ks = pe.rotate(qs, ks, at, at)
        if m.q_scale:
            qs = qs * m.head_dim ** -0.5
        gs, bs = m.gates(scan.read(p.x, a, b, 1))
        if run.valid is not None:  # a padded token writes nothing and decays nothing
            keep = scan_positions(run.valid, a, b, 1, scan.reverse)[:, None, :, None]
            zero = torch.zeros((), dtype=qs.dtype, device=qs.device)
            qs, ks, vs = (torch.where(keep, t, zero) for t in (qs, ks, vs))
            gs = None if gs is None else torch.where(keep if gs.dim() == 4 else keep[..., 0], gs, 0.0)
            bs = None if bs is None else torch.where(keep[..., 0], bs, 0.0)
        if bs is not None and not m.delta:
            ks = upcast(ks) * bs[..., None]  # beta in its own float32: no rounding to the projections' bfloat16
        args = (qs, ks, vs, bs, gs) if m.delta else (qs, ks, vs, gs)
        extra = {"chunk": run.chunk, "cu_seqlens": cu_part, "segment": None} if run.mode == "chunk" else {}
        # the recurrence in at least float32, as softmax's statistics (the gates were computed so: never rounded to
        # bfloat16)
        form = (DELTA_FORMS if m.delta else GATED_FORMS)[run.mode]
        with torch.autocast(qs.device.type, enabled=False):
            out, state = form(*(None if t is None else upcast(t) for t in args),
                              state=None if state is None else upcast(state), **extra)
        return (out, state, vs) if m.finish_reads_values else (out, state)
