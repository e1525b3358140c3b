"""The sinusoidal encoding of the Transformer (Vaswani et al. 2017, section 3.5)."""

from __future__ import annotations

import torch

from ..validate import int_at_least, number_above, positive_int
from .base import InputEncoding, register

__all__ = ["sinusoidal_table", "sinusoidal_encode", "Sinusoidal"]


def sinusoidal_encode(positions: torch.Tensor, dim: int, *, base: float = 10000.0) -> torch.Tensor:
    """``e^pos`` for integer ``positions`` ``(L,)``: ``(L, dim)`` float32 on the positions' device.

    ``e^pos_{2i} = sin(pos / base^(2i/d))``, ``e^pos_{2i+1} = cos(pos / base^(2i/d))``: sine on
    even dimensions, cosine on odd ones, wavelengths from 2 pi to base x 2 pi. Computed in
    float64 on the CPU and rounded once to float32, so that long positions keep full float32
    accuracy (a float32 product ``pos x frequency`` would be off by up to pos x 6e-8 radians).
    """
    dim = positive_int("dim", dim)
    pos = positions.detach().to("cpu", torch.float64).reshape(-1, 1)  # (L, 1)
    i = torch.arange(0, dim, 2, dtype=torch.float64)  # the 2i of each sin/cos pair
    angle = pos / base ** (i / dim)  # (L, ceil(d/2))
    table = torch.empty(pos.shape[0], dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : dim // 2])
    return table.view(*positions.shape, dim).to(device=positions.device, dtype=torch.float32)


def sinusoidal_table(length: int, dim: int, *, base: float = 10000.0) -> torch.Tensor:
    """The ``(length, dim)`` sinusoidal table: row ``pos`` is ``e^pos`` (see :func:`sinusoidal_encode`)."""
    int_at_least("length", length, 0)
    return sinusoidal_encode(torch.arange(length), dim, base=base)


@register("sinusoidal")
class Sinusoidal(InputEncoding):
    """Fixed sinusoids added to the inputs: ``a^i + e^i`` with ``e^i`` of :func:`sinusoidal_encode`.

    Defined for every position, so it runs at any length; no parameters.

    Args:
        dim: E, the input width.
        base: the longest wavelength over 2 pi (10000 in the paper).
    """

    def __init__(self, *, dim: int | None, num_heads: int | None = None, max_len: int | None = None,
                 base: float = 10000.0):
        super().__init__(dim)
        self.base = number_above("base", base, 1)

    def encode(self, positions):
        return sinusoidal_encode(positions, self.dim, base=self.base)
