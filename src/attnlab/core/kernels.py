"""Checked kernels: a fast kernel serves only after it matched attnlab's own form on this device.

A *kernel* is a faster implementation of one of attnlab's forms on some devices: FlexAttention
for the masks (:mod:`attnlab.core.flex`), fla's Triton kernels for the gated family
(:mod:`attnlab.efficient.fla_ops`). Before a kernel first serves a (kernel, device, dtype,
library versions), :func:`check` runs it and attnlab's own form on one small random input: the
kernel in the dtype asked for, the own form in float64 on the same device (the CPU where the
device has no float64), forward and the gradient of every floating input, against a random
cotangent. The largest difference of each tensor, divided by the largest magnitude of the
reference, must stay within :data:`TOLERANCE` of the dtype. The verdict is kept on disk
(:func:`verdict_file`), so a machine checks each kernel once per version of its libraries.

A kernel whose forward fails the check, or raises, is refused; one whose backward fails or
raises (fla refuses some backward passes on some GPUs) serves forward-only calls. Where a kernel
is refused, :func:`serves` returns False and the caller runs attnlab's own form, after one
:class:`KernelFallbackWarning` per kernel and process naming the kernel, its versions and the
difference.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

__all__ = ["Kernel", "KernelFallbackWarning", "TOLERANCE", "Verdict", "check", "device_name", "forget", "kernels",
           "kernels_for", "needs_grad", "register", "serves", "unregister", "verdict", "verdict_file"]

TOLERANCE = {torch.float64: 1e-9, torch.float32: 5e-3, torch.float16: 2e-2, torch.bfloat16: 6e-2}
"""The largest difference a kernel may show against attnlab's float64 form, relative to the
reference's largest magnitude, per dtype of the kernel's inputs. float32 allows TF32 products
(10 mantissa bits, as fla and cuDNN use on Ampere and later); bfloat16 has 8 bits."""


class KernelFallbackWarning(UserWarning):
    """A fast kernel was refused on this device; attnlab's own form computes instead."""


@dataclass(frozen=True)
class Kernel:
    """A fast implementation of one of attnlab's forms.

    Attributes:
        name: unique, e.g. ``"fla.chunk_gated_delta_rule"``.
        serves: the variants (registry names) it computes.
        run: the kernel, ``run(*args) -> tensor or tuple of tensors``.
        own: attnlab's own form with the same arguments and results.
        sample: ``sample(device, dtype, generator) -> args``, a small random input.
        devices: the device types it may serve on.
        versions: ``() -> {library: version}``, what its results depend on besides torch.
        available: ``(device) -> reason or None``: why it cannot run here (a library missing).
    """

    name: str
    serves: tuple[str, ...]
    run: Callable
    own: Callable
    sample: Callable
    devices: tuple[str, ...] = ("cuda",)
    versions: Callable[[], dict[str, str]] = field(default=lambda: {})
    available: Callable[[torch.device], str | None] = field(default=lambda device: None)


@dataclass
class Verdict:
    """The outcome of :func:`check`: ``forward`` / ``backward`` whether each may serve,
    ``errors`` each compared tensor's relative difference, ``reason`` one line."""

    kernel: str
    device: str
    dtype: str
    versions: dict[str, str]
    forward: bool
    backward: bool
    errors: dict[str, float]
    reason: str

    def line(self) -> str:
        """The verdict in one line."""
        served = "serves" if self.forward and self.backward else "serves forward only" if self.forward else "refused"
        versions = ", ".join(f"{k} {v}" for k, v in self.versions.items())
        return f"{self.kernel} on {self.device} in {self.dtype} ({versions}): {served}: {self.reason}"


_KERNELS: dict[str, Kernel] = {}
_VERDICTS: dict[str, Verdict] = {}
_WARNED: set[str] = set()


def register(kernel: Kernel) -> Kernel:
    """Add ``kernel`` (a new name, or replace one of the same name); returns it."""
    _KERNELS[kernel.name] = kernel
    return kernel


def unregister(name: str) -> None:
    """Remove the kernel ``name`` (nothing if there is none)."""
    _KERNELS.pop(name, None)


def kernels() -> list[Kernel]:
    """Every registered kernel."""
    return list(_KERNELS.values())


def kernels_for(variant: str) -> list[Kernel]:
    """The kernels that serve ``variant``."""
    return [k for k in _KERNELS.values() if variant in k.serves]


def device_name(device: torch.device) -> str:
    """What a verdict is kept for: the GPU's name and compute capability, or the CPU's kind."""
    device = torch.device(device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        return f"{torch.cuda.get_device_name(index)} (sm_{major}{minor})"
    return f"{device.type} {platform.machine()}"


def verdict_file() -> Path:
    """Where verdicts are kept: ``$ATTNLAB_CACHE/kernels.json``, else ``~/.cache/attnlab/kernels.json``."""
    root = os.environ.get("ATTNLAB_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "attnlab")
    return Path(root) / "kernels.json"


def _versions(kernel: Kernel) -> dict[str, str]:
    return {"torch": torch.__version__, **kernel.versions()}


def _key(kernel: Kernel, device: torch.device, dtype: torch.dtype) -> str:
    versions = ",".join(f"{k}={v}" for k, v in sorted(_versions(kernel).items()))
    return f"{kernel.name}|{device_name(device)}|{str(dtype).removeprefix('torch.')}|{versions}"


def _load() -> dict:
    try:
        return json.loads(verdict_file().read_text())
    except (OSError, ValueError):
        return {}


def _save(key: str, v: Verdict) -> None:
    path = verdict_file()
    with contextlib.suppress(OSError):  # a read-only home: the verdict holds for this process
        path.parent.mkdir(parents=True, exist_ok=True)
        stored = _load()
        stored[key] = asdict(v)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(stored, f, indent=1, sort_keys=True)
        os.replace(tmp, path)


def _tensors(out) -> list[torch.Tensor]:
    items = out if isinstance(out, (tuple, list)) else (out,)
    return [t for t in items if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _difference(a: torch.Tensor, ref: torch.Tensor) -> float:
    if a.shape != ref.shape:
        return float("inf")
    if a.numel() == 0:
        return 0.0
    ref = ref.double()
    return float((a.double().cpu() - ref.cpu()).abs().max()) / max(float(ref.abs().max()), 1e-12)


def _reference_device(device: torch.device) -> torch.device:
    return torch.device("cpu") if device.type == "mps" else device  # MPS has no float64


def _run(fn, args, cotangents, gen):
    inputs = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    outs = _tensors(fn(*args))
    if cotangents is None:
        cotangents = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device) for o in outs]
    loss = sum((o.double() * c.to(o.device)).sum() for o, c in zip(outs, cotangents))
    return outs, inputs, loss, cotangents


def check(kernel: Kernel, device, dtype: torch.dtype) -> Verdict:
    """Run ``kernel`` against its own form on a small random input (module docstring); the verdict.

    Kept neither in memory nor on disk: :func:`serves` does that."""
    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    versions = _versions(kernel)
    ok_f = ok_b = False
    errors: dict[str, float] = {}
    with torch.inference_mode(False), torch.enable_grad(), torch.autocast(device.type, enabled=False):
        args = kernel.sample(device, dtype, gen)
        args = [a.detach().requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a for a in args]
        ref_dev = _reference_device(device)
        ref_args = [a.detach().to(ref_dev, torch.float64 if a.is_floating_point() else a.dtype)
                    .requires_grad_(a.is_floating_point()) if isinstance(a, torch.Tensor) else a for a in args]
        ref_outs, ref_inputs, ref_loss, cot = _run(kernel.own, ref_args, None, gen)
        ref_grads = torch.autograd.grad(ref_loss, ref_inputs, allow_unused=True)
        tol = TOLERANCE.get(dtype, 5e-3)
        try:
            outs, inputs, loss, _ = _run(kernel.run, args, cot, gen)
        except Exception as e:
            return Verdict(kernel.name, device_name(device), str(dtype).removeprefix("torch."), versions, False, False,
                           {}, f"the forward raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        for i, (o, r) in enumerate(zip(outs, ref_outs)):
            errors[f"output {i}"] = _difference(o.detach(), r.detach())
        ok_f = len(outs) == len(ref_outs) and all(e <= tol for e in errors.values())
        reason = ""
        try:
            grads = torch.autograd.grad(loss, inputs, allow_unused=True)
            for i, (g, r) in enumerate(zip(grads, ref_grads)):
                if r is not None:
                    errors[f"gradient {i}"] = float("inf") if g is None else _difference(g, r)
            ok_b = ok_f and all(e <= tol for k, e in errors.items() if k.startswith("gradient"))
        except Exception as e:
            reason = f"the backward raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; "
    worst = max(errors.items(), key=lambda kv: kv[1]) if errors else ("-", 0.0)
    reason += f"largest difference {worst[1]:.2e} ({worst[0]}), tolerance {tol:.0e}"
    return Verdict(kernel.name, device_name(device), str(dtype).removeprefix("torch."), versions, ok_f, ok_b, errors,
                   reason)


def verdict(kernel: Kernel, device, dtype: torch.dtype) -> Verdict | None:
    """The verdict for ``kernel`` here, from memory, then disk, else by :func:`check` (kept both
    ways); None where the kernel cannot run on this device (:attr:`Kernel.devices`, :attr:`Kernel.available`)."""
    device = torch.device(device)
    if device.type not in kernel.devices or kernel.available(device) is not None:
        return None
    key = _key(kernel, device, dtype)
    if key not in _VERDICTS:
        stored = _load().get(key)
        try:
            _VERDICTS[key] = Verdict(**stored) if stored else check(kernel, device, dtype)
        except TypeError:  # a verdict of another layout: check again
            _VERDICTS[key] = check(kernel, device, dtype)
        if not stored:
            _save(key, _VERDICTS[key])
    return _VERDICTS[key]


def serves(kernel: Kernel, device, dtype: torch.dtype, *, backward: bool) -> bool:
    """Whether ``kernel`` may compute a call here (``backward``: its gradient is needed).

    A refused kernel warns once per process (:class:`KernelFallbackWarning`)."""
    v = verdict(kernel, device, dtype)
    if v is None:
        return False
    ok = v.forward and (v.backward or not backward)
    if not ok and v.kernel + v.dtype not in _WARNED:
        _WARNED.add(v.kernel + v.dtype)
        warnings.warn(f"{v.line()}; attnlab's own form computes instead", KernelFallbackWarning, stacklevel=3)
    return ok


def forget() -> None:
    """Drop the verdicts held in memory and the warnings given (the disk keeps its verdicts)."""
    _VERDICTS.clear()
    _WARNED.clear()


def needs_grad(*tensors) -> bool:
    """Whether a call on ``tensors`` will be differentiated (grad mode on, some input requiring it)."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)
