"""The block map of a mask: which tiles of queries x keys are empty, full or partial.

FlexAttention's ``BlockMask`` idea (per tile of ``q_block x kv_block`` positions: no pair
allowed, every pair, or some) for attnlab's engine, :mod:`attnlab.core.sparse`, which never
touches an empty tile and evaluates the mask only on partial ones. The map is built from a
mask's structure (:meth:`attnlab.core.maskfn.Mask.tiles`: a window, causal, documents or
padding mask is classified from its rule, in milliseconds at any length) and, for what the
structure does not settle (a plain callable, two partial rules meeting in one tile), by
evaluating those tiles a batch at a time: never an ``N x M`` tensor. Each query tile row keeps
the list of its non-empty key tiles (FlexAttention's ``kv_indices``), so the map of a 32K
sliding window takes a few KiB where the dense bool mask takes 1 GiB (:meth:`BlockMap.nbytes`).

Build one with :func:`block_map` and pass it as ``mask=`` to :func:`attnlab.attend` (or to a
layer, or every layer of a model): it is reused as long as the shapes agree, and so are the
plans of its computation (:meth:`BlockMap.chunks`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..validate import is_int
from .maskfn import EMPTY, FULL, PARTIAL, UNKNOWN, Grid, Mask, as_mask

__all__ = ["BlockMap", "Chunk", "block_map", "DEFAULT_BLOCK", "evaluate_tiles", "resolve_block"]

DEFAULT_BLOCK = 64
"""The default side of a tile (queries and keys) on every device."""

BUILD_ELEMENTS = 1 << 24
"""Tile states held at once while a map is built."""

EVAL_ELEMENTS = 1 << 20
"""Pairs a mask is evaluated on at once (tiles the structure does not settle)."""


def resolve_block(block_size) -> tuple[int, int]:
    """``(q_block, kv_block)`` from an int, a pair or None (:data:`DEFAULT_BLOCK`)."""
    if block_size is None:
        return DEFAULT_BLOCK, DEFAULT_BLOCK
    pair = (block_size, block_size) if is_int(block_size) else tuple(block_size)
    if len(pair) != 2 or not all(is_int(x) and x > 0 for x in pair):
        raise ValueError(f"block_size must be a positive int or a pair of them (q_block, kv_block), got {block_size!r}")
    return int(pair[0]), int(pair[1])


@dataclass
class Chunk:
    """Query tile rows ``r0 .. r1 - 1`` computed together, each over ``S`` key tiles (slots).

    ``mode == "run"``: row ``r0 + i`` reads the consecutive key tiles ``start + i step .. + S - 1``
    (a strided view of the keys, no copy); ``mode == "gather"``: it reads ``tiles[i]``.
    ``states`` ``(Bm, Hm, R, S)`` is each slot's state (EMPTY: not allowed for that row, batch
    row or head); ``masked``: some slot is not FULL or reaches past the last key, so the chunk
    needs a mask; ``shared``: every row has the same mask (a shift-invariant mask on a run that
    follows the diagonal), evaluated once for the chunk; ``lead``: the first ``lead`` slots are
    whole key tiles FULL for every row, batch row and head (a run that does not move: the prefix
    of a causal or document block), which a kernel may read without a mask.
    """

    r0: int
    r1: int
    mode: str
    S: int
    states: torch.Tensor
    masked: bool
    start: int = 0
    step: int = 0
    tiles: torch.Tensor | None = None
    shared: bool = False
    lead: int = 0


@dataclass
class BlockMap:
    """A mask's tiles, kept as each query tile row's non-empty key tiles (see the module docstring).

    Attributes:
        n, m: queries and keys. block: ``(q_block, kv_block)``. mask: the mask (bound to n, m),
            evaluated on partial tiles.
        index: ``(Bm, Hm, NQ, S)`` int32, each row's non-empty key tiles in ascending order
            (Bm, Hm: 1, or the batch / heads when the mask depends on them).
        state: ``(Bm, Hm, NQ, S)`` uint8, PARTIAL or FULL (EMPTY past a row's ``count``).
        count: ``(Bm, Hm, NQ)`` int32, non-empty tiles per row.
    """

    n: int
    m: int
    block: tuple[int, int]
    mask: Mask
    index: torch.Tensor
    state: torch.Tensor
    count: torch.Tensor
    _memo: dict = field(default_factory=dict, repr=False)

    @property
    def shape(self) -> tuple[int, int]:
        """``(query tiles, key tiles)``."""
        return -(-self.n // self.block[0]), -(-self.m // self.block[1])

    def nbytes(self) -> int:
        """Bytes held by the map (its tile lists), what :func:`attnlab.attend` keeps besides the mask's rule."""
        return sum(t.numel() * t.element_size() for t in (self.index, self.state, self.count))

    def density(self) -> float:
        """The fraction of tiles computed (non-empty), averaged over batch rows and heads."""
        nq, nk = self.shape
        return float(self.count.double().mean()) / max(nk, 1) if nq else 0.0

    def __repr__(self) -> str:
        return (f"BlockMap(n={self.n}, m={self.m}, block={self.block}, tiles={self.shape}, "
                f"computed={self.density():.4f}, bytes={self.nbytes()}, mask={self.mask!r})")

    def check(self, b: int, h: int, n: int, m: int, device) -> None:
        """Refuse attention of another shape than the map's."""
        if (n, m) != (self.n, self.m):
            raise ValueError(f"the block map is for {self.n} queries x {self.m} keys, but q, k give N={n}, M={m}")
        bm, hm = self.state.shape[:2]
        if bm not in (1, b) or hm not in (1, h):
            raise ValueError(f"the block map is for batch {bm} x heads {hm}, the attention has B={b}, H={h}")

    def rows(self, r0: int, r1: int) -> torch.Tensor:
        """The states of query tile rows ``r0 .. r1 - 1`` against every key tile: ``(Bm, Hm, R, NK)`` uint8."""
        bm, hm, _, s = self.state.shape
        out = torch.zeros(bm, hm, r1 - r0, self.shape[1] + 1, dtype=torch.uint8, device=self.state.device)
        idx = torch.where(self.state[:, :, r0:r1] == EMPTY, self.shape[1], self.index[:, :, r0:r1].long())
        out.scatter_(3, idx, self.state[:, :, r0:r1])
        return out[..., :-1]

    def hidden_keys(self) -> torch.Tensor:
        """``(Bm, M)`` bool: keys no query may attend to (their values never reach an output, so
        attention zeroes them first: NaN or inf there cannot leak). Exact: the columns with no
        FULL tile are settled by evaluating their partial tiles. Kept for the next call."""
        if "hidden" in self._memo:
            return self._memo["hidden"]
        nq, nk = self.shape
        bq, bk = self.block
        bm, hm = self.state.shape[:2]
        dev = self.state.device
        seen = torch.zeros(bm, nk * bk, dtype=torch.int32, device=dev)
        for r0 in range(0, nq, 256):
            st = self.rows(r0, min(nq, r0 + 256))  # (Bm, Hm, R, NK)
            full_col = (st == FULL).any(2).any(1)  # (Bm, NK)
            seen.view(bm, nk, bk).add_(full_col[..., None].int())
            part = (st == PARTIAL) & ~full_col[:, None, None, :]
            if bool(part.any()):
                b_i, h_i, r_i, c_i = part.nonzero(as_tuple=True)
                # (P, bq, bk)
                allowed = evaluate_tiles(self.mask, b_i, h_i, (r0 + r_i) * bq, c_i * bk, bq, bk, self.n, self.m)
                cols = (c_i[:, None] * bk + torch.arange(bk, device=dev)).reshape(-1)
                seen.index_put_((b_i.repeat_interleave(bk), cols), allowed.any(1).reshape(-1).int(), accumulate=True)
        self._memo["hidden"] = seen[:, : self.m] == 0
        return self._memo["hidden"]

    def to(self, device) -> BlockMap:
        """The map on ``device``."""
        return BlockMap(self.n, self.m, self.block, self.mask, self.index.to(device), self.state.to(device),
                        self.count.to(device))

    def chunks(self, budget: int, lead_budget: int | None = None) -> list[Chunk]:
        """The chunks of one attention call over this map, each computing at most about
        ``budget`` tile elements per (batch x head) (see :class:`Chunk`); kept for the next call.
        ``lead_budget``: a chunk with leading FULL slots (:attr:`Chunk.lead`, which a kernel that
        writes no scores out reads unmasked) counts only its other slots, against this budget."""
        if (budget, lead_budget) not in self._memo:
            self._memo[budget, lead_budget] = _plan(self, budget, lead_budget)
        return self._memo[budget, lead_budget]


def evaluate_tiles(mask: Mask, b_i, h_i, q0, k0, bq: int, bk: int, n: int, m: int) -> torch.Tensor:
    """The mask on tiles given by their batch row, head and first query / key: ``(P, bq, bk)``;
    positions past ``n`` / ``m`` are False."""
    dev = q0.device
    q = q0[:, None, None] + torch.arange(bq, device=dev)[None, :, None]  # (P, bq, 1)
    k = k0[:, None, None] + torch.arange(bk, device=dev)[None, None, :]  # (P, 1, bk)
    out = mask(b_i[:, None, None], h_i[:, None, None], q.clamp(max=n - 1), k.clamp(max=m - 1))
    out = torch.as_tensor(out, device=dev).to(torch.bool)
    return out.expand(q0.shape[0], bq, bk) & (q < n) & (k < m)


def block_map(mask, n: int, m: int | None = None, *, batch: int | None = None, heads: int | None = None,
              block_size=None, device=None) -> BlockMap:
    """The :class:`BlockMap` of ``mask`` for ``n`` queries and ``m`` keys (default ``n``).

    Args:
        mask: an attnlab mask (:mod:`attnlab.masks`), a callable ``(b, h, q_idx, kv_idx) -> bool``
            (FlexAttention's mask_mod) or a bool tensor broadcastable to ``(B, H, N, M)``.
        n, m: queries N and keys M.
        batch, heads: B and H of the attention: a callable is evaluated for every batch row and
            head (the shape of its result tells whether it depends on them; FlexAttention asks
            the caller instead). A mask of the library knows its own.
        block_size: the tile, an int or ``(q_block, kv_block)`` (default :data:`DEFAULT_BLOCK`).
        device: where the map lives (default: the mask's tensors', else the CPU).
    """
    for name, v in (("n", n), ("m", m)):
        if v is not None and (not is_int(v) or v < 0):
            raise ValueError(f"{name} must be an int >= 0, got {v!r}")
    m = n if m is None else m
    bq, bk = resolve_block(block_size)
    mk = as_mask(mask).bind(n, m)
    nq, nk = -(-n // bq), -(-m // bk)
    bsz = mk.batch or batch or 1
    hsz = heads or 1
    groups, width = [], 1
    per = max(1, BUILD_ELEMENTS // max(1, bsz * hsz * max(nk, 1)))
    for r0 in range(0, nq, per):
        r1 = min(nq, r0 + per)
        grid = Grid.blocks(n, m, bq, bk, (r0, r1), device=device)
        st = _classify(mk, grid, bsz, hsz, (r1 - r0, nk), n=n, m=m, bq=bq, bk=bk)
        groups.append(_compress(st))
        width = max(width, groups[-1][0].shape[-1])
    bm = max([g[0].shape[0] for g in groups], default=1)
    hm = max([g[0].shape[1] for g in groups], default=1)
    index, state, count = [], [], []
    for idx, stt, cnt in groups:
        pad = width - idx.shape[-1]
        index.append(torch.nn.functional.pad(idx, (0, pad)).expand(bm, hm, -1, -1))
        state.append(torch.nn.functional.pad(stt, (0, pad)).expand(bm, hm, -1, -1))
        count.append(cnt.expand(bm, hm, -1))
    if not groups:
        dev = device
        z = torch.zeros(1, 1, 0, 1, device=dev)
        return BlockMap(n, m, (bq, bk), mk, z.int(), z.to(torch.uint8),
                        torch.zeros(1, 1, 0, dtype=torch.int32, device=dev))
    return BlockMap(n, m, (bq, bk), mk, torch.cat(index, 2).contiguous(), torch.cat(state, 2).contiguous(),
                    torch.cat(count, 2).contiguous())


def _classify(mk: Mask, grid: Grid, bsz: int, hsz: int, shape, *, n, m, bq, bk) -> torch.Tensor:
    """Tile states ``(Bs, Hs, R, NK)`` of one group of rows, UNKNOWN ones settled by evaluation."""
    st = mk.tiles(grid)
    dev = grid.q_lo.device
    if st is None:
        st = torch.full(shape, UNKNOWN, dtype=torch.uint8, device=dev)
    st = st.to(dev)
    st = st.reshape((1,) * (4 - st.dim()) + tuple(st.shape))
    st = st.expand(st.shape[0], st.shape[1], *shape)  # (Bs, Hs, R, NK): Bs, Hs are 1 or the mask's own
    unknown = (st == UNKNOWN).any(0).any(0)  # (R, NK)
    if not bool(unknown.any()):
        return st
    r_i, c_i = unknown.nonzero(as_tuple=True)
    b_ix = torch.arange(bsz, device=dev)
    h_ix = torch.arange(hsz, device=dev)
    per = max(1, EVAL_ELEMENTS // (bsz * hsz * bq * bk))
    results = []
    for a in range(0, r_i.numel(), per):
        rr, cc = r_i[a : a + per], c_i[a : a + per]
        q = (grid.q_lo[rr, 0])[:, None, None] + torch.arange(bq, device=dev)[None, :, None]  # (T, bq, 1)
        k = (grid.kv_lo[0, cc])[:, None, None] + torch.arange(bk, device=dev)[None, None, :]  # (T, 1, bk)
        inside = (q < n) & (k < m)
        out = mk(b_ix[:, None, None, None, None], h_ix[None, :, None, None, None], q.clamp(max=n - 1)[None, None],
                 k.clamp(max=m - 1)[None, None])
        out = torch.as_tensor(out, device=dev).to(torch.bool)
        out = out.reshape((1,) * (5 - out.dim()) + tuple(out.shape))
        all_ = (out | ~inside).all(-1).all(-1)  # (Bo, Ho, T)
        any_ = (out & inside).any(-1).any(-1)
        results.append(torch.where(all_, FULL, torch.where(any_, PARTIAL, EMPTY)).to(torch.uint8))
    bo = max(r.shape[0] for r in results)
    ho = max(r.shape[1] for r in results)
    settled = torch.cat([r.expand(bo, ho, -1) for r in results], -1)  # (Bo, Ho, T)
    bm, hm = max(st.shape[0], bo), max(st.shape[1], ho)
    st = st.expand(bm, hm, *shape).clone()
    st[:, :, r_i, c_i] = torch.where(st[:, :, r_i, c_i] == UNKNOWN, settled.expand(bm, hm, -1), st[:, :, r_i, c_i])
    return st


def _compress(st: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(index, state, count)`` of a group's tile states ``(Bs, Hs, R, NK)``: the non-empty tiles
    of each row in ascending order."""
    nonempty = st != EMPTY
    count = nonempty.sum(-1, dtype=torch.int32)
    nk = st.shape[-1]
    width = max(int(count.max()) if count.numel() else 0, 1)
    if nk == 0:
        z = torch.zeros(*st.shape[:-1], 1, dtype=torch.int32, device=st.device)
        return z, z.to(torch.uint8), count
    col = torch.arange(nk, device=st.device)
    # non-empty first, ascending
    order = torch.sort(torch.where(nonempty, col, nk + col), dim=-1).values[..., :width] % nk
    slot = torch.arange(width, device=st.device)
    live = slot < count[..., None]
    state = torch.where(live, st.gather(-1, order), EMPTY).to(torch.uint8)
    index = torch.where(live, order, 0).to(torch.int32)
    return index, state, count


def _plan(bmap: BlockMap, budget: int, lead_budget: int | None = None) -> list[Chunk]:
    """Group query tile rows into chunks (see :class:`Chunk`): consecutive rows whose key tiles
    are runs at a constant step go in "run" mode (strided views), others gather their tiles; a
    chunk grows while its padded slots stay within 1.3x of the tiles it needs and its elements
    within ``budget`` (with ``lead_budget``: a chunk with leading FULL slots, its other
    elements within ``lead_budget``)."""
    nq, nk = bmap.shape
    bq, bk = bmap.block
    chunks: list[Chunk] = []
    per_rows = 256
    # per query tile row: its first and last allowed key tile, how many, the run of FULL tiles from the first
    lo: list[int] = []
    hi: list[int] = []
    union: list[int] = []
    full: list[int] = []
    ragged = bmap.m % bk != 0
    for r0 in range(0, nq, per_rows):
        st = bmap.rows(r0, min(nq, r0 + per_rows))
        any_ = (st != EMPTY).any(0).any(0)  # (R, NK): the union over batch rows and heads
        cnt = any_.sum(-1)
        col = torch.arange(nk, device=st.device)
        first = torch.where(any_, col, nk).amin(-1)
        lo += first.tolist() if nk else [0] * any_.shape[0]
        hi += torch.where(any_, col, -1).amax(-1).tolist() if nk else [-1] * any_.shape[0]
        union += cnt.tolist()
        # each row's run of whole tiles FULL for every batch row and head, from its first tile
        broken = ~(st == FULL).all(0).all(0) | (col < first[:, None]) | ((col == nk - 1) & ragged)
        full += (torch.where(broken, col, nk).amin(-1) - first).clamp_min(0).tolist() if nk else [0] * any_.shape[0]
    step1 = bq // bk if bq % bk == 0 else None  # the diagonal's move per query tile row
    r = 0
    while r < nq:
        if union[r] == 0:
            r += 1
            continue
        r1, best = r + 1, _costs(lo, hi, union, r, r + 1, step1)
        while r1 < nq:
            cand = _costs(lo, hi, union, r, r1 + 1, step1)
            need = sum(union[r : r1 + 1])
            lead = _lead(lo, full, union, r, r1 + 1, cand) if lead_budget is not None else 0
            paid, limit = (cand[0] - (r1 + 1 - r) * lead, lead_budget) if lead else (cand[0], budget)
            if paid * bq * bk > limit or cand[0] > max(1.3 * need, need + 2 * (r1 + 1 - r)):
                break
            r1, best = r1 + 1, cand
        chunks.append(_chunk(bmap, r, r1, best, lo, union))
        r = r1
    return chunks


def _lead(lo, full, union, r0, r1, cost) -> int:
    """The leading slots of a candidate chunk FULL for all its rows (see :attr:`Chunk.lead`)."""
    _, mode, start, step, width = cost
    live = [i for i in range(r0, r1) if union[i]]
    if mode != "run" or step != 0 or any(lo[i] != start for i in live):
        return 0
    return min(min(full[i] for i in live), width)


def _costs(lo, hi, union, r0, r1, step1):
    """The cheapest layout of rows ``r0 .. r1 - 1``: ``(slots x rows, mode, start, step, S)``."""
    live = [i for i in range(r0, r1) if union[i]]
    rows = r1 - r0
    contiguous = all(hi[i] - lo[i] + 1 == union[i] for i in live)
    options = [(rows * max(union[i] for i in live), "gather", 0, 0, max(union[i] for i in live))]
    if contiguous:
        for step in {0, step1} - {None}:
            start = min(lo[i] - (i - r0) * step for i in live)
            width = max(hi[i] - (start + (i - r0) * step) + 1 for i in live)
            options.append((rows * width, "run", start, step, width))
    return min(options, key=lambda o: (o[0], o[1] != "run"))


def _chunk(bmap: BlockMap, r0: int, r1: int, best, lo, union) -> Chunk:
    _, mode, start, step, width = best
    nq, nk = bmap.shape
    st = bmap.rows(r0, r1)  # (Bm, Hm, R, NK)
    dev = st.device
    rows = torch.arange(r1 - r0, device=dev)
    if mode == "run":
        tiles = start + rows[:, None] * step + torch.arange(width, device=dev)[None, :]  # (R, S)
        inside = (tiles >= 0) & (tiles < nk)
    else:
        any_ = (st != EMPTY).any(0).any(0)  # (R, NK): the union over batch rows and heads
        col = torch.arange(nk, device=dev)
        tiles = torch.sort(torch.where(any_, col, nk + col), -1).values[:, :width] % nk
        inside = torch.arange(width, device=dev)[None, :] < any_.sum(-1, keepdim=True)
        tiles = torch.where(inside, tiles, tiles[:, :1])  # padding slots: a real tile, masked
    states = st.gather(3, tiles.clamp(0, nk - 1).expand(*st.shape[:2], -1, -1))
    states = torch.where(inside, states, EMPTY).to(torch.uint8)
    ragged = bmap.m % bmap.block[1] != 0 and bool(((tiles == nk - 1) & inside).any())
    masked = bool((states != FULL).any()) or ragged
    shared = (masked and mode == "run" and step * bmap.block[1] == bmap.block[0] and bmap.mask.shift_invariant
              and not ragged and bool(inside.all()) and bool((states == states[:, :, :1]).all()))
    lead = 0
    if masked and mode == "run" and step == 0 and bool(inside.all()):
        whole = (states == FULL).all(0).all(0).all(0) & ~((tiles[0] == nk - 1) & (bmap.m % bmap.block[1] != 0))  # (S,)
        lead = int(whole.long().cumprod(0).sum())
    return Chunk(r0, r1, mode, width, states.contiguous(), masked, start, step,
                 None if mode == "run" else tiles.contiguous(), shared, lead)
