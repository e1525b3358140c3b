"""Positional encodings inside attend, MultiHeadAttention and the Encoder."""

import pytest
import torch

from attnlab import MultiHeadAttention, attend, masks, reference_attention
from attnlab import positional as P
from attnlab.models import Encoder
from attnlab.positional import sinusoidal_table
from tests.helpers import assert_close_rel

ALL = P.names()
WITH_ORDER = [n for n in ALL if n != "none"]


def rel_bias(h=3, **kw):
    torch.manual_seed(0)
    pe = P.create("relative", num_heads=h, init_std=1.0, **kw)
    return pe


@pytest.mark.parametrize("backend,normalize", [("auto", "softmax"), ("chunked", "softmax"), ("chunked", "relu")])
def test_bias_score_function_equals_the_reference_with_gradients(backend, normalize):
    g = torch.Generator().manual_seed(0)
    b, h, n, m, d = 2, 3, 9, 9, 4
    q, k, v = (torch.randn(b, h, x, d, generator=g, dtype=torch.float64, requires_grad=True) for x in (n, m, m))
    pe = rel_bias(h, mode="clip", max_distance=3).double()
    pos = torch.arange(n)
    mask = masks.causal().dense(n)
    out = attend(q, k, v, normalize=normalize, mask=mask, score_mod=pe.score_mod(pos, pos), backend=backend, block_size=2).output
    grads = torch.autograd.grad(out.square().sum(), [q, k, v, pe.weight])
    pe.weight.grad = None
    table = pe.bias_from_offsets(pos[None, :] - pos[:, None])  # (H, N, M), with autograd to the weight
    ref, _ = reference_attention(q, k, v, normalize=normalize, mask=mask, bias=table)
    ref_grads = torch.autograd.grad(ref.square().sum(), [q, k, v, pe.weight])
    assert_close_rel(out, ref, 1e-12, "output")
    for name, a, r in zip("qkvw", grads, ref_grads):
        assert_close_rel(a, r, 1e-10, f"grad {name}")
    assert grads[3].abs().sum() > 0


def test_block_sparse_path_never_materialises_the_bias():
    """The score function is called on one chunk of tiles at a time, never on all N x M scores."""
    calls = []
    pe = P.create("alibi", num_heads=2)
    pos = torch.arange(400)
    inner = pe.score_mod(pos, pos)

    def spy(score, b, h, q_idx, kv_idx):
        calls.append(score.numel())
        return inner(score, b, h, q_idx, kv_idx)

    q = torch.randn(1, 2, 400, 4)
    out = attend(q, q, q, normalize="relu", score_mod=spy, mask=masks.window(3), block_size=4).output
    assert calls and sum(calls) < 400 * 400 * 2 / 20  # the window's tiles only, never all 400 x 400 pairs
    ref = attend(q, q, q, normalize="relu", bias=pe.table(400)[None], mask=masks.window(3).dense(400)).output
    assert torch.allclose(out, ref, atol=1e-6)


def test_score_functions_compose_with_a_bias_tensor_and_bad_ones_are_refused():
    from attnlab import score_mods

    pe = P.create("alibi", num_heads=2)
    pos = torch.arange(6)
    extra = torch.randn(1, 2, 6, 6, dtype=torch.float64)
    q = torch.randn(1, 2, 6, 4, dtype=torch.float64)
    capped = score_mods.compose(pe.score_mod(pos, pos), score_mods.softcap(2.0))
    out = attend(q, q, q, score_mod=capped, bias=extra, backend="chunked").output
    scores = (q @ q.transpose(-1, -2)) / 2 + extra
    want = torch.softmax(2.0 * torch.tanh((scores + pe.table(6).double()) / 2.0), -1) @ q
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="score_mod must be a callable"):
        attend(q, q, q, score_mod=3)
    with pytest.raises(ValueError, match="cap must be a number > 0"):
        score_mods.softcap(0)


def make_mha(name, e=16, h=4, **kw):
    torch.manual_seed(0)
    mha = MultiHeadAttention(e, h, positional=name, max_len=32, **kw).double().eval()
    if name == "relative":
        with torch.no_grad():
            mha.positional.weight.normal_()
    return mha


def same_projections(mha):
    plain = make_mha(None)
    plain.load_state_dict({k: v for k, v in mha.state_dict().items() if not k.startswith("positional.")})
    return plain


def test_mha_input_encodings_add_to_the_inputs():
    mha = make_mha("sinusoidal")
    plain = same_projections(mha)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    assert torch.allclose(mha(x).output, plain(x + sinusoidal_table(7, 16).double()).output, atol=1e-12)


@pytest.mark.parametrize("name", ["alibi", "relative"])
def test_mha_bias_encodings_equal_an_explicit_bias(name):
    mha = make_mha(name)
    plain = same_projections(mha)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    bias = mha.positional.table(7).double()
    user = torch.randn(2, 1, 7, 7, dtype=torch.float64)  # the caller's own bias adds to it
    assert torch.allclose(mha(x, bias=user).output, plain(x, bias=bias + user).output, atol=1e-12)


def test_mha_rope_equals_the_reference_on_rotated_heads():
    mha = make_mha("rope", score="scaled_dot")
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    res = mha(x, return_weights=True)  # the chunked path, weights asked for
    q = mha.q_proj(x).view(1, 6, 4, 4).transpose(1, 2)
    k = mha.k_proj(x).view(1, 6, 4, 4).transpose(1, 2)
    v = mha.v_proj(x).view(1, 6, 4, 4).transpose(1, 2)
    from tests.positional.test_encodings import rotation_matrix

    rq = torch.stack([q[:, :, i] @ rotation_matrix(i, 4).T for i in range(6)], dim=2)
    rk = torch.stack([k[:, :, i] @ rotation_matrix(i, 4).T for i in range(6)], dim=2)
    ref_out, ref_w = reference_attention(rq, rk, v)
    assert_close_rel(res.weights, ref_w, 1e-12, "weights")
    assert_close_rel(mha(x).output, mha.out_proj(ref_out.transpose(1, 2).reshape(1, 6, 16)), 1e-12, "sdpa output")


@pytest.mark.parametrize("name", ALL)
def test_decoding_the_last_queries_matches_full_causal_attention(name):
    """Queries fewer than keys sit at the last positions, as the masks align them."""
    mha = make_mha(name)
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    full = mha(x, mask=masks.causal().dense(9)).output
    last = mha(x[:, -3:], x, x, mask=masks.causal().dense(3, 9)).output
    assert torch.allclose(last, full[:, -3:], atol=1e-12)
    explicit = mha(x[:, -3:], x, x, mask=masks.causal().dense(3, 9), positions=torch.tensor([6, 7, 8])).output
    assert torch.allclose(explicit, last, atol=1e-12)


@pytest.mark.parametrize("name", ALL)
def test_encoder_is_permutation_equivariant_only_without_an_encoding(name):
    torch.manual_seed(0)
    enc = Encoder(16, 4, 2, positional=name, max_len=32).double().eval()
    if name == "relative":  # T5 initialises its bias small; any non-zero bias breaks equivariance
        assert enc.positional.weight.abs().sum() > 0
    x = torch.randn(3, 11, 16, dtype=torch.float64)
    perm = torch.randperm(11, generator=torch.Generator().manual_seed(1))
    diff = (enc(x).output[:, perm] - enc(x[:, perm]).output).abs().max().item()
    if name == "none":
        assert diff < 1e-12
    else:
        assert diff > 1e-4, f"{name}: permuting the inputs only permuted the outputs (max diff {diff:.2g})"


@pytest.mark.parametrize("name", WITH_ORDER)
def test_gradients_reach_the_encoding_parameters_through_the_encoder(name):
    torch.manual_seed(0)
    enc = Encoder(16, 4, 2, positional=name, max_len=32)
    x = torch.randn(2, 10, 16)
    enc(x, mask=masks.causal().dense(10)).output.square().mean().backward()
    for pname, p in enc.positional.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"{name}.{pname} got no gradient"


def test_mha_positional_errors():
    with pytest.raises(ValueError, match="unknown positional encoding"):
        MultiHeadAttention(16, 4, positional="sine")
    with pytest.raises(ValueError, match="head width is 4"):
        MultiHeadAttention(16, 4, positional=P.create("rope", dim=8))
    with pytest.raises(ValueError, match="has 2 heads, this layer 4"):
        MultiHeadAttention(16, 4, positional=P.create("alibi", num_heads=2))
    with pytest.raises(ValueError, match="key 6"):
        MultiHeadAttention(16, 4, kdim=6, positional="sinusoidal")
    with pytest.raises(TypeError, match="positional_options"):
        MultiHeadAttention(16, 4, positional_options={"base": 2})
    with pytest.raises(ValueError, match="max_len=8"):
        MultiHeadAttention(16, 4, positional="learned", max_len=8)(torch.randn(1, 9, 16))
    with pytest.raises(ValueError, match=r"bias of shape \(5, 5\)"):
        MultiHeadAttention(16, 4, positional="alibi")(torch.randn(1, 6, 16), bias=torch.zeros(5, 5))
    with pytest.raises(ValueError, match="no positional"):
        MultiHeadAttention(16, 4, positional="rope").to_torch()
    m = MultiHeadAttention(16, 4, positional="rope", positional_options={"base": 500.0})
    assert m.positional.base == 500.0 and "positional='rope'" in repr(m)
    assert MultiHeadAttention(16, 4, positional="none").positional is None


@pytest.mark.parametrize("name", WITH_ORDER)
@pytest.mark.parametrize("normalize", ["softmax", "relu"])
def test_half_precision_follows_float32(name, normalize):
    torch.manual_seed(0)
    m32 = MultiHeadAttention(16, 4, positional=name, normalize=normalize, max_len=32).eval()
    m16 = MultiHeadAttention(16, 4, positional=name, normalize=normalize, max_len=32).eval()
    m16.load_state_dict(m32.state_dict())
    m16 = m16.to(torch.bfloat16)
    x = torch.randn(2, 20, 16)
    out16 = m16(x.to(torch.bfloat16)).output
    assert out16.dtype == torch.bfloat16
    assert_close_rel(out16.float(), m32(x).output, 0.05, f"{name} bf16")


@pytest.mark.parametrize("name", ALL)
def test_padding_keeps_nan_out_and_positions_of_valid_rows_unchanged(name):
    """Padded vectors holding NaN never reach the valid rows, whichever way the encoding acts."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    mha = make_mha(name)

    @settings(deadline=None, max_examples=15)
    @given(n=st.integers(1, 12), data=st.data())
    def check(n, data):
        lengths = data.draw(st.lists(st.integers(1, n), min_size=2, max_size=2))
        x = torch.randn(2, n, 16, dtype=torch.float64)
        mask = masks.padding(torch.tensor(lengths)).dense(n, n)
        poisoned = x.clone()
        for b, length in enumerate(lengths):
            poisoned[b, length:] = float("nan")
        out = mha(poisoned, mask=mask).output
        for b, length in enumerate(lengths):
            alone = mha(x[b : b + 1, :length]).output[0]  # the valid prefix on its own
            assert torch.isfinite(out[b, :length]).all()
            assert torch.allclose(out[b, :length], alone, atol=1e-12)

    check()
