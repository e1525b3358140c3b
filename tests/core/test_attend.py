"""attend() against the float64 textbook reference and against PyTorch's fused kernel."""

import math

import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab import Additive, Bilinear, Cosine, attend, masks, reference_attention
from tests.helpers import assert_close_rel, randn

B, H, N, M, D, DV = 2, 3, 6, 7, 4, 5


def make_score(name):
    torch.manual_seed(7)
    if name == "additive":
        return Additive(D, hidden_dim=6, num_heads=H)
    if name == "bilinear":
        s = Bilinear(D, num_heads=H)
        with torch.no_grad():  # move away from the scaled-dot start
            s.weight.add_(0.3 * torch.randn_like(s.weight))
        return s
    if name == "cosine_learnable":
        return Cosine(0.2, learnable=True, num_heads=H)
    return name


def mask_cases():
    row_without_keys = masks.causal(align="top_left").dense(N, M).clone()
    row_without_keys[2] = False
    return {
        "none": None,
        "causal": masks.causal().dense(N, M),
        "window": masks.window(1).dense(N, M),
        "window_causal": masks.window(2, causal=True).dense(N, M),
        "padding": masks.padding([4, 7]).dense(M, M),
        "padding_empty_batch": masks.padding([0, 3]).dense(M, M),
        "graph": masks.graph(torch.tensor([[0, 1, 2, 3, 6, 5], [1, 2, 0, 0, 4, 5]]), 7).dense(7)[:N, :M],
        "no_self_causal": masks.and_masks(masks.no_self().dense(N, M), masks.causal().dense(N, M)),
        "row_without_keys": row_without_keys,
        "per_head": torch.rand(1, H, N, M, generator=torch.Generator().manual_seed(3)) > 0.4,
    }


SCORES = ["dot", "scaled_dot", "cosine", "cosine_learnable", "additive", "bilinear"]
NORMS = ["softmax", "relu", "sigmoid"]
MASKS = mask_cases()


@pytest.mark.parametrize("mask_name", list(MASKS))
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("score_name", SCORES)
def test_attend_matches_float64_reference(score_name, norm, mask_name):
    gen = torch.Generator().manual_seed(11)
    q, k = randn(B, H, N, D, gen=gen, requires_grad=True), randn(B, H, M, D, gen=gen, requires_grad=True)
    v = randn(B, H, M, DV, gen=gen, requires_grad=True)
    upstream = randn(B, H, N, DV, gen=gen)
    score, mask = make_score(score_name), MASKS[mask_name]
    params = list(score.parameters()) if isinstance(score, torch.nn.Module) else []
    ref_out, ref_w = reference_attention(q, k, v, score=score, normalize=norm, mask=mask)
    ref_grads = torch.autograd.grad(ref_out, (q, k, v, *params), upstream)
    for backend, block in (("auto", None), ("chunked", 4), ("chunked", 1)):
        res = attend(q, k, v, score=score, normalize=norm, mask=mask, backend=backend, block_size=block)
        assert res.weights is None
        tag = f"{score_name}/{norm}/{mask_name}/{backend}/{block}"
        assert_close_rel(res.output, ref_out, 1e-5, tag + " output")
        grads = torch.autograd.grad(res.output, (q, k, v, *params), upstream)
        for name, g, rg in zip(["dq", "dk", "dv", *[f"param{i}" for i in range(len(params))]], grads, ref_grads):
            assert_close_rel(g, rg, 1e-4, f"{tag} {name}")
    res = attend(q, k, v, score=score, normalize=norm, mask=mask, return_weights=True)
    assert_close_rel(res.weights, ref_w, 1e-5, "weights")
    assert_close_rel(res.output, ref_out, 1e-5, "output with weights")


def test_bias_is_added_to_scores_on_both_backends():
    gen = torch.Generator().manual_seed(5)
    q, k, v = randn(B, H, N, D, gen=gen), randn(B, H, M, D, gen=gen), randn(B, H, M, DV, gen=gen)
    bias = randn(1, H, N, M, gen=gen)
    mask = masks.causal().dense(N, M)
    ref_out, _ = reference_attention(q, k, v, mask=mask, bias=bias)
    for backend in ("sdpa", "chunked"):
        assert_close_rel(attend(q, k, v, mask=mask, bias=bias, backend=backend).output, ref_out, 1e-5, backend)
    ref_relu, _ = reference_attention(q, k, v, normalize="relu", bias=bias)
    assert_close_rel(attend(q, k, v, normalize="relu", bias=bias).output, ref_relu, 1e-5, "relu+bias")


def test_sdpa_path_is_taken_and_equals_scaled_dot_product_attention():
    gen = torch.Generator().manual_seed(2)
    q, k, v = randn(2, 4, 33, 16, gen=gen), randn(2, 4, 40, 16, gen=gen), randn(2, 4, 40, 8, gen=gen)
    assert attnlab.backend_for("scaled_dot", "softmax", head_dim=16) == "sdpa"
    assert attnlab.backend_for("cosine", "softmax", head_dim=16) == "sdpa"
    assert attnlab.backend_for("scaled_dot", "relu", head_dim=16) == "chunked"
    assert attnlab.backend_for("scaled_dot", "softmax", head_dim=16, return_weights=True) == "chunked"
    torch.testing.assert_close(attend(q, k, v).output, F.scaled_dot_product_attention(q, k, v), rtol=0, atol=0)
    mk = masks.padding([30, 40]).dense(40, 40)
    torch.testing.assert_close(
        attend(q, k, v, mask=mk).output, F.scaled_dot_product_attention(q, k, v, attn_mask=mk), rtol=0, atol=0
    )
    torch.testing.assert_close(
        attend(q, k, v, score="dot").output, F.scaled_dot_product_attention(q, k, v, scale=1.0), rtol=0, atol=0
    )
    # the chunked path computes the same function
    torch.testing.assert_close(attend(q, k, v, backend="chunked", block_size=8).output, attend(q, k, v).output)


def test_sdpa_backend_refuses_what_it_cannot_compute():
    q = torch.randn(1, 1, 3, 4)
    with pytest.raises(ValueError, match="backend='sdpa' needs softmax"):
        attend(q, q, q, normalize="relu", backend="sdpa")
    with pytest.raises(ValueError, match="backend must be"):
        attend(q, q, q, backend="flash")


@pytest.mark.parametrize("backend", ["auto", "chunked"])
@pytest.mark.parametrize("norm", NORMS)
def test_fully_masked_row_gives_zeros_zero_grads_and_leaves_other_rows_alone(norm, backend):
    gen = torch.Generator().manual_seed(9)
    q, k, v = (randn(1, 2, 5, 4, gen=gen, requires_grad=True) for _ in range(3))
    mask = masks.causal().dense(5).clone()
    mask[3] = False
    out = attend(q, k, v, normalize=norm, mask=mask, backend=backend, block_size=2).output
    assert torch.equal(out[:, :, 3], torch.zeros_like(out[:, :, 3]))
    (gq,) = torch.autograd.grad(out.sum(), q)
    assert torch.isfinite(gq).all() and torch.equal(gq[:, :, 3], torch.zeros_like(gq[:, :, 3]))
    # the other rows equal attention computed without the dead row at all
    keep = [0, 1, 2, 4]
    alone = attend(q[:, :, keep], k, v, normalize=norm, mask=masks.causal().dense(5)[keep], backend=backend).output
    torch.testing.assert_close(out[:, :, keep], alone)


@pytest.mark.parametrize("backend", ["auto", "chunked"])
@pytest.mark.parametrize("score_name", SCORES)
@pytest.mark.parametrize("norm", NORMS)
def test_nan_in_padded_keys_and_values_does_not_leak(score_name, norm, backend):
    gen = torch.Generator().manual_seed(4)
    q = randn(2, H, 5, D, gen=gen, requires_grad=True)
    k, v = randn(2, H, 6, D, gen=gen), randn(2, H, 6, DV, gen=gen)
    k[0, :, 4:], v[0, :, 4:] = float("nan"), float("nan")
    k[1, :, 2:], v[1, :, 2:] = float("inf"), float("nan")
    k.requires_grad_(True)
    v.requires_grad_(True)
    mask = masks.padding([4, 2]).dense(6, 6)
    score = make_score(score_name)
    if norm != "softmax" and backend == "auto":
        backend = "chunked"
    out = attend(q, k, v, score=score, normalize=norm, mask=mask, backend=backend, block_size=2).output
    assert torch.isfinite(out).all()
    clean_k = torch.where(mask.transpose(-1, -2), k.detach(), 0.0)
    clean_v = torch.where(mask.transpose(-1, -2), v.detach(), 0.0)
    ref, _ = reference_attention(q.detach(), clean_k, clean_v, score=score, normalize=norm, mask=mask)
    assert_close_rel(out, ref, 1e-5, "output")
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)


def test_zero_length_inputs():
    q, k, v = torch.randn(2, 3, 0, 4), torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 6)
    res = attend(q, k, v, return_weights=True)
    assert res.output.shape == (2, 3, 0, 6) and res.weights.shape == (2, 3, 0, 5)
    q = torch.randn(2, 3, 4, 4)
    res = attend(q, k[:, :, :0], v[:, :, :0], return_weights=True)
    assert torch.equal(res.output, torch.zeros(2, 3, 4, 6)) and res.weights.shape == (2, 3, 4, 0)


def test_float64_and_bfloat16_follow_their_input_dtype():
    q64 = torch.randn(1, 2, 5, 4, dtype=torch.float64)
    ref, _ = reference_attention(q64, q64, q64, normalize="sigmoid")
    out = attend(q64, q64, q64, normalize="sigmoid").output
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    qb = q64.to(torch.bfloat16)
    for norm in NORMS:
        ob = attend(qb, qb, qb, normalize=norm, return_weights=True)
        assert ob.output.dtype == torch.bfloat16 and ob.weights.dtype == torch.bfloat16
        ref, _ = reference_attention(qb, qb, qb, normalize=norm)
        assert_close_rel(ob.output, ref, 3e-2, f"bf16 {norm}")


def test_chunked_path_holds_one_block_of_scores_not_the_whole_matrix():
    from attnlab.profiling import peak_bytes

    n, d = 2048, 32
    q = torch.randn(1, 2, n, d)
    full_bytes = 2 * n * n * 4  # one (B, H, N, M) fp32 tensor: 32 MiB
    block = 32  # one block of scores: 512 KiB
    peak = peak_bytes(lambda: attend(q, q, q, normalize="relu", block_size=block))
    if peak is None:
        pytest.skip("this torch build exposes no allocation events")
    assert peak < full_bytes / 4, f"chunked forward peak {peak} bytes is not O(block x M)"
    qg = q.clone().requires_grad_(True)
    peak_bwd = peak_bytes(lambda: attend(qg, qg, qg, normalize="relu", block_size=block).output.sum().backward())
    assert peak_bwd < full_bytes / 4, f"chunked backward peak {peak_bwd} bytes is not O(block x M)"
    peak_w = peak_bytes(lambda: attend(q, q, q, normalize="relu", return_weights=True))
    assert peak_w >= full_bytes, "asking for weights must materialise them"


def test_dropout_zeroes_some_weights_and_scales_the_rest():
    torch.manual_seed(0)
    q = torch.zeros(1, 1, 200, 4)
    v = torch.ones(1, 1, 200, 1)
    for backend in ("sdpa", "chunked"):
        out = attend(q, q, v, dropout_p=0.5, backend=backend).output  # uniform weights 1/200
        # each output is (kept / 200) * 2: mean 1, spread from the random keep pattern
        assert abs(out.mean().item() - 1.0) < 0.1 and out.std().item() > 0.05


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        (dict(q=torch.randn(3, 4, 5)), ValueError, "q must have rank 4"),
        (dict(k=torch.randn(1, 2, 6, 3)), ValueError, "same last dimension D"),
        (dict(v=torch.randn(1, 2, 5, 4)), ValueError, "same number of keys M"),
        (dict(k=torch.randn(2, 2, 6, 4)), ValueError, "agree on (B, H)"),
        (dict(q=torch.randn(1, 2, 5, 4, dtype=torch.float64)), TypeError, "share one dtype"),
        (dict(q=torch.ones(1, 2, 5, 4, dtype=torch.long)), TypeError, "floating-point"),
        (dict(mask=torch.ones(5, 5, dtype=torch.bool)), ValueError, "does not broadcast to (B, H, N, M) = (1, 2, 5, 6)"),
        (dict(mask=torch.ones(5, 6)), TypeError, "torch.bool"),
        (dict(mask=[[True]]), TypeError, "mask must be a torch.Tensor"),
        (dict(bias=torch.ones(5, 6, dtype=torch.bool)), TypeError, "bias must be a floating-point"),
        (dict(bias=torch.ones(3, 5, 6)), ValueError, "bias of shape (3, 5, 6)"),
        (dict(score="euclid"), ValueError, "unknown score 'euclid'"),
        (dict(score="additive"), ValueError, "has learnable weights"),
        (dict(score=3), TypeError, "score must be"),
        (dict(normalize="entmax"), ValueError, "unknown normaliser 'entmax'"),
        (dict(dropout_p=1.5), ValueError, "dropout_p"),
        (dict(block_size=0), ValueError, "block_size"),
        (dict(score=Additive(4, num_heads=3)), ValueError, "built for 3 heads"),
        (dict(score=Additive(8)), ValueError, "built for q of last dimension 8"),
        (dict(score=Cosine(learnable=True, num_heads=3)), ValueError, "built for 3 heads"),
    ],
)
def test_bad_input_raises_clear_errors(kwargs, exc, words):
    args = dict(q=torch.randn(1, 2, 5, 4), k=torch.randn(1, 2, 6, 4), v=torch.randn(1, 2, 6, 3))
    args.update(kwargs)
    q, k, v = args.pop("q"), args.pop("k"), args.pop("v")
    with pytest.raises(exc) as info:
        attend(q, k, v, **args)
    assert words in str(info.value)


def test_bilinear_starts_as_scaled_dot_and_cosine_is_scale_free():
    gen = torch.Generator().manual_seed(8)
    q, k, v = randn(1, 2, 5, 4, gen=gen), randn(1, 2, 6, 4, gen=gen), randn(1, 2, 6, 3, gen=gen)
    torch.testing.assert_close(attend(q, k, v, score=Bilinear(4)).output, attend(q, k, v).output)
    torch.testing.assert_close(attend(3.0 * q, 0.5 * k, v, score="cosine").output, attend(q, k, v, score="cosine").output)
    s = attnlab.cosine(q, k, temperature=0.5)
    assert s.abs().max() <= 2.0 + 1e-6
    torch.testing.assert_close(attnlab.scaled_dot(q, k), attnlab.dot(q, k) / math.sqrt(4))


@pytest.mark.parametrize(
    "build, exc, words",
    [
        (lambda: Additive(0), ValueError, "head_dim must be a positive int"),
        (lambda: Additive(4, hidden_dim=-2), ValueError, "hidden_dim must be a positive int"),
        (lambda: Bilinear(4, num_heads=0), ValueError, "num_heads must be a positive int"),
        (lambda: Cosine(temperature=0.0), ValueError, "temperature must be a number > 0"),
        (lambda: attnlab.scores.create("dot", head_dim=4, scale=2), TypeError, "takes no options"),
        (lambda: attnlab.scores.create("euclid", head_dim=4), ValueError, "unknown score 'euclid'"),
    ],
)
def test_bad_score_construction_raises_clear_errors(build, exc, words):
    with pytest.raises(exc) as info:
        build()
    assert words in str(info.value)


def test_create_score_builds_every_listed_score_with_per_head_weights():
    assert attnlab.scores.names() == ["additive", "bilinear", "cosine", "dot", "scaled_dot"]
    assert attnlab.normalizers.names() == ["relu", "sigmoid", "softmax"]
    assert attnlab.scores.create("additive", head_dim=4, num_heads=3, hidden_dim=5).w_q.shape == (3, 4, 5)
    assert attnlab.scores.create("bilinear", head_dim=4, num_heads=2).weight.shape == (2, 4, 4)
    cos = attnlab.scores.create("cosine", head_dim=4, temperature=0.5)
    # a fixed temperature is kept in float64
    torch.testing.assert_close(cos.temperature.flatten(), torch.tensor([0.5], dtype=torch.float64))


def test_square_causal_mask_takes_the_fused_causal_path_with_the_same_result():
    """A square causal mask goes to SDPA's is_causal path (no mask read); the result equals the
    same mask given per batch row (which takes the masked path) and the float64 reference."""
    from attnlab.core import masks
    from attnlab.core.attend import _is_causal
    from attnlab.core.reference import reference_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 4, generator=g, dtype=torch.float64) for _ in range(3))
    c = masks.causal().dense(9)
    assert _is_causal(c) and _is_causal(c[None, None]) and not _is_causal(c.expand(2, 1, 9, 9))
    assert not _is_causal(masks.causal().dense(9, 10)) and not _is_causal(masks.window(2).dense(9)) and not _is_causal(None)
    fast = attend(q, k, v, mask=c).output
    slow = attend(q, k, v, mask=c.expand(2, 1, 9, 9).clone()).output
    ref = reference_attention(q, k, v, mask=c)[0]
    assert (fast - slow).abs().max() < 1e-12 and (fast - ref).abs().max() < 1e-12
