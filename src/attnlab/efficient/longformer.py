"""Longformer (local + global) and BigBird (local + global + random) attention: exact attention under their patterns."""

from __future__ import annotations

import torch

from ..core import masks
from ..validate import ArgumentTypeError, int_at_least
from .base import Budget, PatternStep, Sweep, register

__all__ = ["LongformerAttention", "BigBirdAttention", "block_layout"]


def block_layout(n: int, window: int, block: int | None) -> tuple[int, int]:
    """``(block, number of blocks)`` of BigBird's random blocks for a sequence of ``n``: block =
    ``min(max(window, 64), 128)`` by default, at most ``n``."""
    blk = min(min(max(window, 64), 128) if block is None else block, max(n, 1))
    return blk, -(-n // blk)


def _check_global(global_tokens):
    if isinstance(global_tokens, bool):
        raise ArgumentTypeError("global_tokens must be a count or a list of positions, got a bool")
    if isinstance(global_tokens, int):
        if global_tokens < 0:
            raise ValueError(f"global_tokens must be >= 0, got {global_tokens}")
        return global_tokens
    try:
        idx = sorted({int(i) for i in global_tokens})
    except TypeError:
        raise ArgumentTypeError("global_tokens must be a count or a list of positions, got "
                                f"{type(global_tokens).__name__}") from None
    if idx and idx[0] < 0:
        raise ValueError(f"global token positions must be >= 0, got {idx[0]}")
    return tuple(idx)


@register("longformer")
class LongformerAttention(PatternStep):
    """A sliding window plus global tokens (Beltagy et al. 2020, https://arxiv.org/abs/2004.05150).

    Each query sees the keys within ``window`` positions and every global token; each global
    token sees every key: exact attention under ``masks.window(w) | masks.global_tokens(g)``,
    block-sparse, O(N (w + G)). With every token global it is dense attention.

    Args:
        embed_dim, num_heads, causal: see :class:`attnlab.efficient.PatternStep`.
        window: the half-width w (default 256).
        global_tokens: a count g (the first g positions, e.g. a CLS token) or a list of positions.
        block: the tile of the computation.
    """

    budget = Budget(
        short={"window": 4, "global_tokens": 1},
        long={"window": 256, "global_tokens": 16},
        sweep=Sweep("window", (16, 64, 256, 1024), "window (16 global)", fixed={"global_tokens": 16}),
    )

    def __init__(self, embed_dim: int, num_heads: int, *, window: int = 256, global_tokens=1, block: int | None = None,
                 **options):
        int_at_least("window", window, 0)
        super().__init__(embed_dim, num_heads, **options)
        self.window, self.block = window, block
        self.global_tokens = _check_global(global_tokens)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, window={self.window}, global_tokens={self.global_tokens}"

    def pattern_mask(self):
        return masks.window(self.window, causal=self.causal) | masks.global_tokens(self.global_tokens)

    def cache_bounds(self) -> tuple[int, int]:
        """Causal, with the first g tokens global: the global tokens kept as sinks plus a ring
        buffer of the last ``window + 1`` keys, which equals the causal layer exactly."""
        if not isinstance(self.global_tokens, int):
            raise ValueError("cached longformer decoding needs global_tokens as a count (the first g tokens)")
        return self.window + 1, self.global_tokens


@register("bigbird")
class BigBirdAttention(LongformerAttention):
    """A sliding window, global tokens and random key blocks (Zaheer et al. 2020, https://arxiv.org/abs/2007.14062).

    As :class:`LongformerAttention`, and each query block also sees ``random_blocks`` key
    blocks outside its window (earlier ones when causal), drawn from ``seed`` and the number of
    blocks, so the pattern is fixed for a given length (:meth:`pattern` shows it). Exact
    attention under that pattern.

    Args:
        window, global_tokens, block: as for :class:`LongformerAttention` (BigBird's defaults:
            window 64 with blocks of 64, i.e. 3 window blocks; 2 global tokens); ``block`` is
            also the size of the random blocks (default :func:`block_layout`).
        random_blocks: R, random key blocks per query block (default 3).
        seed: the seed of the random pattern.
    """

    # the random blocks are drawn for the whole length, so a prefix's pattern changes as it grows: no cache
    capabilities = LongformerAttention.capabilities.with_changes(cache=None)
    no_cache_reason = ("it draws its random blocks for the whole length; with random_blocks=0 it is longformer, "
                       "which decodes")
    budget = Budget(
        short={"window": 4, "global_tokens": 1, "random_blocks": 1},
        long={"window": 64, "global_tokens": 2, "random_blocks": 3},
        sweep=Sweep("random_blocks", (0, 1, 4, 12), "random blocks (w 64, 2 global)",
                    fixed={"window": 64, "global_tokens": 2}, seeded=True),
    )

    def __init__(
        self, embed_dim: int, num_heads: int, *, window: int = 64, global_tokens=2, random_blocks: int = 3,
        seed: int = 0, **options
    ):
        int_at_least("random_blocks", random_blocks, 0)
        super().__init__(embed_dim, num_heads, window=window, global_tokens=global_tokens, **options)
        self.num_random, self.seed = random_blocks, int(seed)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, random_blocks={self.num_random}"


    def pattern_mask(self):
        base = super().pattern_mask()
        if not self.num_random:
            return base
        return base | _RandomBlocks(self)

    def random_blocks(self, n: int, device=None) -> torch.Tensor | None:
        """``(nb, R)`` block numbers (-1 = none) of each query block's random key blocks at length n."""
        if self.num_random == 0:
            return None
        blk, nb = block_layout(n, self.window, self.block)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + nb)
        out = torch.full((nb, self.num_random), -1, dtype=torch.long)
        reach = -(-self.window // blk)  # window blocks on each side, never drawn again
        for t in range(nb):
            near = set(range(t - reach, t + reach + 1))
            pool = [s for s in range(nb) if s not in near and (not self.causal or s < t)]
            if pool:
                pick = torch.randperm(len(pool), generator=g)[: self.num_random]
                out[t, : pick.numel()] = torch.tensor(pool)[pick]
        return out.to(device) if device is not None else out


class _RandomBlocks(masks.BlockTable):
    """BigBird's random blocks of a layer, drawn for the length at hand."""

    def __init__(self, layer: BigBirdAttention):  # the step
        super().__init__(None, 1, self._draw, name="random_blocks")
        self.layer = layer

    def _draw(self, n: int, m: int) -> torch.Tensor:
        self.block, nb = block_layout(n, self.layer.window, self.layer.block)
        picks = self.layer.random_blocks(n)
        assert picks is not None  # only a layer with num_random > 0 makes these blocks
        table = torch.zeros(nb, nb, dtype=torch.bool)
        rows = torch.arange(nb)[:, None].expand_as(picks)
        table[rows[picks >= 0], picks[picks >= 0]] = True
        return table

    def bind(self, n, m):
        table = self._draw(n, m)
        return masks.BlockTable(table, self.block, None, self.name)
