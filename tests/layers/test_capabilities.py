"""Every variant's declared capabilities hold: what it says it takes works, what it says it refuses is
refused, and its declared cache decodes to the numbers of the whole sequence. The lists of
variants derive from these declarations, so a wrong one would plan a variant where it fails."""

import pytest
import torch

from attnlab import efficient, masks
from attnlab.layers import Capabilities, ForgetKVCache, KVCache, MatrixState, RecurrentState
from attnlab.layers.mixer import SequenceMixer

E, H, N = 16, 4, 9
NAMES = efficient.select()
CACHE_TYPES = {"kv": KVCache, "window": KVCache, "recurrent": RecurrentState, "matrix": MatrixState, "forget": ForgetKVCache}


def build(name: str, **options):
    opts = dict(efficient.budget(name).short)
    if efficient.budget(name).max_len:
        opts["max_len"] = 32
    if name == "bigbird":
        opts["random_blocks"] = 0  # its random blocks rule out a cache (the class declares none); without them it decodes
    torch.manual_seed(0)
    return efficient.create(name, embed_dim=E, num_heads=H, **opts, **options).double().eval()


def causal_layer(name: str):
    caps = efficient.capabilities(name)
    return build(name) if caps.causal == "mask" else build(name, causal=True)


def causal_mask(name: str):
    return masks.causal() if efficient.capabilities(name).causal == "mask" else None


def test_a_declaration_refuses_unknown_values():
    with pytest.raises(ValueError, match="causal must be one of"):
        Capabilities(causal="always")
    with pytest.raises(ValueError, match="masks must be one of"):
        Capabilities(masks="some")
    with pytest.raises(ValueError, match="cache must be one of"):
        Capabilities(cache="disk")
    assert Capabilities().with_changes(cache=None).cache is None and Capabilities().cache == "kv"


def test_every_registered_variant_declares_its_capabilities():
    assert NAMES[0] == "dense" and set(NAMES) == set(efficient.names())
    for name in NAMES:
        caps = efficient.capabilities(name)
        assert isinstance(caps, Capabilities), name
        assert caps.describe()["family"] == caps.family


@pytest.mark.parametrize("name", NAMES)
def test_causal_form_is_as_declared(name):
    caps = efficient.capabilities(name)
    x = torch.randn(1, N, E, dtype=torch.float64)
    if caps.causal is None:
        with pytest.raises(ValueError, match="cannot be causal"):
            build(name, causal=True)
        return
    layer = causal_layer(name)
    out = layer(x, mask=causal_mask(name)).output
    changed = x.clone()
    changed[:, -1] += 1.0  # the last token: no earlier output may move
    again = layer(changed, mask=causal_mask(name)).output
    moved = (out[:, :-1] - again[:, :-1]).abs().max()
    if name == "reformer":  # later keys are hidden, but the sort into chunks is the whole sequence's (its docstring says so)
        assert moved > 1e-6
    else:
        assert moved < 1e-10, name


@pytest.mark.parametrize("name", NAMES)
def test_scores_and_masks_are_as_declared(name):
    caps = efficient.capabilities(name)
    layer = build(name)
    x = torch.randn(2, N, E, dtype=torch.float64)
    if caps.forms_scores:
        w = layer(x, return_weights=True).weights
        assert w is not None and torch.allclose(w.sum(-1), torch.ones((), dtype=w.dtype))
    else:
        with pytest.raises(ValueError, match="never builds the N x M weights"):
            layer(x, return_weights=True)
    window = masks.window(2)
    if caps.masks == "any":
        layer(x, mask=window)
    else:
        with pytest.raises(ValueError, match="key-padding masks only"):
            layer(x, mask=window)
    padded = layer(x, mask=masks.padding([N, N - 3])).output  # every variant takes key padding
    assert torch.isfinite(padded).all()


@pytest.mark.parametrize("name", NAMES)
def test_the_declared_cache_decodes_to_the_whole_sequence(name):
    layer = causal_layer(name) if efficient.capabilities(name).causal else build(name)
    caps = layer.capabilities  # bigbird without random blocks declares longformer's cache on the instance
    if caps.cache is None:
        with pytest.raises(ValueError, match="no cached decoding|cannot be causal"):
            layer.new_cache()
        return
    x = torch.randn(2, N, E, dtype=torch.float64)
    with torch.no_grad():
        whole = layer(x, mask=causal_mask(name)).output
        cache = layer.new_cache()
        assert isinstance(cache, CACHE_TYPES[caps.cache]), name
        steps = torch.cat([layer(x[:, :4], cache=cache).output] + [layer(x[:, i : i + 1], cache=cache).output for i in range(4, N)], 1)
    assert (steps - whole).abs().max() < 1e-10, name


@pytest.mark.parametrize("name", NAMES)
def test_every_step_calls_the_step_hooks(name):
    caps = efficient.capabilities(name)
    layer = build(name)
    seen = []
    layer.register_step_hook(lambda lay, q, k, v, kw: seen.append((lay, q, kw)))
    x = torch.randn(1, N, E, dtype=torch.float64)
    layer(x)
    assert len(seen) == 1 and seen[0][1].shape == (1, H, N, E // H), name
    lay, q, kw = seen[0]
    assert lay is layer and set(kw) == {"mask", "bias", "score_mod", "return_weights", "state"}, name
    # a sequence mixer is the layer itself (its gates read the input it holds); a step is held by the layer
    assert isinstance(lay, SequenceMixer) == caps.mixer and (not caps.mixer) == hasattr(lay, "step"), name
    # the heads the hook sees are the input's projections (a mixer's: before its short convolution)
    assert torch.allclose(q, layer.q_proj(x).view(1, N, H, E // H).transpose(1, 2), rtol=0, atol=1e-12), name


def test_grouped_keys_arrive_as_declared():
    for name in ("dense", "linear"):
        layer = build(name, num_kv_heads=2)
        heads = []
        layer.register_step_hook(lambda lay, q, k, v, kw, heads=heads: heads.append(k.shape[1]))
        layer(torch.randn(1, N, E, dtype=torch.float64))
        assert heads == [2 if efficient.capabilities(name).grouped_kv else H], name


def test_select_filters_by_declaration():
    assert "dense_naive" not in efficient.select(reference=False)
    assert set(efficient.select(causal=False)) >= {"linformer", "nystrom"}
    assert "linformer" not in efficient.select(causal=True)
    gated = {n for n in efficient.names() if issubclass(efficient.VARIANTS.get(n), efficient.GatedRecurrence)}
    # DeltaProduct runs the gated family's scan as a GatedRecurrence itself, declared a family of its own
    assert efficient.capabilities("deltaproduct").family == "householder" and "deltaproduct" in gated
    assert set(efficient.select(family="gated")) == gated - {"deltaproduct"} and len(gated) >= 7
    # the sequence mixers: the gated recurrences (DeltaProduct among them) and FoX, exactly
    assert set(efficient.select(mixer=True)) == gated | {"fox"}
    assert set(efficient.select(mixer=True)) >= {"retnet", "gla", "deltanet", "gated_deltanet", "kda", "mamba2", "deltaproduct", "fox"}
    assert set(efficient.select(mixer=False)) == set(efficient.names()) - gated - {"fox"}
    assert all(efficient.capabilities(n).cache is not None for n in efficient.select(decodes=True))


def test_bad_names_and_registrations_are_refused():
    from attnlab.core import spanning

    with pytest.raises(ValueError, match="unknown attention 'nope'"):
        efficient.capabilities("nope")
    with pytest.raises(TypeError, match="a class and a callable"):
        spanning.register("ShardedMask", print)
    assert spanning.attention_for(masks.causal()) is None and not spanning.spans(None)
