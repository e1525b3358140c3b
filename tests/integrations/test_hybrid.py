"""attnlab's recurrences inside transformers' hybrid models (Qwen3-Next, Qwen3.5, Kimi Linear,
Mamba-2, Falcon-H1): parity with transformers' own CPU path (hidden states, parameter gradients,
greedy generation), packed batches, and the refusals."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM  # noqa: E402

import attnlab.integrations.transformers  # noqa: E402, F401 - registers attn_implementation="attnlab"
from attnlab.efficient import recurrence  # noqa: E402
from attnlab.integrations import adapters, fallbacks, hybrid, packing, ssd  # noqa: E402
from attnlab.integrations.adapters import UnservedArgument  # noqa: E402
from attnlab.integrations.hybrid import tiny_config, use_kernels  # noqa: E402
from tests.helpers import assert_close_rel  # noqa: E402

FAMILIES = ["qwen3_next", "qwen3_5_text", "kimi_linear", "mamba2", "falcon_h1"]
FLOAT32 = 1e-5  # float32 rounding, relative to the largest value
LINEAR = {"qwen3_next": 3, "qwen3_5_text": 3, "kimi_linear": 3, "mamba2": 4, "falcon_h1": 4}  # of 4 layers (Falcon-H1: beside attention)


def build(family, **kwargs):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config(family), **kwargs).float().eval()
    if family == "falcon_h1":  # its initial time steps make the SSD's share of the output vanish: give it one
        for name, p in model.named_parameters():
            if name.endswith(("mamba.dt_bias", "mamba.A_log")):
                torch.nn.init.uniform_(p, -1.0, 1.0)
    return model


@pytest.fixture
def calls(monkeypatch):
    """How many times each of attnlab's forms ran."""
    counts = {}
    for name in ("chunk_delta", "recurrent_delta", "delta_token", "chunk_gated", "recurrent_gated", "gated_token"):
        original = getattr(recurrence, name)

        def counted(*a, _name=name, _fn=original, **kw):
            counts[_name] = counts.get(_name, 0) + 1
            return _fn(*a, **kw)
        monkeypatch.setattr(recurrence, name, counted)
    return counts


def forward_and_grads(model, ids):
    model.zero_grad()
    out = model(ids, labels=ids, output_hidden_states=True, use_cache=False)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return [h.detach() for h in out.hidden_states], grads


@pytest.mark.parametrize("family", FAMILIES)
def test_hidden_states_and_gradients_equal_transformers_own_path(family, calls):
    model = build(family)
    ids = torch.randint(3, 128, (2, 150), generator=torch.Generator().manual_seed(1))  # 150: chunks of 64 and a remainder
    ref_states, ref_grads = forward_and_grads(model, ids)
    assert not calls
    swap = use_kernels(model)
    states, grads = forward_and_grads(model, ids)
    kind = "gated" if family in ("mamba2", "falcon_h1") else "delta"
    assert calls == {f"chunk_{kind}": LINEAR[family]}, calls  # each linear layer, through attnlab's chunkwise form
    assert len(swap.replaced) == LINEAR[family]
    for i, (a, b) in enumerate(zip(states, ref_states)):
        assert_close_rel(a, b, FLOAT32, f"{family} hidden state {i}")
    assert grads.keys() == ref_grads.keys()
    linear = [n for n in grads if any(n.startswith(layer) for layer in swap.replaced)]
    assert len(linear) >= 5
    for name in grads:
        assert_close_rel(grads[name], ref_grads[name], 1e-4, f"{family} gradient of {name}")


@pytest.mark.parametrize("family", FAMILIES)
def test_every_gradient_is_within_1e_4_of_a_float64_run(family):
    """Against the same model in float64 (attnlab's kernels then compute in float64: exact to
    1e-15), every float32 gradient is within 1e-4 relative, the decays' parameters (``A_log``,
    ``dt_bias``) included: the delta rules accumulate and exponentiate their decays in float64.
    transformers' own float32 path is 4.5e-4 to 5.9e-4 off on the Qwen models' ``A_log``."""
    import copy

    moe = {"experts_implementation": "eager"} if family in ("qwen3_next", "kimi_linear") else {}  # grouped_mm has no float64
    model = build(family, **moe)
    ids = torch.randint(3, 128, (2, 150), generator=torch.Generator().manual_seed(1))
    reference = copy.deepcopy(model).double()
    use_kernels(reference), use_kernels(model)
    _, want = forward_and_grads(reference, ids)
    _, grads = forward_and_grads(model, ids)
    for name in want:
        assert_close_rel(grads[name], want[name], 1e-4, f"{family} gradient of {name} against float64")


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_generation_of_50_tokens_is_identical(family, calls):
    model = build(family)
    prompt = torch.randint(3, 128, (1, 12), generator=torch.Generator().manual_seed(2))
    settings = dict(max_new_tokens=50, min_new_tokens=50, do_sample=False)
    ref = model.generate(prompt, **settings)
    use_kernels(model)
    out = model.generate(prompt, **settings)
    assert out.shape == (1, 62)
    assert torch.equal(out, ref)
    kind = "gated" if family in ("mamba2", "falcon_h1") else "delta"
    assert calls[f"{kind}_token"] == LINEAR[family] * 49  # each new token after the prefill, one step of the recurrent form per layer


def test_attention_layers_keep_attnlabs_attention_implementation():
    ref = build("qwen3_next")
    model = build("qwen3_next", attn_implementation="attnlab")
    assert model.config._attn_implementation == "attnlab"
    use_kernels(model)
    ids = torch.randint(3, 128, (2, 40), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert_close_rel(model(ids).logits, ref(ids).logits, FLOAT32, "qwen3_next with attnlab's attention")
    prompt = ids[:1, :10]
    assert torch.equal(model.generate(prompt, max_new_tokens=20, do_sample=False), ref.generate(prompt, max_new_tokens=20, do_sample=False))


def _fallback_lines(model, prompt) -> tuple[list[str], list]:
    """transformers' kernel-fallback lines and attnlab's warnings during one greedy generation (transformers says each line
    once per process: its memory of the lines said is cleared first)."""
    import logging
    import warnings

    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    kernels = logging.getLogger("transformers.integrations.hub_kernels")
    kernels.addHandler(handler)
    logging.Logger.warning_once.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.generate(prompt, max_new_tokens=3, do_sample=False)
    finally:
        kernels.removeHandler(handler)
    return [line for line in lines if "falling back" in line], [w for w in caught if issubclass(w.category, fallbacks.ServedFallback)]


def test_generation_of_a_served_model_says_what_attnlab_serves_not_that_transformers_falls_back():
    """Issue 58: transformers' "`causal_conv1d_update` is falling back to its reference PyTorch implementation" read as if
    attnlab served nothing; during a served model's call it becomes one line of attnlab's, and stays transformers' elsewhere."""
    model = build("qwen3_next")
    prompt = torch.randint(3, 128, (1, 6), generator=torch.Generator().manual_seed(4))
    swap = use_kernels(model)
    said, ours = _fallback_lines(model, prompt)
    assert said == [] and len(ours) == 1
    assert str(ours[0].message) == (
        "attnlab serves this model's linear-attention layers (Qwen3NextGatedDeltaNet: causal_conv1d_fn, torch_chunk_gated_delta_rule, "
        "torch_recurrent_gated_delta_rule); causal_conv1d_update (the short convolution's one-token update in decoding) is "
        "transformers' own reference PyTorch implementation, as causal_conv1d is not installed")
    swap.restore()  # transformers' own path: its own lines, the convolution update's among them
    said, ours = _fallback_lines(model, prompt)
    assert ours == [] and any(line.startswith("`causal_conv1d_update` is falling back") for line in said)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_packed_batch_equals_its_sequences_one_by_one(family):
    model = build(family)
    use_kernels(model)
    lengths = [13, 70, 1, 44]
    ids = torch.randint(3, 128, (1, sum(lengths)), generator=torch.Generator().manual_seed(4))
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        packed = model(ids, position_ids=positions, use_cache=False, output_hidden_states=True).hidden_states
        alone = [model(part, use_cache=False, output_hidden_states=True).hidden_states for part in ids.split(lengths, 1)]
    for i, layer in enumerate(packed):
        assert_close_rel(layer, torch.cat([a[i] for a in alone], 1), FLOAT32, f"{family} packed hidden state {i}")
    with torch.no_grad():  # the same call without position ids that restart lets state cross: the comparison can fail
        joined = model(ids, use_cache=False).logits
        assert (joined[0, 13:] - model(ids, position_ids=positions, use_cache=False).logits[0, 13:]).abs().max() > 1e-2


def test_transformers_own_path_refuses_packed_offsets_which_attnlab_serves():
    model = build("qwen3_next")
    ids = torch.randint(3, 128, (1, 30), generator=torch.Generator().manual_seed(5))
    cu = torch.tensor([0, 10, 30])
    with pytest.raises(ValueError, match="can't keep packed sequences apart"):
        model(ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=20, max_length_k=20, use_cache=False)
    use_kernels(model)
    with torch.no_grad():
        given = model(ids, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=20, max_length_k=20, use_cache=False,
                      position_ids=torch.cat([torch.arange(10), torch.arange(20)])[None]).logits
        alone = torch.cat([model(ids[:, :10], use_cache=False).logits, model(ids[:, 10:], use_cache=False).logits], 1)
    assert_close_rel(given, alone, FLOAT32, "offsets given")


def test_serving_changes_no_module_class_or_function_of_transformers():
    """use_kernels gives the served layers their own methods; transformers' modeling module, the
    layer class and its functions are the same objects before, during (a call that fails: packed
    offsets with a cache, refused) and after."""
    import inspect
    import sys

    model = build("qwen3_next")
    modeling = sys.modules[type(model).__module__]
    layer = model.model.layers[0].linear_attn
    before = {name: getattr(modeling, name) for name in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule",
                                                         "causal_conv1d_fn")}
    forward = type(layer).forward
    swap = use_kernels(model)
    own = inspect.unwrap(vars(layer)["forward"].__func__)  # under transformers' decorators, copied too
    assert own.__globals__ is vars(sys.modules["attnlab.served." + modeling.__name__]) and own.__code__ is inspect.unwrap(forward).__code__
    cu = torch.tensor([0, 10, 30])
    with pytest.raises(UnservedArgument, match="without a cache"):
        model(torch.randint(3, 128, (1, 30)), cu_seq_lens_q=cu, use_cache=True)
    assert {name: getattr(modeling, name) for name in before} == before and type(layer).forward is forward
    swap.restore()
    assert "forward" not in vars(layer)


def test_restore_gives_back_transformers_path_bit_for_bit(calls):
    model = build("kimi_linear")
    ids = torch.randint(3, 128, (1, 20), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref = model(ids).logits
        swap = use_kernels(model)
        assert set(swap.replaced) == {"model.layers.0.self_attn", "model.layers.1.self_attn", "model.layers.2.self_attn"}
        served = ("causal_conv1d_fn", "chunk_kimi_delta_attention", "recurrent_kimi_delta_attention")
        assert swap.replaced["model.layers.0.self_attn"] == served
        model(ids)
        with pytest.raises(ValueError, match=r"model.layers.0.self_attn \(KimiLinearDeltaAttention\) is already served by attnlab"):
            use_kernels(model)
        swap.restore()
        calls.clear()
        assert torch.equal(model(ids).logits, ref)
    assert not calls


def test_what_attnlab_cannot_serve_is_refused_by_name():
    q = torch.randn(1, 5, 2, 8)
    rule = adapters.delta_rule(torch.nn.functional.normalize, "chunk_gated_delta_rule")
    with pytest.raises(UnservedArgument, match="chunk_gated_delta_rule cannot serve head_first"):
        rule(q, q, q, -torch.rand(1, 5, 2), torch.rand(1, 5, 2), head_first=True)
    with pytest.raises(UnservedArgument, match="use_cache=False"):
        rule(q, q, q, -torch.rand(1, 5, 2), torch.rand(1, 5, 2), output_final_state=True, cu_seqlens=torch.tensor([0, 2, 5]))
    x = torch.randn(1, 5, 4, 8)
    with pytest.raises(UnservedArgument, match="mamba_chunk_scan_combined cannot serve return_varlen_states"):
        ssd.ssd_scan(x, torch.rand(1, 5, 4), -torch.rand(4), q, q, return_varlen_states=True)
    with pytest.raises(ValueError, match="LlamaForCausalLM has no linear-attention layer attnlab serves"):
        use_kernels(AutoModelForCausalLM.from_config(transformers.LlamaConfig(**dict(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2))))
    with pytest.raises(ValueError, match="no tiny config for 'llama'"):
        tiny_config("llama")


@pytest.mark.parametrize("family", ["mamba2", "falcon_h1"])
def test_the_ssd_functions_equal_transformers_with_groups_and_a_wider_state(family):
    """Two B/C groups over eight heads, state width 24 and head width 16; one decoding step (with
    Falcon-H1's gate z) updates the state in place as transformers' does."""
    import importlib

    modeling = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    g = torch.Generator().manual_seed(7)
    x, dt = torch.randn(1, 37, 8, 16, generator=g), torch.randn(1, 37, 8, generator=g)
    a, b, c = -3 * torch.rand(8, generator=g), torch.randn(1, 37, 2, 24, generator=g), torch.randn(1, 37, 2, 24, generator=g)
    d, bias, s0 = torch.randn(8, generator=g), torch.randn(8, generator=g), torch.randn(1, 8, 16, 24, generator=g)
    args = dict(chunk_size=16, D=d, dt_bias=bias, dt_softplus=True, initial_states=s0, return_final_states=True)
    ref, ref_s = modeling.mamba2_chunk_scan(x, dt, a, b, c, **args)
    out, s = ssd.ssd_scan(x, dt, a, b, c, **args)
    assert_close_rel(out, ref, FLOAT32, "ssd scan")
    assert_close_rel(s, ref_s, FLOAT32, "ssd final state")
    step = dict(D=d[:, None].expand(8, 16), dt_bias=bias[:, None].expand(8, 16), dt_softplus=True, z=torch.randn(1, 8, 16, generator=g))
    state_ref, state = ref_s.clone(), ref_s.clone()
    one = (x[:, 0], dt[:, 0, :, None].expand(1, 8, 16), a[:, None, None].expand(8, 16, 24), b[:, 0], c[:, 0])
    assert_close_rel(ssd.ssd_step(state, *one, **step), modeling.mamba2_selective_state_update(state_ref, *one, **step),
                     FLOAT32, "ssd step")
    assert_close_rel(state, state_ref, FLOAT32, "ssd step's state, in place")


def test_every_family_builds_a_model_whose_type_is_known_and_whose_layers_are_served():
    for family in FAMILIES:
        model = AutoModelForCausalLM.from_config(tiny_config(family))
        assert model.config.model_type in hybrid.MODEL_TYPES
        assert {type(m).__name__ for m in model.modules()} & set(hybrid.LAYERS)


def test_mambas_document_index_gives_the_same_packing_as_offsets():
    g = torch.Generator().manual_seed(8)
    x, dt, a = torch.randn(1, 20, 4, 8, generator=g), torch.randn(1, 20, 4, generator=g), -torch.rand(4, generator=g)
    b, c = torch.randn(1, 20, 2, 6, generator=g), torch.randn(1, 20, 2, 6, generator=g)
    seq_idx = torch.tensor([[0] * 7 + [1] * 13])
    by_index = ssd.ssd_scan(x, dt, a, b, c, dt_softplus=True, seq_idx=seq_idx)
    alone = torch.cat([ssd.ssd_scan(x[:, s], dt[:, s], a, b[:, s], c[:, s], dt_softplus=True) for s in (slice(0, 7), slice(7, 20))], 1)
    assert_close_rel(by_index, alone, FLOAT32, "seq_idx")
    assert_close_rel(ssd.ssd_scan(x, dt, a, b, c, dt_softplus=True, cu_seqlens=torch.tensor([0, 7, 20])), alone, FLOAT32, "offsets")


def test_offsets_come_only_from_position_ids_that_restart():
    assert packing.offsets_from_positions(torch.arange(9)[None]) is None
    assert packing.offsets_from_positions(torch.cat([torch.arange(4), torch.arange(5)])[None]).tolist() == [0, 4, 9]
    assert packing.offsets_from_positions(torch.arange(9)[None].expand(2, -1)) is None  # a batch of several is not packed
