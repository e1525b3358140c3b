"""A mask evaluated at given positions: the queries and keys of a call are not at 0 .. N-1 (a
rank's shard of a sharded sequence, the keys of a cache in ring-buffer order)."""

from __future__ import annotations

import torch

from .maskfn import Grid, Mask, as_mask

__all__ = ["Positioned"]


class Positioned(Mask):
    """``inner`` evaluated at given positions: index ``i`` of the queries is position
    ``q_positions[i]``, index ``j`` of the keys ``kv_positions[j]`` (a rank's shard of a sharded
    sequence; the keys of a cache, in ring-buffer order)."""

    def __init__(self, inner, q_positions: torch.Tensor, kv_positions: torch.Tensor):
        self.inner = as_mask(inner)
        self.q_positions, self.kv_positions = q_positions.long(), kv_positions.long()
        self.batch, self.key_only = self.inner.batch, self.inner.key_only

    def __call__(self, b, h, q_idx, kv_idx):
        qp, kp = self.q_positions.to(q_idx.device), self.kv_positions.to(kv_idx.device)
        return self.inner(b, h, qp[q_idx], kp[kv_idx])

    def tiles(self, grid):
        if grid.uniform is None:
            return None
        bq, bk, q0, q1, m = grid.uniform
        ql, qh = _block_range(self.q_positions.to(grid.q_lo.device)[q0:q1], bq)
        kl, kh = _block_range(self.kv_positions.to(grid.kv_lo.device), bk)
        return self.inner.tiles(Grid(ql[:, None], qh[:, None], kl[None, :], kh[None, :]))

    def hidden_keys(self, m, device=None):
        return None

    def bind(self, n, m):
        if self.q_positions.shape[-1] != n or self.kv_positions.shape[-1] != m:
            raise ValueError(f"the mask holds positions of {self.q_positions.shape[-1]} queries x "
                             f"{self.kv_positions.shape[-1]} keys, but the attention has {n} x {m}")
        return self


def _block_range(pos: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Smallest and largest position of each block of ``block`` consecutive entries of ``pos``."""
    n = pos.shape[0]
    pad = -n % block
    if pad:
        pos = torch.cat([pos, pos[-1:].expand(pad)])
    v = pos.view(-1, block)
    return v.amin(1), v.amax(1)
