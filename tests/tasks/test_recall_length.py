"""recall's length knob: the long-range form (noise between the pairs and the queries) and the
short form unchanged."""

import pytest
import torch

from attnlab import tasks
from attnlab.tasks.base import FIRST, IGNORE


def test_without_length_the_task_is_the_short_one():
    t = tasks.create("recall", size=64, pairs=4, queries=4, num_keys=8, num_values=8)
    assert t.max_len == 12 and "length" not in t.options and t.vocab_size == 2 + 8 + 8


def test_the_long_form_puts_noise_between_the_pairs_and_the_queries():
    t = tasks.create("recall", size=64, pairs=4, queries=4, num_keys=8, num_values=8, length=256, noise=5)
    s = t.split("train")
    assert s.tokens.shape == (64, 256) and t.options["length"] == 256 and t.vocab_size == 2 + 8 + 8 + 5
    gap = s.tokens[:, 8:252]
    assert bool(((gap >= FIRST + 16) & (gap < FIRST + 21)).all())  # only noise tokens between
    assert bool((s.labels[:, :252] == IGNORE).all()) and bool((s.labels[:, 252:] != IGNORE).all())
    for tok, lab in zip(s.tokens[:8], s.labels[:8]):
        pairs = {int(tok[i]): int(tok[i + 1]) - FIRST - 8 for i in range(0, 8, 2)}
        assert [pairs[int(q)] for q in tok[252:]] == lab[252:].tolist()  # each query: the value after its key


def test_the_long_form_is_as_short_form_with_noise():
    """The same seed draws the same pairs and queries: only the noise is new."""
    short = tasks.create("recall", size=64, pairs=4, queries=4, num_keys=8, num_values=8).split("train")
    long = tasks.create("recall", size=64, pairs=4, queries=4, num_keys=8, num_values=8, length=40).split("train")
    assert torch.equal(long.tokens[:, :8], short.tokens[:, :8]) and torch.equal(long.tokens[:, -4:], short.tokens[:, -4:])


@pytest.mark.parametrize("options, message", [({"length": 11}, "must hold"), ({"length": 0}, "length"), ({"noise": 0}, "noise")])
def test_bad_lengths_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        tasks.create("recall", size=64, pairs=4, queries=4, num_keys=8, num_values=8, **options)
