"""Padding that cannot reach gradients: non-finite entries of the input rows no query may see are zeroed."""

from __future__ import annotations

import torch

from ..core.blockmap import BlockMap

__all__ = ["silence_padding"]


def _hidden_rows(mask, batch: int, m: int) -> torch.Tensor | None:
    """``(B or 1, M)`` True for the key rows no query may see, or None when the mask does not say."""
    if isinstance(mask, torch.Tensor):
        if mask.dtype != torch.bool or not 2 <= mask.dim() <= 4:
            return None
        return ~mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape)).any(-2).any(1)
    inner = mask.mask if isinstance(mask, BlockMap) else mask
    hidden = getattr(inner, "hidden_keys", None)
    if not callable(hidden) or isinstance(inner, torch.Tensor):
        return None
    try:
        return hidden(m, None)
    except ValueError:
        return None  # a mask of another width: project names that error


def silence_padding(query: torch.Tensor, key: torch.Tensor | None, value: torch.Tensor | None, mask):
    """Replace NaN and infinities by 0 in the input rows that ``mask`` hides from every query (padding).

    A hidden key never reaches an output, but a NaN in its row would still reach gradients: in
    self-attention the padded rows are queries too, their scores are NaN, and autograd multiplies
    their zero upstream gradient by NaN on the way back to the valid keys and to the weights. With
    those entries zeroed, a sequence's outputs and gradients do not depend on what its padding
    holds. Finite rows are left as they are, so outputs (padded rows included) are unchanged for
    finite inputs, bit for bit. Cross-attention cleans the key and value rows; the query rows of
    cross-attention carry no padding information in the mask. The hidden rows come from a bool
    tensor, or from a mask function that knows them (padding, documents). Returns the inputs
    unchanged when nothing is hidden.
    """
    source = query if key is None else key
    if mask is None or not isinstance(source, torch.Tensor) or source.dim() != 3:
        return query, key, value
    if isinstance(mask, torch.Tensor) and mask.shape[-1] != source.shape[1]:
        return query, key, value  # a shape error: project's checks name it
    hidden = _hidden_rows(mask, source.shape[0], source.shape[1])
    if hidden is None or hidden.shape[0] not in (1, source.shape[0]) or hidden.shape[-1] != source.shape[1]:
        return query, key, value
    hidden = hidden.to(source.device)
    if hidden.device.type == "cpu" and not hidden.any():
        return query, key, value  # nothing hidden: no copy (on an accelerator the check would stall the stream)

    def clean(t: torch.Tensor) -> torch.Tensor:
        return t.masked_fill(hidden[..., None] & ~torch.isfinite(t), 0.0)

    if key is None and value is None:
        return clean(query), None, None
    return query, clean(source), None if value is None else clean(value)
