"""A tiny random BERT folder written by Hugging Face ``transformers`` itself (no download), for the
pretrained loader, the attention viewer and their commands."""

import json

import pytest
import torch

WORDS = (
    "the law will never be perfect but its application should be just a cat sat on mat attention is all you need "
    "self weights query key value head layer token model ##s ##ing ##ed , ."
).split()


def write_tiny_bert(folder, *, positions=64, safetensors=True, prefix=False, seed=0):
    """A random 2-block BERT (width 32, 4 heads) in the Hugging Face layout, with a WordPiece tokenizer."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *dict.fromkeys(WORDS)])}
    cfg = transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=positions, type_vocab_size=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        initializer_range=0.3,  # larger than BERT's 0.02: peaked, token-dependent attention, so that swapping it shows
    )
    cls = transformers.BertForSequenceClassification if prefix else transformers.BertModel
    with torch.random.fork_rng(devices=[]):  # leave the global generator as it was for the tests that follow
        torch.manual_seed(seed)
        model = cls(cfg).eval()
    model.save_pretrained(str(folder))
    if not safetensors:  # the older layout (transformers 5 writes safetensors only)
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
        (folder / "model.safetensors").unlink()
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    tok.save(str(folder / "tokenizer.json"))
    (folder / "modules.json").write_text(json.dumps([{"type": "sentence_transformers.models.Transformer"}]))
    return folder
