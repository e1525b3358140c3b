"""What the device check's sections (:mod:`attnlab.studies.device_check`, :mod:`attnlab.studies.device_speed`)
share: the precisions they run, the progress line, and a failure recorded as one line with the device's memory
given back."""

from __future__ import annotations

import gc
from collections.abc import Callable

import torch

__all__ = ["PRECISIONS", "Say", "first_line", "free", "out_of_memory", "quiet"]

PRECISIONS = ("fp32", "bf16")
"""The precisions each section runs: float32, and float32 under bfloat16 autocast."""

Say = Callable[[str], None]


def quiet(_: str) -> None:
    """A progress line said to no one: the sections' default ``say``."""


def first_line(e: BaseException) -> str:
    """``e`` as one line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}".rstrip(": ")


def out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is the device (or the CPU) out of memory."""
    return isinstance(e, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(e, RuntimeError) and "out of memory" in str(e))


def free(device: torch.device, collect: bool = True) -> None:
    """Give the device's cached memory back (after ``collect``: what a failed call left in cycles)."""
    if collect:
        gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
