"""``translate``: sequence to sequence between two generated toy languages, with reordering.

Source (subject-verb-object, determiner and adjectives before the noun)::

    S = NP VERB NP [PREP NP]        NP = DET ADJ{0..2} NOUN

Target (subject-object-verb, adjectives and determiner after the noun, postpositions)::

    S' = NP' [NP' POSTP] NP' VERB'  NP' = NOUN' ADJ'{reversed} DET'

Every source word has one target word (a fixed lexicon), so the task is pure reordering: the
verb moves to the end, each noun phrase is mirrored, the prepositional phrase moves before the
object. The metric is exact match of the decoded target; the cross-attention of a trained
model shows the reordering (``attnlab eval CHECKPOINT --plot FILE.png``).
"""

from __future__ import annotations

import random

from ..models.base import EOS, PAD, TGT_FIRST, TGT_PAD
from .base import FIRST, Split, Task, pad_rows, register, split_sizes

__all__ = ["make_translate", "translate_sentence", "LEXICON"]

_DET = ["the", "a", "this", "every"]
_ADJ = ["big", "red", "old", "new", "small", "quiet", "green", "fast"]
_NOUN = ["dog", "cat", "man", "tree", "house", "bird", "car", "river", "child", "song"]
_VERB = ["sees", "eats", "likes", "finds", "takes", "hears", "paints", "follows"]
_PREP = ["in", "on", "near", "under"]
_SOURCE = [*_DET, *_ADJ, *_NOUN, *_VERB, *_PREP]
_SYLL = ["ka", "mo", "ri", "te", "lu", "sa", "no", "pi", "ze", "vu", "do", "fa"]
LEXICON = {w: _SYLL[i % 12] + _SYLL[(i * 5 + 3) % 12] + ("" if i < 12 else _SYLL[i // 12])
           for i, w in enumerate(_SOURCE)}
"""Source word -> target word (distinct)."""
assert len(set(LEXICON.values())) == len(LEXICON)


def _np(rng: random.Random) -> list[str]:
    return [rng.choice(_DET), *[rng.choice(_ADJ) for _ in range(rng.randint(0, 2))], rng.choice(_NOUN)]


def translate_sentence(words: list[str]) -> list[str]:
    """The target sentence of a source sentence of this grammar."""

    def split_np(i):  # the noun phrase starting at i: (words, next index)
        j = i + 1
        while words[j] in _ADJ:
            j += 1
        return words[i : j + 1], j + 1

    def np_t(np):
        return [LEXICON[np[-1]], *[LEXICON[a] for a in reversed(np[1:-1])], LEXICON[np[0]]]

    subj, i = split_np(0)
    verb = words[i]
    obj, i = split_np(i + 1)
    out = np_t(subj)
    if i < len(words):
        prep = words[i]
        pp, _ = split_np(i + 1)
        out += np_t(pp) + [LEXICON[prep]]
    return out + np_t(obj) + [LEXICON[verb]]


@register("translate", baseline_model=None,
          train_defaults={"steps": 5000, "batch_size": 32, "lr": 2e-3, "embed_dim": 64, "num_layers": 2,
                          "positional": "sinusoidal"})
def make_translate(size: int = 6000, seed: int = 0) -> Task:
    """The ``translate`` task (kind ``seq2seq``): ``size`` training pairs, fixed ``seed``.

    Args:
        size: training sentence pairs. seed: the generator's.
    """
    rng = random.Random(seed)
    src_ids = {w: FIRST + i for i, w in enumerate(_SOURCE)}
    tgt_words = list(LEXICON.values())
    tgt_ids = {w: TGT_FIRST + i for i, w in enumerate(tgt_words)}
    splits = {}
    for name, count in split_sizes(size).items():
        src_rows, tgt_rows = [], []
        for _ in range(count):
            words = _np(rng) + [rng.choice(_VERB)] + _np(rng)
            if rng.random() < 0.5:
                words += [rng.choice(_PREP)] + _np(rng)
            src_rows.append([src_ids[w] for w in words])
            tgt_rows.append([tgt_ids[w] for w in translate_sentence(words)] + [EOS])
        splits[name] = Split(pad_rows(src_rows, PAD), pad_rows(tgt_rows, TGT_PAD))
    return Task(
        name="translate",
        kind="seq2seq",
        vocab_size=FIRST + len(_SOURCE),
        num_labels=TGT_FIRST + len(tgt_words),
        metric="exact_match",
        splits=splits,
        options={"size": size, "seed": seed},
        vocab=["<pad>", "<cls>", *_SOURCE],
        label_names=["<pad>", "<bos>", "<eos>", *tgt_words],
    )
