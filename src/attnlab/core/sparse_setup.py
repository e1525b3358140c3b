"""The geometry of one block-sparse attention call (:mod:`attnlab.core.sparse`): which query
rows and key slots each chunk of a :class:`attnlab.core.blockmap.BlockMap`'s plan reads, as
views of the inputs where the tiles run consecutively, and the mask of its slots."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import overload

import torch

from .blockmap import BlockMap, Chunk, evaluate_tiles
from .maskfn import FULL, PARTIAL
from .scores import Score

__all__ = ["SparseSetup", "index4", "split_heads", "stat_dtype"]


def stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype softmax statistics are kept in: float32 for half-precision inputs, else the input's."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def index4(t: torch.Tensor, b, h, q, kv) -> torch.Tensor:
    """``t[b, h, q, kv]`` of a tensor broadcastable to (B, H, N, M), size-1 axes read at 0."""
    t = t.reshape((1,) * (4 - t.dim()) + tuple(t.shape))
    idx = [x if s > 1 else torch.zeros_like(x) for x, s in zip((b, h, q, kv), t.shape)]
    return t[idx[0], idx[1], idx[2], idx[3]]


@dataclass
class SparseSetup:
    """One call's constants: the map and its plan, the score, normaliser, score function, kernel."""

    bmap: BlockMap
    chunks: list[Chunk]
    b: int
    h: int
    score_fn: Score | None = None
    norm_fn: Callable[..., torch.Tensor] | None = None
    score_mod: Callable[..., torch.Tensor] | None = None
    scale: float | None = None  # the dot product's scale: the fused kernel is possible
    kind: str = "generic"  # "fused", "softmax" or "generic"
    dropout_p: float = 0.0
    seed: int = 0
    params: list = field(default_factory=list)
    memo: dict = field(default_factory=dict)

    # ------------------------------------------------------------------ geometry
    # A chunk is R' groups of query rows, each against its own keys: R' = R tile rows (the keys
    # move with the row: a window, gathered tiles), or R' = 1 when every row reads the same keys
    # (a run that does not move: causal prefixes, documents, no mask), then one block of R bq rows.
    @staticmethod
    def merged(c: Chunk) -> bool:
        """Every row of the chunk reads the same key tiles: one query block of ``R bq`` rows."""
        return c.mode == "run" and c.step == 0

    def groups(self, c: Chunk) -> tuple[int, int]:
        """``(R', rows per group)``."""
        bq = self.bmap.block[0]
        return (1, (c.r1 - c.r0) * bq) if self.merged(c) else (c.r1 - c.r0, bq)

    def rows_of(self, x: torch.Tensor, c: Chunk) -> torch.Tensor:
        """``(R', BH, rows, ·)`` view of a chunk's rows of ``x`` ``(BH, NQ bq, ·)`` (or ``(BH, NQ bq)``)."""
        g, rows = self.groups(c)
        part = x[:, c.r0 * self.bmap.block[0] : c.r1 * self.bmap.block[0]]
        return part.reshape(x.shape[0], g, rows, *x.shape[2:]).transpose(0, 1)

    def put_rows(self, dst: torch.Tensor, c: Chunk, val: torch.Tensor) -> None:
        """Write ``(R', BH, rows, ·)`` into the chunk's rows of ``dst`` ``(BH, NQ bq, ·)``."""
        bq = self.bmap.block[0]
        dst[:, c.r0 * bq : c.r1 * bq] = val.transpose(0, 1).reshape(dst.shape[0], -1, *dst.shape[2:])

    def qpos(self, c: Chunk, device) -> torch.Tensor:
        """``(R', rows)`` query positions of a chunk (clamped into ``0 .. N-1``)."""
        g, rows = self.groups(c)
        bq = self.bmap.block[0]
        return (torch.arange(c.r0 * bq, c.r1 * bq, device=device).view(g, rows)).clamp(max=max(self.bmap.n - 1, 0))

    def tiles(self, c: Chunk, device, groups: bool = False) -> torch.Tensor:
        """``(R, S)`` key tiles of a chunk's tile rows (run mode: may reach outside ``0 .. NK-1``);
        ``(R', S)`` with ``groups``."""
        if c.mode == "gather":
            assert c.tiles is not None  # a gather chunk carries its tiles
            return c.tiles.to(device)
        rows = torch.arange(1 if (groups and self.merged(c)) else c.r1 - c.r0, device=device)
        return c.start + rows[:, None] * c.step + torch.arange(c.S, device=device)[None, :]

    def kpos(self, c: Chunk, device) -> torch.Tensor:
        """``(R', L)`` key positions of a chunk's slots (clamped into ``0 .. M-1``)."""
        bk = self.bmap.block[1]
        pos = self.tiles(c, device, groups=True)[..., None] * bk + torch.arange(bk, device=device)
        return pos.reshape(pos.shape[0], -1).clamp(0, max(self.bmap.m - 1, 0))

    def inside(self, c: Chunk) -> bool:
        """Whether a run's tiles all exist (a strided view of the keys); runs that reach past
        either end gather their tiles instead, clamped (the slots outside are masked)."""
        last = c.start + (0 if self.merged(c) else (c.r1 - c.r0 - 1) * c.step) + c.S
        return c.mode == "run" and c.start >= 0 and last <= self.bmap.shape[1]

    def keys(self, x: torch.Tensor, c: Chunk) -> torch.Tensor:
        """``(R', BH, S bk, D)`` keys (or values) of a chunk from ``x`` ``(BH, NK bk, D)``."""
        bk = self.bmap.block[1]
        bh, _, d = x.shape
        if self.inside(c):
            if self.merged(c):
                return x[None, :, c.start * bk : (c.start + c.S) * bk]
            if x.stride(-1) != 1:
                x = x.contiguous()
            s0, s1 = x.stride(0), x.stride(1)
            return x.as_strided((c.r1 - c.r0, bh, c.S * bk, d), (c.step * bk * s1, s0, s1, x.stride(2)),
                                x.storage_offset() + c.start * bk * s1)
        t = self.tiles(c, x.device, groups=True).clamp(0, self.bmap.shape[1] - 1)  # (R', S)
        g = x.reshape(bh, -1, bk, d)[:, t.reshape(-1)]  # (BH, R' S, bk, D)
        return g.reshape(bh, t.shape[0], c.S * bk, d).transpose(0, 1)

    def fold(self, grad_acc: torch.Tensor, g: torch.Tensor, c: Chunk, slots: tuple[int, int] | None = None) -> None:
        """Add a chunk's key (or value) gradients ``g`` ``(R', BH, S bk, D)`` into ``grad_acc``
        ``(BH, NK, bk, D)``; ``slots``: ``g`` holds only slots ``a .. b - 1`` (a run that does not move)."""
        bk = self.bmap.block[1]
        r, bh, _, d = g.shape
        if self.merged(c) and self.inside(c):
            a, b = slots or (0, c.S)
            grad_acc[:, c.start + a : c.start + b] += g[0].reshape(bh, b - a, bk, d)
            return
        t = self.tiles(c, g.device, groups=True).clamp(0, self.bmap.shape[1] - 1)  # (R', S): outside slots carry 0
        src = g.reshape(r, bh, c.S, bk, d).transpose(0, 1).reshape(bh, r * c.S, bk, d)
        grad_acc.index_add_(1, t.reshape(-1), src)

    # ------------------------------------------------------------------ masks
    def allowed(self, c: Chunk, device, first: int = 0) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``(allowed, dead)`` of slots ``first ..``: ``(Bm, Hm, R, bq, L)`` bool (None when every
        slot is full and real) and ``(Bm, Hm, R, bq)`` rows with no allowed key (None when there are none)."""
        if not c.masked:
            return None, None
        bq, bk = self.bmap.block
        states = c.states[..., first:].to(device)
        tiles = self.tiles(c, device)[:, first:]
        if c.shared:  # every row the same: the first one stands for all (broadcast over R)
            states, tiles = states[:, :, :1], tiles[:1]
        bm, hm, r, s = states.shape
        allowed = (states == FULL)[:, :, :, None, :, None].expand(bm, hm, r, bq, s, bk).clone()
        part = states == PARTIAL
        if bool(part.any()):
            b_i, h_i, r_i, s_i = part.nonzero(as_tuple=True)
            vals = evaluate_tiles(self.bmap.mask, b_i, h_i, (c.r0 + r_i) * bq, tiles[r_i, s_i] * bk, bq, bk,
                                  self.bmap.n, self.bmap.m)
            allowed[b_i, h_i, r_i, :, s_i, :] = vals
        kpos = tiles[..., None] * bk + torch.arange(bk, device=device)  # (R, S, bk)
        inside = (kpos >= 0) & (kpos < self.bmap.m)
        allowed &= inside[None, None, :, None]
        allowed = allowed.view(bm, hm, r, bq, s * bk)
        if self.merged(c) and not c.shared:  # one block of R bq rows
            allowed = allowed.view(bm, hm, 1, r * bq, s * bk)
        dead = ~allowed.any(-1)
        return allowed, (dead if bool(dead.any()) else None)

    def kernel_mask(self, allowed: torch.Tensor, dead: torch.Tensor | None, dtype, open_dead: bool) -> torch.Tensor:
        """The fused kernel's float mask ``(R, BH or 1, bq, L)``: 0 allowed, -inf not; rows with no
        allowed key opened (forward) so that the kernel sees no empty row."""
        if open_dead and dead is not None:
            allowed = allowed | dead[..., None]
        bm, hm, r, bq, length = allowed.shape
        a = allowed.permute(2, 0, 1, 3, 4)  # (R or 1, Bm, Hm, bq, L)
        if bm * hm not in (1, self.b * self.h):
            a = a.expand(r, self.b, self.h, bq, length)
        a = a.reshape(r, -1, bq, length)
        return torch.zeros(a.shape, dtype=dtype, device=a.device).masked_fill_(~a, float("-inf"))

    @overload
    @staticmethod
    def rows5(x: torch.Tensor, dead: torch.Tensor) -> torch.Tensor: ...
    @overload
    @staticmethod
    def rows5(x: torch.Tensor, dead: None) -> None: ...
    @staticmethod
    def rows5(x: torch.Tensor, dead: torch.Tensor | None) -> torch.Tensor | None:
        """``dead`` ``(Bm, Hm, R, bq)`` as ``(R, Bm, Hm, bq)``, to mask a ``(R, B, H, bq, ·)`` tensor."""
        return None if dead is None else dead.permute(2, 0, 1, 3)


def split_heads(x: torch.Tensor, b: int, h: int) -> torch.Tensor:
    """``(R, BH, a, c)`` -> ``(R, B, H, a, c)`` (a view)."""
    return x.view(x.shape[0], b, h, *x.shape[2:])
