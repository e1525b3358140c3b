"""Property tests: lengths 0, 1 and odd, N != M, random masks with dead rows, permutations."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from attnlab import MultiHeadAttention, attend, reference_attention
from tests.helpers import assert_close_rel

dims = st.integers(min_value=0, max_value=7)


@st.composite
def problems(draw):
    b = draw(st.integers(1, 2))
    h = draw(st.integers(1, 3))
    n, m = draw(dims), draw(dims)
    d = draw(st.sampled_from([1, 3, 4]))
    dv = draw(st.sampled_from([1, 2, 5]))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, n, d, generator=g)
    k = torch.randn(b, h, m, d, generator=g)
    v = torch.randn(b, h, m, dv, generator=g)
    mask_kind = draw(st.sampled_from(["none", "random", "random_per_batch"]))
    mask = None
    if mask_kind == "random":
        mask = torch.rand(n, m, generator=g) > draw(st.sampled_from([0.2, 0.6, 0.95]))
    elif mask_kind == "random_per_batch":
        mask = torch.rand(b, 1, n, m, generator=g) > 0.5
    score = draw(st.sampled_from(["dot", "scaled_dot", "cosine"]))
    norm = draw(st.sampled_from(["softmax", "relu", "sigmoid"]))
    block = draw(st.sampled_from([None, 1, 2, 3]))
    return q, k, v, mask, score, norm, block


@given(problems())
def test_attend_equals_reference_on_random_shapes_and_masks(problem):
    q, k, v, mask, score, norm, block = problem
    ref_out, ref_w = reference_attention(q, k, v, score=score, normalize=norm, mask=mask)
    for backend in ("auto", "chunked"):
        res = attend(q, k, v, score=score, normalize=norm, mask=mask, backend=backend, block_size=block)
        assert res.output.shape == ref_out.shape
        assert_close_rel(res.output, ref_out, 1e-5, f"{score}/{norm}/{backend}")
    res = attend(q, k, v, score=score, normalize=norm, mask=mask, return_weights=True)
    assert_close_rel(res.weights, ref_w, 1e-5, "weights")
    if norm == "softmax" and q.shape[2] and k.shape[2]:
        sums = res.weights.sum(-1)
        live = torch.ones_like(sums, dtype=torch.bool) if mask is None else mask.any(-1).expand_as(sums)
        torch.testing.assert_close(sums[live], torch.ones_like(sums[live]))
        assert torch.equal(sums[~live], torch.zeros_like(sums[~live]))


def grads_or_none(out, inputs, upstream):
    if not out.requires_grad:  # e.g. every pair masked: the output is a constant 0
        return [None] * len(inputs)
    return torch.autograd.grad(out, inputs, upstream, allow_unused=True)


@given(problems())
def test_gradients_are_finite_and_match_reference(problem):
    q, k, v, mask, score, norm, block = problem
    q, k, v = (t.clone().requires_grad_(True) for t in (q, k, v))
    if 0 in (q.shape[2], k.shape[2]):
        return  # nothing to differentiate; the forward test covers empty shapes
    ref_out, _ = reference_attention(q, k, v, score=score, normalize=norm, mask=mask)
    out = attend(q, k, v, score=score, normalize=norm, mask=mask, backend="chunked", block_size=block).output
    g = torch.randn_like(out)
    # inputs that do not reach the output (all masked) have zero gradient
    got = grads_or_none(out, (q, k, v), g)
    want = grads_or_none(ref_out, (q, k, v), g)
    # where a gradient is exactly 0 (a row whose weight is all on one key), the block-sparse
    # backward, FlashAttention's dS = P (dO V^T - rowsum(dO O)) (PyTorch's fused kernel's too),
    # leaves the fp32 round-off of dO V^T (a few 1e-7 at these sizes) times the score's scale:
    # up to sqrt(D) for a dot product, 1 / temperature = 10 for the cosine score (1.5e-5 seen on an
    # AVX2-only CPU, whose float32 kernels round differently from AVX-512's)
    floor = 3e-5 if score == "cosine" else 1e-6
    for t, a, r in zip((q, k, v), got, want):
        a = torch.zeros_like(t) if a is None else a
        r = torch.zeros_like(t, dtype=torch.float64) if r is None else r
        assert_close_rel(a, r, 1e-4, f"grad {score}/{norm}", floor=floor)


@given(st.integers(0, 9), st.integers(1, 3), st.sampled_from(["split", "project"]), st.integers(0, 10_000))
def test_permuting_input_rows_permutes_output_rows(n, heads, head_mode, seed):
    torch.manual_seed(seed)
    mha = MultiHeadAttention(12, heads * 2 if 12 % (heads * 2) == 0 else heads, head_mode=head_mode)
    x = torch.randn(2, n, 12)
    perm = torch.randperm(n)
    out = mha(x).output
    out_p = mha(x[:, perm]).output
    torch.testing.assert_close(out_p, out[:, perm], rtol=1e-5, atol=1e-6)
    assert torch.isfinite(out).all()
