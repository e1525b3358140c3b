"""Objectives: one per task kind, each loss and metric against a hand computation."""

import pytest
import torch
from torch import nn

from attnlab import objectives
from attnlab.models.base import BOS, EOS, IGNORE, TGT_PAD, ModelOutput
from attnlab.tasks import KINDS, Split, Task


def _task(kind, tokens, labels, **kw):
    split = Split(tokens, labels)
    return Task(name="t", kind=kind, vocab_size=10, num_labels=kw.pop("num_labels", 3), metric="m",
                splits={"train": split, "val": split, "test": split}, options={}, **kw)


class _Fixed(nn.Module):
    """A model that returns given outputs row after row, one row per input example, in order."""

    def __init__(self, out):
        super().__init__()
        self.out, self.next = out, 0

    def forward(self, tokens, tgt_in=None):
        rows = self.out[self.next : self.next + tokens.shape[0]]
        self.next += tokens.shape[0]
        return ModelOutput(rows)


def test_every_task_kind_has_an_objective_and_unknown_kinds_are_named():
    assert objectives.names() == sorted(KINDS)
    with pytest.raises(ValueError, match="unknown task kind 'ranking'"):
        objectives.create("ranking")


def test_tagging_loss_ignores_unscored_positions_and_trims_with_the_batch():
    tokens = torch.tensor([[2, 3, 0], [4, 0, 0]])
    labels = torch.tensor([[1, IGNORE, IGNORE], [2, IGNORE, IGNORE]])
    task = _task("tagging", tokens, labels)
    inputs, got = objectives.collate(task, task.split("train"), torch.arange(2))
    assert inputs["tokens"].shape == (2, 2) and got.shape == (2, 2)  # the all-padding column is dropped
    logits = torch.randn(2, 2, 3)
    loss = objectives.get(task).loss(_Fixed(logits), inputs, got)
    want = -(logits[0, 0].log_softmax(-1)[1] + logits[1, 0].log_softmax(-1)[2]) / 2
    torch.testing.assert_close(loss, want)


def test_regression_score_is_r_squared_over_the_split():
    y = torch.tensor([1.0, 2.0, 4.0, 7.0])
    pred = torch.tensor([[1.5], [2.0], [3.0], [8.0]])
    task = _task("regression", torch.tensor([[2], [3], [4], [5]]), y, num_labels=1)
    r2 = objectives.get(task).score(_Fixed(pred), task, "test", batch_size=3)  # two batches: R^2 is not averaged per batch
    sse, sst = float(((pred[:, 0] - y) ** 2).sum()), float(((y - y.mean()) ** 2).sum())
    assert r2 == pytest.approx(1 - sse / sst, abs=1e-12)
    torch.testing.assert_close(objectives.get(task).loss(_Fixed(pred), {"tokens": torch.zeros(4, 1)}, y), ((pred[:, 0] - y) ** 2).mean())


def test_seq2seq_teacher_forcing_shifts_the_target_behind_bos():
    seen = {}

    class Spy(nn.Module):
        def forward(self, tokens, tgt_in):
            seen["tgt_in"] = tgt_in
            return ModelOutput(torch.zeros(*tgt_in.shape, 6))

    labels = torch.tensor([[4, 5, EOS, TGT_PAD], [3, EOS, TGT_PAD, TGT_PAD]])
    obj = objectives.create("seq2seq")
    trimmed = obj.trim_labels(labels, keep=2)
    assert trimmed.shape == (2, 3)  # the columns any target uses, whatever the source keeps
    loss = obj.loss(Spy(), {"tokens": torch.ones(2, 2, dtype=torch.long)}, trimmed)
    assert seen["tgt_in"].tolist() == [[BOS, 4, 5], [BOS, 3, EOS]]
    assert float(loss) == pytest.approx(float(torch.log(torch.tensor(6.0))))  # uniform logits over 6 ids


def test_classification_accuracy_counts_right_answers():
    task = _task("classification", torch.tensor([[2], [3], [4]]), torch.tensor([0, 1, 2]))
    logits = torch.tensor([[5.0, 0, 0], [0, 5.0, 0], [5.0, 0, 0]])
    assert objectives.get(task).score(_Fixed(logits), task, "test") == pytest.approx(2 / 3)


def test_evaluation_batches_shrink_with_the_sequence_length():
    from attnlab.objectives.base import EVAL_TOKENS, eval_batch_size

    def split(shape, dtype=torch.long):
        return Split(torch.zeros(shape, dtype=dtype), torch.zeros(shape[0], dtype=torch.long))

    assert eval_batch_size(split((10, 128))) == 256  # short tasks: as before
    assert eval_batch_size(split((10, 2000))) == EVAL_TOKENS // 2000 == 32  # a dense_naive listops batch holds 32 x 4 x 2000^2 weights
    assert eval_batch_size(split((10, 2, 1024))) == 32  # pairs count both documents
    assert eval_batch_size(split((10, 1, 8, 8), torch.float32)) == 256 and eval_batch_size(split((10, 6001, 80), torch.float32)) == 10
    assert eval_batch_size(split((3, 10**6))) == 1
