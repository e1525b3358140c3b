"""The interface every positional encoding implements, and the registry that creates them by name.

An encoding acts in one of three ways (its ``kind``), and a layer calls all three hooks, so
any encoding plugs in anywhere:

* ``"input"`` — a vector ``e^i`` added to the input vector ``a^i`` (sinusoidal, learned, rnn,
  floater): :meth:`PositionalEncoding.add_to`;
* ``"bias"`` — a term ``b_h(i, j)`` added to the scores of head ``h`` (relative, alibi): a
  score function, :meth:`PositionalEncoding.score_mod`;
* ``"rotation"`` — q and k rotated by angles proportional to their positions (rope):
  :meth:`PositionalEncoding.rotate`;
* ``"none"`` — nothing.

Positions are integer tensors: ``(L,)`` shared by the batch, or ``(B, L)`` per row (packed
documents restart them in every document). When the queries are fewer than
the keys (N < M, cached decoding), the default query positions are ``M - N, ..., M - 1``:
the last query sits at the last key, as in :mod:`attnlab.masks`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import nn

from ..core.score_mods import ScoreMod, offset_bias
from ..registry import Registry
from ..validate import ArgumentTypeError, positive_int

__all__ = ["PositionalEncoding", "NoPositional", "register", "create", "names", "ENCODINGS", "kind_of", "positions_for"]

Kind = Literal["input", "bias", "rotation", "none"]


def positions_for(length: int, *, total: int | None = None, device=None) -> torch.Tensor:
    """Default positions of ``length`` vectors that end at position ``total - 1`` (``total`` defaults to ``length``)."""
    total = length if total is None else total
    return torch.arange(total - length, total, device=device)


def check_positions(positions, length: int, what: str) -> torch.Tensor:
    """Validate user positions: an integer tensor ``(length,)`` (or ``(B, length)``, one row per
    sequence) of non-negative entries."""
    if not isinstance(positions, torch.Tensor):
        raise ArgumentTypeError(f"{what} must be a 1-D integer torch.Tensor of length {length}, got "
                                f"{type(positions).__name__}")
    if positions.dtype.is_floating_point or positions.dtype == torch.bool or positions.is_complex():
        raise ArgumentTypeError(f"{what} must have an integer dtype, got {positions.dtype}")
    if positions.dim() not in (1, 2) or positions.shape[-1] != length:
        raise ValueError(f"{what} must have shape ({length},) or (B, {length}), got {tuple(positions.shape)}")
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"{what} must be >= 0, got a minimum of {int(positions.min())}")
    return positions


class PositionalEncoding(nn.Module):
    """Base class: a positional encoding that acts on inputs, on scores or on q and k.

    Subclasses set ``kind`` and override the hook of their kind; the other hooks pass their
    arguments through unchanged.

    Attributes:
        kind: ``"input"``, ``"bias"``, ``"rotation"`` or ``"none"``.
        name: the registry name.
        max_len: the longest sequence it can encode, or None for any length.
    """

    kind: Kind = "none"
    name: str = "none"
    max_len: int | None = None

    def add_to(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """``a^i + e^i`` for inputs ``x`` ``(B, L, E)`` at ``positions`` ``(L,)`` (default 0..L-1)."""
        return x

    def score_mod(self, q_positions: torch.Tensor | None, k_positions: torch.Tensor | None) -> ScoreMod | None:
        """The bias on the scores as a score function at these positions (``(N,)``, ``(B, N)``; None:
        the indices), or None (an encoding that does not act on scores)."""
        return None

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``q`` ``(B, H, N, D)`` and ``k`` ``(B, H, M, D)`` rotated by their positions."""
        return q, k

    def table(self, length: int) -> torch.Tensor:
        """What a plot draws for positions ``0..length-1``: ``(L, E)`` vectors for input
        encodings, the ``(H, L, L)`` bias for bias encodings, ``(L, D/2)`` angles for rope."""
        raise ValueError(f"the {self.name!r} encoding has nothing to draw")

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Same as :meth:`add_to` (the identity for encodings that do not act on inputs)."""
        return self.add_to(x, positions)

    def _check_length(self, positions: torch.Tensor) -> None:
        if self.max_len is not None and positions.numel() and int(positions.max()) >= self.max_len:
            raise ValueError(
                f"the {self.name!r} encoding has positions 0..{self.max_len - 1} (max_len={self.max_len}), "
                f"but position {int(positions.max())} was asked for; create it with a larger max_len "
                "or use an encoding that extrapolates (sinusoidal, rnn, floater, relative, alibi, rope)"
            )


class NoPositional(PositionalEncoding):
    """No positional information: self-attention stays permutation-equivariant."""

    kind = "none"
    name = "none"

    def __init__(self, *, dim: int | None = None, num_heads: int | None = None, max_len: int | None = None):
        super().__init__()


class InputEncoding(PositionalEncoding):
    """An encoding that adds a vector ``e^i`` to each input ``a^i``; subclasses define :meth:`encode`."""

    kind = "input"

    def __init__(self, dim: int | None):  # None (no width given) is refused by the check
        super().__init__()
        self.dim = positive_int("dim", dim)

    def encode(self, positions: torch.Tensor) -> torch.Tensor:
        """``(L, E)`` vectors ``e^i`` for integer ``positions`` ``(L,)``."""
        raise NotImplementedError

    def add_to(self, x, positions=None):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"the {self.name!r} encoding adds to inputs of shape (B, L, {self.dim}), got {got}")
        length = x.shape[1]
        positions = (positions_for(length, device=x.device) if positions is None
                     else check_positions(positions, length, "positions"))
        flat = positions.to(x.device).reshape(-1)  # (L,) or (B L,): encoded row after row
        return x + self.encode(flat).view(*positions.shape, self.dim).to(x.dtype)

    def table(self, length):
        with torch.no_grad():
            return self.encode(torch.arange(length)).float()

    def extra_repr(self) -> str:
        return f"dim={self.dim}" + (f", max_len={self.max_len}" if self.max_len is not None else "")


class BiasEncoding(PositionalEncoding):
    """An encoding that adds ``b_h(i, j)`` to the scores; subclasses define :meth:`bias_from_offsets`."""

    kind = "bias"

    def __init__(self, num_heads: int | None):
        super().__init__()
        if num_heads is None:
            raise ValueError(f"the {self.name!r} encoding biases each head's scores: pass num_heads")
        self.num_heads = positive_int("num_heads", num_heads)

    def head_bias(self, h: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """``b_h(offset)`` elementwise, with broadcasting: ``h`` head indices, ``offsets`` ``j - i``."""
        raise NotImplementedError

    def bias_from_offsets(self, offsets: torch.Tensor) -> torch.Tensor:
        """``(H, n, m)`` bias for integer offsets ``j - i`` ``(n, m)``."""
        h = torch.arange(self.num_heads, device=offsets.device).view(-1, *([1] * offsets.dim()))
        return self.head_bias(h, offsets[None])

    def score_mod(self, q_positions, k_positions):
        return offset_bias(self.head_bias, q_positions, k_positions, params=list(self.parameters()), name=self.name)

    def table(self, length):
        pos = torch.arange(length)
        with torch.no_grad():
            return self.bias_from_offsets(pos[None, :] - pos[:, None]).float()

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"


# ---------------------------------------------------------------------------- registry
ENCODINGS: Registry[type[PositionalEncoding]] = Registry("positional encoding")
"""Every positional encoding by name."""


def register(name: str) -> Callable[[type[PositionalEncoding]], type[PositionalEncoding]]:
    """Class decorator: make an encoding available as ``create(name, ...)``."""
    return ENCODINGS.register(name)


register("none")(NoPositional)


def names() -> list[str]:
    """The names :func:`create` accepts, sorted."""
    return ENCODINGS.names()


def _lookup(name: str) -> type[PositionalEncoding]:
    return ENCODINGS.get(name)


def kind_of(name: str) -> Kind:
    """How the encoding ``name`` acts: ``"input"``, ``"bias"``, ``"rotation"`` or ``"none"``."""
    return _lookup(name).kind


def create(
    name: str, *, dim: int | None = None, num_heads: int | None = None, max_len: int | None = None, **options
) -> PositionalEncoding:
    """Create the positional encoding ``name`` (see :func:`names`).

    Args:
        name: ``"sinusoidal"``, ``"learned"``, ``"rnn"``, ``"floater"``, ``"relative"``,
            ``"alibi"``, ``"rope"`` or ``"none"``.
        dim: the width the encoding acts on: the model width E for input encodings, the head
            width D for ``rope``; bias encodings ignore it.
        num_heads: H; bias encodings give each head its own bias; the others ignore it.
        max_len: the longest sequence; only ``learned`` is bounded by it (default 512 there).
        **options: the encoding's own keyword options (see its class).
    """
    cls = _lookup(name)
    return cls(dim=dim, num_heads=num_heads, max_len=max_len, **options)
