"""The gated linear-attention family (retnet, gla, deltanet, gated_deltanet, mamba2): parallel =
chunkwise = recurrent in float64 (outputs and gradients), decoding with the cache equals the full
forward at constant memory, agreement with fla's reference implementations, errors."""

import functools
import importlib.util
import math
import pathlib
import types

import pytest
import torch
import torch.nn.functional as F

from attnlab import efficient, masks
from attnlab.efficient import recurrence
from tests.helpers import assert_close_rel

GATED = ["retnet", "gla", "deltanet", "gated_deltanet", "mamba2"]
E, H = 32, 4


def inputs(n=45, d=5, dv=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, dtype=torch.float64, generator=g)  # noqa: E731
    q, k, v = r(2, 3, n, d), F.normalize(r(2, 3, n, d), dim=-1), r(2, 3, n, dv)
    return {"q": q, "k": k, "v": v, "beta": torch.rand(2, 3, n, dtype=torch.float64, generator=g),
            "g_head": -0.5 * torch.rand(2, 3, n, dtype=torch.float64, generator=g),
            "g_channel": -0.5 * torch.rand(2, 3, n, d, dtype=torch.float64, generator=g), "s0": r(2, 3, d, dv)}


CASES = [("gated", None), ("gated", "g_head"), ("gated", "g_channel"), ("delta", None), ("delta", "g_head"), ("delta", "g_channel")]


def run(family, form, x, gate, state, chunk=None):
    fn = getattr(recurrence, f"{form}_{family}")
    extra = {"chunk": chunk} if form == "chunk" else {}
    args = (x["q"], x["k"], x["v"]) + ((x["beta"],) if family == "delta" else ()) + (None if gate is None else x[gate],)
    return fn(*args, state=state, **extra)


@pytest.mark.parametrize("family,gate", CASES)
@pytest.mark.parametrize("with_state", [False, True])
def test_parallel_chunkwise_and_recurrent_forms_are_equal_with_gradients(family, gate, with_state):
    x = {k: t.clone().requires_grad_(True) for k, t in inputs().items()}
    names = ["q", "k", "v", "s0"] + (["beta"] if family == "delta" else []) + ([gate] if gate else [])
    results = []
    for form, chunk in [("recurrent", None), ("parallel", None), ("chunk", 1), ("chunk", 7), ("chunk", 16), ("chunk", 64)]:
        out, final = run(family, form, x, gate, x["s0"] if with_state else None, chunk)
        probe = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
        loss = (out * probe).sum() + final.square().sum()
        grads = torch.autograd.grad(loss, [x[n] for n in names], allow_unused=True)
        results.append((form, chunk, out.detach(), final.detach(), grads))
    _, _, ref_out, ref_final, ref_grads = results[0]
    for form, chunk, out, final, grads in results[1:]:
        assert_close_rel(out, ref_out, 1e-10, f"{form} {chunk} output")
        assert_close_rel(final, ref_final, 1e-10, f"{form} {chunk} final state")
        for name, g, r in zip(names, grads, ref_grads):
            if r is not None:
                assert_close_rel(g, r, 1e-10, f"{form} {chunk} gradient of {name}")


def layer(name, **options):
    torch.manual_seed(0)
    return efficient.create(name, embed_dim=E, num_heads=H, **options).double()


@pytest.mark.parametrize("name", GATED)
@pytest.mark.parametrize("causal", [True, False])
def test_every_gated_layer_computes_the_same_in_its_three_forms(name, causal):
    m = layer(name, causal=causal, chunk=8)
    x = torch.randn(2, 29, E, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    results = []
    for mode in ("recurrent", "parallel", "chunk"):
        m.mode = mode
        xi = x.clone().requires_grad_(True)
        out = m(xi).output
        params = [p for _, p in m.named_parameters()]
        grads = torch.autograd.grad(out.square().sum(), [xi, *params])
        results.append((out.detach(), grads))
    for out, grads in results[1:]:
        assert_close_rel(out, results[0][0], 1e-10, f"{name} output")
        for (pname, _), g, r in zip([("x", None), *m.named_parameters()], grads, results[0][1]):
            assert_close_rel(g, r, 1e-10, f"{name} gradient of {pname}")


def test_a_causal_layer_does_not_see_the_future_and_a_bidirectional_one_does():
    for name in GATED:
        x = torch.randn(1, 12, E, dtype=torch.float64)
        y = x.clone()
        y[0, 8] += 1.0
        causal, both = layer(name, causal=True), layer(name)
        assert torch.equal(causal(x).output[0, :8], causal(y).output[0, :8]), name
        assert (both(x).output[0, :8] - both(y).output[0, :8]).abs().max() > 1e-6, name


@pytest.mark.parametrize("name", GATED)
def test_decoding_500_tokens_with_the_cache_equals_the_full_forward_at_constant_memory(name):
    m = layer(name, causal=True, positional="rope")
    x = torch.randn(2, 500, E, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    full = m(x).output
    cache = m.new_cache()
    outs = [m(x[:, :37], cache=cache).output]  # a prefill (chunkwise, from the empty state), then one token at a time
    sizes = set()
    for t in range(37, 500):
        outs.append(m(x[:, t : t + 1], cache=cache).output)
        sizes.add(cache.nbytes())
    assert_close_rel(torch.cat(outs, 1), full, 1e-10, f"{name} decoded")
    assert len(sizes) == 1 and cache.seen == 500
    state = 2 * H * (E // H) ** 2 * 8  # the D x Dv state per head, float64
    conv = 2 * (m.conv_size - 1) * 3 * E * 8 if m.conv_size else 0
    assert sizes == {state + conv}


@pytest.mark.parametrize("name", GATED)
def test_key_padding_anywhere_and_packed_documents(name):
    """Padding anywhere for the recurrence alone; at the end of the row with a short convolution,
    whose window counts positions (left padding: tests/models/test_lm.py's padded batches)."""
    m = layer(name, causal=True)
    x = torch.randn(1, 10, E, dtype=torch.float64)
    at = 10 if m.conv_size else 4
    gap = torch.cat([x[:, :at], torch.full((1, 3, E), float("nan"), dtype=torch.float64), x[:, at:]], 1)
    flags = torch.tensor([[True] * at + [False] * 3 + [True] * (10 - at)])
    for mode in ("chunk", "recurrent"):
        m.mode = mode
        assert_close_rel(m(gap, mask=flags).output[:, flags[0]], m(x).output, 1e-10, f"padding ({mode})")
    docs = masks.Documents([[4, 6]], causal=True)
    packed = m(x, mask=docs).output
    assert_close_rel(packed, torch.cat([m(x[:, :4]).output, m(x[:, 4:]).output], 1), 1e-12, "documents")


def test_grouped_heads_share_keys_and_values():
    m = layer("gated_deltanet", causal=True, num_kv_heads=2)
    assert m.k_proj.out_features == E // 2
    x = torch.randn(2, 20, E, dtype=torch.float64)
    ref = m(x).output
    m.mode = "recurrent"
    assert_close_rel(m(x).output, ref, 1e-10, "grouped")


def test_bfloat16_autocast_trains_close_to_float32():
    for name in GATED:
        m = layer(name, causal=True).float()
        x = torch.randn(2, 200, E, generator=torch.Generator().manual_seed(5))
        ref = m(x).output
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = m(x).output
        out.float().square().sum().backward()
        assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None), name
        assert (out.float() - ref).norm() / ref.norm() < 0.05, name


def test_errors_name_what_was_expected():
    with pytest.raises(ValueError, match="mode must be one of 'chunk', 'parallel', 'recurrent'"):
        layer("gla", mode="fast")
    with pytest.raises(ValueError, match="chunk must be a positive int"):
        layer("retnet", chunk=0)
    with pytest.raises(ValueError, match="conv_size must be an int >= 0"):
        layer("deltanet", conv_size=-1)
    m = layer("deltanet")
    x = torch.randn(1, 5, E, dtype=torch.float64)
    with pytest.raises(ValueError, match="cached decoding needs a causal"):
        m.new_cache()
    with pytest.raises(ValueError, match="self-attention: pass neither key nor value"):
        m(x, x, x)
    with pytest.raises(ValueError, match="key-padding masks only"):
        m(x, mask=masks.window(2))
    c = layer("deltanet", causal=True)
    with pytest.raises(ValueError, match="decodes with the cache its new_cache"):
        c(x, cache=layer("local", causal=True, window=2).new_cache())
    with pytest.raises(ValueError, match="pass no window, sinks or positions"):
        c.new_cache(window=4)
    with pytest.raises(ValueError, match="key_positions must equal positions"):
        c(x, positions=torch.arange(5), key_positions=torch.arange(1, 6))


# ---------------------------------------------------------------- fla's reference implementations
def fla_naive(family: str) -> types.ModuleType:
    """fla's ``fla/ops/<family>/naive.py`` (fla-core on PyPI), loaded by path (its package
    imports Triton, which does not run on a CPU), with its float32 casts made float64 so that
    agreement is checked at float64 precision; nothing else of its code is changed."""
    spec = importlib.util.find_spec("fla")
    if spec is None:
        pytest.skip("fla-core is not installed (pip install -e '.[dev]')")
    source = (pathlib.Path(spec.submodule_search_locations[0]) / "ops" / family / "naive.py").read_text()
    for old, new in [(".float()", ".double()"), ("torch.float32", "torch.float64"), ("dtype=torch.float)", "dtype=torch.float64)"),
                     ("dtype=torch.float,", "dtype=torch.float64,"),
                     (".to(torch.float)", ".to(torch.float64)"), ("dtype=torch.float, device", "dtype=torch.float64, device")]:
        source = source.replace(old, new)
    module = types.ModuleType(f"fla_naive_{family}")
    exec(compile(source, f"fla/ops/{family}/naive.py", "exec"), module.__dict__)
    return module


def bthd(t):
    return t.transpose(1, 2).contiguous()


def test_retention_equals_fla_naive_retention():
    x = inputs(n=33)
    q, k, v = x["q"], x["k"], x["v"]
    ref = fla_naive("retention").naive_retention(q, k, v)
    log_decay = efficient.retention_decays(q.shape[1]).log()[None, :, None].expand(2, -1, 33)
    out, _ = recurrence.chunk_gated(q * q.shape[-1] ** -0.5, k, v, log_decay, chunk=8)
    assert_close_rel(out, ref, 1e-10, "retention")


def test_scalar_decay_equals_fla_simple_gla_the_form_of_mamba2():
    x = inputs(n=33)
    q, k, v, g, s0 = x["q"], x["k"], x["v"], x["g_head"], x["s0"]
    ref, ref_s = fla_naive("simple_gla").naive_recurrent_simple_gla(bthd(q), bthd(k), bthd(v), bthd(g), scale=1.0,
                                                                   initial_state=s0, output_final_state=True)
    out, s = recurrence.chunk_gated(q, k, v, g, chunk=8, state=s0)
    assert_close_rel(out, bthd(ref), 1e-10, "simple gla")
    assert_close_rel(s, ref_s, 1e-10, "simple gla state")


def test_channel_decay_equals_fla_naive_recurrent_gla():
    x = inputs(n=33)
    q, k, v, g, s0 = x["q"], x["k"], x["v"], x["g_channel"], x["s0"]
    ref, ref_s = fla_naive("gla").naive_recurrent_gla(bthd(q), bthd(k), bthd(v), bthd(g), initial_state=s0, output_final_state=True)
    out, s = recurrence.chunk_gated(q * q.shape[-1] ** -0.5, k, v, g, chunk=8, state=s0)  # fla scales q inside
    assert_close_rel(out, bthd(ref), 1e-10, "gla")
    assert_close_rel(s, ref_s, 1e-10, "gla state")


def test_delta_rule_equals_fla_delta_rule_recurrence():
    x = inputs(n=33)
    q, k, v, beta, s0 = x["q"], x["k"], x["v"], x["beta"], x["s0"]
    ref, ref_s = fla_naive("delta_rule").delta_rule_recurrence(q, k, v, beta, initial_state=s0, output_final_state=True)
    out, s = recurrence.chunk_delta(q * q.shape[-1] ** -0.5, k, v, beta, chunk=8, state=s0)
    assert_close_rel(out, ref, 1e-10, "delta rule")
    assert_close_rel(s, ref_s, 1e-10, "delta rule state")


def test_gated_delta_rule_equals_fla_naive_recurrent_gated_delta_rule():
    x = inputs(n=33)
    q, k, v, beta, g, s0 = x["q"], x["k"], x["v"], x["beta"], x["g_head"], x["s0"]
    ref, ref_s = fla_naive("gated_delta_rule").naive_recurrent_gated_delta_rule(
        bthd(q), bthd(k), bthd(v), bthd(beta), bthd(g), scale=1.0, initial_state=s0, output_final_state=True)
    out, s = recurrence.chunk_delta(q, k, v, beta, g, chunk=8, state=s0)
    assert_close_rel(out, bthd(ref), 1e-10, "gated delta rule")
    assert_close_rel(s, ref_s, 1e-10, "gated delta rule state")


@pytest.mark.parametrize("form", ["recurrent", "chunk"])
def test_per_channel_delta_rule_equals_fla_naive_kda(form):
    """Kimi Delta Attention: the gated delta rule with a decay per key channel."""
    x = inputs(n=48)  # fla's chunk reference takes whole chunks of 16
    q, k, v, beta, g, s0 = x["q"], x["k"], x["v"], x["beta"], x["g_channel"], x["s0"]
    naive = fla_naive("kda")
    ref_fn = naive.naive_recurrent_kda if form == "recurrent" else functools.partial(naive.naive_chunk_kda, chunk_size=16)
    ref, ref_s = ref_fn(bthd(q), bthd(k), bthd(v), bthd(g), bthd(beta), scale=1.0, initial_state=s0, output_final_state=True)
    out, s = recurrence.chunk_delta(q, k, v, beta, g, chunk=8, state=s0)
    assert_close_rel(out, bthd(ref), 1e-10, f"kda ({form} reference)")
    assert_close_rel(s, ref_s, 1e-10, f"kda state ({form} reference)")


def test_mamba2_layer_equals_the_papers_recurrence_written_as_a_loop():
    """fla has no reference for Mamba-2 on a CPU: the SSD layer's equations (Dao & Gu 2024,
    section 7) as a float64 loop over the layer's own parameters."""
    m = layer("mamba2", causal=True)
    x = torch.randn(2, 17, E, dtype=torch.float64)
    b, n, d = 2, 17, E // H
    proj = torch.cat([m.q_proj(x), m.k_proj(x), m.v_proj(x)], -1)  # C, B, x
    conv = F.silu(F.conv1d(F.pad(proj.transpose(1, 2), (3, 0)), m.conv.weight, groups=3 * E)).transpose(1, 2)
    c, bk, xv = (t.view(b, n, H, d) for t in conv.split(E, -1))
    dt = F.softplus(m.dt_proj(x) + m.dt_bias)  # (B, N, H)
    a = -m.log_rate.exp()
    h = torch.zeros(b, H, d, d, dtype=torch.float64)
    ys = []
    for t in range(n):
        h = (torch.exp(dt[:, t, :, None, None] * a[:, None, None]) * h
             + dt[:, t, :, None, None] * bk[:, t, :, :, None] * xv[:, t, :, None, :])
        ys.append(torch.einsum("bhd,bhde->bhe", c[:, t], h) + m.skip[:, None] * xv[:, t])
    y = torch.stack(ys, 2)  # (B, H, N, D)
    z = F.silu(m.out_norm.gate(x)).view(b, n, H, d).transpose(1, 2)
    y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + 1e-6) * m.out_norm.norm.weight * z
    ref = m.out_proj(y.transpose(1, 2).reshape(b, n, E))
    assert_close_rel(m(x).output, ref, 1e-10, "mamba2")


def test_a_strong_per_channel_decay_stays_finite_in_float32():
    """GLA's factored chunk scores: e^-G_j grows with a chunk's decay; chunks of CHANNEL_CHUNK keep
    it in float32's range where one chunk of 150 positions at a decay of e^-3 a step would not."""
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 2, 150, 8, generator=g) for _ in range(3))
    decay = torch.full((1, 2, 150, 8), -3.0)
    decay[..., ::2] = -0.01
    ref, _ = recurrence.recurrent_gated(q.double(), k.double(), v.double(), decay.double())
    out, _ = recurrence.chunk_gated(q, k, v, decay, chunk=150)
    assert torch.exp(torch.tensor(3.0 * 150 / 2)).isinf()  # what a single chunk of 150 would have to hold
    assert_close_rel(out.double(), ref, 1e-5, "float32, strong decay")


def test_the_forms_name_inputs_that_do_not_fit():
    x = inputs(n=6)
    q, k, v, beta = x["q"], x["k"], x["v"], x["beta"]
    for fn in (recurrence.recurrent_gated, recurrence.parallel_gated, recurrence.chunk_gated):
        with pytest.raises(ValueError, match=r"k must have q's shape \(B, H, N, D\) = \(2, 3, 6, 5\)"):
            fn(q, k[..., :4], v)
        with pytest.raises(ValueError, match=r"g \(the log decay\) must have shape \(B, H, N\) = \(2, 3, 6\) or"):
            fn(q, k, v, x["g_head"][..., :5])
        with pytest.raises(ValueError, match=r"state must have shape \(B, H, D, Dv\) = \(2, 3, 5, 4\), got \(2, 3, 4, 4\)"):
            fn(q, k, v, state=x["s0"][:, :, :4])
    for fn in (recurrence.recurrent_delta, recurrence.parallel_delta, recurrence.chunk_delta):
        with pytest.raises(ValueError, match=r"beta must have shape \(B, H, N\) = \(2, 3, 6\), got \(2, 3\)"):
            fn(q, k, v, beta[..., 0])
        with pytest.raises(ValueError, match=r"\(B, H, N\) = \(2, 3, 6\) or \(B, H, N, D\) = \(2, 3, 6, 5\), got \(2, 3, 6, 4\)"):
            fn(q, k, v, beta, x["g_channel"][..., :4])  # the delta rule's decay is one per head or per channel (KDA)
    with pytest.raises(ValueError, match=r"q, k, v must be \(B, H, N, D\) tensors"):
        recurrence.chunk_gated(q[0], k, v)
    with pytest.raises(ValueError, match="chunk must be a positive int, got 0"):
        recurrence.chunk_delta(q, k, v, beta, chunk=0)


def test_the_cache_follows_reordered_rows():
    """Beam search keeps some rows of the cache: decoding on from them equals the full forward of
    those rows."""
    m = layer("mamba2", causal=True)
    x = torch.randn(3, 12, E, dtype=torch.float64)
    cache = m.new_cache()
    m(x[:, :7], cache=cache)
    order = torch.tensor([2, 0])
    cache.reorder(order)
    out = torch.cat([m(x[order, t : t + 1], cache=cache).output for t in range(7, 12)], 1)
    assert_close_rel(out, m(x[order]).output[:, 7:], 1e-10, "reordered")
    cache.reset()
    assert cache.nbytes() == 0 and cache.seen == 0


def test_time_step_initialisation_inverts_softplus():
    from attnlab.efficient.gated import inverse_softplus, time_step_bias

    x = torch.tensor([1e-3, 0.05, 0.1, 2.0], dtype=torch.float64)
    torch.testing.assert_close(F.softplus(inverse_softplus(x)), x, rtol=1e-12, atol=0)
    torch.manual_seed(0)
    dt = F.softplus(time_step_bias(1000).double())
    assert 1e-3 <= dt.min() < 2e-3 and 0.05 < dt.max() <= 0.1  # log-uniform over [1e-3, 0.1]
    assert abs(dt.log().mean().item() - (math.log(1e-3) + math.log(0.1)) / 2) < 0.1


@pytest.mark.parametrize("name", efficient.select(family="gated"))
def test_padding_between_real_tokens_warns_exactly_where_the_short_convolution_changes_the_output(name):
    """Key padding in the middle of a row: the variants with a short convolution warn once (their
    outputs after the gap differ from the row without it); the others equal that row, silently."""
    import warnings

    from attnlab.efficient.gated import PaddingInsideWarning

    torch.manual_seed(0)
    m = efficient.create(name, embed_dim=E, num_heads=H, causal=True).double().eval()
    x = torch.randn(1, 12, E, dtype=torch.float64)
    keep = torch.ones(1, 12, dtype=torch.bool)
    keep[0, 5:7] = False
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m(x, mask=masks.valid_keys(torch.arange(12)[None] < 9))  # padding at the end: no warning
        out = m(x, mask=masks.valid_keys(keep)).output[:, keep[0]]
        m(x, mask=masks.valid_keys(keep))  # once per layer: the second call says nothing
        alone = m(x[:, keep[0]]).output
    warned = [w for w in caught if issubclass(w.category, PaddingInsideWarning)]
    assert len(warned) == (m.conv is not None)
    if m.conv is None:
        assert (out - alone).abs().max() < 1e-12
    else:
        assert (out - alone).abs().max() > 1e-3 and "start or the end" in str(warned[0].message)
