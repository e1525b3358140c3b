"""``BlockBias``: a float bias on the scores handed to :func:`attnlab.attend` one row block at a time.

A positional bias (ALiBi, a learned relative bias) is a function of the query and key
positions. As a tensor it would be ``H x N x M`` floats — 1 GiB at N = M = 8192, H = 4 — which
is exactly what the chunked path exists to avoid. A ``BlockBias`` carries the rule instead and
gives the rows of one query block when asked, so the chunked path holds O(block x M) of it;
the SDPA path materialises it once, because PyTorch's kernel takes the bias as a tensor.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch

__all__ = ["BlockBias"]


class BlockBias:
    """A bias ``bias_ij`` on the ``N x M`` scores, computed for query rows ``start:stop`` on request.

    Args:
        n: N, the number of query rows.
        m: M, the number of keys.
        rows: ``rows(start, stop) -> Tensor`` broadcastable to ``(B, H, stop - start, M)``.
        params: the tensors ``rows`` depends on that may need gradients (a learned bias
            table); the chunked path passes them through its autograd function so that they
            get their gradients block by block.
    """

    def __init__(self, n: int, m: int, rows: Callable[[int, int], torch.Tensor], params: Iterable[torch.Tensor] = ()):
        self.n, self.m = int(n), int(m)
        self._rows = rows
        self.params = list(params)

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """The bias of query rows ``start:stop``: broadcastable to ``(B, H, stop - start, M)``."""
        return self._rows(start, stop)

    def materialize(self) -> torch.Tensor:
        """All ``N`` rows at once (what the SDPA path needs)."""
        return self.rows(0, self.n)

    def __add__(self, other) -> "BlockBias":
        """This bias plus a tensor broadcastable to ``(B, H, N, M)`` or another ``BlockBias``."""
        if isinstance(other, BlockBias):
            if (other.n, other.m) != (self.n, self.m):
                raise ValueError(f"cannot add a {other.n} x {other.m} BlockBias to a {self.n} x {self.m} one")
            return BlockBias(self.n, self.m, lambda a, b: self.rows(a, b) + other.rows(a, b), self.params + other.params)
        if isinstance(other, torch.Tensor):
            extra = [other] if other.requires_grad else []
            return BlockBias(self.n, self.m, lambda a, b: self.rows(a, b) + _tensor_rows(other, a, b), self.params + extra)
        return NotImplemented

    __radd__ = __add__

    def __repr__(self) -> str:
        return f"BlockBias(n={self.n}, m={self.m}, params={len(self.params)})"


def _tensor_rows(t: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows ``start:stop`` of a tensor broadcastable to (B, H, N, M) (dim -2 may be 1)."""
    if t.dim() < 2 or t.shape[-2] == 1:
        return t
    return t[..., start:stop, :]
