"""Mixed precision: the arithmetic a run's matrix products use (``TrainConfig.precision``).

=========  ==================================================================================
``fp32``   every operation in float32
``bf16``   matrix products (linear layers, attention's products, convolutions) in bfloat16
           under :func:`torch.autocast`; the weights, their gradients, the optimizer's state,
           norms, softmax statistics and the loss stay float32 (autocast's own op lists, and
           attnlab's scores and normalisers, which work in float32 on half-precision inputs)
``auto``   ``bf16`` where the device multiplies bfloat16 matrices natively (a CPU with
           AVX-512 BF16 or AMX, a CUDA device with bfloat16 support), else ``fp32``
=========  ==================================================================================

No loss scaling is needed: bfloat16 has float32's exponent range.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from pathlib import Path

import torch

__all__ = ["PRECISIONS", "EmulatedBF16Warning", "autocast", "fast_bf16", "resolve", "warn_if_emulated"]

PRECISIONS = ("fp32", "bf16", "auto")
"""The values of ``TrainConfig.precision`` and ``--precision``."""

_CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


class EmulatedBF16Warning(UserWarning):
    """``bf16`` was asked for explicitly on a device that does not multiply bfloat16 natively
    (:func:`fast_bf16` is False): every product is emulated, slower than float32."""


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from ``/proc/cpuinfo`` (empty where there is none: not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def fast_bf16(device: torch.device | str = "cpu") -> bool:
    """Whether ``device`` multiplies bfloat16 matrices in hardware: a CPU with AVX-512 BF16 or
    AMX (read from ``/proc/cpuinfo``; False elsewhere), a CUDA device that supports bfloat16."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        return any(f in _cpu_flags() for f in _CPU_BF16_FLAGS)
    return False


def resolve(precision: str, device: torch.device | str = "cpu") -> str:
    """``"fp32"`` or ``"bf16"``: what ``precision`` (one of :data:`PRECISIONS`) means on ``device``."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if precision == "auto":
        return "bf16" if fast_bf16(device) else "fp32"
    return precision


def warn_if_emulated(precision: str, device: torch.device | str = "cpu", stacklevel: int = 3) -> None:
    """Warn (:class:`EmulatedBF16Warning`) when ``bf16`` is asked for explicitly on a device that
    emulates bfloat16: it runs slower than float32 there (``auto`` picks float32 instead).
    ``stacklevel``: :func:`warnings.warn`'s, counted from here (3: the caller of this function's caller)."""
    device = torch.device(device)
    if precision == "bf16" and not fast_bf16(device):
        warnings.warn(f"no native bfloat16 found on this {device.type.upper()} (on a CPU: neither AVX-512 BF16 nor "
                      "AMX): --precision bf16 is emulated and likely slower than fp32 here (attnlab bench peak "
                      "measures both); --precision auto picks fp32",
                      EmulatedBF16Warning,
                      stacklevel=stacklevel)


def autocast(precision: str, device: torch.device | str = "cpu"):
    """The context a forward pass runs in under ``precision``: :func:`torch.autocast` to bfloat16
    for ``bf16`` (``auto`` resolved on ``device``), nothing for ``fp32``."""
    device = torch.device(device)
    if resolve(precision, device) == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)
