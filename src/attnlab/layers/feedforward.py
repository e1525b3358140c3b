"""The position-wise feed-forward network of a Transformer block."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["FeedForward", "ACTIVATIONS"]

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU}


class FeedForward(nn.Module):
    """``FFN(x) = W_2 dropout(act(W_1 x + b_1)) + b_2``, applied to each vector alone.

    Vaswani et al. 2017, eq. 2 (the "fully connected network" after self-attention in the
    lecture). Input and output ``(B, N, E)``.

    Args:
        embed_dim: E.
        ff_dim: the hidden width (4 E in the paper).
        activation: ``"relu"`` or ``"gelu"``.
        dropout: dropout on the hidden layer.
    """

    def __init__(self, embed_dim: int, ff_dim: int, *, activation: str = "gelu", dropout: float = 0.0):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {activation!r}")
        self.linear1 = nn.Linear(embed_dim, ff_dim)
        self.act = ACTIVATIONS[activation]()
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(ff_dim, embed_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.dropout(self.act(self.linear1(x))))
