"""The checked-kernel gate: a kernel serves only after it matched attnlab's own form here."""

import dataclasses
import json
import warnings

import pytest
import torch

from attnlab.core import kernels as K


def _own(q, k, v):
    return ((q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5).softmax(-1) @ v


def _sample(device, dtype, gen):
    return [torch.randn(2, 3, 16, 8, generator=gen).to(device, dtype) for _ in range(3)]


def _kernel(name, run, **kw):
    return K.Kernel(name, ("test_variant",), run, _own, _sample, devices=("cpu",), **kw)


@pytest.fixture(autouse=True)
def _fresh(fresh_verdicts):
    yield
    for name in [k.name for k in K.kernels() if k.name.startswith("test.")]:
        K.unregister(name)


def test_a_right_kernel_serves_and_its_verdict_is_kept_on_disk(tmp_path):
    sdpa = K.register(_kernel("test.sdpa", lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning
        assert K.serves(sdpa, "cpu", torch.float32, backward=True)
    stored = json.loads((tmp_path / "kernels.json").read_text())
    (key, v), = stored.items()
    assert key.startswith("test.sdpa|cpu") and "torch=" + torch.__version__ in key
    assert v["forward"] and v["backward"] and set(v["errors"]) == {"output 0", "gradient 0", "gradient 1", "gradient 2"}
    assert max(v["errors"].values()) < 1e-5  # float32 against float64
    assert K.kernels_for("test_variant") == [sdpa]


def test_a_wrong_kernel_is_refused_falls_back_and_warns_once(tmp_path):
    wrong = K.register(_kernel("test.wrong", lambda q, k, v: _own(q, k, v) * 1.01))  # 1 % off: over float32's tolerance
    with pytest.warns(K.KernelFallbackWarning, match=r"test.wrong on cpu .* in float32 \(torch .*\): refused: largest difference 1.0"):
        assert not K.serves(wrong, "cpu", torch.float32, backward=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        assert not K.serves(wrong, "cpu", torch.float32, backward=False)
    # bfloat16's tolerance (8 bits) takes a 1 % difference
    assert K.serves(wrong, "cpu", torch.bfloat16, backward=True)


def test_the_verdict_on_disk_is_read_not_checked_again(monkeypatch):
    calls = []
    good = K.register(_kernel("test.counted", lambda q, k, v: (calls.append(1), _own(q, k, v))[1]))
    assert K.serves(good, "cpu", torch.float32, backward=True)
    assert len(calls) == 1
    K.forget()  # a new process: memory gone, the file kept
    monkeypatch.setattr(K, "check", lambda *a: pytest.fail("checked again"))
    assert K.serves(good, "cpu", torch.float32, backward=True)
    assert len(calls) == 1


def test_a_kernel_whose_backward_raises_serves_forward_only():
    class NoBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            return _own(q, k, v)

        @staticmethod
        def backward(ctx, g):
            raise NotImplementedError("this GPU's backward is refused")

    fwd = K.register(_kernel("test.fwd_only", NoBackward.apply))
    v = K.verdict(fwd, "cpu", torch.float32)
    assert v.forward and not v.backward and "NotImplementedError: this GPU's backward is refused" in v.reason
    assert K.serves(fwd, "cpu", torch.float32, backward=False)
    with pytest.warns(K.KernelFallbackWarning, match="serves forward only"):
        assert not K.serves(fwd, "cpu", torch.float32, backward=True)


def test_a_kernel_whose_forward_raises_or_that_cannot_run_here_does_not_serve():
    def broken(q, k, v):
        raise RuntimeError("Triton: unsupported")

    bad = K.register(_kernel("test.raises", broken))
    with pytest.warns(K.KernelFallbackWarning, match="the forward raised RuntimeError: Triton: unsupported"):
        assert not K.serves(bad, "cpu", torch.float32, backward=False)
    elsewhere = K.register(dataclasses.replace(bad, name="test.cuda_only", devices=("cuda",)))
    assert K.verdict(elsewhere, "cpu", torch.float32) is None and not K.serves(elsewhere, "cpu", torch.float32, backward=False)
    missing = K.register(dataclasses.replace(bad, name="test.missing", available=lambda d: "fla is not installed"))
    assert K.verdict(missing, "cpu", torch.float32) is None


def test_a_damaged_verdict_file_is_checked_again(tmp_path):
    (tmp_path / "kernels.json").write_text("{not json")
    good = K.register(_kernel("test.again", _own))
    assert K.serves(good, "cpu", torch.float64, backward=True)
    assert any(k.startswith("test.again|") for k in json.loads((tmp_path / "kernels.json").read_text()))


def test_needs_grad_follows_grad_mode_and_inputs():
    x = torch.ones(2, requires_grad=True)
    assert K.needs_grad(x) and not K.needs_grad(torch.ones(2))
    with torch.no_grad():
        assert not K.needs_grad(x)
