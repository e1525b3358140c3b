"""The language-modelling objective: loss = mean next-token cross-entropy over real positions,
score = perplexity = exp(total NLL / tokens) over the split, and lower is better."""

import math

import torch

from attnlab import objectives
from attnlab.models.base import IGNORE, ModelOutput
from attnlab.tasks.base import Split, Task


class Fixed(torch.nn.Module):
    """Logits that give probability p to the right token whatever the input."""

    def __init__(self, labels_of, p, vocab):
        super().__init__()
        self.labels_of, self.p, self.vocab = labels_of, p, vocab

    def forward(self, tokens):
        labels = self.labels_of[tokens[:, 0]]  # the example's labels, found by its first token
        probs = torch.full((*labels.shape, self.vocab), (1 - self.p) / (self.vocab - 1), dtype=torch.float64)
        probs.scatter_(-1, labels.clamp_min(0)[..., None], self.p)
        return ModelOutput(probs.log())


def test_perplexity_is_exp_mean_nll():
    v = 10
    tokens = torch.tensor([[2, 3, 4, 0], [5, 6, 7, 8]])
    labels = torch.tensor([[3, 4, IGNORE, IGNORE], [6, 7, 8, 9]])
    table = torch.zeros(10, 4, dtype=torch.long)
    table[2], table[5] = labels[0], labels[1]
    task = Task("t", "lm", v, v, "perplexity", {"val": Split(tokens, labels)}, {})
    obj = objectives.get(task)
    assert obj.lower_is_better and obj.better(3.0, 4.0) and not obj.better(4.0, 3.0) and obj.better(9.0, None)
    ppl = obj.score(Fixed(table, 0.5, v), task, "val")
    assert math.isclose(ppl, 2.0, rel_tol=1e-12)  # every scored token has probability 1/2: 6 tokens
    loss = obj.loss(Fixed(table, 0.25, v), {"tokens": tokens}, labels)
    assert math.isclose(float(loss), math.log(4), rel_tol=1e-6)
    assert not objectives.create("tagging").lower_is_better and objectives.create("tagging").better(0.9, 0.8)


def test_nan_never_becomes_the_best():
    obj = objectives.create("lm")
    assert not obj.better(float("nan"), None) and not obj.better(float("nan"), 3.0)
    assert not objectives.create("tagging").better(float("nan"), None)
