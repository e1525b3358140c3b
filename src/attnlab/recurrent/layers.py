"""Sequence layers with one interface, ``(B, N, d) -> (B, N, d)``, for the CNN / RNN /
self-attention comparison: ``rnn`` (Elman), ``lstm``, ``cnn``, ``self_attention``,
``attention_rnn`` and ``lstmn``, created by name with :func:`create`.

Every layer takes ``forward(x, mask=None)`` with ``mask`` ``(B, N)`` bool, True at real
positions (right padding), and returns zeros at padded positions. The recurrent ones also
take ``truncate=s`` (gradients cross only the last ``s`` step-to-step hand-overs; the values do
not change), which :mod:`attnlab.studies.complexity` uses to measure path lengths.
"""

from __future__ import annotations

import torch
from torch import nn

from ..registry import Registry
from ..validate import optional_int, positive_int
from .cells import LSTMN, AttentionRNN, check_prefix_mask

__all__ = ["SequenceLayer", "create", "names", "register", "LAYERS"]

LAYERS: Registry = Registry("sequence layer")


def register(name: str):
    """Class decorator: register a :class:`SequenceLayer` subclass under ``name``."""
    return LAYERS.register(name)


def create(name: str, embed_dim: int, **options) -> SequenceLayer:
    """A sequence layer ``(B, N, embed_dim) -> (B, N, embed_dim)`` by name (see :func:`names`)."""
    positive_int("embed_dim", embed_dim)
    return LAYERS.get(name)(embed_dim, **options)


def names() -> list[str]:
    """The names :func:`create` accepts."""
    return LAYERS.names()


class SequenceLayer(nn.Module):
    """Base class: ``forward(x (B, N, embed_dim), mask=None) -> (B, N, embed_dim)``.

    Attributes:
        recurrent: True when the layer runs step by step (and takes ``truncate=``).
        stacked: True when the layer is a stack whose depth is its ``num_layers`` option.
    """

    recurrent = False
    stacked = False

    def __init__(self, embed_dim: int):
        super().__init__()
        self.embed_dim = embed_dim

    def _check(self, x, mask):
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.embed_dim:
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(f"{self.name} layer expects inputs of shape (B, N, {self.embed_dim}), got {got}")
        mask = check_prefix_mask(mask, x)
        if mask is not None:
            x = x.masked_fill(~mask[..., None], 0.0)
        return x, mask

    @staticmethod
    def _zero_padded(out, mask):
        return out if mask is None else out.masked_fill(~mask[..., None], 0.0)


class _TorchRecurrent(SequenceLayer):
    recurrent = True
    cell: type

    def __init__(self, embed_dim: int, **options):
        super().__init__(embed_dim)
        self.rnn = self.cell(embed_dim, embed_dim, batch_first=True, **options)

    def forward(self, x, mask=None, *, truncate: int | None = None):
        x, mask = self._check(x, mask)
        optional_int("truncate", truncate, 0)
        # hand-overs into steps n - truncate .. n - 1 carry gradients; the one into step `cut` is cut
        cut = 0 if truncate is None else max(0, x.shape[1] - truncate - 1)
        if cut == 0:
            out, _ = self.rnn(x)
        else:  # truncated backpropagation: the state handed into step `cut` is detached
            first, state = self.rnn(x[:, :cut])
            state = tuple(s.detach() for s in state) if isinstance(state, tuple) else state.detach()
            rest, _ = self.rnn(x[:, cut:], state)
            out = torch.cat([first, rest], dim=1)
        return self._zero_padded(out, mask)


@register("rnn")
class ElmanRNN(_TorchRecurrent):
    """The simple (Elman) RNN ``h_i = tanh(W x_i + U h_{i-1} + b)`` (``torch.nn.RNN``)."""

    cell = nn.RNN


@register("lstm")
class LSTMLayer(_TorchRecurrent):
    """An LSTM (``torch.nn.LSTM``), hidden width ``embed_dim``."""

    cell = nn.LSTM


@register("cnn")
class ConvStack(SequenceLayer):
    """``num_layers`` 1-D convolutions of kernel ``kernel_size``, same-length output, GELU after each.

    Centred (default, odd k): position ``i`` of layer ``l`` sees inputs ``i +- l (k - 1) / 2``.
    Causal: it sees ``i - l (k - 1) .. i`` (zero padding on the left only), the direction of the
    recurrent layers. Padded positions are zeroed before every convolution, so they act as the
    zero padding of a shorter sequence.
    """

    stacked = True

    def __init__(self, embed_dim: int, *, kernel_size: int = 3, num_layers: int = 1, causal: bool = False):
        super().__init__(embed_dim)
        positive_int("kernel_size", kernel_size)
        if not causal and kernel_size % 2 == 0:
            raise ValueError(f"a centred kernel must have an odd size (same padding), got {kernel_size}; or use "
                             "causal=True")
        positive_int("num_layers", num_layers)
        self.kernel_size, self.num_layers, self.causal = kernel_size, num_layers, causal
        self.pad = (kernel_size - 1, 0) if causal else (kernel_size // 2, kernel_size // 2)
        self.convs = nn.ModuleList(nn.Conv1d(embed_dim, embed_dim, kernel_size) for _ in range(num_layers))
        self.act = nn.GELU()

    def forward(self, x, mask=None):
        x, mask = self._check(x, mask)
        y = x.transpose(1, 2)  # (B, embed_dim, N)
        keep = None if mask is None else mask[:, None, :]
        for conv in self.convs:
            if keep is not None:
                y = y.masked_fill(~keep, 0.0)
            y = self.act(conv(nn.functional.pad(y, self.pad)))
        return self._zero_padded(y.transpose(1, 2), mask)


@register("self_attention")
class SelfAttentionLayer(SequenceLayer):
    """``num_layers`` Transformer encoder blocks (self-attention + feed-forward, pre-norm) of width
    ``embed_dim``, with ``num_heads`` heads and any positional encoding (default none: every position
    reaches every other in one step). Options go to :class:`attnlab.models.Encoder`."""

    stacked = True

    def __init__(self, embed_dim: int, *, num_heads: int = 1, num_layers: int = 1, **options):
        super().__init__(embed_dim)
        from ..models.encoder import Encoder

        self.num_layers = num_layers
        self.encoder = Encoder(embed_dim, num_heads, num_layers, **options)

    def forward(self, x, mask=None):
        x, mask = self._check(x, mask)
        key_mask = None if mask is None else mask[:, None, None, :]
        return self._zero_padded(self.encoder(x, mask=key_mask).output, mask)


class _CellLayer(SequenceLayer):
    recurrent = True
    cell_type: type

    def __init__(self, embed_dim: int, **options):
        super().__init__(embed_dim)
        self.cell = self.cell_type(embed_dim, embed_dim, **options)

    def forward(self, x, mask=None, *, truncate: int | None = None):
        return self.cell.steps(x, mask, truncate=truncate).output


@register("attention_rnn")
class AttentionRNNLayer(_CellLayer):
    """:class:`attnlab.recurrent.AttentionRNN` as a ``(B, N, d) -> (B, N, d)`` layer."""

    cell_type = AttentionRNN


@register("lstmn")
class LSTMNLayer(_CellLayer):
    """:class:`attnlab.recurrent.LSTMN` as a ``(B, N, d) -> (B, N, d)`` layer."""

    cell_type = LSTMN
