"""The Forgetting Transformer's attention (``fox``): equal to its formula built by hand (outputs and
every gradient, the forget gate's included), to causal dense attention when the gates stay open,
unchanged by padding anywhere and by packing, decoding with its cache to the whole sequence's
outputs, listed by its capabilities, trainable in a language model, and refusing what it cannot do."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab import efficient, masks
from attnlab.efficient import ForgettingAttention
from attnlab.layers import ForgetKVCache, KVCache
from attnlab.layers.mixer import Tokens
from attnlab.models import Encoder, build_model
from attnlab.models.config import AttentionSpec, ModelConfig, PositionalSpec
from tests.helpers import assert_close_rel

E, H = 16, 4


def fox(causal=True, seed=0, gate_std=1.0, gate_bias=1.0, **options):
    """A float64 fox layer whose gates vary (the paper's initialisation keeps them near 1/2)."""
    torch.manual_seed(seed)
    m = efficient.create("fox", embed_dim=E, num_heads=H, causal=causal, **options).double()
    with torch.no_grad():
        m.fgate_proj.weight.normal_(0.0, gate_std)
        m.fgate_proj.bias.normal_(gate_bias, 1.0)
        for lin in (m.q_proj, m.k_proj, m.v_proj, m.out_proj):
            lin.bias.normal_()
    return m


def reference(m: ForgettingAttention, x: torch.Tensor) -> torch.Tensor:
    """FoX by hand: the (B, H, N, N) scores ``q k^T / sqrt(D) + c_i - c_j`` (``-|c_i - c_j|`` both
    ways when not causal), ``c = cumsum(logsigmoid(x w_f + b_f))``, causal -inf, softmax, @ v."""
    b, n, _ = x.shape
    g = m.num_kv_heads

    def heads(lin, count):
        return lin(x).view(b, n, count, -1).transpose(1, 2)

    q, k, v = heads(m.q_proj, H), heads(m.k_proj, g), heads(m.v_proj, g)
    k, v = k.repeat_interleave(H // g, 1), v.repeat_interleave(H // g, 1)
    c = F.logsigmoid(m.fgate_proj(x)).transpose(1, 2).cumsum(-1)  # (B, H, N)
    d = c[..., :, None] - c[..., None, :]  # c_i - c_j
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if m.causal:
        s = (s + d).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    else:
        s = s - d.abs()
    o = s.softmax(-1) @ v
    return m.out_proj(o.transpose(1, 2).reshape(b, n, E))


def all_grads(m, x, out, upstream):
    """Gradients of ``<out, upstream>`` w.r.t. the input and every parameter (gate included), by name."""
    named = [("input", x), *m.named_parameters()]
    got = torch.autograd.grad(out, [t for _, t in named], upstream)
    return dict(zip([n for n, _ in named], got))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [None, 2])
def test_fox_equals_the_hand_built_score_matrix_with_every_gradient(causal, kv_heads):
    n = 150  # three 64-wide tiles: the decay is gathered, and its gradient summed, tile by tile
    m = fox(causal=causal, num_kv_heads=kv_heads)
    x = torch.randn(2, n, E, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    out, ref = m(x).output, reference(m, x)
    assert_close_rel(out, ref, 1e-10, "output")
    upstream = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    got, want = all_grads(m, x, out, upstream), all_grads(m, x, ref, upstream)
    assert {"input", "fgate_proj.weight", "fgate_proj.bias", "q_proj.weight", "k_proj.weight", "v_proj.weight",
            "out_proj.weight"} <= set(got)
    for name in got:
        assert_close_rel(got[name], want[name], 1e-10, f"grad {name}")
    assert want["fgate_proj.weight"].abs().max() > 1e-3  # the gate's gradient is not trivially zero
    # the decay is not a no-op: dense attention under the same weights differs
    dense = efficient.create("dense", embed_dim=E, num_heads=H, num_kv_heads=kv_heads).double()
    dense.load_state_dict(m.state_dict(), strict=False)
    plain = dense(x, mask=masks.causal() if causal else None).output
    assert (plain - ref).abs().max() > 1e-2


@pytest.mark.parametrize("pe", [None, "rope", "alibi"])
def test_gates_held_open_give_causal_dense_attention(pe):
    """f -> 1 (gate weight 0, bias 30: log f = -9e-14 per token): the decay vanishes, and FoX is the
    causal dense layer with the same projections (rope applied by the mixer, alibi composed)."""
    n = 70
    torch.manual_seed(0)
    dense = efficient.create("dense", embed_dim=E, num_heads=H, positional=pe).double()
    m = efficient.create("fox", embed_dim=E, num_heads=H, causal=True, positional=pe).double()
    missing, unexpected = m.load_state_dict(dense.state_dict(), strict=False)
    assert set(missing) == {"fgate_proj.weight", "fgate_proj.bias"} and not unexpected
    with torch.no_grad():
        m.fgate_proj.weight.zero_()
        m.fgate_proj.bias.fill_(30.0)
    x = torch.randn(2, n, E, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    out, ref = m(x).output, dense(x, mask=masks.causal()).output
    assert_close_rel(out, ref, 1e-10, f"fox {pe} output")
    upstream = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    got = torch.autograd.grad(out, [x, m.q_proj.weight, m.k_proj.weight, m.v_proj.weight, m.out_proj.weight], upstream)
    want = torch.autograd.grad(ref, [x, dense.q_proj.weight, dense.k_proj.weight, dense.v_proj.weight, dense.out_proj.weight], upstream)
    for what, a, r in zip(["input", "q", "k", "v", "out"], got, want):
        assert_close_rel(a, r, 1e-10, f"fox {pe} grad {what}")
    with torch.no_grad():
        m.fgate_proj.bias.fill_(0.0)  # f = 1/2: forgetting, far from dense
    assert (m(x).output - ref).abs().max() > 1e-2


@pytest.mark.parametrize("causal", [True, False])
def test_padding_anywhere_holds_nan_and_does_not_forget(causal):
    """Padded tokens (here between real ones, and after them) hold NaN; the real tokens' outputs
    and input gradients equal the sequence without the padding: a padded token does not forget."""
    m = fox(causal=causal)
    n, g = 40, torch.Generator().manual_seed(5)
    real = torch.ones(2, n, dtype=torch.bool)
    real[0, 10:17] = False  # a hole between real tokens
    real[1, 31:] = False  # right padding
    x = torch.randn(2, n, E, dtype=torch.float64, generator=g)
    x[~real] = float("nan")
    xb = x.clone().requires_grad_(True)
    out = m(xb, mask=masks.valid_keys(real)).output
    upstream = torch.randn(out.shape, dtype=torch.float64, generator=g).masked_fill(~real[..., None], 0.0)
    (out * upstream).sum().backward()
    for p in m.parameters():
        assert torch.isfinite(p.grad).all()
    for row in range(2):
        xa = x[row : row + 1, real[row]].clone().requires_grad_(True)
        alone = m(xa).output
        (alone * upstream[row : row + 1, real[row]]).sum().backward()
        assert_close_rel(out[row, real[row]].detach(), alone[0].detach(), 1e-10, f"row {row} output")
        assert_close_rel(xb.grad[row, real[row]], xa.grad[0], 1e-10, f"row {row} input gradient")
    assert torch.isfinite(out[real]).all()


@pytest.mark.parametrize("causal", [True, False])
def test_packed_documents_each_equal_the_document_alone(causal):
    lengths = [5, 9, 4]
    m = fox(causal=causal)
    x = torch.randn(1, 21, E, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    x[:, 18:] = float("nan")  # the row's padding after its documents
    out = m(x, mask=masks.Documents([lengths], causal=causal)).output
    start = 0
    for k in lengths:
        assert_close_rel(out[:, start : start + k], m(x[:, start : start + k]).output, 1e-10, f"document at {start}")
        start += k


def test_weights_are_returned_and_are_the_formula_s():
    m = fox(causal=True)
    x = torch.randn(2, 12, E, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    res = m(x, return_weights=True)
    b, n = 2, 12
    q = m.q_proj(x).view(b, n, H, -1).transpose(1, 2)
    k = m.k_proj(x).view(b, n, H, -1).transpose(1, 2)
    c = F.logsigmoid(m.fgate_proj(x)).transpose(1, 2).cumsum(-1)
    s = (q @ k.transpose(-1, -2) / math.sqrt(E // H) + c[..., :, None] - c[..., None, :])
    want = s.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    assert_close_rel(res.weights, want, 1e-12, "weights")
    assert_close_rel(res.output, reference(m, x), 1e-10, "output with weights")


def test_fox_is_listed_by_its_capabilities_and_created_by_name():
    caps = efficient.capabilities("fox")
    assert (caps.causal, caps.cache, caps.mixer, caps.forms_scores, caps.masks) == ("option", "forget", True, True, "any")
    assert "fox" in efficient.select(causal=True) and "fox" in efficient.select(mixer=True)
    assert "fox" in efficient.select(forms_scores=True) and "fox" in efficient.select(family="gated softmax")
    assert "fox" in efficient.select(causal=True, decodes=True) and "fox" not in efficient.select(exact=True)
    assert "fox" in efficient.names() and efficient.budget("fox").sweep is None
    from attnlab.studies.recall import default_variants, state_floats

    assert "fox" in default_variants()  # by its declaration: input-gated, causal, and it decodes
    assert state_floats("fox", 32, 4, 48) == state_floats("dense", 32, 4, 48) + 4 * 48  # dense's keys and values, one c per head and token
    m = efficient.create("fox", embed_dim=E, num_heads=H)
    assert isinstance(m, ForgettingAttention) and m.causal is False and m.fgate_proj.weight.shape == (H, E)
    assert abs(float(m.fgate_proj.weight.detach().std()) - 0.02) < 0.01 and not m.fgate_proj.bias.any()  # the paper's initialisation
    assert m(torch.randn(2, 7, E)).output.shape == (2, 7, E)
    assert "causal=True" in repr(efficient.create("fox", embed_dim=E, num_heads=H, causal=True))


def test_a_language_model_with_fox_trains_a_step():
    torch.manual_seed(0)
    cfg = ModelConfig(kind="lm", model="lm", num_labels=30, embed_dim=E, vocab_size=30, num_layers=2, num_heads=H, max_len=40,
                      attention=AttentionSpec("fox", {}), positional=PositionalSpec("none"))
    model = build_model(cfg)
    gates = [mod.fgate_proj for mod in model.modules() if isinstance(mod, ForgettingAttention)]
    assert len(gates) == 2 and all(mod.causal for mod in model.modules() if isinstance(mod, ForgettingAttention))
    tokens = torch.randint(2, 30, (3, 24), generator=torch.Generator().manual_seed(1))
    tokens[2, :5] = 0  # a left-padded row (PAD = 0)
    before = [g.weight.detach().clone() for g in gates]
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    logits = model(tokens[:, :-1]).output
    loss = F.cross_entropy(logits.reshape(-1, 30), tokens[:, 1:].reshape(-1), ignore_index=0)
    loss.backward()
    assert math.isfinite(loss.item())
    assert all(g.weight.grad is not None and g.weight.grad.abs().sum() > 0 and g.bias.grad.abs().sum() > 0 for g in gates)
    opt.step()
    assert all(not torch.equal(g.weight, b) for g, b in zip(gates, before))
    # causal: the logits at i do not see later tokens
    model.eval()
    with torch.no_grad():
        changed = tokens.clone()
        changed[:, 15:] = 7
        assert torch.equal(model(tokens).output[:, :15], model(changed).output[:, :15])


def test_an_encoder_builds_fox_in_both_forms():
    x = torch.randn(2, 20, E)
    for causal in (False, True):
        enc = Encoder(E, H, 2, attention="fox", causal=causal)
        assert all(layer.attn.causal is causal for layer in enc.layers)
        out = enc(x, mask=masks.padding(torch.tensor([20, 13]))).output
        assert torch.isfinite(out).all()
        later = x.clone()
        later[:, 15:] = torch.randn(2, 5, E)  # (not a constant shift, which the blocks' LayerNorm removes)
        same = torch.allclose(enc(later).output[:, :15], enc(x).output[:, :15], atol=1e-6)
        assert same is causal  # the bidirectional form sees later tokens, the causal one does not


def test_what_fox_cannot_do_it_refuses_clearly():
    m = efficient.create("fox", embed_dim=E, num_heads=H, causal=True)
    x = torch.randn(1, 6, E)
    with pytest.raises(ValueError, match="is self-attention: pass neither key nor value"):
        m(x, torch.randn(1, 5, E))
    with pytest.raises(ValueError, match="unknown option 'kdim' for the attention 'fox'"):  # a mixer projects its own input
        efficient.create("fox", embed_dim=E, num_heads=H, kdim=8)
    with pytest.raises(ValueError, match="is a sequence mixer.*create the layer"):  # no step to call on heads alone
        efficient.step("fox", embed_dim=E, num_heads=H)
    with pytest.raises(ValueError, match="self-attention: the input .* must share B and N"):
        m.mix(*(torch.randn(1, H, 6, E // H) for _ in range(3)), Tokens(torch.randn(1, 5, E), torch.arange(5)))

    from attnlab.distributed import RingContext, ShardedMask, plan_layout

    lay = plan_layout(12, 2)
    ctx = RingContext(None, 0, 2, [0, 1], torch.stack([lay.positions(r) for r in range(2)]))
    with pytest.raises(ValueError, match="'fox' attention is not exact dense attention: ring attention"):
        m(x, mask=ShardedMask(ctx))  # its cumulative gates span the whole sequence
    with pytest.raises(ValueError, match="does not broadcast"):
        m(x, mask=torch.ones(2, 1, 6, 6, dtype=torch.bool))
    with pytest.raises(TypeError, match="causal must be a bool"):
        efficient.create("fox", embed_dim=E, num_heads=H, causal="yes")


def decode(m, x, real, prefill, chunk):
    """``m``'s outputs for ``x`` fed through a fresh cache: ``prefill`` tokens, then ``chunk`` at a
    time, each call with its tokens' key padding (``real``)."""
    cache = m.new_cache()
    cuts = [0, *range(prefill, x.shape[1], chunk), x.shape[1]]
    return torch.cat([m(x[:, a:b], cache=cache, mask=masks.valid_keys(real[:, a:b])).output for a, b in zip(cuts, cuts[1:])], 1), cache


@pytest.mark.parametrize("pe,kv_heads", [(None, None), ("rope", 2), ("alibi", None), ("sinusoidal", 1)])
@pytest.mark.parametrize("padded", [False, True])
def test_cached_decoding_equals_the_whole_sequence(pe, kv_heads, padded):
    """A prefill of 7, then one token at a time, or 3 at a time, or all at once: every real token's
    output equals the whole sequence's (float64, 1e-10), under rope (the keys enter the cache
    rotated), ALiBi (at the held keys' positions), an input encoding and grouped keys; with
    padding (NaN there): a left-padded row, and a hole and right padding in the other."""
    m = fox(positional=pe, max_len=64, num_kv_heads=kv_heads).eval()
    n, g = 41, torch.Generator().manual_seed(11)
    x = torch.randn(2, n, E, dtype=torch.float64, generator=g)
    real = torch.ones(2, n, dtype=torch.bool)
    if padded:
        real[0, 12:16] = real[0, 38:] = False
        real[1, :5] = False
        x[~real] = float("nan")
    with torch.no_grad():
        whole = m(x, mask=masks.valid_keys(real)).output
        for prefill, chunk in ((7, 1), (7, 3), (1, 1), (n, 1)):
            out, cache = decode(m, x, real, prefill, chunk)
            gap = (out - whole)[real].abs().max().item()
            assert gap < 1e-10, (prefill, chunk, gap)
    assert isinstance(cache, ForgetKVCache) and cache.seen == cache.size == n
    assert torch.isfinite(out[real]).all()
    # the cache holds c = cumsum(log f), padding not forgetting, and the running total is its last
    log_f = F.logsigmoid(m.fgate_proj(torch.nan_to_num(x))).transpose(1, 2).masked_fill(~real[:, None, :], 0.0)
    assert_close_rel(cache.c[..., :n], log_f.cumsum(-1), 1e-12, "held gates")
    assert torch.equal(cache.total, cache.c[..., n - 1])
    # the decay is not a no-op here: the same cache without gates (dense) differs
    dense = efficient.create("dense", embed_dim=E, num_heads=H, positional=pe, max_len=64, num_kv_heads=kv_heads).double().eval()
    dense.load_state_dict(m.state_dict(), strict=False)
    with torch.no_grad():
        plain = dense(x, mask=masks.causal() & masks.valid_keys(real)).output
    assert (plain - whole)[real].abs().max() > 1e-2


def test_cached_decoding_returns_the_weights_and_follows_beams():
    """One new token's weights over the held keys are the whole sequence's last row; after
    ``reorder`` (beam search) and ``reset`` decoding continues each chosen row."""
    m = fox().eval()
    x = torch.randn(2, 15, E, dtype=torch.float64, generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        full = m(x, return_weights=True)
        cache = m.new_cache()
        m(x[:, :14], cache=cache)
        last = m(x[:, 14:], cache=cache, return_weights=True)
        assert last.weights.shape == (2, H, 1, 15)
        assert_close_rel(last.weights, full.weights[:, :, 14:], 1e-10, "weights of the last token")
        beams = torch.tensor([1, 1, 0])
        cache.reset()
        m(x[:, :9], cache=cache)
        cache.reorder(beams)
        rest = torch.cat([m(x[beams, i : i + 1], cache=cache).output for i in range(9, 15)], 1)
        assert_close_rel(rest, m(x[beams]).output[:, 9:], 1e-10, "after reorder")
        assert cache.c.shape[:2] == (3, H)


def test_a_language_model_with_fox_generates_the_same_tokens_with_and_without_its_cache():
    torch.manual_seed(0)
    cfg = ModelConfig(kind="lm", model="lm", num_labels=30, embed_dim=E, vocab_size=30, num_layers=2, num_heads=H, max_len=40,
                      attention=AttentionSpec("fox", {}), positional=PositionalSpec("rope"))
    model = build_model(cfg).double().eval()
    prompt = torch.randint(2, 30, (2, 6), generator=torch.Generator().manual_seed(1))
    cached = torch.stack(list(model.generate(prompt, 12, temperature=0, cache=True)), 1)
    rerun = torch.stack(list(model.generate(prompt, 12, temperature=0, cache=False)), 1)
    assert torch.equal(cached, rerun)
    assert all(isinstance(c, ForgetKVCache) for c in model.new_cache().layers)


def test_what_fox_cannot_decode_it_refuses_clearly():
    m = efficient.create("fox", embed_dim=E, num_heads=H, causal=True)
    x = torch.randn(1, 6, E)
    with pytest.raises(ValueError, match=r"cached decoding needs a causal 'fox' attention \(create it with causal=True\)"):
        efficient.create("fox", embed_dim=E, num_heads=H).new_cache()  # the bidirectional form: later tokens change earlier ones
    with pytest.raises(ValueError, match="cached decoding needs a causal 'fox'"):
        efficient.create("fox", embed_dim=E, num_heads=H)(x, cache=ForgetKVCache())
    with pytest.raises(ValueError, match="cached decoding needs a causal encoder"):
        Encoder(E, H, 1, attention="fox").new_cache()
    with pytest.raises(ValueError, match="cumulative forget gate: pass no window, sinks or positions"):
        m.new_cache(window=8)
    with pytest.raises(ValueError, match=r"decodes with the cache its new_cache\(\) makes, not this one \(KVCache\)"):
        m(x, cache=KVCache())  # a plain KVCache keeps no gates
    with pytest.raises(ValueError, match="not this one \\(a forget-gate cache\\)"):
        efficient.create("dense", embed_dim=E, num_heads=H)(x, cache=m.new_cache())
    with pytest.raises(ValueError, match="mask is the new tokens' key padding"):
        m(x, cache=m.new_cache(), mask=masks.causal())
    with pytest.raises(ValueError, match="a score bias cannot be combined with a cache"):
        m(x, cache=m.new_cache(), bias=torch.zeros(1, H, 6, 6))
    cache = m.new_cache()
    m(x, cache=cache)
    with pytest.raises(ValueError, match="the cache holds gates of shape"):
        cache.write(torch.randn(1, H, 1, E // H), torch.randn(1, H, 1, E // H), torch.zeros(1, 2, 1))
    from attnlab.efficient.fox import forget_decay

    with pytest.raises(ValueError, match="causal form only"):
        forget_decay(torch.zeros(1, H, 3), causal=False, queries=torch.zeros(1, H, 1))


def test_a_padded_token_with_nan_decodes_nothing_into_the_cache():
    torch.manual_seed(0)
    m = efficient.create("fox", embed_dim=16, num_heads=2, causal=True).double()
    x = torch.randn(1, 4, 16, dtype=torch.float64)
    cache = m.new_cache()
    m(x[:, :2], cache=cache)
    bad = x[:, 2:3].clone().fill_(float("nan"))
    m(bad, cache=cache, mask=masks.valid_keys(torch.tensor([[False]])))  # a padded new token holding NaN
    out = m(x[:, 3:4], cache=cache).output
    assert torch.isfinite(out).all()
    clean = m.new_cache()
    m(x[:, :2], cache=clean)
    m(torch.zeros_like(bad), cache=clean, mask=masks.valid_keys(torch.tensor([[False]])))
    assert (m(x[:, 3:4], cache=clean).output - out).abs().max() < 1e-12  # as if the padding held zeros
