"""The tokenizers of the user's data (:mod:`attnlab.tasks.jsonl`), trained on its training split by
the HF ``tokenizers`` library: word-level for given tokens, byte-level BPE for text, character-level
for text that is not words, and the rule that chooses between the last two (:func:`choose_tokenizer`)."""

from __future__ import annotations

import json

from ..validate import choice

__all__ = ["CHAR_MAX_ALPHABET", "CHAR_MAX_WHITESPACE", "KIND_NAMES", "TOKENIZERS", "bpe_tokenizer", "char_tokenizer",
           "choose_tokenizer", "chosen_tokenizer", "tokenizer_kind", "word_tokenizer"]

TOKENIZERS = ("auto", "char", "bpe")
"""The ``tokenizer`` option of text: chosen from the data (:func:`choose_tokenizer`), character-level or byte-level
BPE."""

CHAR_MAX_WHITESPACE = 0.05
"""``auto`` tokenizes text character by character where under this share of its characters is
whitespace: prose has a space every 5-6 characters and code every few more, so text this sparse
in spaces is not words (letter noise, DNA, hex, names), and BPE merges learnt across its long runs
fuse a character with its neighbours (``KEY=w`` became ``KEY``, ``=``, ``wk``)."""

CHAR_MAX_ALPHABET = 128
"""... and where its training split has at most this many distinct characters (ASCII's count):
a larger alphabet (Chinese, Japanese) keeps BPE, whose vocabulary spends its merges on the frequent
characters and words instead of an id for each of thousands of rare characters."""

KIND_NAMES = {"char": "character-level", "bpe": "byte-level BPE", "word": "word-level"}


def choose_tokenizer(texts: list[str], given: str = "auto") -> tuple[str, str]:
    """``(kind, why)``: ``"char"`` or ``"bpe"`` for ``texts`` (the training split's), and the
    reason; ``given`` (:data:`TOKENIZERS`) other than ``auto`` decides. ``auto``: char-level where
    under :data:`CHAR_MAX_WHITESPACE` of the characters are whitespace and at most
    :data:`CHAR_MAX_ALPHABET` distinct characters occur, byte-level BPE otherwise."""
    choice("tokenizer", given, TOKENIZERS)
    if given != "auto":
        return given, f"tokenizer={given} given"
    chars = sum(len(t) for t in texts)
    space = sum(len(t) - len("".join(t.split())) for t in texts) / max(chars, 1)
    alphabet = len({c for t in texts for c in t})
    if space >= CHAR_MAX_WHITESPACE:
        return "bpe", f"auto: {space:.1%} of the training text is whitespace, {CHAR_MAX_WHITESPACE:.0%} or more: words"
    if alphabet > CHAR_MAX_ALPHABET:
        return "bpe", (f"auto: {space:.1%} of the training text is whitespace, but in {alphabet} distinct characters, "
                       f"over {CHAR_MAX_ALPHABET}")
    return "char", (f"auto: {space:.1%} of the training text is whitespace, under {CHAR_MAX_WHITESPACE:.0%}, in "
                    f"{alphabet} distinct characters, at most {CHAR_MAX_ALPHABET}: not words")


def tokenizer_kind(tokenizer: str) -> str:
    """``"word"``, ``"char"`` or ``"bpe"``: the kind of a serialised tokenizer of this task (a
    character-level one is a BPE model with byte fallback and no merges)."""
    model = json.loads(tokenizer)["model"]
    if model["type"] == "WordLevel":
        return "word"
    return "char" if model.get("byte_fallback") and not model.get("merges") else "bpe"


def char_tokenizer(texts: list[str], specials: list[str]):
    """Character-level: after the special tokens, one token per character of ``texts`` (sorted),
    then the 256 bytes (``<0x00>`` ... ``<0xFF>``) that spell a character it never saw: a BPE model
    with no merges and byte fallback, so no text is unknown and the ids are the same in every process."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {t: i for i, t in enumerate(specials)}
    for c in sorted({c for t in texts for c in t}):
        vocab.setdefault(c, len(vocab))
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], byte_fallback=True))
    tok.add_special_tokens(specials)
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    return tok


def chosen_tokenizer(texts: list[str], specials: list[str], vocab_size: int, given: str):
    """``(tokenizer, kind, why)`` of ``texts`` (:func:`choose_tokenizer`)."""
    kind, why = choose_tokenizer(texts, given)
    return (char_tokenizer(texts, specials) if kind == "char"
            else bpe_tokenizer(texts, specials, vocab_size)), kind, why


def word_tokenizer(corpus: list[list[str]]):
    """Word-level, for given tokens (tagging): ``<pad>``, ``<cls>``, ``[UNK]``, then the words of ``corpus``."""
    from tokenizers import Tokenizer, models, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=["<pad>", "<cls>", "[UNK]"],
                                                              show_progress=False))
    return tok


def bpe_tokenizer(texts: list[str], specials: list[str], vocab_size: int):
    """Byte-level BPE (GPT-2's scheme): the UTF-8 bytes of the text, split before runs of letters,
    digits and punctuation, merged by frequency up to ``vocab_size`` tokens. Every one of the 256
    bytes is in the vocabulary, so any text encodes without an unknown token (runs without spaces,
    code, DNA, Chinese), and the vocabulary is the same in every process: the byte alphabet's ids
    are fixed, and each merge is the most frequent pair, ties broken by the pair's ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials,
                                                       show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok
