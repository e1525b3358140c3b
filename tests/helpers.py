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


def assert_every_form_equals(layer, x: torch.Tensor, want: torch.Tensor, modes, tol: float = 1e-10) -> tuple:
    """The layer's output on ``x`` in each of ``modes`` (its ``mode`` attribute) and the gradient
    of every parameter equal ``want``'s, a reference computed from the same parameters; returns the
    reference's gradients (None for a parameter it does not reach)."""
    params = dict(layer.named_parameters())
    want_grads = torch.autograd.grad(want.square().sum(), list(params.values()), allow_unused=True)
    for mode in modes:
        layer.mode = mode
        out = layer(x).output
        assert_close_rel(out, want, tol, f"{mode} output")
        grads = torch.autograd.grad(out.square().sum(), list(params.values()))
        for (name, _), g, r in zip(params.items(), grads, want_grads):
            assert_close_rel(g, r, tol, f"{mode} gradient of {name}")
    return want_grads


def randn(*shape, gen=None, dtype=torch.float32, requires_grad=False):
    t = torch.randn(*shape, generator=gen, dtype=dtype)
    return t.requires_grad_(requires_grad)


def random_graph(n=20, e=70, edge_dim=5, seed=0, unique=False):
    """A random graph: node features (n, 8) float64, edge_index (2, e), edge features (e, edge_dim)."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    if unique:
        ei = torch.unique(ei, dim=1)
    x = torch.randn(n, 8, generator=g, dtype=torch.float64)
    ea = torch.randn(ei.shape[1], edge_dim, generator=g, dtype=torch.float64)
    return x, ei, ea
