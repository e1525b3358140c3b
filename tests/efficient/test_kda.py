"""Kimi Delta Attention (``kda``): the layer in each of its three forms equals its equations
written as a float64 loop over its own parameters (outputs and every parameter's gradient, causal
and bidirectional), decoding with its cache equals the whole sequence, padding and packed
documents, agreement with transformers' ``KimiLinearDeltaAttention`` at the same weights, its
place in the variant lists, and what it refuses."""

import pytest
import torch
import torch.nn.functional as F

from attnlab import efficient, masks
from attnlab.efficient import KimiDeltaAttention
from attnlab.efficient.gated import MODES
from tests.helpers import assert_close_rel, assert_every_form_equals

E, H = 32, 4
D = E // H


def kda(causal=True, seed=0, **options) -> KimiDeltaAttention:
    """A float64 kda layer whose every parameter is away from its initialisation (the decay varies
    across channels, the biases and norm weight are not 0 and 1)."""
    torch.manual_seed(seed)
    m = efficient.create("kda", embed_dim=E, num_heads=H, causal=causal, **options).double()
    with torch.no_grad():
        m.time_bias.normal_(-1.0, 1.0)
        m.decay_up.weight.normal_(0.0, 0.5)
        m.out_norm.norm.weight.normal_(1.0, 0.3)
        for lin in (m.q_proj, m.k_proj, m.v_proj, m.out_proj):
            if lin.bias is not None:
                lin.bias.normal_(0.0, 0.3)
    assert isinstance(m, KimiDeltaAttention)  # the mixer itself
    return m


def scan(m: KimiDeltaAttention, x: torch.Tensor, proj: torch.Tensor) -> torch.Tensor:
    """One causal scan of KDA's equations, token by token: the short convolution and SiLU on the
    projections ``proj`` ``(B, N, 3E)``, L2-normalised q and k, q scaled by ``D^-1/2``, the decay
    ``exp(g_t)`` per head and channel, ``beta_t``, ``S_t = diag(e^g_t) S (I-part) + beta k (v - S^T k)^T``
    and ``o_t = S_t^T q_t``. Returns ``(B, H, N, D)``."""
    b, n, _ = x.shape
    conv = F.silu(F.conv1d(F.pad(proj.transpose(1, 2), (m.conv_size - 1, 0)), m.conv.weight, groups=3 * E)).transpose(1, 2)
    q, k, v = (t.view(b, n, H, D) for t in conv.split(E, -1))
    q, k = F.normalize(q, dim=-1) * D**-0.5, F.normalize(k, dim=-1)
    g = -m.log_rate.exp()[:, None] * F.softplus(m.decay_up(m.decay_down(x)) + m.time_bias).view(b, n, H, D)
    beta = torch.sigmoid(m.beta_proj(x))  # (B, N, H)
    s = torch.zeros(b, H, D, D, dtype=x.dtype)
    outs = []
    for t in range(n):
        s = g[:, t, :, :, None].exp() * s  # each key channel's row of the state decays at its own rate
        kt = k[:, t]
        correction = v[:, t] - torch.einsum("bhd,bhde->bhe", kt, s)  # v_t - S^T k_t
        s = s + beta[:, t, :, None, None] * kt[..., None] * correction[:, :, None, :]
        outs.append(torch.einsum("bhd,bhde->bhe", q[:, t], s))
    return torch.stack(outs, 2)


def reference(m: KimiDeltaAttention, x: torch.Tensor) -> torch.Tensor:
    """The whole layer by hand: both scans when bidirectional (the reverse one over the flipped
    sequence), then the per-head RMSNorm, the low-rank sigmoid output gate and ``W^o``."""
    b, n, _ = x.shape
    proj = torch.cat([m.q_proj(x), m.k_proj(x), m.v_proj(x)], -1)
    o = scan(m, x, proj)
    if not m.causal:
        o = o + scan(m, x.flip(1), proj.flip(1)).flip(2)
    o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + 1e-5) * m.out_norm.norm.weight
    gate = torch.sigmoid(m.out_gate_up(m.out_gate_down(x))).view(b, n, H, D).transpose(1, 2)
    return m.out_proj((o * gate).transpose(1, 2).reshape(b, n, E))


@pytest.mark.parametrize("causal", [True, False])
def test_the_layer_in_each_form_equals_its_equations_as_a_loop_with_every_gradient(causal):
    m = kda(causal=causal, chunk=8)
    x = torch.randn(2, 29, E, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    want_grads = assert_every_form_equals(m, x, reference(m, x), MODES)
    assert all(g is not None for g in want_grads)  # the loop reaches every parameter


def test_the_decay_is_one_per_head_and_key_channel():
    m = kda()
    x = torch.randn(2, 5, E, dtype=torch.float64)
    g, beta = m.gates(x)
    assert g.shape == (2, H, 5, D) and beta.shape == (2, H, 5)
    assert (g < 0).all() and (g.std(-1) > 1e-3).all()  # a decay, and not one value repeated over the channels


def test_gradients_flow_to_the_gate_parameters():
    m = kda().float()
    x = torch.randn(2, 40, E)
    m(x).output.square().sum().backward()
    for name in ("decay_down.weight", "decay_up.weight", "log_rate", "time_bias", "beta_proj.weight", "out_gate_down.weight",
                 "out_gate_up.weight"):
        grad = m.get_parameter(name).grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().max() > 0, name


def test_decoding_with_the_cache_token_by_token_equals_the_whole_sequence():
    m = kda(positional="rope")
    x = torch.randn(2, 60, E, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    full = m(x).output
    cache = m.new_cache()
    outs = [m(x[:, :11], cache=cache).output]  # a prefill (chunkwise), then one token at a time
    sizes = set()
    for t in range(11, 60):
        outs.append(m(x[:, t : t + 1], cache=cache).output)
        sizes.add(cache.nbytes())
    assert_close_rel(torch.cat(outs, 1), full, 1e-10, "decoded")
    assert cache.seen == 60 and sizes == {2 * H * D * D * 8 + 2 * (m.conv_size - 1) * 3 * E * 8}  # constant: state and conv
    cache.reset()
    steps = torch.cat([m(x[:, t : t + 1], cache=cache).output for t in range(60)], 1)  # from the first token
    assert_close_rel(steps, full, 1e-10, "decoded from empty")


def test_key_padding_and_packed_documents():
    m = kda()
    x = torch.randn(1, 10, E, dtype=torch.float64)
    padded = torch.cat([x, torch.full((1, 3, E), float("nan"), dtype=torch.float64)], 1)
    flags = torch.tensor([[True] * 10 + [False] * 3])
    for mode in MODES:
        m.mode = mode
        assert_close_rel(m(padded, mask=flags).output[:, :10], m(x).output, 1e-10, f"padding ({mode})")
    packed = m(x, mask=masks.Documents([[4, 6]], causal=True)).output
    assert_close_rel(packed, torch.cat([m(x[:, :4]).output, m(x[:, 4:]).output], 1), 1e-12, "documents")


def test_it_computes_what_transformers_kimi_linear_delta_attention_computes():
    """The same weights in transformers' layer: its recurrence runs in float32 and its L2 norm adds
    1e-6 under the square root, so agreement is to float32 precision."""
    mk = pytest.importorskip("transformers.models.kimi_linear.modeling_kimi_linear")
    from transformers.models.kimi_linear.configuration_kimi_linear import KimiLinearConfig

    cfg = KimiLinearConfig(hidden_size=E, num_hidden_layers=1, layer_types=["linear_attention"],
                           linear_attn_config={"head_dim": D, "num_heads": H, "short_conv_kernel_size": 4})
    ref = mk.KimiLinearDeltaAttention(cfg, 0).double()
    m = kda(bias=False)
    with torch.no_grad():
        ref.forget_gate.A_log.copy_(m.log_rate.view(1, 1, H, 1))
        ref.forget_gate.dt_bias.copy_(m.time_bias)
        for theirs, ours in [(ref.q_proj, m.q_proj), (ref.k_proj, m.k_proj), (ref.v_proj, m.v_proj), (ref.o_proj, m.out_proj),
                             (ref.conv1d, m.conv), (ref.forget_gate.f_a_proj, m.decay_down), (ref.forget_gate.f_b_proj, m.decay_up),
                             (ref.b_proj, m.beta_proj), (ref.g_a_proj, m.out_gate_down), (ref.g_b_proj, m.out_gate_up),
                             (ref.o_norm, m.out_norm.norm)]:
            theirs.weight.copy_(ours.weight)
    x = torch.randn(2, 70, E, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert_close_rel(m(x).output, ref(x), 1e-4, "transformers")


def test_it_is_listed_with_the_gated_family_and_studied_by_bench_recall():
    from attnlab.studies.recall import default_variants

    assert efficient.capabilities("kda") == efficient.capabilities("gated_deltanet")
    assert "kda" in efficient.select(family="gated", decodes=True, mixer=True)
    assert "kda" in default_variants()
    assert efficient.VARIANTS.in_order().index("kda") == efficient.VARIANTS.in_order().index("gated_deltanet") + 1


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="gate_rank must be a positive int"):
        kda(gate_rank=0)
    m = kda()
    x = torch.randn(1, 5, E, dtype=torch.float64)
    with pytest.raises(ValueError, match="self-attention: pass neither key nor value"):
        m(x, x, x)
    with pytest.raises(ValueError, match="key-padding masks only"):
        m(x, mask=masks.window(2))
    with pytest.raises(ValueError, match="never builds the N x M weights"):
        m(x, return_weights=True)
    with pytest.raises(ValueError, match="query"):
        m(torch.randn(1, 5, E + 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="cached decoding needs a causal"):
        kda(causal=False).new_cache()
    with pytest.raises(ValueError, match="is a sequence mixer.*create the layer"):  # no step to call on heads alone
        efficient.step("kda", embed_dim=E, num_heads=H)
