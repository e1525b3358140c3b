"""Cached decoding in one attention layer: feeding the tokens a few at a time through a cache
gives what the causal layer gives on the whole sequence (float64), for every positional
encoding, grouped heads, head formulations, padding, and every variant that decodes causally;
bounded caches keep constant memory; cross-attention computes its keys once; bad use is refused."""

import pytest
import torch

from attnlab import MultiHeadAttention, efficient, positional
from attnlab.core import masks
from attnlab.layers.cache import KVCache, StaticKV

B, N, E, H = 2, 41, 16, 4


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(B, N, E, generator=g, dtype=torch.float64)
    real = torch.ones(B, N, dtype=torch.bool)
    real[1, :6] = False  # a left-padded row
    return x, real


def decode(layer, x, real, chunk):
    """The outputs of feeding ``x`` ``chunk`` tokens at a time through a fresh cache."""
    cache = layer.new_cache()
    pm = real[:, None, None, :]
    return torch.cat([layer(x[:, a : a + chunk], cache=cache, mask=pm[..., a : a + chunk]).output for a in range(0, N, chunk)], 1)


def assert_cached_equals_full(layer, x, real, full_mask):
    layer = layer.double().eval()
    with torch.no_grad():
        ref = layer(x, mask=full_mask).output
        for chunk in (1, 5, N):
            out = decode(layer, x, real, chunk)
            assert (out - ref)[real].abs().max() < 1e-10, chunk


@pytest.mark.parametrize("pe", ["none"] + [n for n in positional.names() if n != "none"])
def test_dense_cache_equals_full_for_every_encoding(pe, data):
    x, real = data
    torch.manual_seed(1)
    layer = MultiHeadAttention(E, H, positional=pe, max_len=64)
    assert_cached_equals_full(layer, x, real, masks.causal().dense(N) & real[:, None, None, :])


@pytest.mark.parametrize("kw", [{"num_kv_heads": 2, "positional": "rope"}, {"num_kv_heads": 1, "positional": "alibi"},
                                {"head_mode": "project", "positional": "relative"}, {"score": "additive"}, {"normalize": "relu"}])
def test_dense_cache_other_layers(kw, data):
    x, real = data
    torch.manual_seed(2)
    assert_cached_equals_full(MultiHeadAttention(E, H, **kw), x, real, masks.causal().dense(N) & real[:, None, None, :])


VARIANTS = [("dense_naive", {}), ("local", {"window": 5}), ("longformer", {"window": 4, "global_tokens": 2}),
            ("linear", {}), ("performer", {"seed": 0}), ("fox", {})]


def test_bigbird_declares_no_cache_whatever_its_options():
    """Its declaration is its class's: random_blocks=0 is longformer's pattern, and the message says to use it."""
    layer = efficient.create("bigbird", embed_dim=E, num_heads=H, causal=True, window=4, global_tokens=1, random_blocks=0)
    assert efficient.capabilities("bigbird").cache is None and layer.capabilities is efficient.capabilities("bigbird")
    with pytest.raises(ValueError, match="no cached decoding .*with random_blocks=0 it is longformer, which decodes"):
        layer.new_cache()


@pytest.mark.parametrize("name,opts", VARIANTS)
@pytest.mark.parametrize("pe", [None, "rope", "sinusoidal"])
def test_variant_cache_equals_causal_layer(name, opts, pe, data):
    x, real = data
    torch.manual_seed(3)
    causal = {} if name == "dense_naive" else {"causal": True}
    layer = efficient.create(name, embed_dim=E, num_heads=H, positional=pe, max_len=64, **causal, **opts)
    full_mask = masks.causal().dense(N) & real[:, None, None, :] if name == "dense_naive" else real[:, None, None, :]
    assert_cached_equals_full(layer, x, real, full_mask)


def test_variant_grouped_cache(data):
    x, real = data
    torch.manual_seed(4)
    layer = efficient.create("local", embed_dim=E, num_heads=H, causal=True, window=3, num_kv_heads=2)
    assert_cached_equals_full(layer, x, real, real[:, None, None, :])


def test_performer_running_shift_equals_global_shift():
    """Keys whose feature logits grow along the sequence: the running stabiliser rescales the
    sums many times and still matches the layer, whose stabiliser is the maximum over all keys."""
    torch.manual_seed(5)
    layer = efficient.create("performer", embed_dim=E, num_heads=H, causal=True, seed=1).double().eval()
    x = torch.randn(1, N, E, dtype=torch.float64) * torch.linspace(0.2, 3.0, N, dtype=torch.float64)[None, :, None]
    with torch.no_grad():
        ref = layer(x).output
        cache = layer.new_cache()
        out = torch.cat([layer(x[:, i : i + 1], cache=cache).output for i in range(N)], 1)
    assert (out - ref).abs().max() < 1e-10


def test_refused_variants_and_non_causal():
    for name, opts in [("linformer", {"max_len": 64}), ("nystrom", {}), ("reformer", {})]:
        with pytest.raises(ValueError, match="no cached decoding|cannot be causal"):
            efficient.create(name, embed_dim=E, num_heads=H, **opts).new_cache()
    with pytest.raises(ValueError, match="random blocks"):
        efficient.create("bigbird", embed_dim=E, num_heads=H, causal=True, window=4).new_cache()
    for name in ("local", "linear", "performer"):
        with pytest.raises(ValueError, match="causal=True"):
            efficient.create(name, embed_dim=E, num_heads=H).new_cache()
    with pytest.raises(ValueError, match="its own window"):
        efficient.create("local", embed_dim=E, num_heads=H, causal=True, window=3).new_cache(window=8)


def test_bounded_cache_is_local_attention_and_constant_memory():
    """A window-only cache over dense attention equals local attention with window w - 1, and
    holds the same bytes after 100 tokens as after 1000."""
    torch.manual_seed(6)
    dense = MultiHeadAttention(E, H, positional="rope").double().eval()
    local = efficient.create("local", embed_dim=E, num_heads=H, causal=True, window=7, positional="rope").double().eval()
    local.load_state_dict(dense.state_dict())
    x = torch.randn(1, 1000, E, dtype=torch.float64)
    cache = dense.new_cache(window=8)
    with torch.no_grad():
        ref = local(x).output
        outs, sizes = [], {}
        for i in range(1000):
            outs.append(dense(x[:, i : i + 1], cache=cache).output)
            if i + 1 in (100, 1000):
                sizes[i + 1] = cache.nbytes()
    assert (torch.cat(outs, 1) - ref).abs().max() < 1e-10
    assert sizes[100] == sizes[1000] and cache.size == 8 and cache.seen == 1000


def test_streaming_positions_are_cache_slots():
    """positions='cache': with ALiBi, a key's bias is its distance within the cache (sinks
    first), so after the window has slid the sink sits at distance ``window`` from the query,
    not at its distance in the stream (checked against an explicit computation)."""
    torch.manual_seed(7)
    layer = MultiHeadAttention(E, H, positional="alibi").double().eval()
    x = torch.randn(1, 30, E, dtype=torch.float64)
    cache = layer.new_cache(window=4, sinks=1, positions="cache")
    with torch.no_grad():
        for i in range(29):
            layer(x[:, i : i + 1], cache=cache)
        out = layer(x[:, 29:30], cache=cache).output
        # by hand: keys = token 0 (slot 0) and tokens 26..29 (slots 1..4); the query at slot 4
        keep = torch.tensor([0, 26, 27, 28, 29])
        q, k, v, _ = layer.project(x[:, 29:30], x[:, keep], positions=torch.tensor([4]), key_positions=torch.arange(5))
        bias = layer.positional.score_mod(torch.tensor([4]), torch.arange(5))
        ref = layer.merge_heads(layer.step(q, k, v, score_mod=bias).output)
    assert (out - ref).abs().max() < 1e-12
    assert sorted(cache.slot_pos.tolist()) == [0, 26, 27, 28, 29]


def test_cross_attention_cache_computes_keys_once():
    torch.manual_seed(8)
    layer = MultiHeadAttention(E, H, kdim=12, vdim=12).double().eval()
    mem = torch.randn(B, 9, 12, dtype=torch.float64)
    q = torch.randn(B, 5, E, dtype=torch.float64)
    mm = torch.ones(B, 1, 1, 9, dtype=torch.bool)
    mm[0, ..., 7:] = False
    cache = layer.new_cross_cache()
    with torch.no_grad():
        ref = layer(q, mem, mask=mm).output
        first = layer(q[:, :2], mem, cache=cache, mask=mm).output
        keys = cache.k
        rest = layer(q[:, 2:], cache=cache, mask=mm).output  # no memory passed: the cached keys
    assert cache.k is keys and isinstance(cache, StaticKV)
    assert (torch.cat([first, rest], 1) - ref).abs().max() < 1e-12


def test_cache_errors():
    layer = MultiHeadAttention(E, H)
    x = torch.randn(1, 3, E)
    with pytest.raises(ValueError, match="positions come from it"):
        layer(x, cache=layer.new_cache(), positions=torch.arange(3))
    with pytest.raises(ValueError, match="query only"):
        layer(x, x, cache=layer.new_cache())
    with pytest.raises(ValueError, match="key padding"):
        layer(x, cache=layer.new_cache(), mask=masks.causal().dense(3))
    with pytest.raises(ValueError, match="needs the key"):
        layer(x, cache=layer.new_cross_cache())
    with pytest.raises(TypeError, match="new_cache"):
        layer(x, cache=object())
    with pytest.raises(ValueError, match="give a window"):
        KVCache(sinks=2)
    with pytest.raises(ValueError, match="'absolute' or 'cache'"):
        KVCache(window=4, positions="text")
    cache = layer.new_cache()
    layer(x, cache=cache)
    with pytest.raises(ValueError, match="the cache holds keys"):
        cache.update(torch.randn(2, H, 1, E // H), torch.randn(2, H, 1, E // H))


def test_fused_projection_weights_follow_every_change_of_the_weights():
    """The fused [W^q; W^k; W^v] kept between inference calls is rebuilt after an in-place
    update, a load_state_dict, a swapped .data and a dtype change."""
    torch.manual_seed(9)
    layer = MultiHeadAttention(E, H).eval()
    x = torch.randn(1, 5, E)

    def fresh():  # the same layer built anew from the current weights
        other = MultiHeadAttention(E, H).eval()
        other.load_state_dict(layer.state_dict())
        return other(x).output

    with torch.no_grad():
        layer(x)
        layer.q_proj.weight.mul_(2)
        assert torch.equal(layer(x).output, fresh())
        layer.load_state_dict({k: v * 0.5 for k, v in layer.state_dict().items()})
        assert torch.equal(layer(x).output, fresh())
        layer.k_proj.weight.data = torch.randn(E, E)
        assert torch.equal(layer(x).output, fresh())
        layer.double()
        assert layer(x.double()).output.dtype == torch.float64


def test_a_variant_refuses_a_cache_it_did_not_make():
    local = efficient.create("local", embed_dim=E, num_heads=H, causal=True, window=3)
    x = torch.randn(1, 4, E)
    with pytest.raises(ValueError, match="new_cache"):
        local(x, cache=KVCache())  # unbounded: would compute full causal attention
    with pytest.raises(ValueError, match="new_cache"):
        local(x, cache=KVCache(window=9))
    linear = efficient.create("linear", embed_dim=E, num_heads=H, causal=True)
    with pytest.raises(ValueError, match="new_cache"):
        linear(x, cache=KVCache())  # would compute exact softmax
    with pytest.raises(ValueError, match="no attention weights"):
        linear(x, cache=linear.new_cache(), return_weights=True)
    with pytest.raises(ValueError, match="recurrent state"):
        MultiHeadAttention(E, H)(x, cache=linear.new_cache())


def test_cross_cache_row_mismatch_is_named():
    layer = MultiHeadAttention(E, H)
    cache = layer.new_cross_cache()
    layer(torch.randn(1, 2, E), torch.randn(1, 5, E), cache=cache)
    with pytest.raises(ValueError, match="holds keys of 1 row"):
        layer(torch.randn(3, 1, E), cache=cache)
    cache.reorder(torch.tensor([0, 0, 0]))
    assert layer(torch.randn(3, 1, E), cache=cache).output.shape == (3, 1, E)


def test_performer_state_after_an_all_padding_first_call():
    """A row whose first tokens are all padding: its running stabiliser stays unset, and the
    outputs of its real tokens equal the layer run on the whole row."""
    torch.manual_seed(10)
    layer = efficient.create("performer", embed_dim=E, num_heads=H, causal=True, seed=2).double().eval()
    x = torch.randn(2, 12, E, dtype=torch.float64) * 3
    real = torch.ones(2, 12, dtype=torch.bool)
    real[1, :4] = False
    with torch.no_grad():
        ref = layer(x, mask=real[:, None, None, :]).output
        cache = layer.new_cache()
        out = torch.cat([layer(x[:, a : a + 4], cache=cache, mask=masks.valid_keys(real[:, a : a + 4])).output for a in (0, 4, 8)], 1)
    assert (out - ref)[real].abs().max() < 1e-10
    assert torch.isfinite(cache.shift).all()


def test_performer_redraws_once_per_forward_call_with_packed_documents():
    from attnlab.core.masks import Documents

    layer = efficient.create("performer", embed_dim=E, num_heads=H, causal=True, seed=3, redraw_interval=2).train()
    x = torch.randn(1, 12, E)
    layer(x, mask=Documents([2, 3, 4, 3], causal=True))  # three document lengths: three attention steps, one call
    assert int(layer.step.calls) == 1


def test_cache_and_documents_option_errors():
    from attnlab.core.masks import Documents

    with pytest.raises(ValueError, match="window"):
        KVCache(window=0)
    with pytest.raises(ValueError, match="sinks"):
        KVCache(window=4, sinks=-1)
    with pytest.raises(ValueError, match="window"):
        Documents([3, 2], window=-1)
