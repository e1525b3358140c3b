"""``dense_naive``: the same attention as ``dense`` (every score, normaliser, mask, bias, the
weights), but with the N x N weights materialised and kept for backward: memory grows as N^2."""

import pytest
import torch

from attnlab import efficient, masks
from attnlab.profiling import peak_bytes

E, H = 16, 4


def pair(**options):
    torch.manual_seed(0)
    dense = efficient.create("dense", embed_dim=E, num_heads=H, **options).double()
    naive = efficient.create("dense_naive", embed_dim=E, num_heads=H, **options).double()
    naive.load_state_dict(dense.state_dict())
    return dense, naive


@pytest.mark.parametrize("options", [{}, {"score": "cosine", "normalize": "relu"}, {"positional": "alibi"}, {"positional": "rope"}])
def test_naive_equals_dense_with_gradients_masks_and_weights(options):
    dense, naive = pair(**options)
    n = 11
    mask = masks.and_masks(masks.padding(torch.tensor([n, 6])).dense(n, n), masks.causal().dense(n))
    x = torch.randn(2, n, E, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    outs = []
    for m in (dense, naive):
        xi = x.clone().requires_grad_(True)
        res = m(xi, mask=mask, return_weights=True)
        (g,) = torch.autograd.grad(res.output.square().sum(), [xi])
        outs.append((res.output, res.weights, g))
    for a, b in zip(*outs):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert naive(x, mask=mask).weights is None  # weights only when asked, as everywhere


def test_naive_holds_the_n_by_n_weights_and_dense_does_not():
    dense, naive = pair()
    dense, naive = dense.float(), naive.float()
    n = 1024
    x = torch.randn(1, n, E, requires_grad=True)
    matrix = H * n * n * 4  # one layer's (H, N, N) float32 weights

    def step(m):
        return lambda: m(x).output.sum().backward()

    assert peak_bytes(step(naive)) > 2 * matrix  # scores and weights, both kept by autograd
    assert peak_bytes(step(dense)) < matrix / 4  # the fused kernel never holds them


def test_an_encoder_with_dense_naive_equals_dense_causal_and_with_score_options():
    from attnlab.models import Encoder

    for options in ({"causal": True, "positional": "alibi"}, {"score": "cosine", "normalize": "sigmoid"}):
        torch.manual_seed(0)
        dense = Encoder(E, H, 2, attention="dense", **options).double().eval()
        naive = Encoder(E, H, 2, attention="dense_naive", **options).double().eval()
        naive.load_state_dict(dense.state_dict())
        x = torch.randn(2, 9, E, dtype=torch.float64)
        pad = masks.padding(torch.tensor([9, 5])).dense(9, 9)
        torch.testing.assert_close(naive(x, mask=pad).output, dense(x, mask=pad).output, rtol=1e-12, atol=1e-12)
