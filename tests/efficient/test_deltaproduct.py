"""Gated DeltaProduct against its equations written as a float64 loop (outputs and every
gradient, in its three forms, causal and bidirectional), against fla's reference recurrence
``naive_recurrent_gated_delta_product``, and with padding and packed documents."""

import pytest
import torch
import torch.nn.functional as F

from attnlab import efficient, masks
from tests.efficient.test_gated import fla_naive
from tests.helpers import assert_every_form_equals

E, H = 24, 3
D = E // H


def build(n_h=2, **options):
    torch.manual_seed(0)
    m = efficient.create("deltaproduct", embed_dim=E, num_heads=H, num_householder=n_h, chunk=4, **options).double()
    with torch.no_grad():  # away from the initial values, so that every parameter matters
        for p in m.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return m


def parts(m, x):
    """q ``(B, N, H, D)`` (features, scaled), the keys and values of every step ``(B, N, n_h, H, D)``,
    beta ``(B, N, n_h, H)`` and the log decay ``(B, N, H)``, from the layer's parameters."""
    b, n, _ = x.shape
    n_h = m.num_householder
    heads = lambda t: t.view(b, n, -1, H, D)  # noqa: E731
    k = torch.cat([heads(m.k_proj(x))] + ([heads(m.extra_keys(x))] if n_h > 1 else []), 2)
    v = torch.cat([heads(m.v_proj(x))] + ([heads(m.extra_values(x))] if n_h > 1 else []), 2)
    q = F.normalize(F.silu(m.q_proj(x).view(b, n, H, D)), dim=-1) * D**-0.5
    k = F.normalize(F.silu(k), dim=-1)
    beta = 2 * torch.sigmoid(m.beta_proj(x)).view(b, n, n_h, H)
    g = -m.log_rate.exp() * F.softplus(m.decay_proj(x) + m.time_bias)
    return q, k, v, beta, g


def scan(q, k, v, beta, g):
    """The paper's recurrence, token by token and step by step: ``S <- alpha_t S``, then for each
    step ``S <- S + beta k (v - S^T k)^T``, then ``o_t = S^T q_t``. Returns ``(B, H, N, D)``."""
    b, n = q.shape[:2]
    s = q.new_zeros(b, H, D, D)
    out = []
    for t in range(n):
        s = s * g[:, t].exp()[..., None, None]
        for j in range(k.shape[2]):
            kj, vj = k[:, t, j], v[:, t, j]  # (B, H, D)
            s = s + beta[:, t, j][..., None, None] * kj[..., :, None] * (vj - torch.einsum("bhkv,bhk->bhv", s, kj))[..., None, :]
        out.append(torch.einsum("bhkv,bhk->bhv", s, q[:, t]))
    return torch.stack(out, 2)


def reference(m, x, causal):
    q, k, v, beta, g = parts(m, x)
    o = scan(q, k, v, beta, g)
    if not causal:  # the same recurrence from the last token to the first, added before the norm
        o = o + scan(*(t.flip(1) for t in (q, k, v, beta, g))).flip(2)
    o = m.out_norm(o, x)
    return m.out_proj(o.transpose(1, 2).reshape(x.shape[0], x.shape[1], E))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n_h", [1, 2, 3])
def test_every_form_equals_the_equations_as_a_loop_with_every_gradient(causal, n_h):
    m = build(n_h, causal=causal)
    x = torch.randn(2, 11, E, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    want = reference(m, x, causal)
    grads = assert_every_form_equals(m, x, want, ("recurrent", "parallel", "chunk"))
    named = dict(zip(dict(m.named_parameters()), grads))
    for name in ("beta_proj.weight", "decay_proj.weight", "log_rate", "out_norm.gate.weight",
                 *(("extra_keys.weight", "extra_values.weight") if n_h > 1 else ())):
        assert named[name].abs().max() > 1e-6, name  # every parameter reaches the output


def test_it_computes_what_flas_reference_recurrence_computes():
    naive = fla_naive("gated_delta_product")
    m = build(3, causal=True)
    x = torch.randn(2, 9, E, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    q, k, v, beta, g = parts(m, x)
    b, n = x.shape[:2]
    o, _ = naive.naive_recurrent_gated_delta_product(q, k.reshape(b, n * 3, H, D), v.reshape(b, n * 3, H, D), g,
                                                     beta.reshape(b, n * 3, H), scale=1.0, num_householder=3)
    want = m.out_proj(m.out_norm(o.transpose(1, 2), x).transpose(1, 2).reshape(b, n, E))
    got = m(x).output
    assert (got - want).abs().max() < 1e-12


def test_negative_eigenvalues_are_reachable():
    """``beta`` in (0, 2): a step's transition ``I - beta k k^T`` (k of unit norm) has the
    eigenvalue ``1 - beta`` along k, below zero where beta > 1, as the paper needs."""
    m = build(2, causal=True)
    x = 3 * torch.randn(1, 64, E, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    beta = parts(m, x)[3]
    assert beta.min() > 0 and beta.max() < 2 and (beta > 1).any() and (beta < 1).any()


def test_padding_and_packed_documents_are_each_alone():
    m = build(2, causal=True, positional="rope")
    x = torch.randn(2, 12, E, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    padded = m(x, mask=masks.padding([12, 7])).output
    assert (padded[1, :7] - m(x[1:, :7]).output[0]).abs().max() < 1e-12
    rows = [[5, 7], [4, 3]]
    out = m(x, mask=masks.Documents(rows, causal=True)).output
    for r, row in enumerate(rows):
        start = 0
        for length in row:
            assert (out[r, start : start + length] - m(x[r : r + 1, start : start + length]).output[0]).abs().max() < 1e-12
            start += length


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="num_householder must be a positive int"):
        build(0)
    with pytest.raises(ValueError, match="mode must be one of"):
        build(2).mode = "fast"
