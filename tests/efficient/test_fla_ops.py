"""fla's Triton kernels behind the checked-kernel gate (attnlab.efficient.fla_ops), on a CPU: each
adapter, with fla's naive recurrent reference in place of its chunk kernel, gives attnlab's own
chunkwise form (outputs, final states and, through core.kernels.check, every gradient) in
float64; a wrong mapping is refused; the variants reach the ops named; a CPU never dispatches to
fla nor imports it."""

import dataclasses
import importlib.util
import itertools
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

from attnlab import efficient
from attnlab.core import kernels
from attnlab.efficient import fla_ops, recurrence
from tests.efficient.test_gated import fla_naive
from tests.helpers import assert_close_rel


def _recurrent(name):
    """fla's naive recurrent reference for the op ``name`` as ``f(q, k, v, *gates, scale, s0) -> (o, s)``
    in fla's layout, the gates in the chunk op's order."""
    if name == "chunk_simple_gla":
        ref = fla_naive("simple_gla").naive_recurrent_simple_gla
        return lambda q, k, v, g, scale, s0: ref(q, k, v, g, scale=scale, initial_state=s0, output_final_state=True)
    if name == "chunk_gla":  # no scale argument: K^-1/2 inside
        ref = fla_naive("gla").naive_recurrent_gla
        return lambda q, k, v, g, scale, s0: ref(q * scale * q.shape[-1] ** 0.5, k, v, g, initial_state=s0, output_final_state=True)
    if name == "chunk_delta_rule":  # (B, H, T, D), and no scale argument
        ref = fla_naive("delta_rule").delta_rule_recurrence

        def delta(q, k, v, beta, scale, s0):
            o, s = ref(*(t.transpose(1, 2) for t in (q * scale * q.shape[-1] ** 0.5, k, v, beta)), initial_state=s0,
                       output_final_state=True)
            return o.transpose(1, 2), s
        return delta
    if name == "chunk_gated_delta_rule":  # beta before g, where the chunk op takes g first
        ref = fla_naive("gated_delta_rule").naive_recurrent_gated_delta_rule
        return lambda q, k, v, g, beta, scale, s0: ref(q, k, v, beta, g, scale=scale, initial_state=s0, output_final_state=True)
    ref = fla_naive("kda").naive_recurrent_kda
    return lambda q, k, v, g, beta, scale, s0: ref(q, k, v, g, beta, scale=scale, initial_state=s0, output_final_state=True)


def stand_in(name):
    """fla's chunk op ``name`` with its signature, computed by its naive reference (one document at
    a time when packed); every flag that changes the computation must arrive off."""
    ref = _recurrent(name)

    def op(q, k, v, *gates, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu=None, **flags):
        assert output_final_state and flags and not any(flags.values()), flags
        if cu_seqlens is None:
            return ref(q, k, v, *gates, scale, initial_state)
        assert q.shape[0] == 1 and torch.equal(cu_seqlens_cpu, cu_seqlens.cpu())
        outs = [ref(*(t[:, a:b] for t in (q, k, v, *gates)), scale, None if initial_state is None else initial_state[i:i + 1])
                for i, (a, b) in enumerate(itertools.pairwise(cu_seqlens.tolist()))]
        return torch.cat([o for o, _ in outs], 1), torch.cat([s for _, s in outs])
    return op


pytestmark = pytest.mark.usefixtures("fresh_verdicts")


CASES = [("chunk_simple_gla", "head"), ("chunk_simple_gla", None), ("chunk_gla", "channel"), ("chunk_delta_rule", None),
         ("chunk_gated_delta_rule", "head"), ("chunk_gated_delta_rule", None), ("chunk_kda", "channel")]
ADAPTERS = {"chunk_simple_gla": fla_ops.simple_gla, "chunk_gla": fla_ops.gla, "chunk_delta_rule": fla_ops.delta_rule,
            "chunk_gated_delta_rule": fla_ops.gated_delta_rule, "chunk_kda": fla_ops.kda}
DELTA = {"chunk_delta_rule", "chunk_gated_delta_rule", "chunk_kda"}


def arguments(name, gate, *, b=2, n=45, h=3, d=5, dv=4, seed=0):
    """q, k, v(, beta), g of the form ``name`` takes; D != Dv, so that a transposed state cannot pass."""
    gen = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=gen)

    q, k, v = r(b, h, n, d) * d ** -0.5, F.normalize(r(b, h, n, d), dim=-1), r(b, h, n, dv)
    g = None if gate is None else F.logsigmoid(r(b, h, n, *((d,) if gate == "channel" else ())) + 2.0)
    beta = 2.0 * torch.rand(b, h, n, dtype=torch.float64, generator=gen)
    return ((q, k, v, beta, g) if name in DELTA else (q, k, v, g)), r(b, h, d, dv)


@pytest.mark.parametrize("name,gate", CASES)
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_each_adapter_over_fla_naive_reference_equals_attnlab_own_chunk_form(name, gate, with_state, packed):
    args, s0 = arguments(name, gate, b=1 if packed else 2)
    cu = torch.tensor([0, 13, 45]) if packed else None
    state = s0.expand(2, *s0.shape[1:]) * torch.tensor([1.0, -0.5], dtype=torch.float64)[:, None, None, None] if with_state else None
    out, s = ADAPTERS[name](*args, state, cu, op=stand_in(name))
    own = recurrence.chunk_delta if name in DELTA else recurrence.chunk_gated
    ref, ref_s = own(*args, state=state, cu_seqlens=cu)
    assert out.shape == ref.shape and s.shape == ref_s.shape == (2, 3, 5, 4)
    assert_close_rel(out, ref, 1e-10, f"{name} output")
    assert_close_rel(s, ref_s, 1e-10, f"{name} final state")
    assert not with_state or (ref - own(*args, state=None, cu_seqlens=cu)[0]).abs().max() > 1e-2  # the state was read


def test_fla_chunk_delta_rule_has_no_decay():
    args, _ = arguments("chunk_gated_delta_rule", "head")
    with pytest.raises(ValueError, match="chunk_delta_rule has no decay"):
        fla_ops.delta_rule(*args, op=stand_in("chunk_delta_rule"))


def _gradients(kernel):
    return sum(isinstance(t, torch.Tensor) for t in kernel.sample("cpu", torch.float64, torch.Generator().manual_seed(0)))


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_each_kernel_passes_the_gate_check_with_fla_naive_reference_in_its_place(name, monkeypatch):
    """The Kernel as registered (its run: both of fla's paths, a batch of two and packed documents),
    fla's op replaced by its naive reference: forward and every gradient within float64's tolerance."""
    monkeypatch.setattr(fla_ops, "fla_op", stand_in)
    kernel = dataclasses.replace(fla_ops.KERNELS[f"fla.{name}"], devices=("cpu",))
    v = kernels.check(kernel, "cpu", torch.float64)
    assert v.forward and v.backward, v.line()
    assert sorted(e for e in v.errors if e.startswith("output")) == [f"output {i}" for i in range(4)]  # o and s, twice
    assert len([e for e in v.errors if e.startswith("gradient")]) == _gradients(kernel)
    assert max(v.errors.values()) <= kernels.TOLERANCE[torch.float64]


def _wrong(kind):
    good = stand_in("chunk_gated_delta_rule")

    def op(q, k, v, g, beta, *, scale, **kw):
        if kind == "unscaled":  # fla's default scale, K^-1/2, on a q attnlab already scaled
            return good(q, k, v, g, beta, scale=q.shape[-1] ** -0.5, **kw)
        if kind == "detached decay":  # the forward right, no gradient reaches g
            return good(q, k, v, g.detach(), beta, scale=scale, **kw)
        o, s = good(q, k, v, g, beta, scale=scale, **kw)
        return o, s.transpose(-1, -2)  # the state in fla's V-first layout
    return op


@pytest.mark.parametrize("kind", ["unscaled", "state transposed"])
def test_a_wrong_mapping_is_refused_by_the_check(kind, monkeypatch):
    monkeypatch.setattr(fla_ops, "fla_op", lambda name: _wrong(kind))
    kernel = dataclasses.replace(fla_ops.KERNELS["fla.chunk_gated_delta_rule"], devices=("cpu",))
    v = kernels.check(kernel, "cpu", torch.float64)
    assert not v.forward and not v.backward
    assert v.errors["output 0" if kind == "unscaled" else "output 1"] > 1e-2


def test_a_kernel_whose_gradient_is_wrong_serves_forward_only_and_warns_once(monkeypatch):
    monkeypatch.setattr(fla_ops, "fla_op", lambda name: _wrong("detached decay"))
    kernel = fla_ops.KERNELS["fla.chunk_gated_delta_rule"]
    if importlib.util.find_spec("triton") is None:  # without Triton the kernel is not available, not even to check
        assert not kernels.serves(dataclasses.replace(kernel, devices=("cpu",)), "cpu", torch.float64, backward=False)
    kernel = dataclasses.replace(kernel, devices=("cpu",), available=lambda device: None)
    assert kernels.serves(kernel, "cpu", torch.float64, backward=False)
    with pytest.warns(kernels.KernelFallbackWarning, match=r"fla.chunk_gated_delta_rule .* serves forward only"):
        assert not kernels.serves(kernel, "cpu", torch.float64, backward=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not kernels.serves(kernel, "cpu", torch.float64, backward=True)
    assert kernels.verdict(kernel, "cpu", torch.float64).errors["gradient 4"] == float("inf")  # g: no gradient came back


def test_on_a_cpu_the_dispatch_returns_none_without_asking_the_gate(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the gate was asked on a CPU")

    monkeypatch.setattr(kernels, "serves", refuse)
    (q, k, v, g), s0 = arguments("chunk_gla", "channel")
    (dq, dk, dv, beta, dg), _ = arguments("chunk_gated_delta_rule", "head")
    assert fla_ops.dispatch_gated(q, k, v, g, s0, None) is None
    assert fla_ops.dispatch_delta(dq, dk, dv, beta, dg, s0, None) is None
    assert recurrence.chunk_delta(dq, dk, dv, beta, dg, state=s0)[0].shape == dv.shape
    real = fla_ops.KERNELS["fla.chunk_gla"]
    assert real.devices == ("cuda",) and kernels.verdict(real, "cpu", torch.float32) is None


def test_pick_names_the_op_of_each_form():
    head, channel = torch.zeros(1, 2, 3), torch.zeros(1, 2, 3, 4)
    f32, bf16 = torch.float32, torch.bfloat16
    assert fla_ops.pick(False, head, f32) == fla_ops.pick(False, None, f32) == "fla.chunk_simple_gla"
    assert fla_ops.pick(False, channel, f32) == "fla.chunk_gla"
    assert fla_ops.pick(True, None, bf16) == "fla.chunk_delta_rule"  # fla's delta rule refuses float32
    assert fla_ops.pick(True, None, f32) == fla_ops.pick(True, head, bf16) == "fla.chunk_gated_delta_rule"
    assert fla_ops.pick(True, channel, f32) == "fla.chunk_kda"


SERVED = ["retnet", "mamba2", "gla", "deltanet", "gated_deltanet", "deltaproduct", "kda"]


@pytest.mark.parametrize("variant", SERVED)
def test_each_variant_reaches_a_kernel_that_names_it(variant, monkeypatch):
    """The layer's chunkwise calls (float32, as on a GPU) would go to the op whose Kernel lists it."""
    seen = []

    def spy(delta):
        def record(q, k, v, *rest):
            g = rest[-3]  # (beta,) g, state, cu_seqlens
            seen.append(fla_ops.pick(delta, g, q.dtype))
        return record

    monkeypatch.setattr(fla_ops, "dispatch_gated", spy(False))
    monkeypatch.setattr(fla_ops, "dispatch_delta", spy(True))
    monkeypatch.setattr(fla_ops, "SERVED_ON", ("cpu",))  # the forms ask for a kernel only on a device fla serves
    torch.manual_seed(0)
    layer = efficient.create(variant, embed_dim=32, num_heads=4, causal=True)
    layer(torch.randn(2, 20, 32))
    assert seen and all(variant in fla_ops.KERNELS[name].serves for name in seen), (variant, seen)
    assert {k.name for k in kernels.kernels_for(variant)} >= set(seen)


def test_the_kernels_are_registered_with_their_libraries_and_say_why_they_cannot_run():
    assert sorted(fla_ops.KERNELS) == sorted(f"fla.{n}" for n in ADAPTERS)
    assert sorted({v for k in fla_ops.KERNELS.values() for v in k.serves}) == sorted(SERVED)
    assert set(SERVED) <= set(efficient.names()) and "fox" not in {v for k in fla_ops.KERNELS.values() for v in k.serves}
    kernel = fla_ops.KERNELS["fla.chunk_kda"]
    assert set(kernel.versions()) == {"fla", "triton"} and kernel.versions()["fla"] == "0.6.0"
    if importlib.util.find_spec("triton") is None:  # this machine has no Triton: the reason names what is missing and the extra
        reason = kernel.available(torch.device("cuda"))
        assert reason is not None and "attnlab[fla]" in reason


@pytest.mark.slow
def test_importing_attnlab_on_a_cpu_imports_neither_fla_nor_triton():
    """A fresh interpreter: import attnlab, run both chunkwise forms and a masked attend on the CPU;
    no fla, no triton, and not torch's compiler stack (torch._dynamo, FlexAttention's module: a
    second of every child process's start) in sys.modules."""
    code = ("import sys, torch, attnlab, attnlab.efficient; from attnlab.efficient import recurrence;"
            " q = torch.randn(1, 2, 9, 4); g = -torch.rand(1, 2, 9);"
            " recurrence.chunk_gated(q, q, q, g); recurrence.chunk_delta(q, q, q, torch.rand(1, 2, 9), g);"
            " attnlab.attend(q, q, q, mask=attnlab.masks.window(2));"
            " print(sorted(m for m in sys.modules if m.split('.')[0] in ('fla', 'triton') or m in ('torch._dynamo',"
            " 'torch.nn.attention.flex_attention')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


@pytest.mark.parametrize("right", [True, False])
def test_chunk_delta_is_served_by_a_passing_kernel_and_falls_back_from_a_failing_one_with_one_warning(right, monkeypatch):
    """End to end through :func:`recurrence.chunk_delta`, the dispatch let onto the CPU: a kernel that
    matches attnlab's form computes the call; one that does not is refused, warns once, and the
    call is attnlab's own form, bit for bit."""
    (q, k, v, beta, g), s0 = arguments("chunk_gated_delta_rule", "head")
    q, k, v, beta, g, s0 = (t.float() for t in (q, k, v, beta, g, s0))
    own, own_s = recurrence.chunk_delta(q, k, v, beta, g, state=s0)  # on a CPU: never dispatched
    op = stand_in("chunk_gated_delta_rule") if right else _wrong("unscaled")
    calls = []
    monkeypatch.setattr(fla_ops, "fla_op", lambda name: lambda *a, **kw: (calls.append(name), op(*a, **kw))[1])
    name = "fla.chunk_gated_delta_rule"
    monkeypatch.setitem(fla_ops.KERNELS, name, dataclasses.replace(fla_ops.KERNELS[name], devices=("cpu",), available=lambda d: None))
    monkeypatch.setattr(fla_ops, "SERVED_ON", ("cpu",))
    if right:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out, s = recurrence.chunk_delta(q, k, v, beta, g, state=s0)
        checked = len(calls)
        out, s = recurrence.chunk_delta(q, k, v, beta, g, state=s0)
        assert len(calls) == checked + 1  # the call itself went to the kernel
        assert_close_rel(out, own, 1e-4, "served output")
        assert_close_rel(s, own_s, 1e-4, "served state")
    else:
        with pytest.warns(kernels.KernelFallbackWarning, match=r"fla.chunk_gated_delta_rule on cpu .*: refused: largest difference"):
            out, s = recurrence.chunk_delta(q, k, v, beta, g, state=s0)
        checked = len(calls)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per process
            out, s = recurrence.chunk_delta(q, k, v, beta, g, state=s0)
        assert len(calls) == checked  # refused: never called again
        assert torch.equal(out, own) and torch.equal(s, own_s)
