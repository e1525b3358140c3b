"""Comba (efficient/comba.py), a mixer in one file: its layer computes what fla's reference
recurrence of Comba computes from the layer's parts (q, k, v, the read key p, beta, the decay),
decodes token by token as it computes the whole sequence, and is created, listed and refused as
every mixer."""

import pytest
import torch
import torch.nn.functional as F

from attnlab import efficient, masks
from tests.efficient.test_gated import fla_naive

E, H = 16, 2
D = E // H


def build(**options):
    torch.manual_seed(0)
    m = efficient.create("comba", embed_dim=E, num_heads=H, **options).double()
    with torch.no_grad():  # away from their initial values, so that a wrong use of either shows
        m.inner_decay.copy_(torch.tensor([0.3, -1.2]))
        m.correction.copy_(torch.tensor([0.5, 1.7]))
    return m


def parts(m, x):
    """q, k, v ``(B, N, H, D)`` after the short convolution (SiLU) and the features, the read key p,
    beta and the log decay ``(B, N, H)``, from the layer's parameters and the paper's equations."""
    b, n, _ = x.shape
    qkv = torch.cat([m.q_proj(x), m.k_proj(x), m.v_proj(x)], -1).transpose(1, 2)  # (B, 3E, N)
    w = m.conv.weight  # (3E, 1, K): depthwise, causal
    qkv = F.silu(F.conv1d(F.pad(qkv, (w.shape[-1] - 1, 0)), w, groups=qkv.shape[1])).transpose(1, 2)
    q, k, v = (t.reshape(b, n, H, D) for t in qkv.split(E, -1))
    p = k * torch.sigmoid(m.inner_decay)[:, None]
    q = F.normalize(q - m.correction[:, None] * p, dim=-1)
    k, p = F.normalize(k, dim=-1), F.normalize(p, dim=-1)
    beta = torch.sigmoid(m.beta_proj(x))
    g = -m.log_rate.exp() * F.softplus(m.decay_proj(x) + m.time_bias)
    return q, k, v, p, beta, g


@pytest.mark.parametrize("mode", ["chunk", "parallel", "recurrent"])
def test_it_computes_what_flas_reference_recurrence_of_comba_computes(mode):
    naive = fla_naive("comba")
    m = build(causal=True, mode=mode, chunk=4)
    x = torch.randn(2, 11, E, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    q, k, v, p, beta, g = parts(m, x)
    o, _ = naive.naive_recurrent_comba(q, k, v, p, beta, g, scale=D**-0.5)  # (B, N, H, D)
    b, n = x.shape[:2]
    gate = torch.sigmoid(m.gate_proj(x)).view(b, n, H, D).transpose(1, 2)
    want = m.out_proj((m.out_norm(o.transpose(1, 2), x) * gate).transpose(1, 2).reshape(b, n, E))
    assert (m(x).output - want).abs().max() < 1e-12


def test_the_corrected_query_is_what_sets_it_apart_from_gated_deltanet():
    m = build(causal=True)
    x = torch.randn(1, 9, E, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    before = m(x).output
    with torch.no_grad():
        m.correction.zero_()
    without = m(x).output
    assert (without - before).abs().max() > 1e-3  # d_h reaches the output
    with torch.no_grad():
        m.inner_decay.fill_(5.0)  # p's positive scale is normalised away: no change with d = 0
    assert (m(x).output - without).abs().max() < 1e-12


def test_decoding_token_by_token_equals_the_whole_sequence_and_padding_is_silent():
    m = build(causal=True)
    x = torch.randn(2, 10, E, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    whole = m(x).output
    cache = m.new_cache()
    steps = torch.cat([m(x[:, i : i + 1], cache=cache).output for i in range(10)], 1)
    assert (steps - whole).abs().max() < 1e-12 and cache.seen == 10
    padded = m(x, mask=masks.padding([10, 6])).output
    assert (padded[1, :6] - m(x[1:, :6]).output[0]).abs().max() < 1e-12


def test_it_is_a_mixer_of_the_gated_family_and_refuses_what_mixers_refuse():
    caps = efficient.capabilities("comba")
    assert caps.mixer and caps.family == "gated" and caps.cache == "matrix"
    assert "comba" in efficient.select(mixer=True, decodes=True)
    with pytest.raises(ValueError, match="is a sequence mixer"):
        efficient.step("comba", embed_dim=E, num_heads=H)
    with pytest.raises(ValueError, match="is self-attention"):
        build()(torch.randn(1, 3, E, dtype=torch.float64), key=torch.randn(1, 3, E, dtype=torch.float64))
