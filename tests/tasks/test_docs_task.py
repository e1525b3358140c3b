"""The ``docs`` language-modelling task: real text from the standard library's documentation,
labels that are the next byte, disjoint contiguous splits, the unigram baseline by its formula."""

import math

import numpy as np
import pytest
import torch

from attnlab import tasks
from attnlab.tasks.base import FIRST
from attnlab.tasks.docs import decode_bytes, docs_text, encode_bytes, unigram_perplexity


@pytest.fixture(scope="module")
def task():
    return tasks.create("docs", size=300, length=64)


def test_labels_are_the_next_byte(task):
    for split in task.splits.values():
        assert split.tokens.shape == split.labels.shape and split.tokens.shape[1] == 64
        assert torch.equal(split.tokens[:, 1:], split.labels[:, :-1])
        assert int(split.tokens.min()) >= FIRST and int(split.tokens.max()) < FIRST + 256
    assert len(task.split("train")) == 300 and task.kind == "lm" and task.metric == "perplexity"


def test_splits_are_contiguous_parts_of_the_real_text(task):
    text = docs_text()
    assert len(text) > 200_000 and b"def " in text  # the reference manual, code examples included
    n = task.artifacts["bytes"]
    assert n["train"] + n["val"] + n["test"] == len(text)
    val_start = n["train"]
    first_val = bytes((task.split("val").tokens[0] - FIRST).tolist())
    assert text[val_start : val_start + 64] == first_val  # validation starts where training text ends
    test_bytes = bytes((task.split("test").tokens - FIRST).flatten().tolist())
    train_text = text[:val_start]
    assert test_bytes[:64] not in train_text


def test_unigram_baseline_by_its_formula(task):
    train = np.array([0, 0, 1], dtype=np.uint8)
    test = np.array([0, 1], dtype=np.uint8)
    # counts + 1: byte 0 -> 3, byte 1 -> 2, 254 others -> 1; total 259
    want = math.exp(-(math.log(3 / 259) + math.log(2 / 259)) / 2)
    assert unigram_perplexity(train, test) == pytest.approx(want, rel=1e-12)
    assert 10 < task.baseline["unigram"] < 60


def test_byte_codec_round_trip():
    s = "Attention, naïve — 注意"
    assert decode_bytes(encode_bytes(s)) == s
    assert decode_bytes([0, 1] + encode_bytes("a")) == "a"


def test_bad_options():
    with pytest.raises(ValueError, match="length"):
        tasks.create("docs", length=4)
    with pytest.raises(ValueError, match="shorter length"):
        tasks.create("docs", length=100_000)
