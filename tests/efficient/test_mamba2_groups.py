"""Mamba-2 with B and C shared by groups of heads (``ngroups``) and a state width other than the head
width (``state_size``): the layer in each of its forms equals the SSD recurrence written as a
float64 loop over its own parameters (outputs and every gradient), one group per head of the head
width is the default layer, decoding with the cache equals the whole sequence, padding and packed
documents, and what is refused."""

import pytest
import torch
import torch.nn.functional as F

from attnlab import efficient, masks
from attnlab.efficient import Mamba2Attention
from attnlab.efficient.gated import MODES
from attnlab.layers.mixer import Tokens
from tests.helpers import assert_close_rel, assert_every_form_equals

E, H = 32, 4
D = E // H


def mamba2(causal=True, seed=0, **options) -> Mamba2Attention:
    """A float64 mamba2 layer (default: 2 groups of B and C of width 6, heads of width 8) with its
    biases, skip and norm weight away from their initialisation."""
    torch.manual_seed(seed)
    options = {"ngroups": 2, "state_size": 6, **options}
    m = efficient.create("mamba2", embed_dim=E, num_heads=H, causal=causal, **options).double()
    with torch.no_grad():
        for lin in (m.q_proj, m.k_proj, m.v_proj, m.out_proj):
            lin.bias.normal_(0.0, 0.3)
        m.skip.normal_(1.0, 0.5)
        m.out_norm.norm.weight.normal_(1.0, 0.3)
        m.dt_bias.normal_(-1.0, 0.5)
    assert isinstance(m, Mamba2Attention)  # the mixer itself
    return m


def scan(m: Mamba2Attention, x: torch.Tensor, proj: torch.Tensor) -> torch.Tensor:
    """One causal scan of the SSD layer, token by token: the short convolution and SiLU over C, B
    (``G x S`` each) and x (``H x D``), head ``h`` reading group ``h // (H / G)``, ``h_t =
    exp(dt_t A_h) h_{t-1} + dt_t B_t x_t^T`` (an ``S x D`` state per head), ``h_t^T C_t``. Returns
    that and x, ``(B, H, N, D)`` each."""
    b, n, _ = x.shape
    g, s = m.ngroups, m.state_size
    conv = F.silu(F.conv1d(F.pad(proj.transpose(1, 2), (m.conv_size - 1, 0)), m.conv.weight, groups=proj.shape[-1])).transpose(1, 2)
    c, bk, xv = conv.split([g * s, g * s, E], -1)
    c, bk, xv = c.view(b, n, g, s), bk.view(b, n, g, s), xv.view(b, n, H, D)
    group = [h // (H // g) for h in range(H)]
    dt = F.softplus(m.dt_proj(x) + m.dt_bias)  # (B, N, H)
    a = -m.log_rate.exp()
    state = torch.zeros(b, H, s, D, dtype=x.dtype)
    ys = []
    for t in range(n):
        ct, bt = c[:, t, group], bk[:, t, group]  # (B, H, S): each head's group
        state = (torch.exp(dt[:, t] * a)[:, :, None, None] * state
                 + dt[:, t, :, None, None] * bt[..., None] * xv[:, t, :, None, :])
        ys.append(torch.einsum("bhs,bhsd->bhd", ct, state))
    return torch.stack(ys, 2), xv.transpose(1, 2)


def reference(m: Mamba2Attention, x: torch.Tensor) -> torch.Tensor:
    """The layer by hand: both scans when bidirectional (the reverse one over the flipped sequence;
    the skip ``D_h x_t`` once, with the forward scan's x), then RMSNorm per head, ``silu(z)`` and ``W^o``."""
    b, n, _ = x.shape
    proj = torch.cat([m.q_proj(x), m.k_proj(x), m.v_proj(x)], -1)  # C, B, x
    y, xv = scan(m, x, proj)
    if not m.causal:
        y = y + scan(m, x.flip(1), proj.flip(1))[0].flip(2)
    y = y + m.skip[:, None, None] * xv
    y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + 1e-6) * m.out_norm.norm.weight
    z = F.silu(m.out_norm.gate(x)).view(b, n, H, D).transpose(1, 2)
    return m.out_proj((y * z).transpose(1, 2).reshape(b, n, E))


@pytest.mark.parametrize("causal", [True, False])
def test_grouped_b_and_c_equal_the_ssd_recurrence_as_a_loop_with_every_gradient(causal):
    m = mamba2(causal=causal, chunk=8)
    assert m.q_proj.out_features == m.k_proj.out_features == 2 * 6 and m.conv.weight.shape[0] == 2 * 2 * 6 + E
    x = torch.randn(2, 29, E, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    want_grads = assert_every_form_equals(m, x, reference(m, x), MODES)
    assert all(g is not None for g in want_grads)  # the loop reaches every parameter


def test_heads_of_a_group_share_b_and_c():
    """Heads 0 and 1 (group 0) given the same x, decay and skip compute the same output; heads 1
    and 2 (groups 0 and 1) do not."""
    m = mamba2(ngroups=2, state_size=6)
    with torch.no_grad():
        m.v_proj.weight.view(H, D, E)[:] = m.v_proj.weight.view(H, D, E)[0]
        m.v_proj.bias.view(H, D)[:] = m.v_proj.bias.view(H, D)[0]
        m.conv.weight[2 * 12 :].view(H, D, 1, -1)[:] = m.conv.weight[2 * 12 :].view(H, D, 1, -1)[0]
        m.dt_proj.weight[:] = m.dt_proj.weight[0]
        for p in (m.dt_bias, m.log_rate, m.skip):
            p.fill_(p[0].item())
    seen = []
    m.register_step_hook(lambda layer, q, k, v, kw: seen.append((tuple(q.shape), tuple(k.shape), tuple(v.shape))))
    x = torch.randn(1, 9, E, dtype=torch.float64)
    m(x)
    assert seen == [((1, 2, 9, 6), (1, 2, 9, 6), (1, H, 9, D))]  # C and B per group, x per head
    q, k, v = m.heads(x, torch.arange(9))
    m.finish = lambda o, x, v: o  # the recurrence's heads, before the norm
    heads = m.mix(q, k, v, Tokens(x, torch.arange(9))).output
    assert_close_rel(heads[:, 1], heads[:, 0], 1e-12, "group 0")
    assert (heads[:, 2] - heads[:, 1]).abs().max() > 1e-3


def test_one_group_per_head_of_the_head_width_is_the_default_layer():
    default = mamba2(ngroups=None, state_size=None)
    explicit = efficient.create("mamba2", embed_dim=E, num_heads=H, causal=True, ngroups=H, state_size=D).double()
    explicit.load_state_dict(default.state_dict())
    x = torch.randn(2, 20, E, dtype=torch.float64)
    assert_close_rel(explicit(x).output, default(x).output, 1e-12, "ngroups=H, state_size=D")
    assert not default.grouped_bc and "ngroups" not in repr(default)
    grouped = mamba2(ngroups=H, state_size=D + 2)  # per head, another width: the grouped path
    assert grouped.grouped_bc and "ngroups=4, state_size=10" in repr(grouped) and grouped.q_proj.out_features == H * (D + 2)


@pytest.mark.parametrize("options", [{"ngroups": 2, "state_size": 6}, {"ngroups": 1, "state_size": 16}, {"ngroups": 4, "state_size": 3}])
def test_decoding_with_the_cache_equals_the_whole_sequence(options):
    m = mamba2(**options)
    x = torch.randn(2, 40, E, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    full = m(x).output
    cache = m.new_cache()
    outs = [m(x[:, :9], cache=cache).output] + [m(x[:, t : t + 1], cache=cache).output for t in range(9, 40)]
    assert_close_rel(torch.cat(outs, 1), full, 1e-10, f"decoded {options}")
    width = options["ngroups"] * options["state_size"]
    assert cache.state.shape == (2, H, options["state_size"], D)
    assert cache.nbytes() == 2 * H * options["state_size"] * D * 8 + 2 * (m.conv_size - 1) * (2 * width + E) * 8


def test_key_padding_packed_documents_and_an_input_encoding():
    m = mamba2()
    x = torch.randn(1, 10, E, dtype=torch.float64)
    padded = torch.cat([x, torch.full((1, 3, E), float("nan"), dtype=torch.float64)], 1)
    flags = torch.tensor([[True] * 10 + [False] * 3])
    assert_close_rel(m(padded, mask=flags).output[:, :10], m(x).output, 1e-10, "padding")
    packed = m(x, mask=masks.Documents([[4, 6]], causal=True)).output
    assert_close_rel(packed, torch.cat([m(x[:, :4]).output, m(x[:, 4:]).output], 1), 1e-12, "documents")
    for positional, size in [("sinusoidal", 6), ("rope", D)]:  # rope rotates C and B: grouped, of the head width
        enc = mamba2(positional=positional, state_size=size)
        cache = enc.new_cache()
        steps = torch.cat([enc(x[:, t : t + 1], cache=cache).output for t in range(10)], 1)
        assert_close_rel(steps, enc(x).output, 1e-10, f"{positional}, decoded")
        assert (enc(x).output - mamba2(state_size=size)(x).output).abs().max() > 1e-6  # the encoding is applied


def test_bad_groups_are_refused():
    with pytest.raises(ValueError, match="ngroups must divide num_heads.*ngroups=3 and num_heads=4"):
        mamba2(ngroups=3)
    with pytest.raises(ValueError, match="ngroups must be a positive int"):
        mamba2(ngroups=0)
    with pytest.raises(ValueError, match="state_size must be a positive int"):
        mamba2(state_size=0)
    with pytest.raises(ValueError, match="it takes no num_kv_heads"):
        mamba2(num_kv_heads=2)
    with pytest.raises(ValueError, match="unknown option 'head_mode' for the attention 'mamba2'"):  # a mixer has one head form
        mamba2(head_mode="project")
    with pytest.raises(ValueError, match="rotates the .mamba2. attention.s queries and keys, of width 6: it needs them of the head width"):
        mamba2(positional="rope")
    m = mamba2()
    x = torch.randn(1, 5, E, dtype=torch.float64)
    with pytest.raises(ValueError, match="self-attention: pass neither key nor value"):
        m(x, x, x)
    with pytest.raises(ValueError, match="query"):
        m(torch.randn(1, 5, E + 1, dtype=torch.float64))


@pytest.mark.parametrize("ngroups,state_size", [(1, 32), (2, 16)])
def test_groups_as_wide_as_the_layer_are_split_by_group_not_by_head(ngroups, state_size):
    """ngroups x state_size = E: the projections have the layer's width, but C and B are still
    ngroups heads of state_size (a width test alone would split them into H heads of D)."""
    torch.manual_seed(0)
    m = efficient.create("mamba2", embed_dim=32, num_heads=4, ngroups=ngroups, state_size=state_size, causal=True).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    seen = []
    m.register_step_hook(lambda layer, q, k, v, kw: seen.append((tuple(q.shape), tuple(k.shape), tuple(v.shape))))
    out = m(x).output
    assert seen == [((2, ngroups, 7, state_size), (2, ngroups, 7, state_size), (2, 4, 7, 8))]
    c, b = (p(x).view(2, 7, ngroups, state_size).transpose(1, 2) for p in (m.q_proj, m.k_proj))
    v = m.v_proj(x).view(2, 7, 4, 8).transpose(1, 2)
    by_hand = m.merge_heads(m.mix(c, b, v, Tokens(x, torch.arange(7))).output)
    assert (out - by_hand).abs().max() < 1e-12
