"""The BERT loader against Hugging Face transformers and sentence-transformers, and its errors."""

import json
import shutil

import pytest
import torch

from attnlab import pretrained
from attnlab.pretrained import PretrainedError
from attnlab.pretrained.heads import attention_map, find_links, token_positions
from tests.bert_folder import write_tiny_bert

transformers = pytest.importorskip("transformers")

SENTENCES = [
    "The law will never be perfect, but its application should be just.",
    "Attention is all you need.",
    "A cat sat on the mat, and the model attends to its weights.",
]


def hf_run(folder, batch, dtype=torch.float32):
    hf = transformers.AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval().to(dtype)
    with torch.no_grad():
        return hf(input_ids=batch.ids, attention_mask=batch.padding.long(), token_type_ids=batch.token_type_ids,
                  output_hidden_states=True, output_attentions=True)


def compare_with_hf(model, folder, texts, dtype=torch.float32):
    """Max differences (hidden states at real tokens, attention probabilities at real query rows) against HF."""
    model = model.to(dtype)
    batch = model.encode(texts)
    assert not batch.padding.all(), "the texts must need padding"
    with torch.no_grad():
        ours = model(batch, return_weights=True, return_hidden=True)
    ref = hf_run(folder, batch, dtype)
    real = batch.padding
    hidden = max((a - b).abs()[real].max().item() for a, b in zip(ours.hidden, ref.hidden_states))
    probs = max((a - b).abs().transpose(1, 2)[real].max().item() for a, b in zip(ours.weights, ref.attentions))
    assert len(ours.hidden) == len(ref.hidden_states) and len(ours.weights) == len(ref.attentions)
    return hidden, probs


def test_tiny_bert_equals_hugging_face_in_float32_and_float64(tiny_bert):
    m = pretrained.load(tiny_bert)
    assert m.missing == []
    hidden, probs = compare_with_hf(m, tiny_bert, SENTENCES)
    assert hidden < 1e-5 and probs < 1e-6, (hidden, probs)
    hidden, probs = compare_with_hf(pretrained.load(tiny_bert), tiny_bert, SENTENCES, torch.float64)
    assert hidden < 1e-10 and probs < 1e-12, (hidden, probs)


def test_minilm_equals_hugging_face_on_real_sentences_with_padding(minilm):
    hidden, probs = compare_with_hf(minilm, minilm.folder, SENTENCES)
    assert hidden < 1e-5 and probs < 1e-6, (hidden, probs)


def test_minilm_sentence_embeddings_equal_sentence_transformers(minilm):
    st = pytest.importorskip("sentence_transformers")
    ref = st.SentenceTransformer(str(minilm.folder), device="cpu").encode(SENTENCES, convert_to_tensor=True)
    ours = minilm.embed(SENTENCES)
    assert minilm.normalize_embeddings  # the folder's modules.json ends with Normalize
    assert (ours - ref).abs().max().item() < 1e-5


def test_minilm_has_a_head_that_links_its_to_law_as_hugging_face_sees_it(minilm):
    amap = attention_map(minilm, SENTENCES[0])
    best = find_links(amap, "its", "law", top=3)
    i, j = amap.tokens.index("its"), amap.tokens.index("law")
    ref = torch.stack([a[0] for a in hf_run(minilm.folder, minilm.encode(SENTENCES[0])).attentions])  # (L, H, N, N)
    flat = ref[:, :, i, j].flatten()
    assert divmod(int(flat.argmax()), ref.shape[1]) == (best[0].layer, best[0].head)
    assert best[0].weight == pytest.approx(float(flat.max()), abs=1e-6)
    assert best[0].weight > 0.5 and best[0].weight >= best[1].weight >= best[2].weight


def test_weights_from_pytorch_bin_and_with_a_task_models_bert_prefix(tmp_path, tiny_bert):
    ref = pretrained.load(tiny_bert).embed(SENTENCES)
    bin_folder = write_tiny_bert(tmp_path / "bin", safetensors=False)
    assert (bin_folder / "pytorch_model.bin").exists() and not (bin_folder / "model.safetensors").exists()
    assert torch.equal(pretrained.load(bin_folder).embed(SENTENCES), ref)  # same seed, same weights
    prefixed = write_tiny_bert(tmp_path / "cls", prefix=True)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(prefixed / "model.safetensors"))
    assert any(k.startswith("bert.") for k in tensors)
    m = pretrained.load(prefixed)
    hf = transformers.BertForSequenceClassification.from_pretrained(str(prefixed)).eval()
    batch = m.encode(SENTENCES)
    with torch.no_grad():
        ref_hidden = hf.bert(input_ids=batch.ids, attention_mask=batch.padding.long(),
                             token_type_ids=batch.token_type_ids).last_hidden_state
    assert m.missing == [] and (m(batch).output - ref_hidden).abs()[batch.padding].max() < 1e-5
    # the old LayerNorm names (gamma / beta) of early BERT checkpoints
    old = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v for k, v in tensors.items()}
    assert any(k.endswith("LayerNorm.gamma") for k in old)
    save_file(old, str(prefixed / "model.safetensors"))
    assert torch.equal(pretrained.load(prefixed)(batch).output, m(batch).output)


def test_segment_ids_and_small_batches_match_hugging_face(tiny_bert):
    m = pretrained.load(tiny_bert)
    pair = m.tokenizer.encode("the law will never be perfect", "its application should be just")
    assert set(pair.type_ids) == {0, 1}
    batch = pretrained.Encoded(torch.tensor([pair.ids]), torch.tensor([pair.type_ids]), torch.ones(1, len(pair.ids), dtype=torch.bool),
                               [pair.tokens])
    assert (m(batch).output - hf_run(tiny_bert, batch).last_hidden_state).abs().max() < 1e-5
    whole = m.embed(SENTENCES)
    assert (m.embed(SENTENCES, batch_size=1) - whole).abs().max() < 1e-5  # batches of 1: no padding
    m.train()
    m.embed(SENTENCES)
    assert m.training  # embed runs in eval mode and gives the mode back


def test_bad_arguments_are_refused(tiny_bert):
    m = pretrained.load(tiny_bert)
    for kwargs, message in (({"max_length": 1}, "max_length must be"), ({"max_length": 0}, "max_length must be"),
                            ({"pad_to": 2}, "pad_to=2 is shorter than the longest text")):
        with pytest.raises(ValueError, match=message):
            m.encode(SENTENCES, **kwargs)
    with pytest.raises(ValueError, match="no texts to embed"):
        m.embed([])
    with pytest.raises(ValueError, match="batch_size must be"):
        m.embed(SENTENCES, batch_size=0)
    with pytest.raises(TypeError, match="texts must be"):
        m.encode([1, 2])


def test_pooling_and_length_come_from_the_sentence_transformers_files(tmp_path, tiny_bert):
    folder = tmp_path / "st"
    shutil.copytree(tiny_bert, folder)
    (folder / "modules.json").write_text(json.dumps([
        {"type": "sentence_transformers.models.Transformer", "path": ""},
        {"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"},
        {"type": "sentence_transformers.models.Normalize", "path": "2_Normalize"},
    ]))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 8}))
    m = pretrained.load(folder)
    assert (m.pooling, m.normalize_embeddings, m.sentence_length) == ("cls", True, 8)
    batch = m.encode(SENTENCES[1])
    ref = torch.nn.functional.normalize(m(batch).output[:, 0], dim=-1)
    assert torch.allclose(m.embed(SENTENCES[1]), ref, atol=1e-6)
    with pytest.raises(ValueError, match="more than 8"):
        m.embed(SENTENCES[0])  # sentence-transformers would cut it at 8 tokens: we say so
    assert m.embed(SENTENCES[0], truncate=True).shape == (1, 32)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_weightedmean_tokens": True}))
    with pytest.raises(PretrainedError, match="pooling \\['weightedmean_tokens'\\]"):
        pretrained.load(folder)


def test_a_variant_at_its_exact_limit_keeps_the_trained_output(tiny_bert):
    dense = pretrained.load(tiny_bert)
    local = pretrained.load(tiny_bert, attention="local", attention_options={"window": 64})
    assert isinstance(local.model.encoder.layers[0].attn.step, __import__("attnlab").efficient.LocalAttention)
    assert (local.embed(SENTENCES) - dense.embed(SENTENCES)).abs().max() < 1e-5
    narrow = pretrained.load(tiny_bert, attention="local", attention_options={"window": 1})
    assert (narrow.embed(SENTENCES) - dense.embed(SENTENCES)).abs().max() > 1e-3  # a real change, not a no-op
    lin = pretrained.load(tiny_bert, attention="linformer", attention_options={"k": 8})
    assert any("proj_k" in k for k in lin.missing)  # its own projections are not in the checkpoint
    relu = pretrained.load(tiny_bert, normalize="relu")
    assert (relu.embed(SENTENCES) - dense.embed(SENTENCES)).abs().max() > 1e-3


def test_text_longer_than_the_positions_is_refused_or_truncated_when_asked(tiny_bert):
    m = pretrained.load(tiny_bert)
    long = " ".join(["attention"] * 100)
    with pytest.raises(ValueError, match="102 tokens, more than 64.*truncate"):
        m.encode(long)
    batch = m.encode(long, truncate=True)
    assert batch.ids.shape == (1, 64) and batch.tokens[0][-1] == "[SEP]" and batch.tokens[0][0] == "[CLS]"
    with pytest.raises(ValueError, match="exceeds the model's 64 positions"):
        m.encode("a", max_length=100)


def test_available_names_the_shipped_model_and_where_it_is(minilm):
    assert pretrained.available()["all-MiniLM-L6-v2"] == str(minilm.folder)
    assert pretrained.locate("all-MiniLM-L6-v2") == minilm.folder and (minilm.folder / "config.json").exists()


def test_unknown_name_lists_the_known_models():
    with pytest.raises(PretrainedError, match="unknown model 'bert-huge'.*all-MiniLM-L6-v2"):
        pretrained.locate("bert-huge")


def test_a_folder_of_another_architecture_says_which(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(PretrainedError, match="model_type 'gpt2' \\(GPT2LMHeadModel\\)"):
        pretrained.load(tmp_path)


def test_missing_files_and_mismatched_tensors_are_named(tmp_path, tiny_bert):
    with pytest.raises(PretrainedError, match="no config.json"):
        pretrained.load(tmp_path)
    folder = tmp_path / "m"
    shutil.copytree(tiny_bert, folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(PretrainedError, match="no tokenizer.json"):
        pretrained.load(folder)
    shutil.copy(tiny_bert / "tokenizer.json", folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["intermediate_size"] = 48
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PretrainedError,
                       match="'encoder.layer.0.intermediate.dense.weight' has shape \\(64, 32\\), the model expects \\(48, 32\\)"):
        pretrained.load(folder)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(PretrainedError, match="could not be read"):
        pretrained.load(folder)
    (folder / "model.safetensors").unlink()
    with pytest.raises(PretrainedError, match="neither model.safetensors nor pytorch_model.bin"):
        pretrained.load(folder)


def test_an_efficient_variant_has_no_attention_map(tiny_bert):
    with pytest.raises(ValueError, match="never builds the N x M weights"):
        attention_map(pretrained.load(tiny_bert, attention="linear"), SENTENCES[0])


def test_token_positions_find_words_split_into_pieces():
    tokens = ["[CLS]", "the", "head", "##s", "attend", "heads", "[SEP]"]
    assert token_positions(tokens, "heads") == [5]  # the exact token first
    assert token_positions(["[CLS]", "head", "##s", "[SEP]"], "Heads") == [1]
    with pytest.raises(ValueError, match="'law' is not among the tokens"):
        token_positions(tokens, "law")
