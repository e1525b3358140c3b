"""The step alone: ``efficient.step(name, ...)`` on heads computes what the layer holding it
computes, with the same checks and hooks, and whoever calls a step (the layer, the transformers
integration, a study) runs its hooks."""

import pytest
import torch

from attnlab import efficient, masks
from attnlab.efficient import StepCall

E, H, N = 16, 4, 10


def heads(seed=0, b=2, n=N):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, H, n, E // H, generator=g, dtype=torch.float64) for _ in range(3)]


@pytest.mark.parametrize("name", efficient.select(mixer=False))
def test_a_step_alone_equals_the_layers_step_on_the_same_heads(name):
    opts = dict(efficient.budget(name).short) | ({"max_len": N} if efficient.budget(name).max_len else {})
    opts |= {"seed": 0} if "seed" in (efficient.VARIANTS.options(name) or ()) else {}
    torch.manual_seed(0)
    layer = efficient.create(name, embed_dim=E, num_heads=H, **opts).double()
    alone = efficient.step(name, embed_dim=E, num_heads=H, **{k: v for k, v in opts.items() if k != "max_len" or
                                                                  "max_len" in efficient.VARIANTS.options(name)}).double()
    alone.load_state_dict(layer.step.state_dict())
    q, k, v = heads()
    seen = []
    alone.register_hook(lambda step, q, k, v, kw: seen.append((step, kw["mask"])))
    pad = masks.padding([N, N - 3])
    with torch.no_grad():
        got, want = alone(q, k, v, StepCall(mask=pad)).output, layer.step(q, k, v, mask=pad).output
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert len(seen) == 1 and seen[0][0] is alone and seen[0][1] is pad


def test_a_step_refuses_by_its_declaration_whoever_calls_it():
    q, k, v = heads()
    linear = efficient.step("linear", embed_dim=E, num_heads=H)
    with pytest.raises(ValueError, match="never builds the N x M weights"):
        linear(q.float(), k.float(), v.float(), return_weights=True)
    with pytest.raises(ValueError, match="key-padding masks only"):
        linear(q.float(), k.float(), v.float(), mask=masks.window(2))
    for name in efficient.select(mixer=True):  # a sequence mixer is the layer itself: it has no step to call on heads
        with pytest.raises(ValueError, match=f"the '{name}' attention is a sequence mixer: .*efficient.create\\('{name}'"):
            efficient.step(name, embed_dim=E, num_heads=H)
    with pytest.raises(ValueError, match="unknown option 'windw' for the attention step 'local'; it takes .*window"):
        efficient.step("local", embed_dim=E, num_heads=H, windw=2)
    with pytest.raises(TypeError, match="give the step a StepCall or keyword options, not both"):
        linear(q.float(), k.float(), v.float(), StepCall(), mask=None)


def test_a_layer_holds_a_step_given_to_it_and_refuses_a_mismatch():
    from attnlab import MultiHeadAttention

    step = efficient.step("local", embed_dim=E, num_heads=H, window=2)
    layer = MultiHeadAttention(E, H, step=step)
    assert layer.step is step and layer.name == "local" and layer.step.window == 2
    assert not hasattr(layer, "window")  # the step's attributes are the step's: the layer does not forward them
    layer.step.window = 3
    assert step.window == 3 and not hasattr(layer, "window")
    with pytest.raises(ValueError, match="the step is built for embed_dim=16, num_heads=4; the layer has embed_dim=32"):
        MultiHeadAttention(32, 4, step=step)
    with pytest.raises(TypeError, match="score: options of the attention step"):
        MultiHeadAttention(E, H, step=step, score="cosine")
    with pytest.raises(TypeError, match="step must be an attnlab.layers.step.AttentionStep"):
        MultiHeadAttention(E, H, step=torch.nn.Linear(2, 2))


def test_the_transformers_integration_calls_its_steps_and_their_hooks_run():
    transformers = pytest.importorskip("transformers")
    from attnlab.integrations.transformers import serving_steps

    config = transformers.BertConfig(vocab_size=100, hidden_size=E, num_hidden_layers=2, num_attention_heads=H,
                                     intermediate_size=32, max_position_embeddings=64)
    config.attnlab_options = {"window": 2}
    torch.manual_seed(0)
    model = transformers.BertModel._from_config(config, attn_implementation="attnlab:local").eval()
    ids = torch.randint(3, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids)
    served = serving_steps(model)
    assert len(served) == 2 and all(len(s) == 1 and s[0].name == "local" and s[0].window == 2 for s in served.values())
    calls = []
    for name, (step,) in served.items():
        step.register_hook(lambda step, q, k, v, kw, name=name: calls.append((name, tuple(q.shape))))
    model(input_ids=ids)
    assert sorted(calls) == sorted((name, (2, H, 12, E // H)) for name in served)


def test_the_approximation_study_calls_the_step_and_its_hooks_run(monkeypatch):
    from attnlab.studies import approximation

    calls = []
    create = efficient.create

    def watched(name, **options):
        layer = create(name, **options)
        layer.register_step_hook(lambda layer, q, k, v, kw: calls.append((layer.name, q.shape[2])))
        return layer

    monkeypatch.setattr(efficient, "create", watched)
    records = approximation.run_approximation(n=16, variants=["local", "performer"], seeds=1)
    assert {r.variant for r in records} == {"local", "performer"}
    assert len(calls) == len(records) and all(n == 16 for _, n in calls)


@pytest.mark.parametrize("name", ["dense", "dense_naive"])
def test_a_step_causal_by_mask_takes_causal_true_as_the_causal_mask_joined_to_the_calls(name):
    """Issue 58: ``create("dense", ..., causal=True)`` raised where every other causal variant takes it."""
    assert efficient.capabilities(name).causal == "mask"
    torch.manual_seed(0)
    layer = efficient.create(name, embed_dim=E, num_heads=H, causal=True).double()
    plain = efficient.create(name, embed_dim=E, num_heads=H).double()
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(2, N, E, dtype=torch.float64)
    pad = masks.padding([N, N - 3])
    for given, want in ((None, masks.causal()), (pad, masks.causal() & pad)):
        torch.testing.assert_close(layer(x, mask=given).output, plain(x, mask=want).output, rtol=0, atol=0)
    assert not torch.allclose(layer(x).output, plain(x).output)  # it is causal: not the bidirectional layer
    assert "causal=True" in repr(layer.step)
    cache = layer.new_cache()  # decoding: the cache is causal already, one token at a time equals the whole
    steps = torch.cat([layer(x[:, t : t + 1], cache=cache).output for t in range(N)], 1)
    torch.testing.assert_close(steps, layer(x).output)
    q, k, v = heads()
    with pytest.raises(ValueError, match=f"causal '{name}' attention needs as many queries as keys, got N=10, M=4"):
        layer.step(q, k[:, :, :4], v[:, :, :4])


def test_a_steps_causal_option_is_refused_where_its_declaration_has_none():
    with pytest.raises(ValueError, match="'linformer' attention cannot be causal"):
        efficient.step("linformer", embed_dim=E, num_heads=H, max_len=8, causal=True)
    with pytest.raises(TypeError, match="causal must be a bool, got str"):
        efficient.step("local", embed_dim=E, num_heads=H, causal="yes")
    with pytest.raises(ValueError, match="embed_dim must be divisible by num_heads, got embed_dim=10 and num_heads=4"):
        efficient.step("local", embed_dim=10, num_heads=H)


def test_a_mask_builder_joins_the_library_once():
    assert "causal" in masks.names() and "causal" in masks.__all__
    with pytest.raises(ValueError, match="a mask named 'causal' is already registered"):
        masks.builder(masks.causal)
