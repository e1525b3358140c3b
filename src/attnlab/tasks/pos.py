"""``pos``: part-of-speech tagging in a generated language whose words are ambiguous.

Grammar (one sentence)::

    S  = [please] NP VP [PP] [FINAL]
    NP = DET ADJ{0..2} NOUN          VP = VERB NP          PP = PREP NP

Half of the noun and verb slots take an *ambiguous* word (``saw``, ``watch``, ``fly``, ``duck``,
``park``, ``ring``) that is a NOUN after a determiner or adjective and a VERB after the
subject: the neighbouring word decides. A sentence may end with a word (``back``, ``home``,
``down``, ``off``) that is a particle (PRT) when the sentence began with ``please`` and an
adverb (ADV) otherwise: only a word far away decides. So a per-word model is capped at the
accuracy of each word's most frequent tag (``baseline["word_majority"]``), a window of
neighbours resolves the first ambiguity but not the second, and self-attention resolves both.
"""

from __future__ import annotations

import random

from .base import FIRST, IGNORE, Split, Task, pad_rows, register, split_sizes

__all__ = ["make_pos", "TAGS"]

TAGS = ["DET", "ADJ", "NOUN", "VERB", "PREP", "INTJ", "ADV", "PRT"]
_DET = ["the", "a", "this", "every"]
_ADJ = ["big", "red", "old", "new", "small", "quiet"]
_NOUN = ["dog", "cat", "man", "tree", "house", "bird", "car"]
_VERB = ["sees", "eats", "likes", "finds", "takes", "hears"]
_AMBIG = ["saw", "watch", "fly", "duck", "park", "ring"]
_PREP = ["in", "on", "near", "under"]
_FINAL = ["back", "home", "down", "off"]
WORDS = ["please", *_DET, *_ADJ, *_NOUN, *_VERB, *_AMBIG, *_PREP, *_FINAL]


def _sentence(rng: random.Random) -> list[tuple[str, str]]:
    def np_():
        out = [(rng.choice(_DET), "DET")]
        out += [(rng.choice(_ADJ), "ADJ") for _ in range(rng.randint(0, 2))]
        out.append((rng.choice(_AMBIG if rng.random() < 0.5 else _NOUN), "NOUN"))
        return out

    polite = rng.random() < 0.5
    words = [("please", "INTJ")] if polite else []
    words += np_()
    words.append((rng.choice(_AMBIG if rng.random() < 0.5 else _VERB), "VERB"))
    words += np_()
    if rng.random() < 0.5:
        words.append((rng.choice(_PREP), "PREP"))
        words += np_()
    if rng.random() < 0.6:
        words.append((rng.choice(_FINAL), "PRT" if polite else "ADV"))
    return words


def _word_majority(sentences) -> float:
    """Accuracy of tagging every word with its most frequent tag (counted on the same sentences)."""
    counts: dict[str, dict[str, int]] = {}
    for s in sentences:
        for w, t in s:
            counts.setdefault(w, {}).setdefault(t, 0)
            counts[w][t] += 1
    best = sum(max(c.values()) for c in counts.values())
    total = sum(sum(c.values()) for c in counts.values())
    return best / total


@register("pos", train_defaults={"steps": 600, "batch_size": 32, "lr": 2e-3, "embed_dim": 64, "num_layers": 2,
                                 "positional": "rope"})
def make_pos(size: int = 4000, seed: int = 0) -> Task:
    """The ``pos`` task: ``size`` training sentences (val and test: size / 8 each), fixed ``seed``.

    Args:
        size: training sentences. seed: the generator's.
    """
    sizes = split_sizes(size)
    rng = random.Random(seed)
    word_id = {w: FIRST + i for i, w in enumerate(WORDS)}
    tag_id = {t: i for i, t in enumerate(TAGS)}
    splits, test_sentences = {}, []
    for name, count in sizes.items():
        sents = [_sentence(rng) for _ in range(count)]
        if name == "test":
            test_sentences = sents
        toks = pad_rows([[word_id[w] for w, _ in s] for s in sents], 0)
        labs = pad_rows([[tag_id[t] for _, t in s] for s in sents], IGNORE, toks.shape[1])
        splits[name] = Split(toks, labs)
    vocab = ["<pad>", "<cls>", *WORDS]
    return Task(
        name="pos",
        kind="tagging",
        vocab_size=len(vocab),
        num_labels=len(TAGS),
        metric="token_accuracy",
        splits=splits,
        options={"size": size, "seed": seed},
        vocab=vocab,
        label_names=list(TAGS),
        baseline={"word_majority": _word_majority(test_sentences)},
    )
