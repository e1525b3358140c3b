"""attnlab as transformers' attention backend: parity with transformers' own sdpa path, generation
with its cache, swapped variants, sentence embeddings, and the errors for what a variant lacks."""

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers import masking_utils as hf_masks  # noqa: E402

import attnlab.integrations.transformers as at  # noqa: E402
from attnlab.integrations import masking  # noqa: E402
from attnlab.integrations.transformers import UnsupportedError  # noqa: E402

SMALL = dict(vocab_size=100, hidden_size=64, num_attention_heads=4, num_hidden_layers=2, intermediate_size=128,
             max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
GPT2 = dict(vocab_size=100, n_embd=64, n_head=4, n_layer=2, n_positions=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)

ARCHITECTURES = {  # name: (model class, config); the windows (8) are shorter than the 40-token batch
    "bert": ("BertModel", "BertConfig", SMALL),
    "gpt2": ("GPT2Model", "GPT2Config", GPT2),
    "llama": ("LlamaModel", "LlamaConfig", {**SMALL, "num_key_value_heads": 2}),
    "mistral": ("MistralModel", "MistralConfig", {**SMALL, "num_key_value_heads": 2, "sliding_window": 8}),
    "qwen2": ("Qwen2Model", "Qwen2Config", {**SMALL, "num_key_value_heads": 2}),
    "modernbert": ("ModernBertModel", "ModernBertConfig", {**SMALL, "num_hidden_layers": 3, "local_attention": 8,
                                                           "global_attn_every_n_layers": 2}),
}


def build(name, impl, options=None, *, arch=ARCHITECTURES, **overrides):
    """A random-weight model (seed 0, float64, eval) with attn_implementation=impl."""
    model_cls, config_cls, kwargs = arch[name]
    config = getattr(transformers, config_cls)(**{**kwargs, **overrides})
    config.attnlab_options = options
    torch.manual_seed(0)
    return getattr(transformers, model_cls)._from_config(copy.deepcopy(config), attn_implementation=impl).double().eval()


def batch(n=40, rows=3, seed=1):
    """Token ids and a padding mask: row 1 right-padded, row 2 left-padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (rows, n), generator=g)
    am = torch.ones(rows, n, dtype=torch.long)
    am[1, n - 10 :] = 0
    am[2, :7] = 0
    return ids.masked_fill(am == 0, 0), am


@pytest.mark.parametrize("name", list(ARCHITECTURES))
@pytest.mark.parametrize("options", [None, {"backend": "chunked", "block_size": 8}], ids=["auto", "block-sparse"])
def test_hidden_states_equal_the_sdpa_path_in_float64_on_a_padded_batch(name, options):
    ids, am = batch()
    ref, ours = build(name, "sdpa"), build(name, "attnlab", options)
    with torch.no_grad():
        a = ref(input_ids=ids, attention_mask=am, output_hidden_states=True).hidden_states
        b = ours(input_ids=ids, attention_mask=am, output_hidden_states=True).hidden_states
    real = am.bool()
    assert len(a) == len(b)
    assert max((x - y)[real].abs().max().item() for x, y in zip(a, b)) < 1e-10


def test_the_masks_transformers_builds_are_recognised_and_equal_its_own():
    """Causal, bidirectional and sliding windows become attnlab bands (tiles known without
    evaluating a pair); another function is evaluated; all equal transformers' dense sdpa mask,
    with padding and cache offsets."""
    am = torch.ones(2, 20, dtype=torch.bool)
    am[0, :3] = False
    custom = hf_masks.and_masks(hf_masks.causal_mask_function, lambda b, h, q, kv: (q - kv) % 3 != 1)
    cases = [(hf_masks.causal_mask_function, ("band", None, 0)), (hf_masks.bidirectional_mask_function, ("full",)),
             (hf_masks.sliding_window_causal_mask_function(5), ("band", -4, 0)),
             (hf_masks.sliding_window_bidirectional_mask_function(3), ("band", -3, 3)), (custom, ("custom",))]
    for fn, kind in cases:
        for n, m, q_off, kv_off in [(20, 20, 0, 0), (1, 20, 19, 0), (4, 12, 16, 8)]:
            mask = masking.model_mask(2, n, m, q_off, kv_off, fn, am)
            want = hf_masks.sdpa_mask(batch_size=2, q_length=n, kv_length=m, q_offset=q_off, kv_offset=kv_off, mask_function=fn,
                                      attention_mask=am, allow_is_causal_skip=False)
            assert mask.kind == kind
            assert torch.equal(mask.dense(n, m, batch=2).expand(2, 1, n, m), want.expand(2, 1, n, m))


def test_soft_capping_is_a_score_function_equal_to_gemma2_eager():
    """Gemma 2 caps its logits (sdpa refuses it); eager computes its softmax in float32, hence 1e-6."""
    arch = {"gemma2": ("Gemma2Model", "Gemma2Config", {**SMALL, "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 8})}
    ids, _ = batch()
    outs = {}
    for cap in (0.02, None):  # random weights give small logits: a small cap bites
        ref = build("gemma2", "eager", arch=arch, attn_logit_softcapping=cap)
        ours = build("gemma2", "attnlab", arch=arch, attn_logit_softcapping=cap)
        with torch.no_grad():
            a, outs[cap] = ref(input_ids=ids).last_hidden_state, ours(input_ids=ids).last_hidden_state
        assert (a - outs[cap]).abs().max().item() < 1e-6
    assert (outs[0.02] - outs[None]).abs().max().item() > 1e-3  # the cap changes the model: it was applied


def test_attention_weights_and_gradients_equal_transformers():
    ids, am = batch(16)
    ref, ours = build("bert", "eager"), build("bert", "attnlab")
    a = ref(input_ids=ids, attention_mask=am, output_attentions=True)
    b = ours(input_ids=ids, attention_mask=am, output_attentions=True)
    real = am.bool()
    for x, y in zip(a.attentions, b.attentions):
        assert (x - y).transpose(1, 2)[real].abs().max().item() < 1e-12
    (a.last_hidden_state[real] ** 2).sum().backward()
    (b.last_hidden_state[real] ** 2).sum().backward()
    grads = dict(ref.named_parameters())
    assert max((p.grad - grads[k].grad).abs().max().item() for k, p in ours.named_parameters() if p.grad is not None) < 1e-10


def test_attention_dropout_applies_in_training_only():
    ids, am = batch(16)
    kw = dict(attention_probs_dropout_prob=0.5, hidden_dropout_prob=0.0)
    model, ref = build("bert", "attnlab", **kw), build("bert", "sdpa", **kw)
    real = am.bool()
    with torch.no_grad():
        still = model(input_ids=ids, attention_mask=am).last_hidden_state
        assert (still - ref(input_ids=ids, attention_mask=am).last_hidden_state)[real].abs().max().item() < 1e-10
        model.train()
        first, second = (model(input_ids=ids, attention_mask=am).last_hidden_state for _ in range(2))
    assert (first - second)[real].abs().max().item() > 1e-3 and (first - still)[real].abs().max().item() > 1e-3


LMS = {
    "llama": ("LlamaForCausalLM", "LlamaConfig", {**SMALL, "num_key_value_heads": 2}),
    "mistral": ("MistralForCausalLM", "MistralConfig", {**SMALL, "num_key_value_heads": 2, "sliding_window": 16}),
    "gpt2": ("GPT2LMHeadModel", "GPT2Config", GPT2),
}
GREEDY = dict(max_new_tokens=50, min_new_tokens=50, do_sample=False)


def generate(model, ids, am, **kw):
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=am, **GREEDY, **kw)


@pytest.mark.parametrize("name", list(LMS))
def test_generate_gives_the_tokens_of_transformers_own_attention(name):
    """Greedy, 50 new tokens, with transformers' cache (prefill, then one token at a time; Mistral's
    window of 16 slides), on a left-padded batch."""
    ids, am = batch(12, seed=2)
    ids, am = ids[[0, 2]], am[[0, 2]]  # generation pads on the left
    a = generate(build(name, "sdpa", arch=LMS), ids, am)
    b = generate(build(name, "attnlab", arch=LMS), ids, am)
    assert a.shape == (2, 62) and torch.equal(a, b)


@pytest.mark.parametrize("variant,options", [("local", {"window": 6}), ("longformer", {"window": 6}), ("linear", None),
                                             ("performer", None)])
def test_a_swapped_variant_decodes_with_the_cache_as_it_computes_the_whole_sequence(variant, options):
    ids, am = batch(12, seed=2)
    ids, am = ids[[0, 2]], am[[0, 2]]
    model = build("llama", at.implementation(variant), options, arch=LMS)
    cached, whole = generate(model, ids, am), generate(model, ids, am, use_cache=False)
    assert torch.equal(cached, whole)
    assert not torch.equal(cached, generate(build("llama", "attnlab", arch=LMS), ids, am))  # the variant changed the model


def test_a_sparse_pattern_that_covers_every_pair_keeps_the_trained_output():
    ids, am = batch()
    ref = build("bert", "sdpa")
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=am).last_hidden_state
        full = build("bert", "attnlab:local", {"window": 40})(input_ids=ids, attention_mask=am).last_hidden_state
        cut = build("bert", "attnlab:local", {"window": 4})(input_ids=ids, attention_mask=am).last_hidden_state
    real = am.bool()
    assert (want - full)[real].abs().max().item() < 1e-10
    assert (want - cut)[real].abs().max().item() > 1e-3


def test_what_a_variant_lacks_is_named_with_the_model():
    ids, am = batch(12, seed=2)
    for variant in ("linformer", "nystrom"):
        with pytest.raises(UnsupportedError,
                           match=rf"LlamaAttention \(a llama model\) attends causally; the '{variant}' attention has no causal form"):
            build("llama", f"attnlab:{variant}", arch=LMS)(input_ids=ids)
    with pytest.raises(UnsupportedError, match=r"MistralAttention .* sliding window of 16 positions, which cuts at 40 keys; the 'linear'"):
        build("mistral", "attnlab:linear", arch=LMS)(input_ids=batch(40)[0])
    build("mistral", "attnlab:linear", arch=LMS)(input_ids=batch(16)[0])  # a window that cuts nothing is plain causal
    with pytest.raises(UnsupportedError, match=r"decodes with a cache; the 'reformer' attention has no cached decoding"):
        generate(build("llama", "attnlab:reformer", arch=LMS), ids[:1], am[:1])
    arch = {"gemma2": ("Gemma2Model", "Gemma2Config", {**SMALL, "num_key_value_heads": 2, "head_dim": 16, "sliding_window": 64})}
    with pytest.raises(UnsupportedError, match=r"Gemma2Attention \(a gemma2 model\) needs soft-capping \(50.0\); the 'linear'"):
        build("gemma2", "attnlab:linear", arch=arch)(input_ids=ids)
    with pytest.raises(UnsupportedError, match=r"needs the attention weights; the 'performer'"):
        build("bert", "attnlab:performer")(input_ids=ids, output_attentions=True)


def test_unknown_names_and_options_are_refused_with_the_known_ones():
    assert at.implementation() == "attnlab" and at.implementation("local") == "attnlab:local"
    assert set(at.implementations()) <= set(transformers.AttentionInterface().valid_keys())
    with pytest.raises(ValueError, match=r"unknown attention variant 'flash'; known: dense, bigbird, .*linear"):
        at.implementation("flash")
    with pytest.raises(ValueError, match=r"'gla' attention is a sequence mixer: it computes its gates from the layer's input"):
        at.implementation("gla")
    ids, _ = batch(8)
    with pytest.raises(ValueError, match=r"the exact attention takes score, normalize, backend, block_size, not window"):
        build("bert", "attnlab", {"window": 3})(input_ids=ids)
    with pytest.raises(ValueError, match=r"unknown option 'windw' for the attention 'local'; it takes .*window"):
        build("bert", "attnlab:local", {"windw": 3})(input_ids=ids)
    with pytest.raises(TypeError, match=r"attnlab_options must be a dict"):
        build("bert", "attnlab", "window=3")(input_ids=ids)



def test_a_misspelt_or_unswappable_variant_is_answered_with_attnlabs_variants():
    """transformers refuses a name it does not hold before attnlab sees it: implementation() and
    set_attention() name the closest variant; the variants that cannot serve are registered, and
    refused at the first call with the reason and the swappable ones."""
    ids, _ = batch(8)
    model = build("llama", "attnlab", arch=LMS)
    for name in ("lokal", "attnlab:lokal"):
        with pytest.raises(ValueError, match=r"unknown attention variant 'lokal' \(did you mean 'local'\?\); known: dense, .*local"):
            at.implementation(name)
    with pytest.raises(ValueError, match=r"'lokal' \(did you mean 'local'\?\)"):
        at.set_attention(model, "lokal", window=2)
    assert model.config._attn_implementation == "attnlab" and not model.config.attnlab_options
    model.set_attn_implementation("attnlab:retnet")
    with pytest.raises(UnsupportedError, match=r"LlamaAttention \(a llama model\): the 'retnet' attention is a sequence mixer: "
                                               r"it computes its gates from the layer's input, .*; swappable: dense, bigbird, .*local"):
        model(input_ids=ids)
    model.set_attn_implementation("attnlab:dense")
    with pytest.raises(UnsupportedError, match=r"the exact attention is attn_implementation='attnlab', not 'attnlab:dense'"):
        model(input_ids=ids)


def test_options_left_by_an_earlier_variant_are_named_with_how_to_reset_them():
    ids, am = batch(16)
    real = am.bool()
    model = build("bert", "attnlab:local", {"window": 2})
    with torch.no_grad():
        want = build("bert", "sdpa")(input_ids=ids, attention_mask=am).last_hidden_state
        local = model(input_ids=ids, attention_mask=am).last_hidden_state
        model.set_attn_implementation("attnlab")
        with pytest.raises(ValueError, match=r"takes score, normalize, backend, block_size, not window \('window' is an option of bigbird, "
                                             r"local, longformer: left from an earlier attn_implementation\?\)\. Reset the options with "
                                             r"model\.config\.attnlab_options = \{\}, or switch with .*set_attention\(model, 'dense'"):
            model(input_ids=ids, attention_mask=am)
        model.set_attn_implementation("attnlab:linear")
        with pytest.raises(ValueError, match=r"unknown option 'window' for the attention 'linear'; it takes eps, max_len, seed \('window'"):
            model(input_ids=ids, attention_mask=am)
        model.config.attnlab_options = {}
        model.set_attn_implementation("attnlab")
        assert (model(input_ids=ids, attention_mask=am).last_hidden_state - want)[real].abs().max().item() < 1e-10
        # set_attention sets the implementation and exactly its options: nothing is left behind
        assert at.set_attention(model, "local", window=2) == "attnlab:local"
        assert torch.equal(model(input_ids=ids, attention_mask=am).last_hidden_state, local)
        assert at.set_attention(model, "dense") == "attnlab" and model.config.attnlab_options == {}
        assert (model(input_ids=ids, attention_mask=am).last_hidden_state - want)[real].abs().max().item() < 1e-10
    with pytest.raises(ValueError, match=r"unknown option 'windw' for the attention 'local'; it takes .* \(did you mean 'window'\?\)"):
        at.set_attention(model, "local", windw=2)
    with pytest.raises(ValueError, match=r"unknown option 'head_mode' for the attention 'local'"):  # the model's projections stay
        at.set_attention(model, "local", window=2, head_mode="project")
    assert model.config._attn_implementation == "attnlab"


def test_set_attention_reaches_every_config_of_an_encoder_decoder():
    """T5's encoder and decoder stacks hold copies of the model's config: each gets the options."""
    arch = {"t5": ("T5Model", "T5Config", dict(vocab_size=100, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                              pad_token_id=0, decoder_start_token_id=0))}
    ids, _ = batch(20)
    model = build("t5", "attnlab", arch=arch)
    at.set_attention(model, "dense", normalize="sigmoid")
    assert model.encoder.config is not model.config
    assert all(getattr(m.config, "attnlab_options", None) == {"normalize": "sigmoid"} for m in (model, model.encoder, model.decoder))
    with torch.no_grad():
        ours = model(input_ids=ids, decoder_input_ids=ids[:, :5]).last_hidden_state
        want = build("t5", "attnlab", {"normalize": "sigmoid"}, arch=arch)(input_ids=ids, decoder_input_ids=ids[:, :5]).last_hidden_state
    assert torch.equal(ours, want)

def test_a_normaliser_swapped_into_a_trained_model_changes_it_and_softmax_does_not():
    ids, am = batch(16)
    with torch.no_grad():
        want = build("bert", "sdpa")(input_ids=ids, attention_mask=am).last_hidden_state
        same = build("bert", "attnlab", {"normalize": "softmax", "score": "scaled_dot"})(input_ids=ids, attention_mask=am)
        other = build("bert", "attnlab", {"normalize": "sigmoid"})(input_ids=ids, attention_mask=am)
    real = am.bool()
    assert (want - same.last_hidden_state)[real].abs().max().item() < 1e-10
    assert (want - other.last_hidden_state)[real].abs().max().item() > 1e-3


def test_minilm_embeddings_through_transformers_equal_attnlab_pretrained_and_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers")
    from tests.pretrained.test_load import SENTENCES

    plain = st.SentenceTransformer(str(minilm.folder), device="cpu").encode(SENTENCES, convert_to_tensor=True)
    model = st.SentenceTransformer(str(minilm.folder), device="cpu", model_kwargs={"attn_implementation": "attnlab"})
    assert model[0].auto_model.config._attn_implementation == "attnlab"
    ours = model.encode(SENTENCES, convert_to_tensor=True)
    assert (ours - plain).abs().max().item() < 1e-5
    assert (ours - minilm.embed(SENTENCES)).abs().max().item() < 1e-5


def test_a_vision_transformer_gives_the_logits_of_its_own_attention():
    """transformers' ViT (timm cannot be imported on this machine: its torchvision wheels need CUDA torch)."""
    arch = {"vit": ("ViTForImageClassification", "ViTConfig", dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                                                                      num_attention_heads=4, intermediate_size=128, num_labels=10))}
    pixels = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        want = build("vit", "sdpa", arch=arch)(pixel_values=pixels).logits
        for options in (None, {"backend": "chunked", "block_size": 4}):
            assert (build("vit", "attnlab", options, arch=arch)(pixel_values=pixels).logits - want).abs().max().item() < 1e-10
        swapped = build("vit", "attnlab:nystrom", {"landmarks": 17, "pinv": "exact"},  # 17 tokens: its exact limit
                        arch=arch)(pixel_values=pixels).logits
    assert (swapped - want).abs().max().item() < 1e-8


def test_a_relative_position_bias_is_added_as_t5_adds_it():
    """T5 hands its learnt relative-position bias to the attention (position_bias=): encoder,
    causal decoder and cross-attention equal sdpa's."""
    arch = {"t5": ("T5Model", "T5Config", dict(vocab_size=100, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                              pad_token_id=0, decoder_start_token_id=0))}
    ids, am = batch(20)
    dec = batch(9, seed=3)[0][:, :9].clamp(min=3)
    with torch.no_grad():
        a = build("t5", "sdpa", arch=arch)(input_ids=ids, attention_mask=am, decoder_input_ids=dec)
        b = build("t5", "attnlab", arch=arch)(input_ids=ids, attention_mask=am, decoder_input_ids=dec)
    assert (a.encoder_last_hidden_state - b.encoder_last_hidden_state)[am.bool()].abs().max().item() < 1e-10
    assert (a.last_hidden_state - b.last_hidden_state).abs().max().item() < 1e-10
    with pytest.raises(UnsupportedError, match=r"T5Attention \(a t5 model\) needs a score bias; the 'linear' attention"):
        build("t5", "attnlab:linear", arch=arch)(input_ids=ids, attention_mask=am, decoder_input_ids=dec)


def test_generate_with_a_static_cache_gives_the_tokens_of_transformers_own_attention():
    ids, am = batch(12, seed=2)
    ids, am = ids[[0, 2]], am[[0, 2]]
    a = generate(build("llama", "sdpa", arch=LMS), ids, am, cache_implementation="static")
    b = generate(build("llama", "attnlab", arch=LMS), ids, am, cache_implementation="static")
    assert torch.equal(a, b) and torch.equal(a, generate(build("llama", "sdpa", arch=LMS), ids, am))


def test_a_variant_is_refused_the_same_with_a_cache_as_without():
    """A sliding-window cache has dropped the keys a window cut: linear attention over what is left
    would be a windowed variant, so decoding past the window is refused as the whole sequence is;
    bigbird's random blocks are drawn for the whole length: no cached decoding."""
    ids, am = batch(12, seed=2)
    with pytest.raises(UnsupportedError, match=r"sliding window of 16 positions, which cuts at 17 keys; the 'linear'"):
        generate(build("mistral", "attnlab:linear", arch=LMS), ids[:1], am[:1])
    with pytest.raises(UnsupportedError, match=r"decodes with a cache; the 'bigbird' attention has no cached decoding"):
        generate(build("llama", "attnlab:bigbird", {"random_blocks": 2, "window": 2, "global_tokens": 1}, arch=LMS), ids[:1], am[:1])
