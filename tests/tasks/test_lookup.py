"""The lookup task: its construction (every key written with every value equally often, the
label the value of the past writes) and why order-free and per-token models are at chance."""

import pytest
import torch

from attnlab import tasks
from attnlab.tasks.base import FIRST, IGNORE


def _parts(t):
    o = t.options
    read_base = FIRST + o["num_keys"] * o["values"]
    return o, read_base, read_base + o["num_keys"]


def test_every_key_is_written_with_every_value_equally_often_and_the_label_is_the_past_value():
    t = tasks.create("lookup", size=64, seed=3)
    o, read_base, noise_base = _parts(t)
    s = t.split("train")
    assert s.tokens.shape == (64, o["length"]) and t.max_len == 1024
    for tok, lab in zip(s.tokens, s.labels):
        writes = tok[tok < read_base] - FIRST
        key, val = writes // o["values"], writes % o["values"]
        counts = torch.zeros(o["num_keys"], o["values"], dtype=torch.long)
        counts.index_put_((key, val), torch.ones_like(key), accumulate=True)
        present = counts.sum(1) > 0
        assert int(present.sum()) == o["keys"]
        assert (counts[present] == o["repeats"]).all()  # the whole sequence: no value of a key is more frequent than another
        reads = ((tok >= read_base) & (tok < noise_base)).nonzero().squeeze(1)
        assert len(reads) == o["queries"] and bool((lab[reads] != IGNORE).all()) and int((lab != IGNORE).sum()) == o["queries"]
        first_read = int(reads[0])
        past = tok[:first_read]
        past = past[past < read_base] - FIRST
        for pos in reads[:8]:
            k = int(tok[pos]) - read_base
            vals = (past[past // o["values"] == k] % o["values"]).unique()
            assert vals.tolist() == [int(lab[pos])]  # the past holds one value for the key: the label
        # the nearest past write is at least `gap` tokens before the first read
        last_write = int((tok[:first_read] < read_base).nonzero().max())
        assert first_read - last_write > o["gap"]


def test_a_bag_of_tokens_with_the_read_key_is_at_chance():
    """The best order-free predictor: for the read key, the value counts over the whole sequence
    (what a bag of tokens knows) are all equal, so a count-based guess is right 1 / values of the time."""
    t = tasks.create("lookup", size=512, seed=0)
    o, read_base, noise_base = _parts(t)
    s = t.split("test")
    right = total = 0
    for tok, lab in zip(s.tokens, s.labels):
        writes = tok[tok < read_base] - FIRST
        counts = torch.zeros(o["num_keys"], o["values"])
        counts.index_put_((writes // o["values"], writes % o["values"]), torch.ones(len(writes)), accumulate=True)
        reads = (lab != IGNORE).nonzero().squeeze(1)
        for pos in reads:
            row = counts[int(tok[pos]) - read_base]
            assert row.max() == row.min()  # no information: every value as frequent
            right += int(int(row.argmax()) == int(lab[pos]))
            total += 1
    assert abs(right / total - 1 / o["values"]) < 0.05


def test_per_token_labels_are_independent_of_the_read_token():
    """A model that sees each token alone predicts from the read's key only: over the test split
    each key's reads carry every value about equally often, so it cannot beat chance."""
    t = tasks.create("lookup", size=4000, seed=1)
    o, read_base, _ = _parts(t)
    s = t.split("train")
    scored = s.labels != IGNORE
    key, lab = s.tokens[scored] - read_base, s.labels[scored]
    table = torch.zeros(o["num_keys"], o["values"])
    table.index_put_((key, lab), torch.ones(len(key)), accumulate=True)
    best = table.max(1).values.sum() / table.sum()  # the best per-token rule, fitted on the training split itself
    assert best < 1 / o["values"] + 0.02


@pytest.mark.parametrize("options, message", [
    ({"length": 512}, "cannot hold the log"),
    ({"keys": 40}, "cannot exceed num_keys"),
    ({"values": 1}, "at least 2"),
    ({"gap": -1}, "gap must be"),
    ({"repeats": 0}, "repeats"),
])
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        tasks.create("lookup", size=64, **options)


def test_the_arenas_training_size_is_said_where_a_user_looks():
    """Issue 58: the arena trains lookup on 512 sequences, ``attnlab train lookup`` on 1,024; ``attnlab list tasks lookup``
    (the option's help) and the arena guide say so."""
    from pathlib import Path

    from attnlab.arena.presets import PRESETS
    from attnlab.cli.listing import option_rows

    arena = PRESETS["quick"].tasks["lookup"].task_options["size"]
    size = option_rows("tasks", "lookup")["size"]
    assert (arena, size["default"]) == (512, 1024) and f"the arena's default run trains on {arena}" in size["help"]
    guide = " ".join((Path(__file__).parents[2] / "docs" / "guides" / "arena.md").read_text().split())
    assert "task's default 1,024 training sequences; the arena's default run trains on 512" in guide
