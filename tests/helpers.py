"""Test helpers: the tolerance rule of the issues and seeded inputs."""

import torch


def assert_close_rel(actual: torch.Tensor, ref: torch.Tensor, tol: float, what: str = "", floor: float = 1e-7) -> None:
    """max |actual - ref| <= tol * max |ref| (+ ``floor``): the error relative to the reference's
    magnitude. The absolute ``floor`` (fp32's round-off on the unit-scale inputs of these tests)
    only matters where the true value is 0, e.g. a cosine score's gradient in one dimension."""
    assert actual.shape == ref.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(ref.shape)}"
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    err = (actual.double() - ref.double()).abs().max().item() if ref.numel() else 0.0
    scale = ref.double().abs().max().item() if ref.numel() else 0.0
    assert err <= tol * scale + floor, f"{what}: max error {err:.3g} > {tol} x reference magnitude {scale:.3g}"


def randn(*shape, gen=None, dtype=torch.float32, requires_grad=False):
    t = torch.randn(*shape, generator=gen, dtype=dtype)
    return t.requires_grad_(requires_grad)
