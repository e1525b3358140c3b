"""Block-sparse softmax attention: a sliding window, global tokens and random blocks, computed exactly.

The engine behind ``local``, ``longformer`` and ``bigbird``. The sequence is cut into blocks
of ``block`` positions; with ``r = ceil(window / block)``, query block ``t`` attends to

* its window: key blocks ``t - r .. t + r`` (``t - r .. t`` when causal), masked to the band
  ``|i - j| <= window`` (``0 <= i - j <= window``);
* ``random`` further key blocks chosen per query block (BigBird);
* the global keys (Longformer, BigBird), each counted once even where the window or a random
  block already holds it;

and each global query attends to every key (its row is computed densely). Every query block
runs PyTorch's fused ``scaled_dot_product_attention`` over its gathered keys with a boolean
mask, so forward and backward hold O(N x (window + random x block + globals)) mask bits and
no N x N tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["block_sparse_attention", "block_layout", "pattern"]


def block_layout(n: int, window: int, block: int | None) -> tuple[int, int]:
    """``(block, number of blocks)`` for a sequence of ``n``: block = ``min(max(window, 64), 128)``
    by default (a query block then reaches ``2 ceil(window / block) + 1`` key blocks), at most ``n``."""
    blk = min(min(max(window, 64), 128) if block is None else block, max(n, 1))
    return blk, -(-n // blk)


def _gather_blocks(x: torch.Tensor, blk: int, nb: int, index: torch.Tensor) -> torch.Tensor:
    """``(B, H, L, D)`` -> ``(B, nb, H, R x blk, D)``: for each query block, the key blocks in
    ``index`` ``(nb, R)`` (block numbers; outside ``0 .. nb-1``: an empty block, to be masked)."""
    b, h, length, d = x.shape
    x = F.pad(x, (0, 0, blk, (nb + 1) * blk - length - blk)).view(b, h, nb + 1, blk, d)  # slot 0: empty
    slot = torch.where((index >= 0) & (index < nb), index + 1, 0)
    g = x[:, :, slot]  # (B, H, nb, R, blk, D)
    return g.permute(0, 2, 1, 3, 4, 5).reshape(b, nb, h, index.shape[1] * blk, d)


def block_sparse_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int,
    *,
    causal: bool = False,
    valid: torch.Tensor | None = None,
    block: int | None = None,
    global_index: torch.Tensor | None = None,
    random_blocks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Exact softmax attention restricted to the sparse pattern of the module docstring.

    Args:
        q, k: ``(B, H, N, D)``; v: ``(B, H, N, Dv)`` (self-attention: N keys).
        window: w >= 0.
        causal: one-sided window, and no key after its query anywhere.
        valid: ``(B, N)`` bool, False for padded keys.
        block: block length (see :func:`block_layout`).
        global_index: ``(G,)`` long, distinct positions of the global tokens.
        random_blocks: ``(nb, R)`` long, the extra key blocks of each query block (-1 = none);
            must not repeat a block of the window.

    Returns:
        ``(B, H, N, Dv)``.
    """
    b, h, n, d = q.shape
    if k.shape[2] != n:
        raise ValueError(f"this attention relates positions: it needs as many keys as queries, got N={n}, M={k.shape[2]}")
    dev = q.device
    blk, nb = block_layout(n, window, block)
    reach = -(-window // blk)  # key blocks on each side that the window touches
    count = reach + 1 if causal else 2 * reach + 1
    win_index = torch.arange(nb, device=dev)[:, None] + torch.arange(count, device=dev)[None, :] - reach  # (nb, count)
    index = win_index if random_blocks is None else torch.cat([win_index, random_blocks.to(dev)], dim=1)
    qb = F.pad(q, (0, 0, 0, nb * blk - n)).view(b, h, nb, blk, d).transpose(1, 2)  # (B, nb, H, blk, D)
    kk, vv = _gather_blocks(k, blk, nb, index), _gather_blocks(v, blk, nb, index)  # (B, nb, H, R' blk, D)

    # positions of queries and gathered keys, and which keys exist
    qpos = torch.arange(nb * blk, device=dev).view(nb, blk)  # (nb, blk)
    kpos = (index[:, :, None] * blk + torch.arange(blk, device=dev)).reshape(nb, -1)  # (nb, R' blk)
    exists = ((index[:, :, None] >= 0) & (index[:, :, None] < nb)).expand(-1, -1, blk).reshape(nb, -1) & (kpos >= 0) & (kpos < n)
    key_ok = exists[None].expand(b, -1, -1)
    if valid is not None:
        key_ok = key_ok & valid[:, kpos.clamp(0, n - 1)]  # (B, nb, R' blk)
    off = kpos[:, None, :] - qpos[:, :, None]  # (nb, blk, R' blk): j - i
    nwin = count * blk
    in_window = torch.zeros_like(off, dtype=torch.bool)
    w_off = off[..., :nwin]
    in_window[..., :nwin] = ((w_off <= 0) & (w_off >= -window)) if causal else (w_off.abs() <= window)
    allowed = in_window.clone()
    allowed[..., nwin:] = True  # random blocks: every key of the block
    if causal:
        allowed &= off <= 0
    mask = allowed[None] & key_ok[:, :, None, :]  # (B, nb, blk, R' blk)

    if global_index is not None and global_index.numel():
        gi = global_index.to(dev)
        kg = k[:, :, gi].unsqueeze(1).expand(b, nb, h, gi.numel(), d)  # (B, nb, H, G, D)
        vg = v[:, :, gi].unsqueeze(1).expand(b, nb, h, gi.numel(), v.shape[-1])
        kk, vv = torch.cat([kk, kg], dim=3), torch.cat([vv, vg], dim=3)
        goff = gi[None, None, :] - qpos[:, :, None]  # (nb, blk, G)
        # a global key already among the gathered keys of this query is not counted twice
        seen = ((goff <= 0) & (goff >= -window)) if causal else (goff.abs() <= window)  # in the window
        if random_blocks is not None:
            in_random = (random_blocks.to(dev)[:, :, None] == (gi // blk)[None, None, :]).any(1)  # (nb, G)
            seen = seen | in_random[:, None, :]
        g_ok = ~seen & ((goff <= 0) if causal else torch.ones_like(seen))
        g_valid = torch.ones(b, gi.numel(), dtype=torch.bool, device=dev) if valid is None else valid[:, gi]
        mask = torch.cat([mask, g_ok[None] & g_valid[:, None, None, :]], dim=-1)

    row_ok = mask.any(-1, keepdim=True)  # (B, nb, blk, 1)
    mask = mask | ~row_ok  # a row with no key attends anywhere, then is zeroed: no NaN
    width = kk.shape[3]
    out = F.scaled_dot_product_attention(
        qb.reshape(b * nb, h, blk, d),
        kk.reshape(b * nb, h, width, d),
        vv.reshape(b * nb, h, width, v.shape[-1]),
        attn_mask=mask.reshape(b * nb, 1, blk, width),
    )  # (B nb, H, blk, Dv)
    out = out.view(b, nb, h, blk, -1).masked_fill(~row_ok[:, :, None], 0.0)
    out = out.transpose(1, 2).reshape(b, h, nb * blk, -1)[:, :, :n]

    if global_index is not None and global_index.numel():
        # global queries attend to every key (every earlier key when causal)
        gq = q[:, :, gi]  # (B, H, G, D)
        gmask = torch.ones(b, 1, gi.numel(), n, dtype=torch.bool, device=dev)
        if causal:
            gmask = gmask & (torch.arange(n, device=dev)[None, :] <= gi[:, None])
        if valid is not None:
            gmask = gmask & valid[:, None, None, :]
        grow_ok = gmask.any(-1, keepdim=True)
        gout = F.scaled_dot_product_attention(gq, k, v, attn_mask=gmask | ~grow_ok).masked_fill(~grow_ok, 0.0)
        out = out.index_copy(2, gi, gout)
    return out


def pattern(
    n: int,
    window: int,
    *,
    causal: bool = False,
    block: int | None = None,
    global_index: torch.Tensor | None = None,
    random_blocks: torch.Tensor | None = None,
) -> torch.Tensor:
    """The ``(n, n)`` bool mask of the pattern :func:`block_sparse_attention` computes (for tests and plots)."""
    blk, nb = block_layout(n, window, block)
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    off = j - i
    m = ((off <= 0) & (off >= -window)) if causal else (off.abs() <= window)
    if random_blocks is not None:
        qb, kb = i // blk, j // blk
        for t in range(nb):
            for r in random_blocks[t].tolist():
                if r >= 0:
                    m |= (qb == t) & (kb == r)
    if global_index is not None:
        g = torch.zeros(n, dtype=torch.bool)
        g[global_index] = True
        m |= g[None, :] | g[:, None]
    if causal:
        m &= off <= 0
    return m
