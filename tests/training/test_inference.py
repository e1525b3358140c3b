"""Using a trained model: the eval summary names its split's size, and predict finds the labels a model never saw."""

from attnlab.training import TrainResult
from attnlab.training.inference import split_summary, unseen_labels


def _result(size: int) -> TrainResult:
    return TrainResult("pos", "transformer", "dense", "token_accuracy", 0.5, 1.0, "ck", 4, [], test_size=size)


def test_the_eval_summary_names_the_size_after_the_split_scored():
    """Issue 40: ``attnlab eval --split val --json`` called the validation count ``test_size``."""
    val = split_summary(_result(8), "val")
    assert val["val_size"] == 8 and val["val_unit"] == "examples" and "test_size" not in val and "test_unit" not in val
    assert list(val) == [k.replace("test_", "val_") for k in _result(8).summary()]  # same order, the split's keys renamed
    assert split_summary(_result(8), "train")["train_size"] == 8
    assert split_summary(_result(64), "test") == _result(64).summary()  # train --json's and the arena's key kept


def test_unseen_labels_are_those_outside_the_trained_label_set():
    """Issue 40: predict counted a label the model never saw as wrong without a word."""
    cls = {"kind": "classification", "labels": ["cat", "dog"]}
    rows = [{"text": "a", "label": "cat"}, {"text": "b", "label": "bird"}, {"text": "c"}, {"text": "d", "label": "fish"},
            {"text": "e", "label": "bird"}]
    assert unseen_labels(cls, rows) == ["bird", "fish"]
    assert unseen_labels(cls, rows[:1] + rows[2:3]) == []
    tags = {"kind": "tagging", "labels": ["NOUN", "VERB"]}
    assert unseen_labels(tags, [{"tokens": ["x", "y"], "labels": ["NOUN", "ADJ"]}, {"tokens": ["z"]}]) == ["ADJ"]
    assert unseen_labels({"kind": "classification", "labels": ["0", "1"]}, [{"text": "a", "label": 1}, {"text": "b", "label": 2}]) == ["2"]
    assert unseen_labels({"kind": "seq2seq", "labels": ["a"]}, [{"source": "x", "target": "anything"}]) == []
