"""FlexAttention for attnlab's masks: a ``BlockMask`` from the tiles a block map already knows.

:func:`block_mask` turns a :class:`~attnlab.core.blockmap.BlockMap` into FlexAttention's
``BlockMask`` (``torch.nn.attention.flex_attention``) without evaluating the mask again: each
query tile row's PARTIAL tiles become ``kv_num_blocks`` / ``kv_indices`` (the kernel applies the
mask there), its FULL tiles ``full_kv_num_blocks`` / ``full_kv_indices`` (read unmasked), and
empty tiles are never read. :func:`flex_attend` computes attention with it: on CUDA through
``torch.compile(flex_attention)``, compiled once per process, whose kernels tile by up to 128 x
128, so the map's tiles must be multiples of :data:`FLEX_BLOCK` there. Elsewhere it runs
FlexAttention's eager operator (PyTorch's reference math and its autograd: the public function
refuses gradients on the CPU) with a mask that reads the BlockMask's tile lists as the compiled
kernels do, so the eager result depends on the BlockMask, not on the mask alone.

:func:`kernel` makes the checked kernel (:mod:`attnlab.core.kernels`) that lets
:func:`attnlab.attend` send a call to FlexAttention on CUDA only after it matched attnlab's own
block-sparse form there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from . import masks
from .blockmap import BlockMap, block_map, resolve_block
from .kernels import Kernel
from .maskfn import FULL, PARTIAL, Mask, as_mask

if TYPE_CHECKING:  # FlexAttention's module imports torch's compiler stack: imported where a BlockMask is made
    from torch.nn.attention.flex_attention import BlockMask

__all__ = ["FLEX_BLOCK", "SERVED_ON", "SERVES", "block_mask", "flex_attend", "flex_map", "kernel", "sample",
           "sample_masks", "tiles", "unfit"]

FLEX_BLOCK = 128
"""The tile FlexAttention computes with: its CUDA kernels take a sparse block that is a multiple
of their own (up to 128 x 128), and attnlab builds the map at this size unless told otherwise."""

SERVED_ON = ("cuda",)
"""The device types on which :func:`attnlab.attend` (``backend="auto"``) asks the gate for FlexAttention at all."""

SERVES = ("dense", "local", "longformer", "bigbird")
"""The variants that compute through :func:`attnlab.attend` under a mask (the exact ones)."""

_COMPILED: list[Callable] = []


def block_mask(bmap: BlockMap) -> BlockMask:
    """FlexAttention's ``BlockMask`` of ``bmap``: its tiles, its block size and its mask.

    ``kv_num_blocks`` / ``kv_indices`` ``(Bm, Hm, NQ)`` / ``(Bm, Hm, NQ, NK)`` int32 list each
    query tile row's PARTIAL key tiles, ``full_kv_*`` its FULL ones (ascending; FlexAttention
    reads ``NK`` slots per row); ``mask_mod`` is the map's mask with its tensors on the map's device
    (:meth:`~attnlab.core.maskfn.Mask.to`), ``seq_lengths`` ``(N, M)``."""
    width = max(bmap.shape[1], 1)
    idx = bmap.index.long()

    def listed(kind: int) -> tuple[torch.Tensor, torch.Tensor]:
        sel = bmap.state == kind  # (Bm, Hm, NQ, S)
        num = sel.sum(-1, dtype=torch.int32)
        order = torch.where(sel, idx, width + idx).sort(-1).values  # this kind's tiles first, ascending
        slot = torch.arange(order.shape[-1], device=order.device)
        ind = torch.where(slot < num[..., None], order, 0).to(torch.int32)
        return num.contiguous(), F.pad(ind, (0, width - ind.shape[-1])).contiguous()  # (Bm, Hm, NQ, NK)

    (kn, ki), (fn, fi) = listed(PARTIAL), listed(FULL)
    from torch.nn.attention.flex_attention import BlockMask

    return BlockMask.from_kv_blocks(kn, ki, fn, fi, BLOCK_SIZE=bmap.block, mask_mod=bmap.mask.to(idx.device),
                                    seq_lengths=(bmap.n, bmap.m))


def tiles(blocks: BlockMask) -> torch.Tensor:
    """The tile states a ``BlockMask`` lists: ``(B, H, NQ, NK)`` uint8, EMPTY / PARTIAL / FULL."""
    nk = blocks.kv_indices.shape[-1]
    out = torch.zeros(*blocks.kv_indices.shape[:-1], nk + 1, dtype=torch.uint8, device=blocks.kv_indices.device)
    for num, ind, state in ((blocks.kv_num_blocks, blocks.kv_indices, PARTIAL),
                            (blocks.full_kv_num_blocks, blocks.full_kv_indices, FULL)):
        if num is not None and ind is not None:
            slot = torch.arange(ind.shape[-1], device=ind.device)
            col = torch.where(slot < num[..., None], ind.long(), nk)  # unused slots: the spare column
            out.scatter_(-1, col.expand(*out.shape[:-1], -1), state)
    return out[..., :nk]


def flex_map(mask, b: int, h: int, n: int, m: int, device, block_size=None) -> BlockMap:
    """The block map FlexAttention computes ``mask`` with: a map given is kept (moved to
    ``device``); a mask (None: every pair) is mapped at ``block_size``, default :data:`FLEX_BLOCK`."""
    if isinstance(mask, BlockMap):
        return mask if mask.index.device == torch.device(device) else mask.to(device)
    return block_map(masks.full() if mask is None else mask, n, m, batch=b, heads=h,
                     block_size=block_size if block_size is not None else FLEX_BLOCK, device=device)


def unfit(q: torch.Tensor, v: torch.Tensor, *, dot: bool, mask, score_mod, bias, dropout_p: float, return_weights: bool,
          block_size=None, auto: bool = False) -> str | None:
    """Why FlexAttention cannot compute this call of :func:`attnlab.attend`, or None when it can.

    ``dot``: softmax over a dot-product score; ``auto``: the call did not ask for FlexAttention,
    which then takes a mask function or block map alone and leaves the plain causal mask to SDPA."""
    blk = (mask.block if isinstance(mask, BlockMap) else resolve_block(block_size) if block_size is not None
           else (FLEX_BLOCK,) * 2)
    inner = mask.mask if isinstance(mask, BlockMap) else mask
    cuda = q.device.type == "cuda"
    for bad, need in ((not dot, "softmax over a dot-product score (dot, scaled_dot, cosine, bilinear)"),
                      (score_mod is not None, "no score_mod"), (bias is not None, "no bias"),
                      (bool(dropout_p), "no dropout"), (return_weights, "return_weights=False"),
                      (auto and (inner is None or isinstance(inner, torch.Tensor)), "a mask function or a block map"),
                      (auto and isinstance(inner, Mask) and inner.is_causal(q.shape[2], v.shape[2]),
                       "a mask other than causal"),
                      (cuda and any(x % FLEX_BLOCK for x in blk),
                       f"tiles of multiples of {FLEX_BLOCK} on CUDA, got {blk}"),
                      (cuda and min(q.shape[-1], v.shape[-1]) < 16, "heads at least 16 wide on CUDA")):
        if bad:
            return need
    return None


def _eager_blocks(blocks: BlockMask, b: int, h: int) -> tuple:
    """``blocks`` as FlexAttention's operator takes it, its mask reading the tile lists as the
    compiled kernels do: a FULL tile's pairs all allowed, a PARTIAL one's where the mask allows,
    any other tile's none. Evaluated once, ``(B, H, N, M)``, as the eager operator scores all pairs."""
    n, m = blocks.seq_lengths
    bq, bk = blocks.BLOCK_SIZE
    st = tiles(blocks).repeat_interleave(bq, -2)[..., :n, :].repeat_interleave(bk, -1)[..., :m]  # (Bb, Hb, N, M)
    ix = [torch.arange(size, device=st.device).view([-1 if i == d else 1 for i in range(4)])
          for d, size in enumerate((b, h, n, m))]
    inner = torch.as_tensor(as_mask(blocks.mask_mod)(*ix), device=st.device).to(torch.bool)
    allowed = ((st == FULL) | ((st == PARTIAL) & inner)).expand(b, h, n, m)

    def listed_mask(b, h, q_idx, kv_idx):
        return allowed[b, h, q_idx, kv_idx]

    return (*blocks.as_tuple()[:-1], listed_mask)


def _no_score_mod(score, b, h, q_idx, kv_idx):
    return score


def flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bmap: BlockMap, scale: float | None = None, *,
                blocks: BlockMask | None = None) -> torch.Tensor:
    """Softmax attention ``softmax(scale q k^T) v`` under ``bmap``'s mask through FlexAttention.

    Keys no query may attend to are zeroed first (NaN there cannot leak); a query with no
    allowed key gets zeros and zero gradients (FlexAttention's rule, attnlab's too).

    Args:
        q: ``(B, H, N, D)``. k: ``(B, G, M, D)`` with G dividing H (``enable_gqa`` when G < H).
        v: ``(B, G, M, Dv)``.
        bmap: the mask's block map for ``N x M`` (:func:`flex_map`).
        scale: of the scores (default ``1 / sqrt(D)``).
        blocks: the ``BlockMask`` to compute with (default :func:`block_mask` of ``bmap``).
    """
    blocks = block_mask(bmap) if blocks is None else blocks
    hidden = bmap.hidden_keys()  # (Bm, M)
    if bool(hidden.any()):
        zero = torch.zeros((), dtype=v.dtype, device=v.device)
        keep = ~hidden[:, None, :, None]
        k, v = torch.where(keep, k, zero), torch.where(keep, v, zero)
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    gqa = k.shape[1] != q.shape[1]
    if q.device.type == "cuda":
        if not _COMPILED:
            from torch.nn.attention.flex_attention import flex_attention

            _COMPILED.append(torch.compile(flex_attention))
        return _COMPILED[0](q, k, v, block_mask=blocks, scale=scale, enable_gqa=gqa)
    out, _, _ = torch.ops.higher_order.flex_attention(q, k, v, _no_score_mod,
                                                      _eager_blocks(blocks, q.shape[0], q.shape[1]), scale, {})
    return out


def sample_masks() -> tuple:
    """The mask rules the check runs FlexAttention under, each compiled into its own kernel: a
    causal sliding window (the local variant), a window with global tokens (Longformer), a
    window or a prefix-LM (two rules nested in an or), and a window with random blocks (BigBird)."""
    table = torch.rand(4, 4, generator=torch.Generator().manual_seed(0)) < 0.3  # random key blocks, a tile wide
    bigbird = masks.window(64) | masks.global_tokens(2) | masks.BlockTable(table, FLEX_BLOCK, None, "random_blocks")
    return (masks.window(256, causal=True), masks.window(64) | masks.global_tokens(FLEX_BLOCK),
            masks.window(64) | masks.prefix_lm(200), bigbird)


def sample(device, dtype: torch.dtype, generator: torch.Generator) -> tuple:
    """The check's input: B=1, H=4 query heads on G=2 key heads, N=M=500 (a ragged last tile),
    D=64, and the block maps of :func:`sample_masks` at 128-wide tiles (FULL, PARTIAL and EMPTY tiles)."""
    q, k, v = (torch.randn(1, heads, 500, 64, generator=generator, dtype=torch.float64).to(device, dtype)
               for heads in (4, 2, 2))
    return q, k, v, tuple(block_map(m, 500, block_size=FLEX_BLOCK, device=device) for m in sample_masks())


def kernel(own: Callable) -> Kernel:
    """The checked kernel ``torch.flex_attention`` on CUDA: ``run(q, k, v, maps)`` is
    :func:`flex_attend` under each block map of ``maps``, ``own(q, k, v, maps)`` attnlab's
    block-sparse form of the same calls."""
    def each(fn: Callable) -> Callable:
        return lambda q, k, v, maps: tuple(fn(q, k, v, m) for m in maps)

    return Kernel("torch.flex_attention", SERVES, run=each(flex_attend), own=each(own), sample=sample,
                  devices=("cuda",))
