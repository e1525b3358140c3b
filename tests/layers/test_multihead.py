"""MultiHeadAttention against torch.nn.MultiheadAttention and the float64 reference."""

import pytest
import torch
from torch import nn

from attnlab import MultiHeadAttention, efficient, masks, reference_attention
from tests.helpers import assert_close_rel

E, H = 16, 4


def torch_mha(**kw):
    torch.manual_seed(0)
    m = nn.MultiheadAttention(E, H, batch_first=True, **kw)
    with torch.no_grad():  # non-zero biases, so that copying them is tested too
        for p in m.parameters():
            if p.dim() == 1:
                p.normal_(0, 0.1)
    return m.eval()


@pytest.mark.parametrize("kw", [{}, {"bias": False}, {"kdim": 6, "vdim": 10}])
@pytest.mark.parametrize("case", ["unmasked", "padding", "causal", "padding+causal"])
def test_from_torch_reproduces_outputs_and_per_head_weights(kw, case):
    m = torch_mha(**kw)
    ours = MultiHeadAttention.from_torch(m).eval()
    g = torch.Generator().manual_seed(1)
    n = 7
    x = torch.randn(3, n, E, generator=g)
    if kw.get("kdim"):  # cross-attention from inputs of other widths
        key, value = torch.randn(3, n, m.kdim, generator=g), torch.randn(3, n, m.vdim, generator=g)
    else:  # self-attention, m(x, x, x)
        key = value = x
    lengths = torch.tensor([7, 4, 1])
    torch_kw, our_mask = {}, None
    if "padding" in case:
        torch_kw["key_padding_mask"] = ~masks.padding(lengths).dense(n, n)[:, 0, 0]  # torch: True = ignore
        our_mask = masks.padding(lengths).dense(n, n)
    if "causal" in case:
        torch_kw["attn_mask"] = ~masks.causal().dense(n)  # torch: True = not allowed
        our_mask = masks.and_masks(our_mask, masks.causal().dense(n))
    with torch.no_grad():
        want, want_w = m(x, key, value, need_weights=True, average_attn_weights=False, **torch_kw)
        got = ours(x, key, value, mask=our_mask, return_weights=True)
    torch.testing.assert_close(got.output, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.weights, want_w, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # the fast path (no weights asked) agrees too
        torch.testing.assert_close(ours(x, key, value, mask=our_mask).output, want, rtol=1e-5, atol=1e-5)


def test_self_attention_default_and_to_torch_round_trip():
    m = torch_mha()
    ours = MultiHeadAttention.from_torch(m)
    back = ours.to_torch()
    assert back.batch_first
    for (name, p), (name2, p2) in zip(m.state_dict().items(), back.state_dict().items()):
        assert name == name2 and torch.equal(p, p2), name
    x = torch.randn(2, 5, E)
    with torch.no_grad():
        torch.testing.assert_close(ours(x).output, m(x, x, x, need_weights=False)[0], rtol=1e-5, atol=1e-5)
    m2 = torch_mha(kdim=6, vdim=10)
    back2 = MultiHeadAttention.from_torch(m2).to_torch()
    for (name, p), (_, p2) in zip(m2.state_dict().items(), back2.state_dict().items()):
        assert torch.equal(p, p2), name


def head_inputs(mha, x):
    """q, k, v per head computed by hand in float64 from the module's weights."""
    x = x.double()
    b, n, _ = x.shape
    outs = []
    for lin, head in ((mha.q_proj, "head_q"), (mha.k_proj, "head_k"), (mha.v_proj, "head_v")):
        y = x @ lin.weight.double().T + lin.bias.double()  # q^i = W^q a^i (+ b)
        if mha.head_mode == "project":
            w = getattr(mha, head).double()  # (H, D, E): q^{i,h} = W^{q,h} q^i
            outs.append(torch.stack([y @ w[h].T for h in range(mha.num_heads)], dim=1))
        else:
            outs.append(y.view(b, n, mha.num_heads, mha.head_dim).transpose(1, 2))
    return outs


@pytest.mark.parametrize("head_mode", ["split", "project"])
@pytest.mark.parametrize("score", ["scaled_dot", "additive", "bilinear", "cosine"])
@pytest.mark.parametrize("normalize", ["softmax", "relu"])
def test_both_head_modes_equal_the_reference(head_mode, score, normalize):
    torch.manual_seed(3)
    mha = MultiHeadAttention(E, H, score=score, normalize=normalize, head_mode=head_mode)
    x = torch.randn(2, 5, E)
    mask = masks.padding([5, 3]).dense(5, 5)
    q, k, v = head_inputs(mha, x)
    ref, ref_w = reference_attention(q, k, v, score=mha.step.score, normalize=normalize, mask=mask)
    concat = ref.transpose(1, 2).reshape(2, 5, E)
    want = concat @ mha.out_proj.weight.double().T + mha.out_proj.bias.double()
    got = mha(x, mask=mask, return_weights=True)
    assert_close_rel(got.output, want, 1e-5, "output")
    assert_close_rel(got.weights, ref_w, 1e-5, "weights")


def test_learnable_scores_get_gradients_and_one_weight_set_per_head():
    mha = MultiHeadAttention(E, H, score="additive", score_options={"hidden_dim": 3})
    assert mha.step.score.w_q.shape == (H, E // H, 3)
    mha(torch.randn(2, 4, E)).output.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mha.step.score.parameters())
    cos = MultiHeadAttention(E, H, score="cosine", score_options={"learnable": True, "temperature": 0.3})
    assert cos.step.score.log_temperature.shape == (H, 1, 1)
    cos(torch.randn(1, 3, E)).output.sum().backward()
    assert cos.step.score.log_temperature.grad is not None


def test_cross_attention_lengths_and_dropout_only_in_training():
    mha = MultiHeadAttention(E, H, dropout=0.5)
    x, mem = torch.randn(2, 3, E), torch.randn(2, 9, E)
    res = mha.eval()(x, mem, return_weights=True)
    assert res.output.shape == (2, 3, E) and res.weights.shape == (2, H, 3, 9)
    torch.testing.assert_close(mha(x, mem).output, mha(x, mem).output)  # eval: deterministic
    mha.train()
    assert not torch.equal(mha(x, mem).output, mha(x, mem).output)


@pytest.mark.parametrize(
    "build, exc, words",
    [
        (lambda: MultiHeadAttention(10, 3), ValueError, "embed_dim must be divisible by num_heads"),
        (lambda: MultiHeadAttention(8, 0), ValueError, "num_heads must be a positive int"),
        (lambda: MultiHeadAttention(8, 2, score="nope"), ValueError, "unknown score 'nope'"),
        (lambda: MultiHeadAttention(8, 2, normalize="nope"), ValueError, "unknown normaliser 'nope'"),
        (lambda: MultiHeadAttention(8, 2, head_mode="mixed"), ValueError, "head_mode"),
        (lambda: MultiHeadAttention(8, 2, dropout=1.0), ValueError, "dropout"),
        (lambda: MultiHeadAttention(8, 2, score="cosine").to_torch(), ValueError, "to_torch needs"),
        (lambda: MultiHeadAttention(8, 2, head_mode="project").to_torch(), ValueError, "to_torch needs"),
        (lambda: efficient.create("dense", embed_dim=8, num_heads=2, causal=True).to_torch(), ValueError, "the layer is causal"),
        (lambda: MultiHeadAttention.from_torch(nn.Linear(2, 2)), TypeError, "expects a torch.nn.MultiheadAttention"),
        (lambda: MultiHeadAttention.from_torch(nn.MultiheadAttention(8, 2, add_bias_kv=True)), ValueError, "add_bias_kv"),
        (lambda: MultiHeadAttention(8, 2)(torch.randn(2, 3, 7)), ValueError, "query must have last dimension 8"),
        (lambda: MultiHeadAttention(8, 2)(torch.randn(3, 8)), ValueError, "query must have rank 3"),
        (lambda: MultiHeadAttention(8, 2)(torch.randn(2, 3, 8), torch.randn(1, 4, 8)), ValueError, "batch size"),
        (
            lambda: MultiHeadAttention(8, 2)(torch.randn(2, 3, 8), mask=torch.ones(4, 4, dtype=torch.bool)),
            ValueError,
            "mask of shape (4, 4) does not broadcast",
        ),
    ],
)
def test_bad_input_raises_clear_errors(build, exc, words):
    with pytest.raises(exc) as info:
        build()
    assert words in str(info.value)


def test_silence_padding_zeroes_only_non_finite_entries_of_hidden_rows():
    from attnlab.layers.padding import silence_padding

    x = torch.randn(2, 5, 3, dtype=torch.float64)
    x[1, 3, 0], x[1, 4, 2], x[0, 1, 1] = float("nan"), float("inf"), float("nan")  # row (0, 1) is a real position
    pad = masks.padding(torch.tensor([5, 3])).dense(5, 5)
    q, k, v = silence_padding(x, None, None, pad)
    assert k is None and v is None
    want = x.clone()
    want[1, 3, 0] = want[1, 4, 2] = 0.0
    assert torch.equal(q[1], want[1]) and torch.equal(q[0, [0, 2, 3, 4]], x[0, [0, 2, 3, 4]])
    assert q[0, 1, 1].isnan()  # a real position's NaN is the caller's, not padding: left as it is
    finite = torch.randn(2, 5, 3)
    assert torch.equal(silence_padding(finite, None, None, pad)[0], finite)  # finite inputs: bit for bit
    # causal + padding as one (B, 1, N, N) mask: the padded positions are hidden columns too
    both = masks.and_masks(masks.causal().dense(5), pad)
    assert torch.equal(silence_padding(x, None, None, both)[0][1], want[1])
    # cross-attention: key and value rows are cleaned, the queries (no padding information) are not
    query = torch.full((2, 2, 3), float("nan"), dtype=torch.float64)
    q2, k2, v2 = silence_padding(query, x, x.clone(), pad)
    assert q2 is query and torch.equal(k2[1], want[1]) and torch.equal(v2[1], want[1])
    # nothing to do: no mask, a float mask, nothing hidden, or a mask of the wrong width (project names that error)
    for mask in (None, pad.double(), masks.causal().dense(5), masks.padding(torch.tensor([4, 3])).dense(4, 4)):
        assert silence_padding(x, None, None, mask)[0] is x


def test_an_input_of_another_dtype_than_the_layer_is_refused_naming_both_and_the_fix():
    """torch's "mat1 and mat2 must have the same dtype" named neither the layer nor the fix; the fix
    it names is right (the converted call equals the float64 reference), and autocast's own dtypes pass."""
    mha = MultiHeadAttention(8, 2)
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"query has dtype torch\.float64, but this layer computes in torch\.float32: convert the "
                                        r"input, query\.to\(torch\.float32\), or the layer to the input's: "
                                        r"layer\.to\(torch\.float64\) \(layer\.double\(\)\)"):
        mha(x)
    with pytest.raises(TypeError, match=r"key has dtype torch\.float64, but this layer computes in torch\.float32"):
        mha(x.float(), x)
    with pytest.raises(TypeError, match=r"query has dtype torch\.int64, .* query\.to\(torch\.float32\) \(attention takes float vectors\)"):
        mha(torch.ones(2, 3, 8, dtype=torch.long))
    ref, _ = reference_attention(*mha.double().project(x)[:3])
    assert_close_rel(mha(x).output, mha.merge_heads(ref), 1e-12)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert mha.float()(x.bfloat16()).output.dtype == torch.bfloat16


def test_a_torch_style_key_padding_tensor_is_pointed_to_masks_valid_keys():
    """A (B, M) bool tensor is no (B, H, N, M) mask: the message says that key padding goes through
    masks.valid_keys and its polarity, and the way it names gives torch's key_padding_mask output."""
    mha = MultiHeadAttention(E, H)
    x = torch.randn(2, 5, E)
    real = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    with pytest.raises(ValueError, match=r"mask of shape \(2, 5\) does not broadcast .*; a \(B, M\) = \(2, 5\) key-padding tensor goes "
                                         r"through attnlab\.masks\.valid_keys\(flags\), flags True = a real key \(every attention "
                                         r"reads a bare 2-D tensor as an \(N, M\) mask of \(query, key\) pairs; torch's "
                                         r"key_padding_mask is True = padding: valid_keys\(~key_padding_mask\)\)"):
        mha(x, mask=real)
    want, _ = mha.to_torch()(x, x, x, key_padding_mask=~real)
    assert (mha(x, mask=masks.valid_keys(real)).output - want).abs().max() < 1e-6


def test_a_variant_is_no_option_of_the_exact_layer_but_made_by_efficient_create():
    """The layer takes no variant= or attention= option (its __new__ shim is gone: Python's own TypeError);
    efficient.create makes a variant: a step held by a MultiHeadAttention, or a sequence mixer, the layer itself."""
    from attnlab.layers.mixer import SequenceMixer

    with pytest.raises(TypeError, match=r"__init__\(\) got an unexpected keyword argument 'variant'"):
        MultiHeadAttention(E, H, variant="fox")
    with pytest.raises(TypeError, match=r"__init__\(\) got an unexpected keyword argument 'attention'"):
        MultiHeadAttention(E, H, attention="linear")
    fox, linear = (efficient.create(n, embed_dim=E, num_heads=H) for n in ("fox", "linear"))
    assert isinstance(fox, SequenceMixer) and not isinstance(fox, MultiHeadAttention) and fox.name == "fox"
    assert isinstance(linear, MultiHeadAttention) and linear.step.name == "linear"
