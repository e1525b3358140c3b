"""Test helpers: the tolerance rule of the issues and seeded inputs."""

import torch


def assert_close_rel(actual: torch.Tensor, ref: torch.Tensor, tol: float, what: str = "") -> None:
    """max |actual - ref| <= tol * max |ref|: the error relative to the reference's magnitude."""
    assert actual.shape == ref.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    err = (actual.double() - ref.double()).abs().max().item() if ref.numel() else 0.0
    scale = ref.double().abs().max().item() if ref.numel() else 0.0
    assert err <= tol * scale or err == 0.0, f"{what}: max error {err:.3g} > {tol} x reference magnitude {scale:.3g}"


def randn(*shape, gen=None, dtype=torch.float32, requires_grad=False):
    t = torch.randn(*shape, generator=gen, dtype=dtype)
    return t.requires_grad_(requires_grad)
