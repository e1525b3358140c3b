"""The gated family's chunkwise forms through fla's Triton kernels on CUDA, behind the checked-kernel gate.

flash-linear-attention (fla, ``pip install 'attnlab[fla]'``) computes the forms of
:mod:`attnlab.efficient.recurrence` with fused Triton kernels. :func:`dispatch_gated` and
:func:`dispatch_delta`, called first by :func:`~attnlab.efficient.recurrence.chunk_gated` and
:func:`~attnlab.efficient.recurrence.chunk_delta`, hand a call to fla where one of its kernels
serves it (:func:`attnlab.core.kernels.serves`: it matched attnlab's own form on this GPU, dtype
and library versions, forward and every gradient), and return None otherwise: the own form
computes, unchanged. Which op computes which form:

=============================  ===============================  =====================================
fla op                         attnlab form                     variants
=============================  ===============================  =====================================
``chunk_simple_gla``           gated, decay per head or none    retnet, mamba2
``chunk_gla``                  gated, decay per key channel     gla
``chunk_delta_rule``           delta, no decay, half precision  deltanet
``chunk_gated_delta_rule``     delta, decay per head (or none)  gated_deltanet, deltaproduct, deltanet
``chunk_kda``                  delta, decay per key channel     kda
=============================  ===============================  =====================================

fla's ``chunk_delta_rule`` refuses float32, the precision the family's layers run their recurrence
in: there DeltaNet goes through ``chunk_gated_delta_rule`` with a zero decay. Each adapter maps
attnlab's arguments to fla's and back: ``(B, H, N, D)`` to ``(B, T, H, K)``, ``scale=1.0`` (q
arrives scaled), the state ``(B or S, H, D, Dv)`` in at least float32, ``cu_seqlens``, and every
flag that would change the computation (q/k L2 norm, gate or beta activation in the kernel, the
state's V-first layout) off. fla keeps its own chunk length (64): ``chunk`` and ``segment`` do not
reach it. Not handed to fla: float64 (attnlab's reference precision), q, k, v of mixed dtypes, key
widths over :data:`MAX_KEY_WIDTH`, empty sequences or documents: attnlab's own form computes those
(and the gate's float64 reference is therefore always the own form). A kernel's check runs both of
fla's code paths on its sample (:func:`both_paths`): a batch of sequences and packed documents.

fla and Triton are imported only inside functions, only when a call is on a CUDA device: on a
machine without CUDA, ``import attnlab`` imports neither.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..core import kernels
from ..core.kernels import Kernel

__all__ = ["KERNELS", "MAX_KEY_WIDTH", "SERVED_ON", "both_paths", "delta_rule", "dispatch_delta", "dispatch_gated",
           "fla_op", "gated_delta_rule", "gla", "kda", "pick", "register_kernels", "simple_gla"]

SERVED_ON = ("cuda",)
"""The device types on which :func:`dispatch_gated` and :func:`dispatch_delta` ask the gate at all."""

MAX_KEY_WIDTH = 256
"""The widest key fla's chunk kernels take (``K <= 256``, asserted by its state kernels and KDA's)."""

KERNELS: dict[str, Kernel] = {}
"""fla's kernels by name (``"fla.chunk_gla"``), once :func:`register_kernels` has run."""

_MODULES = {"chunk_simple_gla": "simple_gla", "chunk_gla": "gla", "chunk_delta_rule": "delta_rule",
            "chunk_gated_delta_rule": "gated_delta_rule", "chunk_kda": "kda"}
_SERVES = {"chunk_simple_gla": ("retnet", "mamba2"), "chunk_gla": ("gla",), "chunk_delta_rule": ("deltanet",),
           "chunk_gated_delta_rule": ("gated_deltanet", "deltaproduct", "deltanet"), "chunk_kda": ("kda",)}
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_DOCUMENTS = (0, 37, 128)  # the sample's packed documents: uneven, neither a whole number of fla's chunks


def fla_op(name: str) -> Callable:
    """fla's function ``name`` (``"chunk_gla"``), imported on first use (this imports Triton)."""
    return getattr(importlib.import_module(f"fla.ops.{_MODULES[name]}"), name)


@functools.cache
def _import_failure(name: str) -> str | None:
    try:
        importlib.import_module("triton")
        fla_op(name)
    except Exception as e:  # Triton or fla missing, or not loadable on this machine (any failure): not served here
        return f"fla's {name} cannot be imported ({type(e).__name__}: {e}); pip install 'attnlab[fla]'"
    return None


def _availability(name: str) -> Callable[[torch.device], str | None]:
    def available(device: torch.device) -> str | None:
        return _import_failure(name)
    return available


def _versions() -> dict[str, str]:
    out = {}
    for key, dists in (("fla", ("fla-core", "flash-linear-attention")), ("triton", ("triton",))):
        found = []
        for dist in dists:
            try:
                found.append(importlib.metadata.version(dist))
            except importlib.metadata.PackageNotFoundError:
                pass
        out[key] = found[0] if found else "missing"
    return out


# ---------------------------------------------------------------------------- the adapters
def _fla(t: torch.Tensor) -> torch.Tensor:
    """attnlab's ``(B, H, N, ...)`` as fla's ``(B, T, H, ...)`` (and back: the same transpose)."""
    return t.transpose(1, 2)


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in at least float32 (fla's decays and states; float64 stays, for the references)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _call(name, op, q, k, v, gates, *, state, cu_seqlens, **flags):
    """fla's ``name`` (or ``op``, its stand-in) on attnlab's arguments; ``gates`` in fla's order,
    already in its layout. Returns attnlab's ``(o, final_state)``."""
    op = fla_op(name) if op is None else op
    cu = None
    if cu_seqlens is not None:
        cu = cu_seqlens.to(q.device, torch.long)
        flags["cu_seqlens_cpu"] = cu_seqlens.to("cpu", torch.long)
    o, s = op(_fla(q), _fla(k), _fla(v), *gates, scale=1.0, initial_state=None if state is None else _wide(state),
              output_final_state=True, cu_seqlens=cu, **flags)
    dtype = q.dtype if state is None else torch.promote_types(q.dtype, state.dtype)
    return _fla(o), s.to(dtype)


def _zero_decay(q: torch.Tensor) -> torch.Tensor:
    return q.new_zeros(q.shape[:3], dtype=torch.promote_types(q.dtype, torch.float32))


def simple_gla(q, k, v, g=None, state=None, cu_seqlens=None, *, op=None):
    """:func:`~attnlab.efficient.recurrence.chunk_gated` with a decay per head ``g`` ``(B, H, N)``
    (None: no decay) through fla's ``chunk_simple_gla`` (``op``: a stand-in with its signature)."""
    g = _zero_decay(q) if g is None else g
    return _call("chunk_simple_gla", op, q, k, v, (_fla(_wide(g)),), state=state, cu_seqlens=cu_seqlens,
                 state_v_first=False)


def gla(q, k, v, g, state=None, cu_seqlens=None, *, op=None):
    """:func:`~attnlab.efficient.recurrence.chunk_gated` with a decay per key channel ``g``
    ``(B, H, N, D)`` through fla's ``chunk_gla``."""
    return _call("chunk_gla", op, q, k, v, (_fla(_wide(g)),), state=state, cu_seqlens=cu_seqlens, state_v_first=False)


def delta_rule(q, k, v, beta, g=None, state=None, cu_seqlens=None, *, op=None):
    """:func:`~attnlab.efficient.recurrence.chunk_delta` without a decay (``g`` must be None)
    through fla's ``chunk_delta_rule`` (half precision only: fla refuses float32)."""
    if g is not None:
        raise ValueError("fla's chunk_delta_rule has no decay: pass g=None, or use gated_delta_rule")
    return _call("chunk_delta_rule", op, q, k, v, (_fla(beta),), state=state, cu_seqlens=cu_seqlens,
                 use_qk_l2norm_in_kernel=False)


def gated_delta_rule(q, k, v, beta, g=None, state=None, cu_seqlens=None, *, op=None):
    """:func:`~attnlab.efficient.recurrence.chunk_delta` with a decay per head ``g`` ``(B, H, N)``
    (None: a zero decay) through fla's ``chunk_gated_delta_rule``."""
    g = _zero_decay(q) if g is None else g
    return _call("chunk_gated_delta_rule", op, q, k, v, (_fla(_wide(g)), _fla(beta)), state=state,
                 cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                 allow_neg_eigval=False, state_v_first=False, use_gate_in_kernel=False)


def kda(q, k, v, beta, g, state=None, cu_seqlens=None, *, op=None):
    """:func:`~attnlab.efficient.recurrence.chunk_delta` with a decay per key channel ``g``
    ``(B, H, N, D)`` (Kimi Delta Attention) through fla's ``chunk_kda``."""
    return _call("chunk_kda", op, q, k, v, (_fla(_wide(g)), _fla(beta)), state=state, cu_seqlens=cu_seqlens,
                 use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False,
                 allow_neg_eigval=False, safe_gate=False, state_v_first=False)


_ADAPTERS: dict[str, Callable] = {"chunk_simple_gla": simple_gla, "chunk_gla": gla, "chunk_delta_rule": delta_rule,
                                  "chunk_gated_delta_rule": gated_delta_rule, "chunk_kda": kda}


# ---------------------------------------------------------------------------- the kernels
def both_paths(form: Callable) -> Callable:
    """``form(*inputs, state, cu_seqlens)`` run twice on a sample: as its batch of two sequences,
    then its second row as the packed documents ``(0, 37, 128)``, each from one of the two
    initial states: fla's two code paths (equal lengths, variable lengths) in one check."""
    def run(*args):
        *inputs, state = args
        packed = [None if t is None else t[1:] for t in inputs]
        cu = torch.tensor(_DOCUMENTS, device=state.device)
        return (*form(*inputs, state, None), *form(*packed, state, cu))
    return run


def _sample(delta: bool, gate: str | None) -> Callable:
    """A sample input of the form: B = 2, H = 2, N = 128, D = Dv = 64, q scaled, k L2-normalised,
    the log decay negative (a log-sigmoid), beta in (0, 2) (DeltaProduct's range), an initial state."""
    def sample(device, dtype, gen):
        b, h, n, d = 2, 2, _DOCUMENTS[-1], 64

        def r(*shape):
            return torch.randn(*shape, generator=gen, dtype=torch.float64)

        q, k, v = r(b, h, n, d) * d ** -0.5, F.normalize(r(b, h, n, d), dim=-1), r(b, h, n, d)
        g = None if gate is None else F.logsigmoid(r(b, h, n, *((d,) if gate == "channel" else ())) + 2.0)
        beta = 2.0 * torch.rand(b, h, n, generator=gen, dtype=torch.float64)
        args = (q, k, v, beta, g, r(b, h, d, d)) if delta else (q, k, v, g, r(b, h, d, d))
        return [None if t is None else t.to(device, dtype) for t in args]
    return sample


def register_kernels(chunk_gated: Callable, chunk_delta: Callable) -> dict[str, Kernel]:
    """Register one :class:`~attnlab.core.kernels.Kernel` per fla op (named ``"fla.<op>"``), whose
    own form is attnlab's chunkwise form: ``chunk_gated`` and ``chunk_delta``, given by
    :mod:`attnlab.efficient.recurrence` (which imports this module, so cannot be imported by it).
    Returns :data:`KERNELS`."""
    def gated_own(q, k, v, g, state, cu):
        return chunk_gated(q, k, v, g, state=state, cu_seqlens=cu)

    def delta_own(q, k, v, beta, g, state, cu):
        return chunk_delta(q, k, v, beta, g, state=state, cu_seqlens=cu)

    gates = {"chunk_simple_gla": "head", "chunk_gla": "channel", "chunk_delta_rule": None,
             "chunk_gated_delta_rule": "head", "chunk_kda": "channel"}
    for op, gate in gates.items():
        delta = op not in ("chunk_simple_gla", "chunk_gla")
        KERNELS[f"fla.{op}"] = kernels.register(Kernel(
            name=f"fla.{op}", serves=_SERVES[op], run=both_paths(_ADAPTERS[op]),
            own=both_paths(delta_own if delta else gated_own), sample=_sample(delta, gate), devices=("cuda",),
            versions=_versions, available=_availability(op)))
    return KERNELS


# ---------------------------------------------------------------------------- the dispatch
def pick(delta: bool, g: torch.Tensor | None, dtype: torch.dtype) -> str:
    """The fla kernel for a call of the delta form (``delta``) or the gated one, with the log decay
    ``g`` (None, per head ``(B, H, N)``, per channel ``(B, H, N, D)``) in ``dtype``."""
    channel = g is not None and g.dim() == 4
    if not delta:
        return "fla.chunk_gla" if channel else "fla.chunk_simple_gla"
    if channel:
        return "fla.chunk_kda"
    return ("fla.chunk_delta_rule" if g is None and dtype in (torch.float16, torch.bfloat16)
            else "fla.chunk_gated_delta_rule")


def dispatch_gated(q, k, v, g, state, cu_seqlens):
    """fla's ``(o, final_state)`` for :func:`~attnlab.efficient.recurrence.chunk_gated`'s
    (checked) arguments where a kernel serves the call (CUDA only, see the module), else None."""
    if q.device.type not in SERVED_ON:
        return None
    return _eager_dispatch()(False, q, k, v, None, g, state=state, cu_seqlens=cu_seqlens)


def dispatch_delta(q, k, v, beta, g, state, cu_seqlens):
    """fla's ``(o, final_state)`` for :func:`~attnlab.efficient.recurrence.chunk_delta`'s (checked)
    arguments where a kernel serves the call (CUDA only, see the module), else None."""
    if q.device.type not in SERVED_ON:
        return None
    return _eager_dispatch()(True, q, k, v, beta, g, state=state, cu_seqlens=cu_seqlens)


@functools.cache
def _eager_dispatch() -> Callable:
    """:func:`_dispatch` outside torch.compile's graphs (fla's ops are opaque to it: the gate and the
    call run eagerly); wrapped on first use, since the wrapper imports torch's compiler stack."""
    return torch.compiler.disable(_dispatch)


def _dispatch(delta, q, k, v, beta, g, *, state, cu_seqlens):
    if q.dtype not in _DTYPES or not q.dtype == k.dtype == v.dtype or q.shape[-1] > MAX_KEY_WIDTH or q.shape[2] == 0:
        return None
    if cu_seqlens is not None and bool((cu_seqlens.diff() == 0).any()):  # an empty document: no verdict covers it
        return None
    kernel = KERNELS.get(pick(delta, g, q.dtype))
    if kernel is None or not kernels.serves(kernel, q.device, q.dtype,
                                            backward=kernels.needs_grad(q, k, v, beta, g, state)):
        return None
    adapter = _ADAPTERS[kernel.name.removeprefix("fla.")]
    return adapter(q, k, v, beta, g, state, cu_seqlens) if delta else adapter(q, k, v, g, state, cu_seqlens)
