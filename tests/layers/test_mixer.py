"""The sequence mixer's own checks (layers/mixer.py), what every mixer inherits: each refusal of a call
it cannot honour, with its message, and ``is_mixer`` telling the two kinds apart."""

import pytest
import torch

from attnlab import efficient, masks
from attnlab.efficient import is_mixer
from attnlab.layers import KVCache, MultiHeadAttention, SequenceMixer
from attnlab.validate import ArgumentTypeError


def gated(**options):
    torch.manual_seed(0)
    return efficient.create("gated_deltanet", embed_dim=16, num_heads=2, **options)


def test_is_mixer_tells_the_two_kinds_apart():
    assert is_mixer(efficient.VARIANTS.get("gated_deltanet")) and is_mixer(efficient.VARIANTS.get("fox"))
    assert not is_mixer(efficient.VARIANTS.get("dense")) and not is_mixer(efficient.VARIANTS.get("local"))
    assert not is_mixer("gated_deltanet") and not is_mixer(None)  # a name or nothing is no class
    assert isinstance(gated(), SequenceMixer) and not isinstance(gated(), MultiHeadAttention)


@pytest.mark.parametrize(("options", "error", "message"), [
    ({"embed_dim": 15}, ValueError, "embed_dim must be divisible by num_heads"),
    ({"num_kv_heads": 3}, ValueError, "num_kv_heads must divide num_heads"),
    ({"causal": 1}, ArgumentTypeError, "causal must be a bool, got int"),
    ({"positional": "alibi"}, ValueError, "never forms the scores a bias encoding would add to"),
    ({"kdim": 8}, ValueError, "unknown option 'kdim'"),
])
def test_a_mixer_refuses_what_it_cannot_be(options, error, message):
    args = {"embed_dim": 16, "num_heads": 2, **options}
    with pytest.raises(error, match=message):
        efficient.create("gated_deltanet", **args)


def test_a_mixer_refuses_a_call_it_cannot_honour():
    m, x = gated(causal=True), torch.randn(1, 5, 16)
    with pytest.raises(ValueError, match="is self-attention: pass neither key nor value"):
        m(x, value=x)
    with pytest.raises(ValueError, match="never builds the N x M weights"):
        m(x, return_weights=True)
    with pytest.raises(ValueError, match="cannot add a score bias"):
        m(x, bias=torch.zeros(1, 1, 5, 5))
    with pytest.raises(ValueError, match="key_positions must equal positions"):
        m(x, positions=torch.arange(5), key_positions=torch.arange(1, 6))
    with pytest.raises(ValueError, match="takes key-padding masks only"):
        m(x, mask=masks.window(1))
    with pytest.raises(ValueError, match="must have last dimension 16"):
        m(torch.randn(1, 5, 8))
    with pytest.raises(ValueError, match="decodes with the cache its new_cache\\(\\) makes"):
        m(x, cache=KVCache())
    with pytest.raises(ValueError, match="with a cache the positions come from it"):
        m(x, cache=m.new_cache(), positions=torch.arange(5))
    with pytest.raises(ValueError, match="pass no window, sinks or positions"):
        m.new_cache(window=4)
    with pytest.raises(ArgumentTypeError, match="a step hook is a callable"):
        m.register_step_hook(3)


def test_a_bidirectional_mixer_has_no_cache_and_given_positions_are_its_tokens():
    with pytest.raises(ValueError, match="cached decoding needs a causal 'gated_deltanet' attention"):
        gated().new_cache()
    m, x = gated(causal=True, positional="rope"), torch.randn(1, 6, 16, dtype=torch.float64)
    m = m.double()
    assert torch.equal(m(x).output, m(x, positions=torch.arange(6), key_positions=torch.arange(6)).output)
    shifted = (m(x, positions=torch.arange(6) + 3).output - m(x).output).abs().max()
    spread = (m(x, positions=torch.arange(6) * 2).output - m(x).output).abs().max()
    assert shifted < 1e-12 and spread > 1e-6  # rope reads them: relative, so a shift changes nothing


def test_a_layer_refuses_what_is_no_cache_and_a_mixer_a_cache_of_another_kind():
    x = torch.randn(1, 3, 16)
    with pytest.raises(ArgumentTypeError, match="cache must come from new_cache\\(\\) or new_cross_cache\\(\\), got dict"):
        MultiHeadAttention(16, 2)(x, cache={})
    with pytest.raises(ValueError, match="not this one \\(dict\\)"):
        gated(causal=True)(x, cache={})
