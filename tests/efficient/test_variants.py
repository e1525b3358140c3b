"""Every efficient variant: exact in its limit, approximate with a budget, refusing what it cannot do."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab import MultiHeadAttention, efficient, masks
from attnlab.efficient import (
    favor_features,
    iterative_pinv,
    kernel_attention,
    orthogonal_gaussian,
)
from attnlab.efficient.reformer import SELF_LOGIT
from attnlab.layers.mixer import SequenceMixer
from tests.helpers import assert_close_rel

E, H = 16, 4
VARIANTS = [n for n in efficient.names() if n not in ("dense", "dense_naive")]  # the efficient ones
PATTERNS = ["bigbird", "local", "longformer"]  # exact attention under a sparse pattern
APPROXIMATIONS = [n for n in VARIANTS if not efficient.capabilities(n).forms_scores]  # all but the patterns and fox


def dense_layer():
    torch.manual_seed(0)
    return efficient.create("dense", embed_dim=E, num_heads=H).double()


def like(dense, name, **options):
    m = efficient.create(name, embed_dim=E, num_heads=H, **options).double()
    missing, unexpected = m.load_state_dict(dense.state_dict(), strict=False)
    assert not unexpected
    return m


def grads(module, x, mask=None):
    x = x.clone().requires_grad_(True)
    out = module(x, mask=mask).output
    g = torch.autograd.grad(out.square().sum(), [x, *[p for n, p in module.named_parameters() if n.startswith(("q_", "v_", "out_"))]])
    return out, g


def test_registry():
    assert efficient.names() == sorted(efficient.VARIANTS.in_order()) and "dense" in efficient.names()
    mixers = efficient.select(mixer=True)
    assert {"retnet", "gla", "deltanet", "gated_deltanet", "kda", "mamba2", "deltaproduct", "fox"} <= set(mixers)
    for name in VARIANTS:  # every variant is a step the layer holds or a mixer that is the layer, registered under its own name
        layer = efficient.create(name, embed_dim=E, num_heads=H, **({"max_len": 8} if name == "linformer" else {}))
        if name in mixers:
            assert isinstance(layer, SequenceMixer) and type(layer) is efficient.VARIANTS.get(name) and not hasattr(layer, "step")
            assert layer.name == name
        else:
            assert isinstance(layer, MultiHeadAttention) and type(layer.step) is efficient.VARIANTS.get(name)
            assert layer.step.name == layer.name == name
    with pytest.raises(ValueError, match="unknown attention 'flash'"):
        efficient.create("flash", embed_dim=E, num_heads=H)


def exact_cases(n):
    eye = torch.eye(n, dtype=torch.float64)
    return {
        "local": ({"window": n - 1}, {}),
        "longformer": ({"window": 1, "global_tokens": n}, {}),
        "bigbird": ({"window": 1, "global_tokens": n, "random_blocks": 1}, {}),
        "nystrom": ({"landmarks": n, "pinv": "exact"}, {}),
        "linformer": ({"max_len": n, "k": n}, {"proj_k": eye, "proj_v": eye}),
    }


@pytest.mark.parametrize("name", ["local", "longformer", "bigbird", "nystrom", "linformer"])
@pytest.mark.parametrize("padded", [False, True])
def test_exact_limits_equal_dense_attention_with_gradients(name, padded):
    n = 19
    dense = dense_layer()
    options, weights = exact_cases(n)[name]
    m = like(dense, name, **options)
    if weights:
        m.load_state_dict({**m.state_dict(), **weights})
    x = torch.randn(3, n, E, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    mask = masks.padding(torch.tensor([n, 11, 1])).dense(n, n) if padded else None
    out, g = grads(m, x, mask)
    ref, g_ref = grads(dense, x, mask)
    assert_close_rel(out, ref, 1e-10, f"{name} output")
    # Nystrom's gradient passes through pinv(softmax(Q K^T)), whose derivative grows with that
    # matrix's condition number: float64 keeps it to ~1e-7 here, not 1e-12
    tol = 1e-5 if name == "nystrom" else 1e-9
    for a, r in zip(g, g_ref):
        assert_close_rel(a, r, tol, f"{name} gradient")


@pytest.mark.parametrize("causal", [False, True])
def test_reformer_with_one_bucket_and_one_chunk_is_dense_shared_qk_attention(causal):
    n = 13
    dense = dense_layer()
    m = like(dense, "reformer", num_buckets=1, num_hashes=1, chunk_size=n, causal=causal)
    x = torch.randn(2, n, E, dtype=torch.float64)
    lengths = torch.tensor([n, 6])
    q = m.q_proj(x).view(2, n, H, E // H).transpose(1, 2)
    v = m.v_proj(x).view(2, n, H, E // H).transpose(1, 2)
    # the textbook steps of the paper: keys = normalised queries, self only as a last resort
    scores = q @ F.normalize(q, dim=-1).transpose(-2, -1) / math.sqrt(E // H)
    allowed = masks.padding(lengths).dense(n, n).expand(2, H, n, n)
    if causal:
        allowed = allowed & masks.causal().dense(n)
    scores = torch.where(torch.eye(n, dtype=torch.bool) & allowed, torch.full_like(scores, SELF_LOGIT), scores)
    w = torch.nan_to_num(scores.masked_fill(~allowed, float("-inf")).softmax(-1))
    ref = m.out_proj((w @ v).transpose(1, 2).reshape(2, n, E))
    assert_close_rel(m(x, mask=masks.padding(lengths).dense(n, n)).output, ref, 1e-12, "reformer")


@pytest.mark.parametrize("causal", [False, True])
def test_reformer_chunk_groups_recomputed_in_backward_equal_one_group(causal, monkeypatch):
    """The LSH step holds one group of chunks at a time (its backward recomputes each group and
    adds its gradients into the slots it read, the wrapped-around chunk included): groups of one
    chunk give what one group of all the chunks gives, outputs and gradients, with padding."""
    import importlib

    reformer = importlib.import_module("attnlab.efficient.reformer")
    x = torch.randn(2, 70, E, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    pad = masks.padding([70, 52])
    results = []
    for group in (1 << 30, 1):
        monkeypatch.setattr(reformer, "GROUP_ELEMENTS", group)
        m = like(dense_layer(), "reformer", num_buckets=4, num_hashes=2, chunk_size=8, seed=0, causal=causal)
        results.append(grads(m, x, pad))
    (out, g), (out1, g1) = results
    assert_close_rel(out1, out, 1e-12, "output")
    for a, r in zip(g1, g):
        assert_close_rel(a, r, 1e-12, "gradient")


def test_reformer_error_shrinks_with_more_hash_rounds():
    dense = dense_layer()
    x = 4 * torch.randn(1, 256, E, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    exact = like(dense, "reformer", num_buckets=1, num_hashes=1, chunk_size=256)(x).output
    errs = []
    for rounds in (1, 4, 8):
        out = like(dense, "reformer", num_buckets=4, num_hashes=rounds, chunk_size=32, seed=0)(x).output
        errs.append(((out - exact).norm() / exact.norm()).item())
    assert errs[0] > errs[1] > errs[2]


@pytest.mark.parametrize("name", ["local", "longformer", "bigbird"])
@pytest.mark.parametrize("causal", [False, True])
def test_sparse_patterns_equal_dense_attention_under_the_same_mask(name, causal):
    dense = dense_layer()
    opts = {"window": 3, "block": 4}
    if name != "local":
        opts["global_tokens"] = [0, 9, 30]
    if name == "bigbird":
        opts["random_blocks"] = 2
    m = like(dense, name, causal=causal, **opts)
    n = 37
    pattern = m.step.pattern(n) if name != "local" else masks.window(3, causal=causal).dense(n)
    if name == "bigbird":  # the random blocks do add pairs beyond window and globals
        longformer = like(dense, "longformer", causal=causal, window=3, block=4, global_tokens=[0, 9, 30])
        assert pattern.sum() > longformer.step.pattern(n).sum()
    x = torch.randn(2, n, E, dtype=torch.float64)
    pad = masks.padding(torch.tensor([n, 20])).dense(n, n)
    out, g = grads(m, x, pad)
    ref, g_ref = grads(dense, x, masks.and_masks(pattern, pad))
    assert_close_rel(out, ref, 1e-10, name)
    for a, r in zip(g, g_ref):
        assert_close_rel(a, r, 1e-9, f"{name} gradient")


def test_linear_attention_equals_its_formula_and_its_rnn_form():
    dense = dense_layer()
    m = like(dense, "linear", eps=0.0)
    x = torch.randn(2, 30, E, dtype=torch.float64)
    q = m.q_proj(x).view(2, 30, H, 4).transpose(1, 2)
    k = m.k_proj(x).view(2, 30, H, 4).transpose(1, 2)
    v = m.v_proj(x).view(2, 30, H, 4).transpose(1, 2)
    a = (F.elu(q) + 1) @ (F.elu(k) + 1).transpose(-2, -1)
    for causal in (False, True):
        aa = a.tril() if causal else a
        ref = m.out_proj(((aa / aa.sum(-1, keepdim=True)) @ v).transpose(1, 2).reshape(2, 30, E))
        m.step.causal = causal
        assert_close_rel(m(x).output, ref, 1e-12, f"linear causal={causal}")


def test_linear_recurrent_mode_equals_the_parallel_causal_mode_over_512_steps():
    torch.manual_seed(0)
    m = efficient.create("linear", embed_dim=32, num_heads=4, causal=True, positional="rope")
    x = torch.randn(2, 512, 32)
    parallel = m(x).output
    cache = m.new_cache()  # the recurrent state (S, z): one token at a time, constant size
    outs = [m(x[:, t : t + 1], cache=cache).output for t in range(512)]
    assert cache.seen == 512
    assert (torch.cat(outs, 1) - parallel).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="causal=True"):
        efficient.create("linear", embed_dim=32, num_heads=4).new_cache()
    with pytest.raises(ValueError, match=r"\(B, N, 32\)"):
        m(x[:, 0], cache=m.new_cache())


def test_kernel_attention_causal_chunks_equal_the_quadratic_form():
    g = torch.Generator().manual_seed(0)
    pq, pk = torch.rand(1, 2, 300, 5, generator=g, dtype=torch.float64), torch.rand(1, 2, 300, 5, generator=g, dtype=torch.float64)
    v = torch.randn(1, 2, 300, 3, generator=g, dtype=torch.float64)
    a = (pq @ pk.transpose(-2, -1)).tril()
    ref = (a / a.sum(-1, keepdim=True)) @ v
    for chunk in (1, 7, 128, 512):
        assert_close_rel(kernel_attention(pq, pk, v, causal=True, eps=0.0, chunk=chunk), ref, 1e-12, f"chunk {chunk}")


def test_performer_kernel_estimate_error_shrinks_with_more_features():
    g = torch.Generator().manual_seed(0)
    d = 16
    q = 0.5 * torch.randn(1, 1, 64, d, generator=g, dtype=torch.float64)
    k = 0.5 * torch.randn(1, 1, 64, d, generator=g, dtype=torch.float64)
    exact = (q @ k.transpose(-2, -1) / math.sqrt(d)).softmax(-1)
    errs = []
    for nf in (16, 64, 256, 1024, 4096):
        e = 0.0
        for seed in range(5):
            w = orthogonal_gaussian(nf, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
            a = favor_features(q, w, is_query=True) @ favor_features(k, w, is_query=False).transpose(-2, -1)
            e += ((a / a.sum(-1, keepdim=True) - exact).norm() / exact.norm()).item() / 5
        errs.append(e)
    assert all(a > b for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < 0.35 * errs[1]  # Monte Carlo: ~1/sqrt(F), 64x the features -> ~1/8 the error


def test_orthogonal_features_are_orthogonal_within_blocks_with_gaussian_norms():
    w = orthogonal_gaussian(40, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    blk = w[:16] / w[:16].norm(dim=-1, keepdim=True)
    assert torch.allclose(blk @ blk.T, torch.eye(16, dtype=torch.float64), atol=1e-12)
    norms = orthogonal_gaussian(4096, 16, generator=torch.Generator().manual_seed(1), dtype=torch.float64).norm(dim=-1)
    assert abs(norms.square().mean().item() - 16) < 0.6  # E|g|^2 = D for Gaussian rows


def test_performer_redraws_features_in_training_only():
    m = efficient.create("performer", embed_dim=E, num_heads=H, redraw_interval=2, seed=0)
    x = torch.randn(1, 5, E)
    first = m.step.features.clone()
    m.eval()
    for _ in range(3):
        m(x)
    assert torch.equal(m.step.features, first)
    m.train()
    m(x)
    m(x)
    assert torch.equal(m.step.features, first)
    m(x)  # the third training call redraws
    assert not torch.equal(m.step.features, first)


def test_iterative_pinv_converges_to_the_pseudo_inverse():
    a = torch.randn(3, 8, 8, dtype=torch.float64).softmax(-1)
    exact = torch.linalg.pinv(a)
    e6 = (iterative_pinv(a, 6) - exact).norm() / exact.norm()
    e20 = (iterative_pinv(a, 20) - exact).norm() / exact.norm()
    assert e20 < 1e-8 and e20 < e6


@pytest.mark.parametrize("name", VARIANTS)
def test_padding_with_nan_does_not_leak(name):
    opts = {"max_len": 32} if name == "linformer" else {}
    torch.manual_seed(0)
    m = efficient.create(name, embed_dim=E, num_heads=H, **opts).double()
    if name in ("performer", "reformer"):
        m.step.seed = 0
    x = torch.randn(2, 20, E, dtype=torch.float64)
    x[1, 12:] = float("nan")
    out = m(x, mask=masks.padding(torch.tensor([20, 12])).dense(20, 20)).output
    assert torch.isfinite(out[:, :12]).all() and torch.isfinite(out[0]).all()
    empty = m(x[:, :0]).output
    assert empty.shape == (2, 0, E)


@pytest.mark.parametrize("name", APPROXIMATIONS)
def test_what_a_variant_cannot_do_raises(name):
    opts = {"max_len": 32} if name == "linformer" else {}
    m = efficient.create(name, embed_dim=E, num_heads=H, **opts)
    x = torch.randn(1, 10, E)
    with pytest.raises(ValueError, match="key-padding masks only.*causal=True"):
        m(x, mask=masks.causal().dense(10))
    with pytest.raises(ValueError, match="never builds the N x M weights"):
        m(x, return_weights=True)
    with pytest.raises(ValueError, match="cannot add a score bias"):
        m(x, bias=torch.zeros(10, 10))
    with pytest.raises(ValueError, match="rope or an input encoding"):
        efficient.create(name, embed_dim=E, num_heads=H, positional="alibi", **opts)
    if name in ("linformer", "nystrom"):
        with pytest.raises(ValueError, match="cannot be causal"):
            efficient.create(name, embed_dim=E, num_heads=H, causal=True, **opts)
    else:
        efficient.create(name, embed_dim=E, num_heads=H, causal=True, **opts)(x)


@pytest.mark.parametrize("name", PATTERNS)
def test_a_sparse_pattern_is_exact_attention_under_any_mask_bias_and_encoding(name):
    """What the approximations refuse, the patterns do: they are dense attention restricted to
    their pattern (block-sparse), so a causal mask, a score bias, a bias encoding and the weights
    all work, and equal the dense layer under pattern & mask."""
    opts = {"window": 3, "block": 4} | ({} if name == "local" else {"global_tokens": [0, 9]})
    n = 21
    x = torch.randn(2, n, E, dtype=torch.float64)
    bias = torch.randn(1, H, n, n, dtype=torch.float64)
    for pe in (None, "alibi"):
        torch.manual_seed(0)
        dense = efficient.create("dense", embed_dim=E, num_heads=H, positional=pe).double()
        m = efficient.create(name, embed_dim=E, num_heads=H, positional=pe, **opts).double()
        m.load_state_dict(dense.state_dict())
        allowed = m.step.pattern(n) & masks.causal().dense(n)
        got = m(x, mask=masks.causal(), bias=bias, return_weights=True)
        want = dense(x, mask=allowed, bias=bias, return_weights=True)
        assert_close_rel(got.output, want.output, 1e-10, f"{name} {pe} output")
        assert_close_rel(got.weights, want.weights, 1e-10, f"{name} {pe} weights")
        assert bool((got.weights[:, :, ~allowed] == 0).all())  # nothing outside the pattern


def test_variant_specific_errors():
    with pytest.raises(ValueError, match="pass max_len"):
        efficient.create("linformer", embed_dim=E, num_heads=H)
    lf = efficient.create("linformer", embed_dim=E, num_heads=H, max_len=8, k=4)
    lf(torch.randn(1, 5, E))  # shorter than max_len: fine
    with pytest.raises(ValueError, match="max_len=8, got 9 keys"):
        lf(torch.randn(1, 9, E))
    with pytest.raises(ValueError, match="window must be an int >= 0"):
        efficient.create("local", embed_dim=E, num_heads=H, window=-1)
    with pytest.raises(ValueError, match="num_buckets must be 1 or even"):
        efficient.create("reformer", embed_dim=E, num_heads=H, num_buckets=3)
    with pytest.raises(ValueError, match="landmarks"):
        efficient.create("nystrom", embed_dim=E, num_heads=H, landmarks=0)
    with pytest.raises(ValueError, match="global token positions must be >= 0"):
        efficient.create("longformer", embed_dim=E, num_heads=H, global_tokens=[-1])
    with pytest.raises(ValueError, match="as many keys as queries"):
        efficient.create("local", embed_dim=E, num_heads=H)(torch.randn(1, 4, E), torch.randn(1, 6, E))


@pytest.mark.parametrize("name", ["linear", "performer"])
@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_kernel_attention_equals_the_whole_computation(name, chunk):
    """The chunked autograd function (features recomputed chunk by chunk) = plain autograd."""
    from attnlab.efficient.kernel import chunked_kernel_attention
    from attnlab.efficient.linear import _EluMap
    from attnlab.efficient.performer import _FavorMap

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, H, 50, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    valid = torch.ones(2, 50, dtype=torch.bool)
    valid[1, 31:] = False
    w = orthogonal_gaussian(32, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    fmap = _EluMap() if name == "linear" else _FavorMap(w)
    out = chunked_kernel_attention(fmap, q, k, v, valid=valid, eps=0.0, chunk=chunk)
    grads = torch.autograd.grad(out.square().sum(), [q, k, v])
    # the same attention with whole feature tensors under plain autograd
    if name == "linear":
        pq, pk = F.elu(q) + 1, F.elu(k) + 1
    else:
        pq, pk = favor_features(q, w, is_query=True), favor_features(k, w, is_query=False)
    ref = kernel_attention(pq, pk * valid[:, None, :, None], v, eps=0.0)  # the stabilisers differ: compare without eps
    ref_grads = torch.autograd.grad(ref.square().sum(), [q, k, v])
    assert_close_rel(out, ref, 1e-10, f"{name} chunk {chunk}")
    for a, r in zip(grads, ref_grads):
        assert_close_rel(a, r, 1e-9, f"{name} chunk {chunk} gradient")


def test_lsh_buckets_hash_by_the_nearest_rotated_axis():
    from attnlab.efficient import lsh_buckets

    rot = torch.eye(2, dtype=torch.float64)[None]  # one round, 4 buckets: +x, +y, -x, -y
    x = torch.tensor([[3.0, 1.0], [0.2, 2.0], [-5.0, 1.0], [0.1, -0.4]], dtype=torch.float64)[None, None]
    assert lsh_buckets(x, rot).tolist() == [[[[0, 1, 2, 3]]]]
    assert torch.equal(lsh_buckets(7 * x, rot), lsh_buckets(x, rot))  # angular: scale does not matter
    with pytest.raises(ValueError, match=r"rotations must have shape \(R, 2, buckets/2\)"):
        lsh_buckets(x, torch.eye(2))
