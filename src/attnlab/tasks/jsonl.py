"""``jsonl``: the user's own data, one JSON object per line, with a tokenizer trained on it.

The first line decides the kind, and every line must then have the same fields:

* tagging — ``{"tokens": ["I", "saw", ...], "labels": ["PRON", "VERB", ...]}`` (as many labels as tokens);
* classification — ``{"text": "...", "label": "positive"}`` (a label may be a string or an int);
* seq2seq — ``{"source": "...", "target": "..."}``.

Tokenizers are trained on the training split by the HF ``tokenizers`` library: a word-level
vocabulary for given tokens (ids 0, 1, 2: ``<pad>``, ``<cls>``, ``[UNK]``; a word seen only in
validation or test is ``[UNK]``, and building the task warns with the share of such tokens,
:class:`UnknownTokensWarning`); for text (ids 0 and 1: ``<pad>`` and ``<cls>``; targets:
``<pad>``, ``<bos>``, ``<eos>``) **byte-level BPE**, or **character-level** where the text is not
words (:func:`choose_tokenizer`; the ``tokenizer`` option overrides it): every byte is in either
vocabulary, so no text is lost to an unknown token (code, logs, DNA, Chinese). Both are
deterministic: the same file gives the same vocabulary in every process. The lines are shuffled
with ``seed`` and cut into train / val / test. The trained tokenizers, their kind and why, the
label names and the file's SHA-256 travel with the task (``Task.artifacts``) into checkpoints:
``attnlab predict`` needs only the checkpoint, and ``eval``, ``--resume`` and the viewer encode
with the run's own tokenizers and refuse a file that has changed since
(:func:`attnlab.tasks.create`'s ``saved``). A malformed file raises a ``DataError`` (a ``ValueError``) naming the
line and the field; so does a file with one label (:func:`check_labels`), and a file whose
majority label is :data:`MAJORITY_WARN` of it or more warns (:class:`MajorityLabelWarning`) and
shows that label's score in the run's summary (``Task.notes``).
"""

from __future__ import annotations

import json
import random
import warnings
from collections import Counter
from pathlib import Path

from ..validate import DataError, choice
from .base import IGNORE, Split, Task, pad_rows, register
from .text_tokenizers import (
    CHAR_MAX_ALPHABET,
    CHAR_MAX_WHITESPACE,
    KIND_NAMES,
    TOKENIZERS,
    choose_tokenizer,
    chosen_tokenizer,
    tokenizer_kind,
    word_tokenizer,
)

__all__ = ["CHAR_MAX_ALPHABET", "CHAR_MAX_WHITESPACE", "FIELDS", "LONG_DEFAULTS", "LONG_WORDS", "MAJORITY_WARN",
           "SHORT_DEFAULTS", "TOKENIZERS", "MajorityLabelWarning", "UnknownTokensWarning", "check_labels",
           "choose_tokenizer", "encode_inputs", "kind_of_record", "make_jsonl", "read_records", "run_id_fields",
           "token_strings", "tokenizer_kind", "train_defaults_for", "unknown_share"]

FIELDS = {"tagging": ("tokens", "labels"), "classification": ("text", "label"), "seq2seq": ("source", "target")}


def kind_of_record(rec: dict) -> str | None:
    """The kind whose fields ``rec`` has (None if none)."""
    for kind, fields in FIELDS.items():
        if all(f in rec for f in fields):
            return kind
    return None


def read_records(path: str | Path, kind: str | None = None, *, inputs_only: bool = False) -> tuple[str, list[dict]]:
    """Parse and check a jsonl file; returns ``(kind, records)``.

    With ``inputs_only`` (prediction) only the input field of ``kind`` is required.
    """
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read {p}: {e}") from None
    records = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{p} line {no}"
        try:
            rec = json.loads(line)
        except ValueError as e:
            raise DataError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise DataError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        if kind is None:
            kind = kind_of_record(rec)
            if kind is None:
                raise DataError(
                    f"{where}: expected the fields tokens+labels (tagging), text+label (classification) "
                    f"or source+target (seq2seq), got {sorted(rec)}"
                )
        fields = FIELDS[kind][:1] if inputs_only else FIELDS[kind]
        for f in fields:
            if f not in rec:
                raise DataError(f"{where}: missing field {f!r} ({kind} data has {' and '.join(FIELDS[kind])})")
        _check(rec, kind, where, inputs_only)
        records.append(rec)
    if not records:
        raise DataError(f"{p} holds no records")
    return kind, records


def _check(rec, kind, where, inputs_only):
    if kind == "tagging":
        toks = rec["tokens"]
        if not isinstance(toks, list) or not toks or not all(isinstance(t, str) for t in toks):
            raise DataError(f"{where}: field 'tokens' must be a non-empty list of strings")
        if not inputs_only:
            labs = rec["labels"]
            if not isinstance(labs, list) or not all(isinstance(t, (str, int)) for t in labs):
                raise DataError(f"{where}: field 'labels' must be a list of strings or ints")
            if len(labs) != len(toks):
                raise DataError(f"{where}: field 'labels' has {len(labs)} entries for {len(toks)} tokens")
    else:
        first, second = FIELDS[kind]
        if not isinstance(rec[first], str) or not rec[first].strip():
            raise DataError(f"{where}: field {first!r} must be a non-empty string")
        if not inputs_only:
            ok = (isinstance(rec[second], str) and rec[second].strip() if kind == "seq2seq"
                  else isinstance(rec[second], (str, int)))
            if not ok or isinstance(rec[second], bool):
                what = "a non-empty string" if kind == "seq2seq" else "a string or an int"
                raise DataError(f"{where}: field {second!r} must be {what}")


MAJORITY_WARN = 0.9
"""A file whose most frequent label is this share of its labels (or more) is nearly one-class: a
model that learnt nothing scores about this by always answering it, and the other labels are a
tenth of the test split or less (10 of 100 records), so the score left to earn rests on a few
examples. Building the task warns, and the run's summary shows that label's score beside the model's."""


def _label_list(kind: str, records: list[dict]) -> list[str]:
    if kind == "tagging":
        return [str(lab) for r in records for lab in r["labels"]]
    return [str(r["label"]) for r in records]


def check_labels(kind: str, records: list[dict], path: str | Path = "the file") -> None:
    """Refuse a file with one label (a ``ValueError``): every model scores 1.0 on it by answering
    that label, and learns nothing. Warns (:class:`MajorityLabelWarning`) when one label is
    :data:`MAJORITY_WARN` of them or more. Nothing to check for seq2seq."""
    if kind == "seq2seq":
        return
    counts = Counter(_label_list(kind, records))
    top, n = max(sorted(counts.items()), key=lambda kv: kv[1])
    unit = "token" if kind == "tagging" else "record"
    if len(counts) == 1:
        raise DataError(f"{path}: every {unit} has the label {top!r}: a model scores 1.0 by always answering it and "
                        f"learns nothing; {kind} data needs at least two labels")
    share = n / sum(counts.values())
    if share >= MAJORITY_WARN:
        warnings.warn(f"{path}: {share:.1%} of the {unit}s have the label {top!r} (nearly one class): always "
                      f"answering it scores about as much, so a score near {share:.2f} says little; the run's summary "
                      "shows that label's score beside the model's",
                      MajorityLabelWarning, stacklevel=4)


def _majority_note(kind: str, metric: str, train_recs: list[dict], test_recs: list[dict],
                   records: list[dict]) -> str | None:
    """The summary's line for a nearly one-class file: the test score of always answering the
    training split's most frequent label (None below :data:`MAJORITY_WARN`)."""
    if kind == "seq2seq":
        return None
    counts = Counter(_label_list(kind, records))
    share = max(counts.values()) / sum(counts.values())
    if share < MAJORITY_WARN:
        return None
    trained = Counter(_label_list(kind, train_recs))
    top = max(sorted(trained.items()), key=lambda kv: kv[1])[0]
    test = _label_list(kind, test_recs)
    score = sum(lab == top for lab in test) / max(len(test), 1)
    unit = "tokens" if kind == "tagging" else "records"
    return f"majority class alone ({top!r}, {share:.1%} of the file's {unit}): test {metric} = {score:.4f}"


def encode_inputs(kind: str, artifacts: dict, records: list[dict]) -> list[list[int]]:
    """Token ids of the input field of each record, with the task's trained tokenizer."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(artifacts["tokenizer"])
    if kind == "tagging":
        return [tok.encode(r["tokens"], is_pretokenized=True).ids for r in records]
    return [tok.encode(r[FIELDS[kind][0]]).ids for r in records]


def token_strings(tokenizer: str, ids: list[int]) -> list[str]:
    """Each token id as the text it stands for under the serialised ``tokenizer`` (a byte-level
    token shows its characters, a space included, not its byte alphabet's ``Ġ``)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(tokenizer)
    return [tok.decode([i], skip_special_tokens=False) or tok.id_to_token(i) or f"#{i}" for i in ids]


def unknown_share(tokenizer: str, rows: list[list[int]]) -> float:
    """The share of the tokens of ``rows`` (token ids) that are the tokenizer's ``[UNK]`` (0.0
    when it has none: byte-level text tokenizers represent every input)."""
    from tokenizers import Tokenizer

    unk = Tokenizer.from_str(tokenizer).token_to_id("[UNK]")
    total = sum(len(r) for r in rows)
    return 0.0 if unk is None or not total else sum(r.count(unk) for r in rows) / total


SHORT_DEFAULTS = {"positional": "rope"}
"""Training defaults of short records: rope, which scored best of the positional encodings on
token roles in Python source (benchmarks/user_data.py; the scores, and the no-attention baselines
``attnlab train jsonl`` shows beside the model: ``benchmarks/results/user-data-*``, the models guide)."""

LONG_WORDS = 200
"""Texts of more than this many tokens on average are long documents: whitespace-separated words,
or characters where the text is tokenized by character (:func:`choose_tokenizer`)."""

LONG_DEFAULTS = {"positional": "rope", "batch_size": 8, "warmup": 20, "lr": 0.002}
"""Training defaults of long documents: smaller batches (more steps in the same epochs), a shorter
warm-up (which took most of the steps at batch 32) and a higher learning rate, each of which raised
the score on pieces of standard-library source labelled by package (benchmarks/long_documents.py; the scores:
``benchmarks/results/long-documents-*``, the models guide). Text tokenized by character, hundreds of
tokens a row, trains on the same recipe (benchmarks/user_data_repro.py --only-tokenizer)."""


def train_defaults_for(path: str | None = None, seed: int = 0, val_fraction: float = 0.1, test_fraction: float = 0.1,
                       size: int | None = None, tokenizer: str = "auto", **options) -> dict:
    """The training defaults of a jsonl file, by its length: :data:`LONG_DEFAULTS` for
    classification texts of more than :data:`LONG_WORDS` tokens on average, else
    :data:`SHORT_DEFAULTS` (also when the file or an option is bad: building the task reports why)."""
    if path is None:
        return dict(SHORT_DEFAULTS)
    try:
        kind, records = read_records(path)
        if kind != "classification":
            return dict(SHORT_DEFAULTS)
        texts = [r["text"] for r in records]
        char = _input_tokenizer(kind, records, seed=seed, val_fraction=val_fraction, test_fraction=test_fraction,
                                size=size, tokenizer=tokenizer) == "char"
    except (ValueError, TypeError):
        return dict(SHORT_DEFAULTS)
    if sum(len(t) if char else len(t.split()) for t in texts) / len(texts) > LONG_WORDS:
        return dict(LONG_DEFAULTS)
    return dict(SHORT_DEFAULTS)


def _input_tokenizer(kind: str, records: list[dict], *, seed: int, val_fraction: float, test_fraction: float,
                     size: int | None, tokenizer: str, field: int = 0) -> str:
    """The kind of tokenizer field ``field`` of ``records`` gets (0: the input; ``word`` for given tokens), chosen on
    the training split."""
    if kind == "tagging":
        return "word"
    texts = [r[FIELDS[kind][field]] for r in records]
    return choose_tokenizer([texts[i] for i in _parts(len(texts), seed, val_fraction, test_fraction, size)["train"]],
                            tokenizer)[0]


def run_id_fields(path: str | None = None, seed: int = 0, val_fraction: float = 0.1, test_fraction: float = 0.1,
                  size: int | None = None, tokenizer: str = "auto", **options) -> dict:
    """What a run on the file is beyond its options and contents, for the arena's run id: ``{"tokenizer":
    "char"}`` where its text is tokenized by character, ``{"target_tokenizer": "char"}`` where a seq2seq
    target is (runs stored before that rule, on byte-level BPE, keep their ids and are never taken for
    these), else ``{}``."""
    if path is None:
        return {}
    try:
        kind, records = read_records(path)
        split = {"seed": seed, "val_fraction": val_fraction, "test_fraction": test_fraction, "size": size,
                 "tokenizer": tokenizer}
        fields = {"tokenizer": _input_tokenizer(kind, records, **split)}
        if kind == "seq2seq":
            fields["target_tokenizer"] = _input_tokenizer(kind, records, **split, field=1)
    except (ValueError, TypeError):  # a bad file: building the task reports it
        return {}
    return {k: v for k, v in fields.items() if v == "char"}


def _parts(n: int, seed: int, val_fraction: float, test_fraction: float, size: int | None) -> dict[str, list[int]]:
    """The records of each split: ``n`` shuffled with ``seed``, test first, then validation, the rest training (its
    first ``size``)."""
    order = list(range(n))
    random.Random(seed).shuffle(order)
    n_val = max(1, round(n * val_fraction))
    n_test = max(1, round(n * test_fraction))
    parts = {"test": order[:n_test], "val": order[n_test : n_test + n_val], "train": order[n_test + n_val :]}
    if size is not None:
        parts["train"] = parts["train"][:size]
    return parts


def _rebuild(saved: dict, **options) -> Task:
    """The task on the same file with the tokenizers and labels a checkpoint saved (``saved``:
    its ``task_artifacts``), never trained again: ``attnlab eval``, ``--resume`` and the viewer
    score exactly the tokens the run trained on."""
    if "tokenizer" not in saved or "labels" not in saved or ("kind" in saved and saved["kind"] == "seq2seq"
                                                              and "target_tokenizer" not in saved):
        raise DataError("the run was saved without its tokenizer (by an attnlab from before tokenizers travelled with "
                        "runs): its inputs cannot be encoded as they were in training, and re-tokenising would score "
                        "other tokens; train it again")
    return _build(saved=saved, **options)


def _encoders(kind: str, records: list[dict], train_recs: list[dict], saved: dict | None, vocab_size: int,
              tokenizer: str):
    """``(artifacts, tokenizer, target tokenizer or None)``: the run's saved ones, or trained on the training split."""
    from tokenizers import Tokenizer

    artifacts: dict = {"kind": kind}
    tgt = None
    if saved is not None:  # the run's own tokenizers; a run from before their kinds were saved: read from the tokenizer
        tok = Tokenizer.from_str(saved["tokenizer"])
        names = list(saved["labels"])
        fields = ("tokenizer", "target_tokenizer") if kind == "seq2seq" else ("tokenizer",)
        for f in fields:
            artifacts[f"{f}_kind"] = saved.get(f"{f}_kind") or tokenizer_kind(saved[f])
            artifacts[f"{f}_reason"] = saved.get(f"{f}_reason") or "saved with the run"
        if kind == "seq2seq":
            tgt = Tokenizer.from_str(saved["target_tokenizer"])
            artifacts["target_tokenizer"] = saved["target_tokenizer"]
    elif kind == "tagging":
        tok = word_tokenizer([r["tokens"] for r in train_recs])
        names = sorted({str(lab) for r in records for lab in r["labels"]})
        artifacts.update(tokenizer_kind="word", tokenizer_reason="the file's own tokens")
    elif kind == "classification":
        tok, *chosen = chosen_tokenizer([r["text"] for r in train_recs], ["<pad>", "<cls>"], vocab_size, tokenizer)
        artifacts.update(zip(("tokenizer_kind", "tokenizer_reason"), chosen))
        names = sorted({str(r["label"]) for r in records})
    else:
        tok, *chosen = chosen_tokenizer([r["source"] for r in train_recs], ["<pad>", "<cls>"], vocab_size, tokenizer)
        tgt, *target_chosen = chosen_tokenizer([r["target"] for r in train_recs], ["<pad>", "<bos>", "<eos>"],
                                               vocab_size, tokenizer)
        artifacts.update(zip(("tokenizer_kind", "tokenizer_reason", "target_tokenizer_kind", "target_tokenizer_reason"),
                             (*chosen, *target_chosen)))
        artifacts["target_tokenizer"] = tgt.to_str()
        names = token_strings(artifacts["target_tokenizer"], list(range(tgt.get_vocab_size())))
    artifacts["tokenizer"] = tok.to_str()
    artifacts["labels"] = names
    return artifacts, tok, tgt


def _build(path: str | None = None, *, seed: int = 0, val_fraction: float = 0.1, test_fraction: float = 0.1,
           vocab_size: int = 2000, size: int | None = None, tokenizer: str = "auto", saved: dict | None = None) -> Task:
    if path is None:
        raise ValueError("the jsonl task needs its file: --data FILE.jsonl (attnlab train jsonl --data FILE, "
                         "attnlab arena --data FILE)")
    if not (0 < val_fraction < 1 and 0 < test_fraction < 1 and val_fraction + test_fraction < 1):
        raise ValueError("val_fraction and test_fraction must be in (0, 1) and sum below 1")
    choice("tokenizer", tokenizer, TOKENIZERS)
    kind, records = read_records(path, None if saved is None else saved.get("kind"))
    if kind == "tagging" and tokenizer != "auto":
        raise ValueError(f"tokenizer={tokenizer}: tagging data brings its own tokens (a word-level vocabulary of "
                         "them); the tokenizer option is for text (classification, seq2seq)")
    if len(records) < 3:
        raise DataError(f"{path}: need at least 3 records for train, val and test, got {len(records)}")
    if saved is None:  # a run from before this check keeps its score
        check_labels(kind, records, path)
    parts = _parts(len(records), seed, val_fraction, test_fraction, size)
    train_recs = [records[i] for i in parts["train"]]
    artifacts, tok, tgt = _encoders(kind, records, train_recs, saved, vocab_size, tokenizer)
    names = artifacts["labels"]
    label_id = {n: i for i, n in enumerate(names)}
    if kind != "seq2seq":
        unseen = sorted({str(lab) for r in records for lab in (r["labels"] if kind == "tagging" else [r["label"]])}
                        - set(label_id))
        if unseen:
            raise DataError(f"{path} holds labels the run never had ({', '.join(unseen[:5])}): it is not the file "
                            "the run trained on")
    splits, unknown = {}, {}
    for name, idx in parts.items():
        recs = [records[i] for i in idx]
        ids = encode_inputs(kind, artifacts, recs)
        unknown[name] = unknown_share(artifacts["tokenizer"], ids)
        if kind == "tagging":
            labels = pad_rows([[label_id[str(lab)] for lab in r["labels"]] for r in recs], IGNORE,
                              max(len(x) for x in ids))
        elif kind == "classification":
            labels = pad_rows([[label_id[str(r["label"])] for r in recs]], 0)[0]
        else:
            labels = pad_rows([tgt.encode(r["target"]).ids + [2] for r in recs], 0)
        splits[name] = Split(pad_rows(ids, 0), labels)
    if any(unknown.values()):
        shares = ", ".join(f"{unknown[name]:.1%} of {name}" for name in ("train", "val", "test"))
        warnings.warn(f"{path}: tokens unknown to the vocabulary ([UNK]): {shares}; a tagging vocabulary holds the "
                      "training split's words, so words seen only in validation or test are unknown",
                      UnknownTokensWarning, stacklevel=3)
    metric = {"tagging": "token_accuracy", "classification": "accuracy", "seq2seq": "exact_match"}[kind]
    notes = [f"{'input ' if kind == 'seq2seq' else ''}tokenizer: {KIND_NAMES[artifacts['tokenizer_kind']]} "
             f"({artifacts['tokenizer_reason']})"]
    if kind == "seq2seq":
        notes.append(f"target tokenizer: {KIND_NAMES[artifacts['target_tokenizer_kind']]} "
                     f"({artifacts['target_tokenizer_reason']})")
    notes += filter(None, [_majority_note(kind, metric, train_recs, [records[i] for i in parts["test"]], records)])
    return Task(
        name="jsonl",
        kind=kind,
        vocab_size=tok.get_vocab_size(),
        num_labels=len(names),
        metric=metric,
        splits=splits,
        options={"path": str(path), "seed": seed, "val_fraction": val_fraction, "test_fraction": test_fraction,
                 "vocab_size": vocab_size, "size": size, "tokenizer": tokenizer},
        vocab=token_strings(artifacts["tokenizer"], list(range(tok.get_vocab_size()))),
        label_names=names,
        artifacts=artifacts,
        notes=notes,
    )


class UnknownTokensWarning(UserWarning):
    """Some of a user file's tokens are not in the vocabulary the task trained (``[UNK]``): their
    words are lost to the model."""


class MajorityLabelWarning(UserWarning):
    """One label is :data:`MAJORITY_WARN` of a user file's labels or more: always answering it scores about that
    share."""


@register("jsonl", train_defaults=train_defaults_for, baseline_model="window_mlp", files=("path",), rebuild=_rebuild)
def make_jsonl(path: str | None = None, seed: int = 0, val_fraction: float = 0.1, test_fraction: float = 0.1,
               vocab_size: int = 2000, size: int | None = None, tokenizer: str = "auto") -> Task:
    """The user's file as a task (see the module docstring).

    Args:
        path: the jsonl file (``attnlab train jsonl --data FILE``).
        seed: the shuffle of the lines into train / val / test.
        val_fraction: the share of the lines held out for validation.
        test_fraction: the share of the lines held out for test.
        vocab_size: the most tokens of a byte-level BPE tokenizer (the 256 bytes, the special
            tokens and the most frequent merges; a character-level one has a token per character).
        size: keep this many training lines (default: all).
        tokenizer: text's tokenizer: ``auto`` (:func:`choose_tokenizer`), ``char`` or ``bpe``.
    """
    return _build(path, seed=seed, val_fraction=val_fraction, test_fraction=test_fraction, vocab_size=vocab_size,
                  size=size, tokenizer=tokenizer)


make_jsonl.run_id_fields = run_id_fields
