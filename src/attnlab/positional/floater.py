"""FLOATER: position vectors from a continuous dynamical system (Liu et al. 2020)."""

from __future__ import annotations

import torch
from torch import nn

from ..validate import number_above, positive_int
from .base import InputEncoding, register
from .sinusoidal import sinusoidal_encode

__all__ = ["Floater", "FloaterDynamics"]


class FloaterDynamics(nn.Module):
    """The network ``h(t, z; theta) = W_2 tanh(W_1 z + w_t t + b_1) + b_2`` of ``dz/dt = h(t, z)``."""

    def __init__(self, dim: int, hidden: int, init_scale: float):
        super().__init__()
        self.inp = nn.Linear(dim, hidden)
        self.time = nn.Parameter(torch.randn(hidden) / hidden**0.5)
        self.outp = nn.Linear(hidden, dim)
        with torch.no_grad():  # start close to the sinusoidal encoding, with gradients everywhere
            self.outp.weight.mul_(init_scale)
            self.outp.bias.zero_()

    def forward(self, t: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return self.outp(torch.tanh(self.inp(z) + t * self.time))


@register("floater")
class Floater(InputEncoding):
    """``e^i = sinusoidal(i) + z(i dt)`` with ``z(0) = z_0`` and ``dz/dt = h(t, z; theta)``.

    Liu et al. 2020, "Learning to Encode Position for Transformer with Continuous Dynamical
    Model" (https://arxiv.org/abs/2003.09229): position vectors are samples of the solution
    of an ODE whose right-hand side is a small trained network, so they exist at every
    position (integrate further) with a parameter count independent of the length. As in the
    paper's initialisation from a pre-trained Transformer, the ODE learns a correction on top of
    the sinusoidal encoding: with ``h = 0`` (and ``z_0 = 0``, its initial value) the encoding is
    exactly the sinusoidal one. The ODE is solved by torchdiffeq (``odeint``) on the grid of
    positions, one step per position, and differentiated through the solver; the paper also
    injects the encoding before every block, attnlab adds it once at the input.

    Args:
        dim: E, the input width.
        hidden: width of the dynamics network (default E).
        dt: the time between two consecutive positions.
        method: the torchdiffeq solver (``"rk4"``: a fixed-step fourth-order method; ``"euler"``,
            ``"midpoint"``; adaptive ones such as ``"dopri5"`` also work, slower).
        init_scale: scale of the dynamics network's last layer at initialisation.
    """

    def __init__(
        self,
        *,
        dim: int | None,
        num_heads: int | None = None,
        max_len: int | None = None,
        hidden: int | None = None,
        dt: float = 0.1,
        method: str = "rk4",
        init_scale: float = 0.1,
    ):
        super().__init__(dim)
        number_above("dt", dt, 0)
        self.hidden = self.dim if hidden is None else positive_int("hidden", hidden)
        self.dt, self.method = float(dt), method
        self.z0 = nn.Parameter(torch.zeros(self.dim))
        self.dynamics = FloaterDynamics(self.dim, self.hidden, init_scale)

    def solve(self, steps: int) -> torch.Tensor:
        """``z(0), z(dt), ..., z((steps - 1) dt)``: ``(steps, E)``."""
        from ..extras import require

        odeint = require("torchdiffeq", "ode", "the FLOATER encoding (an ODE solved with torchdiffeq)").odeint

        t = torch.arange(steps, device=self.z0.device, dtype=self.z0.dtype) * self.dt
        if steps == 1:
            return self.z0[None]
        return odeint(self.dynamics, self.z0, t, method=self.method)  # (steps, E)

    def _solved(self, steps: int) -> torch.Tensor:
        """``solve(steps)``; without gradients, kept and reused while the parameters are unchanged
        (decoding asks for one position more at each step: the trajectory is solved to twice the
        length asked, so that a stream of T tokens costs O(T) solver steps, not O(T^2)). A fixed
        step solver on the grid of positions gives a prefix the same values at any length."""
        if torch.is_grad_enabled():
            return self.solve(steps)
        key = tuple((p.data_ptr(), p._version, p.dtype, p.device) for p in self.parameters())
        memo = getattr(self, "_memo", None)
        if memo is None or memo[0] != key or memo[1].shape[0] < steps:
            memo = (key, self.solve(max(steps, 2 * (memo[1].shape[0] if memo is not None and memo[0] == key else 0))))
            self._memo = memo
        return memo[1][:steps]

    def encode(self, positions):
        if positions.numel() == 0:
            return self.z0.new_zeros(0, self.dim)
        positions = positions.to(self.z0.device)
        z = self._solved(int(positions.max()) + 1)[positions]  # (L, E)
        return sinusoidal_encode(positions, self.dim).to(z.dtype) + z

    def extra_repr(self) -> str:
        return f"dim={self.dim}, hidden={self.hidden}, dt={self.dt}, method={self.method!r}"
