"""The generated tasks: deterministic, labelled by their own rules, with clear errors."""

import random

import pytest
import torch

from attnlab import tasks
from attnlab.tasks import FIRST, IGNORE
from attnlab.tasks.listops import evaluate_listops
from attnlab.tasks.pos import TAGS


def test_registry():
    assert tasks.names() == ["digits", "docs", "graph_files", "jsonl", "karate", "listops", "lookup", "molecules", "pathfinder", "pos",
                             "recall", "retrieval", "sbm", "speech", "text", "translate", "wav_folder"]
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        tasks.create("nope")


@pytest.mark.parametrize("name", ["pos", "recall", "listops", "translate"])
def test_same_seed_same_data_other_seed_other_data(name):
    a, b, c = tasks.create(name, size=200, seed=3), tasks.create(name, size=200, seed=3), tasks.create(name, size=200, seed=4)
    for split in ("train", "val", "test"):
        assert torch.equal(a.split(split).tokens, b.split(split).tokens)
        assert torch.equal(a.split(split).labels, b.split(split).labels)
    assert not torch.equal(a.split("train").tokens[:, :8], c.split("train").tokens[:, :8])
    assert len(a.split("train")) == 200 and len(a.split("val")) == 64 == len(a.split("test"))
    assert int(a.split("train").tokens.max()) < a.vocab_size


def test_pos_ambiguous_words_follow_their_rules():
    task = tasks.create("pos", size=500)
    words = task.vocab
    ambiguous = {"saw", "watch", "fly", "duck", "park", "ring"}
    finals = {"back", "home", "down", "off"}
    seen_noun = seen_verb = seen_prt = seen_adv = 0
    for toks, labs in zip(task.split("train").tokens.tolist(), task.split("train").labels.tolist()):
        sent = [(words[t], TAGS[lab]) for t, lab in zip(toks, labs) if t]
        for i, (w, tag) in enumerate(sent):
            if w in ambiguous:
                prev = sent[i - 1][1]
                assert tag == ("NOUN" if prev in ("DET", "ADJ") else "VERB")
                seen_noun += tag == "NOUN"
                seen_verb += tag == "VERB"
            if w in finals:
                assert i == len(sent) - 1
                assert tag == ("PRT" if sent[0][0] == "please" else "ADV")
                seen_prt += tag == "PRT"
                seen_adv += tag == "ADV"
    assert min(seen_noun, seen_verb, seen_prt, seen_adv) > 20
    assert 0.85 < task.baseline["word_majority"] < 0.97  # what a per-word model can reach


def test_recall_labels_are_the_values_paired_with_the_queried_keys():
    task = tasks.create("recall", size=100, pairs=4, queries=3, num_keys=8, num_values=5)
    s = task.split("train")
    for toks, labs in zip(s.tokens.tolist(), s.labels.tolist()):
        pairs = {toks[2 * i]: toks[2 * i + 1] for i in range(4)}
        assert len(pairs) == 4  # distinct keys
        for pos in range(8, 11):
            assert labs[pos] == pairs[toks[pos]] - FIRST - 8
        assert all(lab == IGNORE for lab in labs[:8])
    with pytest.raises(ValueError, match="cannot exceed num_keys"):
        tasks.create("recall", pairs=10, num_keys=8)


def test_listops_values_match_an_independent_evaluation():
    assert evaluate_listops(["[MAX", "2", "9", "]"]) == 9
    assert evaluate_listops(["[MED", "5", "1", "3", "8", "]"]) == 3  # lower middle of 1 3 5 8
    assert evaluate_listops(["[SM", "7", "[MIN", "4", "6", "]", "]"]) == 1
    with pytest.raises(ValueError, match="unbalanced"):
        evaluate_listops(["[MAX", "2"])
    task = tasks.create("listops", size=100, max_length=40)
    rng = random.Random(0)

    def value(tokens):  # an independent recursive evaluator over the token strings
        def parse(i):
            t = tokens[i]
            if not t.startswith("["):
                return int(t), i + 1
            op, args, i = t[1:], [], i + 1
            while tokens[i] != "]":
                v, i = parse(i)
                args.append(v)
            f = {"MAX": max, "MIN": min, "MED": lambda a: sorted(a)[(len(a) - 1) // 2], "SM": lambda a: sum(a) % 10}[op]
            return f(args), i + 1

        return parse(0)[0]

    s = task.split("test")
    for row in rng.sample(range(len(s)), 30):
        toks = [task.vocab[t] for t in s.tokens[row].tolist() if t]
        assert 16 <= len(toks) <= 40
        assert value(toks) == int(s.labels[row])
    assert 0.0 < task.baseline["majority"] < 0.5


def test_unknown_task_options_are_named():
    with pytest.raises(TypeError, match="task 'pos' has no option 'foo'; its options: size, seed"):
        tasks.create("pos", foo=1)
