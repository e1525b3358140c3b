"""The checks of a :class:`attnlab.MultiHeadAttention`'s construction and inputs."""

from __future__ import annotations

import torch

from ..positional.base import PositionalEncoding, kind_of
from ..positional.base import create as create_positional
from ..validate import ArgumentTypeError

__all__ = ["check_input", "make_positional"]


def make_positional(self, positional, options, max_len) -> PositionalEncoding | None:
    """The layer's positional encoding from a name or an encoding, checked against its widths (None: none)."""
    if positional is None:
        if options:
            raise ArgumentTypeError("positional_options given without a positional encoding")
        return None
    if isinstance(positional, str):
        kind = kind_of(positional)
        dim = self.head_dim if kind == "rotation" else self.embed_dim
        pe = create_positional(positional, dim=dim, num_heads=self.num_heads, max_len=max_len, **(options or {}))
    elif isinstance(positional, PositionalEncoding):
        if options:
            raise ArgumentTypeError("positional_options apply only to an encoding given by name")
        pe = positional
    else:
        raise ArgumentTypeError(f"positional must be a name or a PositionalEncoding, got {type(positional).__name__}")
    if pe.kind == "none":
        return None
    if pe.kind == "input" and (pe.dim != self.embed_dim or self.kdim != self.embed_dim or self.vdim != self.embed_dim):
        raise ValueError(
            f"the {pe.name!r} encoding adds width-{pe.dim} vectors to the inputs, but the inputs have widths "
            f"query {self.embed_dim}, key {self.kdim}, value {self.vdim}"
        )
    if pe.kind == "rotation" and pe.dim != self.head_dim:
        raise ValueError(f"the {pe.name!r} encoding rotates width-{pe.dim} vectors, but the head width is {self.head_dim}")
    if pe.kind == "bias" and pe.num_heads != self.num_heads:
        raise ValueError(f"the {pe.name!r} encoding has {pe.num_heads} heads, this layer {self.num_heads}")
    return pe


def check_input(self, name: str, x, width: int, batch: int | None) -> None:
    """``self``: the layer. Refuse an input that is not a ``(B, N, width)`` tensor of this layer's dtype (``batch``: B, when known)."""
    if not isinstance(x, torch.Tensor):
        raise ArgumentTypeError(f"{name} must be a torch.Tensor of shape (B, N, {width}), got {type(x).__name__}")
    if x.dim() != 3:
        raise ValueError(f"{name} must have rank 3, shape (B, N, {width}); got shape {tuple(x.shape)}")
    if x.shape[-1] != width:
        raise ValueError(f"{name} must have last dimension {width}, got shape {tuple(x.shape)}")
    if batch is not None and x.shape[0] != batch:
        raise ValueError(f"{name} has batch size {x.shape[0]}, but query has {batch}")
    w = getattr(self.q_proj, "weight", None)  # the layer's dtype (autocast computes in its own: any input then)
    if isinstance(w, torch.Tensor) and w.is_floating_point() and x.dtype != w.dtype and not torch.is_autocast_enabled(x.device.type):
        fix = f", or the layer to the input's: layer.to({x.dtype})" + (" (layer.double())" if x.dtype == torch.float64 else "")
        raise ArgumentTypeError(f"{name} has dtype {x.dtype}, but this layer computes in {w.dtype}: convert the input, "
                                f"{name}.to({w.dtype})" + (fix if x.is_floating_point() else " (attention takes float vectors)"))

