"""Which backend computes each registered variant on a device, and why (``attnlab backends``).

Dense attention goes to PyTorch's :func:`~torch.nn.functional.scaled_dot_product_attention`
(FlashAttention, cuDNN or the memory-efficient kernel on CUDA, the flash kernel on the CPU).
A variant that a checked kernel serves (:mod:`attnlab.core.kernels`: FlexAttention for the masks,
fla for the gated family, on CUDA) goes to it once its verdict on this device passed; everything
else, and every variant whose kernel was refused or cannot run here, is computed by attnlab's own
form, the one tested against the float64 reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.kernels import kernels_for, verdict
from . import names

__all__ = ["Serving", "serving", "serving_table"]

SDPA = "torch sdpa"
OWN = "attnlab"


@dataclass
class Serving:
    """One row of :func:`serving_table`: ``backend`` computes ``variant`` (forward and backward;
    ``inference`` the forward of a call without gradients, when it differs), ``why`` in one line."""

    variant: str
    backend: str
    why: str
    inference: str | None = None


def serving(variant: str, device, dtype: torch.dtype = torch.float32) -> Serving:
    """What computes ``variant`` on ``device`` in ``dtype`` (checking its kernels here if no verdict is kept)."""
    device = torch.device(device)
    kernels = kernels_for(variant)
    if variant == "dense":
        # no mask, a dense one or causal: PyTorch's kernel; a mask function: the masks' kernel, if any
        masked = (_checked(variant, kernels, device, dtype) if kernels
                  else Serving(variant, OWN, "attnlab's block-sparse path"))
        return Serving(variant, SDPA, "PyTorch's fused kernel (flash, cuDNN or memory-efficient); with a mask "
                                      f"function: {masked.backend} ({masked.why})")
    if not kernels:
        return Serving(variant, OWN, "no faster kernel is registered for it: attnlab's own form")
    return _checked(variant, kernels, device, dtype)


def _checked(variant: str, kernels: list, device: torch.device, dtype: torch.dtype) -> Serving:
    """The first of ``kernels`` whose verdict here passed, else attnlab's own form with every reason."""
    reasons = []
    for k in kernels:
        if device.type not in k.devices:
            reasons.append(f"{k.name} serves on {' and '.join(k.devices)} only")
            continue
        missing = k.available(device)
        if missing is not None:
            reasons.append(f"{k.name}: {missing}")
            continue
        v = verdict(k, device, dtype)
        assert v is not None  # available here: checked
        if v.forward and v.backward:
            return Serving(variant, k.name, f"checked here: {v.reason}")
        if v.forward:
            return Serving(variant, OWN, f"{k.name} serves calls without gradients only ({v.reason})", inference=k.name)
        reasons.append(f"{k.name} refused here: {v.reason}")
    return Serving(variant, OWN, "; ".join(reasons) + ": attnlab's own form")


def serving_table(device, dtype: torch.dtype = torch.float32) -> list[Serving]:
    """:func:`serving` of every registered variant, in registry order."""
    return [serving(v, device, dtype) for v in names()]
