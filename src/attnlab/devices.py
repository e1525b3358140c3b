"""Devices: what ``--device`` and ``device=`` accept, and what a device-aware measurement needs.

``auto`` is CUDA where torch sees a CUDA device, else Apple's MPS where present, else the CPU.
A device that this machine does not have is refused with one line (:class:`DeviceError`).
Time on a GPU is read after a synchronisation (the GPU runs behind the host), and peak memory
from the device's caching allocator; on the CPU, wall-clock time and the profiler's peak
(:mod:`attnlab.profiling`).
"""

from __future__ import annotations

import contextlib
import platform
from collections.abc import Iterator

import torch

__all__ = ["DEVICES", "DeviceError", "describe", "forked_rng", "in_words", "peak_memory", "reset_peak_memory",
           "resolve", "rng_state", "set_rng_state", "synchronize"]

DEVICES = "auto|cpu|cuda[:i]|mps"
"""What ``--device`` accepts, as its help shows it."""


class DeviceError(ValueError):
    """A device this machine does not have, or a name torch does not know."""


def _has_mps() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def resolve(device: str | torch.device | None = "auto") -> torch.device:
    """The :class:`torch.device` that ``device`` names on this machine (``None`` or ``"auto"``:
    CUDA, else MPS, else the CPU). ``cuda`` is the current CUDA device; ``cuda:i`` must exist.
    Nothing here initialises CUDA."""
    if device is None or device == "auto":
        if torch.cuda.is_available():  # no index: CUDA is not initialised here (a forked worker may still start it)
            return torch.device("cuda")
        return torch.device("mps") if _has_mps() else torch.device("cpu")
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise DeviceError(f"unknown device {device!r}; expected {DEVICES}") from e
    if d.type == "cpu":
        return torch.device("cpu")
    if d.type == "cuda":
        if not torch.cuda.is_available():
            built = ("built without CUDA" if torch.version.cuda is None
                     else f"built for CUDA {torch.version.cuda}, but no GPU is visible")
            raise DeviceError(f"device {device!r}: this machine has no CUDA device (torch {torch.__version__} is "
                              f"{built}); use --device cpu or auto")
        count = torch.cuda.device_count()
        if d.index is not None and d.index >= count:
            raise DeviceError(f"device {device!r}: this machine has {count} CUDA device{'s' if count != 1 else ''} "
                              f"(cuda:0{f' .. cuda:{count - 1}' if count > 1 else ''})")
        return d
    if d.type == "mps":
        if not _has_mps():
            raise DeviceError(f"device {device!r}: this machine has no MPS device (Apple silicon with a torch built "
                              "for it)")
        return d
    raise DeviceError(f"device {device!r}: attnlab runs on {DEVICES}")


def describe(device: str | torch.device) -> str:
    """The device in words, as a results file records it: the GPU's name, or the CPU's."""
    d = torch.device(device)
    if d.type == "cuda":
        return torch.cuda.get_device_name(d.index if d.index is not None else torch.cuda.current_device())
    if d.type == "cpu":
        with contextlib.suppress(OSError):
            for line in open("/proc/cpuinfo"):
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
        return platform.processor() or platform.machine()
    return d.type


def in_words(device: str | torch.device) -> str:
    """``cpu``, or a device and its name, ``cuda (NVIDIA H100 80GB HBM3)``: how results name where they were
    measured."""
    d = torch.device(device)
    return "cpu" if d.type == "cpu" else f"{d} ({describe(d)})"


def synchronize(device: str | torch.device) -> None:
    """Wait until the device has done the work queued so far (nothing on the CPU)."""
    d = torch.device(device)
    if d.type == "cuda":
        torch.cuda.synchronize(d)
    elif d.type == "mps":
        torch.mps.synchronize()


def reset_peak_memory(device: str | torch.device) -> None:
    """Start counting the device allocator's peak anew (CUDA; nothing elsewhere)."""
    d = torch.device(device)
    if d.type == "cuda":
        torch.cuda.reset_peak_memory_stats(d)


def peak_memory(device: str | torch.device) -> int | None:
    """Bytes the CUDA allocator held at most since :func:`reset_peak_memory`; None off CUDA."""
    d = torch.device(device)
    return int(torch.cuda.max_memory_allocated(d)) if d.type == "cuda" else None


def rng_state(device: str | torch.device) -> dict[str, torch.Tensor]:
    """The random state a resume on ``device`` needs: the CPU generator's, and the CUDA device's."""
    d = torch.device(device)
    state = {"rng": torch.get_rng_state()}
    if d.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(d)
    return state


def set_rng_state(state: dict, device: str | torch.device) -> None:
    """Restore what :func:`rng_state` saved (a CUDA state only on a CUDA device: a run moved to
    another kind of device resumes its CPU draws, and its device's draws start from its seed)."""
    torch.set_rng_state(state["rng"])
    d = torch.device(device)
    if d.type == "cuda" and "cuda_rng" in state:
        torch.cuda.set_rng_state(state["cuda_rng"].cpu(), d)


@contextlib.contextmanager
def forked_rng() -> Iterator[None]:
    """Inside, draws from torch's generators (the CPU's and any CUDA device's in use) leave the
    caller's state untouched."""
    devices = (list(range(torch.cuda.device_count())) if torch.cuda.is_available() and torch.cuda.is_initialized()
               else [])
    with torch.random.fork_rng(devices=devices):
        yield
