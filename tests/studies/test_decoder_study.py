"""The decoder half of bench pretrained: the trained folder, the byte tokenizer, and the rows."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from attnlab.studies import decoder  # noqa: E402


def test_the_byte_tokenizer_has_one_token_per_byte_and_round_trips():
    tok = decoder.byte_tokenizer()
    text = "naïve café: x = 1 \u2192 2\n\ttabs"
    ids = tok.encode(text).ids
    assert len(ids) == len(text.encode("utf-8")) and tok.get_vocab_size() == 256
    assert tok.decode(ids) == text


def test_the_trained_folder_is_a_transformers_model_with_its_record(tiny_decoder):
    info = json.loads((tiny_decoder / "training.json").read_text())
    assert info["steps"] == 3 and info["length"] == 32 and info["validation_perplexity"] > 1
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny_decoder), attn_implementation="sdpa")
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_key_value_heads == 2
    assert decoder.is_decoder(tiny_decoder) and decoder.is_decoder("docs-llama")
    assert not list(tiny_decoder.parent.glob("tiny.*"))  # the temporary folder is gone


def test_rows_the_exact_backend_keeps_the_perplexity_and_a_window_changes_it(tiny_decoder):
    recs = decoder.run(str(tiny_decoder), ["local", "linear"], [32], windows=6, timing_batch=2, max_points=1)
    assert [(r.variant, r.budget) for r in recs] == [("sdpa", "trained"), ("attnlab", "exact"), ("local", "window=16"),
                                                     ("linear", "(none)")]
    sdpa, exact, local, linear = recs
    assert sdpa.ratio == 1.0 and sdpa.time_ratio == 1.0 and sdpa.windows == 6
    assert abs(exact.ratio - 1) < 1e-6  # float32, the same attention computed by attnlab
    assert abs(local.ratio - 1) > 1e-6 and abs(linear.ratio - 1) > 1e-4
    # the held-out windows are the docs text's test part, never trained on
    train, _, test = decoder._splits(decoder.byte_tokenizer())
    assert torch.equal(decoder.heldout_windows(tiny_decoder, 32, 6)[0], test[:32])


def test_a_variant_without_a_causal_form_and_a_bad_folder_are_refused(tmp_path, tiny_decoder, tiny_bert):
    assert "linformer" not in decoder.decoder_variants() and "gla" not in decoder.decoder_variants()
    with pytest.raises(ValueError, match="the 'linformer' attention cannot serve a causal language model; expected some of .*local"):
        decoder.run(str(tiny_decoder), ["linformer"], [32])
    with pytest.raises(ValueError, match="neither a decoder folder .* nor a known name \\(docs-llama\\)"):
        decoder.run(str(tmp_path), ["local"], [32])
    with pytest.raises(ValueError, match="lengths must be in 2 .. 32"):
        decoder.run(str(tiny_decoder), ["local"], [64])
    assert not decoder.is_decoder(tiny_bert)


def test_an_unknown_variant_is_named_as_unknown(tiny_decoder):
    with pytest.raises(ValueError, match="unknown attention variant 'locl'; expected some of .*local"):
        decoder.run(str(tiny_decoder), ["locl"], [32])
    with pytest.raises(ValueError, match=r"lengths must be in 2 .. 512 \(the model's positions\), got \[1024\]"):
        decoder.run("docs-llama", ["local"], [1024])  # refused before the model is trained


def test_training_settings_are_checked_before_any_work(tmp_path):
    with pytest.raises(ValueError, match="unknown training setting\\(s\\) step; expected some of steps, length"):
        decoder.train_decoder(tmp_path / "d", step=3)
    for bad, message in ((dict(steps=0), "steps must be a positive int"), (dict(length=1), "length must be an int >= 2"),
                         (dict(lr=0.0), "lr must be a number > 0")):
        with pytest.raises(ValueError, match=message):
            decoder.train_decoder(tmp_path / "d", **bad)
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_another_decoder_is_measured_on_standard_library_docstrings(tmp_path, tiny_decoder):
    """A folder without docs-llama's training record: held-out text is the standard library's
    documented code, through the folder's own tokenizer."""
    import shutil

    from attnlab.studies.pretrained import docstring_pairs

    other = tmp_path / "other"
    shutil.copytree(tiny_decoder, other)
    (other / "training.json").unlink()
    w = decoder.heldout_windows(other, 32, 3)
    assert w.shape == (3, 32)
    tok = decoder.byte_tokenizer()
    text = "".join(p.document for p in docstring_pairs(12))
    assert tok.decode(w.reshape(-1).tolist()) == tok.decode(tok.encode(text).ids[: 96])


def test_a_hybrid_folder_gains_the_kernels_row_at_the_same_perplexity(tmp_path, monkeypatch):
    """bench pretrained --model on a Qwen3-Next folder (random weights, the byte tokenizer): the
    'kernels' row computes its linear-attention layers through attnlab and keeps the perplexity."""
    from attnlab.integrations.hybrid import tiny_config

    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(tiny_config("qwen3_next", vocab_size=256)).save_pretrained(tmp_path / "qwen")
    with pytest.raises(ValueError, match="has no tokenizer.json: the held-out text is cut into tokens by the model's own"):
        decoder.run(str(tmp_path / "qwen"), ["local"], [48], windows=2)
    decoder.byte_tokenizer().save(str(tmp_path / "qwen" / "tokenizer.json"))
    assert decoder.is_decoder(tmp_path / "qwen") and decoder.is_hybrid(tmp_path / "qwen")
    from attnlab.efficient import recurrence

    served = []
    chunk_delta = recurrence.chunk_delta
    monkeypatch.setattr(recurrence, "chunk_delta", lambda *a, **kw: served.append(a[0].shape) or chunk_delta(*a, **kw))
    recs = decoder.run(str(tmp_path / "qwen"), ["local"], [48], windows=2, timing_batch=1, max_points=1)
    assert [r.variant for r in recs] == ["sdpa", "attnlab", "kernels", "local"]
    sdpa, exact, kernels, local = recs
    assert abs(kernels.ratio - 1) < 1e-5 and abs(exact.ratio - 1) < 1e-6
    assert served and all(shape[2] == 48 for shape in served)  # only the kernels row's three linear layers, every call
    assert not decoder.is_hybrid(tmp_path)
