"""The decoder-only language model: cached decoding gives the logits of running the whole prefix,
over 260 steps, for every positional encoding and every variant that decodes causally, with and
without padding in the batch (float64 1e-10, float32 1e-5); sampling follows its definition."""

import math

import pytest
import torch

from attnlab import positional
from attnlab.models import LanguageModel, ModelConfig, build_model, create, sample_next
from attnlab.models.base import PAD
from attnlab.models.config import AttentionSpec, PositionalSpec

STEPS, V = 260, 40


def lm(attention="dense", pe="none", dtype=torch.float64, **options):
    torch.manual_seed(0)
    cfg = ModelConfig(kind="lm", model="lm", num_labels=V, embed_dim=16, vocab_size=V, num_layers=2, num_heads=4, max_len=STEPS + 8,
                      attention=AttentionSpec(attention, options), positional=PositionalSpec(pe))
    return build_model(cfg).to(dtype).eval()


def tokens(batch=2, pad=0):
    g = torch.Generator().manual_seed(1)
    t = torch.randint(2, V, (batch, STEPS), generator=g)
    t[-1, :pad] = PAD  # a left-padded last row
    return t


def max_gap(model, toks, prefill=1):
    """The largest difference over real positions between the full-prefix logits and the
    logits of decoding: ``prefill`` tokens at once, then one at a time."""
    with torch.no_grad():
        full = model(toks).output
        cache = model.new_cache()
        steps = [model(toks[:, :prefill], cache=cache).output]
        steps += [model(toks[:, i : i + 1], cache=cache).output for i in range(prefill, toks.shape[1])]
    real = toks != PAD
    return (torch.cat(steps, 1) - full)[real].abs().max().item()


@pytest.mark.parametrize("pe", positional.names())
def test_cached_equals_full_prefix_every_encoding(pe):
    assert max_gap(lm(pe=pe), tokens(pad=9)) < 1e-10
    assert max_gap(lm(pe=pe), tokens(pad=0), prefill=17) < 1e-10


@pytest.mark.parametrize(
    "attention,opts",
    [("dense_naive", {}), ("local", {"window": 16}), ("longformer", {"window": 16, "global_tokens": 2}), ("linear", {}),
     ("performer", {"seed": 0}), ("retnet", {}), ("gla", {}), ("deltanet", {}), ("gated_deltanet", {}), ("mamba2", {}),
     ("fox", {})],
)
@pytest.mark.parametrize("pe", ["none", "rope"])
def test_cached_equals_full_prefix_every_causal_variant(attention, opts, pe):
    assert max_gap(lm(attention, pe, **opts), tokens(pad=9)) < 1e-10


@pytest.mark.parametrize("pe", ["rope", "alibi", "sinusoidal"])
def test_cached_float32(pe):
    assert max_gap(lm(pe=pe, dtype=torch.float32), tokens(pad=9)) < 1e-5


def test_generate_cached_equals_uncached_and_is_seeded():
    model = lm(pe="rope")
    prompt = tokens()[:, :5]
    run = lambda cache, seed: torch.stack(list(model.generate(prompt, 40, temperature=1.0, top_k=10, cache=cache,  # noqa: E731
                                                              generator=torch.Generator().manual_seed(seed))), 1)
    a, b = run(True, 3), run(False, 3)
    assert torch.equal(a, b) and a.shape == (2, 40)
    assert not torch.equal(a, run(True, 4))
    greedy = torch.stack(list(model.generate(prompt, 10, temperature=0)), 1)
    seq = prompt
    for _ in range(10):  # greedy by hand, from the full prefix
        logits = model(seq).output[:, -1]
        logits[:, PAD] = -math.inf
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], 1)
    assert torch.equal(greedy, seq[:, 5:])


def test_generate_stops_rows_and_streams_with_a_bounded_cache():
    model = lm(pe="rope")
    out = list(model.generate(tokens()[:, :3], 30, temperature=0, stop=lambda t: torch.ones_like(t, dtype=torch.bool)))
    assert len(out) == 1  # every row stopped after its first token
    streamed = list(model.generate(tokens()[:, :3], 50, temperature=0, window=8, sinks=2))
    assert len(streamed) == 50


def test_sample_next_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.0, 0.05, 0.5, 0.3, 0.15]]))
    g = torch.Generator().manual_seed(0)
    draws = torch.stack([sample_next(logits, top_k=2, generator=g) for _ in range(400)])
    assert set(draws.flatten().tolist()) == {2, 3}
    draws = torch.stack([sample_next(logits, top_p=0.75, generator=g) for _ in range(400)])
    assert set(draws.flatten().tolist()) == {2, 3}  # 0.5 + 0.3 reaches 0.75: 0.15 and 0.05 are cut
    assert int(sample_next(logits, temperature=0)) == 2
    assert int(sample_next(torch.zeros(1, 5), temperature=0)) != PAD
    for bad in ({"temperature": -1.0}, {"top_k": 0}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(ValueError):
            sample_next(logits, **bad)


def test_language_model_needs_a_causal_backbone():
    with pytest.raises(ValueError, match="causal backbone"):
        LanguageModel(create("transformer", V, 16))
    with pytest.raises(ValueError, match="causal backbone"):
        LanguageModel(create("window_mlp", V, 16))
    assert LanguageModel(create("mlp", V, 16)).vocab_size == V
    with pytest.raises(ValueError, match="no attention to cache"):
        LanguageModel(create("mlp", V, 16)).new_cache()
    with pytest.raises(ValueError, match="prompt"):
        next(lm().generate(torch.zeros(2, 0, dtype=torch.long), 3))


def test_causal_lm_does_not_see_the_future():
    """Changing token 10 leaves the logits at positions 0..9 exactly as they were."""
    model = lm(pe="alibi")
    a = tokens()
    b = a.clone()
    b[:, 10] = (b[:, 10] + 1 - 2) % (V - 2) + 2
    with torch.no_grad():
        la, lb = model(a).output, model(b).output
    assert torch.equal(la[:, :10], lb[:, :10]) and not torch.allclose(la[:, 10:], lb[:, 10:])


def test_generate_checks_at_the_call_and_runs_a_backbone_without_attention():
    with pytest.raises(ValueError, match="top_k"):
        lm().generate(tokens()[:, :3], 5, top_k=0)  # raised at the call, before any token
    base = LanguageModel(create("mlp", V, 16)).double()
    out = torch.stack(list(base.generate(tokens()[:, :3], 6, temperature=0)), 1)  # nothing to cache: reruns the prefix
    assert out.shape == (2, 6)


def test_grouped_query_language_model_caches_fewer_heads():
    """num_kv_heads through the model config: the cache holds G heads, and cached decoding still
    equals the full prefix."""
    torch.manual_seed(0)
    cfg = ModelConfig(kind="lm", model="lm", num_labels=V, embed_dim=16, vocab_size=V, num_layers=2, num_heads=4, max_len=STEPS + 8,
                      attention=AttentionSpec("dense", {}), positional=PositionalSpec("rope"), options={"num_kv_heads": 1})
    model = build_model(cfg).double().eval()
    assert max_gap(model, tokens(pad=9)) < 1e-10
    cache = model.new_cache()
    with torch.no_grad():
        model(tokens()[:, :10], cache=cache)
    assert cache.layers[0].k.shape[1] == 1  # multi-query: one key / value head
