"""Using a trained model: score a checkpoint on a split, predict for user records, read a
seq2seq model's cross-attention, and generate text with a language model."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from .. import objectives
from .. import tasks as task_registry
from ..models.base import BOS, EOS, FIRST, PAD
from ..tasks import Task
from .checkpoint import CheckpointError, load_checkpoint
from .draws import drawn_from
from .loop import TrainResult, attention_label
from .precision import autocast, resolve

__all__ = ["cross_attention_example", "evaluate", "generate", "predict", "prediction_accuracy", "saved_task", "score",
           "split_summary", "unseen_labels"]


def score(model: nn.Module, task: Task, split: str, batch_size: int | None = None) -> float:
    """The task's metric of ``model`` on a split (its objective's :meth:`~attnlab.objectives.Objective.score`)."""
    return objectives.get(task).score(model, task, split, batch_size)


def evaluate(path: str | Path, split: str = "test", *, task: Task | None = None, device=None) -> TrainResult:
    """Score a checkpoint's best weights on a split of its task (rebuilt from its config, or
    ``task`` for one built in Python) on ``device`` (None: the CPU; ``"auto"``: CUDA where present),
    at the precision the run trained and validated in; what a
    variant draws at each call (Reformer's rotations without a seed) is drawn from the run's seed,
    so the same checkpoint gives the same score in any process (the caller's generator left as it was)."""
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[]):  # building the model draws too
        ck = load_checkpoint(path, device=device)
    if task is None:
        task = saved_task(ck)
    else:  # built in Python: it must be the one the run trained on (the same file and, for user data, tokenizers)
        task_registry.check_saved(task, ck.meta.get("task_artifacts"), f"the run in {ck.path.parent}")
    precision = _precision(ck)
    # train's test score of the same weights
    with drawn_from(ck.config.seed), autocast(precision, next(ck.model.parameters()).device):
        value = objectives.get(task).score(ck.model, task, split)
    size, unit = task.split_size(split)
    return TrainResult(
        task.name, ck.config.model, attention_label(ck.config), task.metric, value, time.perf_counter() - t0,
        str(ck.path), ck.meta.get("step", 0), ck.meta.get("history", []), test_size=size, test_unit=unit,
        precision=precision, pretrain=ck.meta.get("pretrain"),
    )


def saved_task(ck) -> Task:
    """The task a loaded checkpoint ``ck`` trained on, rebuilt from its config with what it saved
    (user data: its tokenizers and labels, and the file's hash, checked: a changed file is refused)."""
    return task_registry.create(ck.config.task, saved=ck.meta.get("task_artifacts") or {}, **ck.config.task_options)


def split_summary(result: TrainResult, split: str) -> dict:
    """:meth:`TrainResult.summary` of an :func:`evaluate` on ``split``, its size and unit named after
    the split scored: ``test_size`` / ``test_unit``, ``val_size`` / ``val_unit`` or ``train_size`` /
    ``train_unit`` (``attnlab train --json`` and the arena keep ``test_size``, the test split's)."""
    named = {"test_size": f"{split}_size", "test_unit": f"{split}_unit"}
    return {named.get(k, k): v for k, v in result.summary().items()}


def _precision(ck) -> str:
    """The precision a checkpoint's run trained and validated in (``auto`` resolved then)."""
    return ck.meta.get("precision") or resolve(ck.config.precision, next(ck.model.parameters()).device)


def cross_attention_example(path: str | Path, index: int = 0,
                            split: str = "test") -> tuple[torch.Tensor, list[str], list[str]]:
    """For a seq2seq checkpoint: greedy-decode example ``index`` of a split and return the last
    decoder block's cross-attention ``(M, N)`` (mean over heads), the source words and the
    generated words (EOS included)."""
    ck = load_checkpoint(path)
    task = saved_task(ck)
    if task.kind != "seq2seq":
        raise CheckpointError(f"task {task.name!r} is {task.kind}: cross-attention exists only for seq2seq tasks")
    data = task.split(split)
    if not 0 <= index < len(data):
        raise ValueError(f"index must be in 0 .. {len(data) - 1}, got {index}")
    src = data.tokens[index : index + 1]
    src = src[:, : max(int((src != 0).sum()), 1)]
    ck.model.eval()
    with torch.no_grad():
        out = ck.model.greedy(src)[0] + [EOS]
        w = ck.model(src, torch.tensor([[BOS] + out[:-1]]), return_weights=True).weights
    words = [task.vocab[t] for t in src[0].tolist()]
    return w[0].mean(0), words, [task.label_names[t] for t in out]


def predict(path: str | Path, records: list[dict], *, beam_size: int | None = None, device=None) -> list[dict]:
    """Predictions of a checkpoint for user records (the input field of its jsonl kind: tagging
    ``tokens``, classification ``text``, seq2seq ``source``): each record with every field it
    has (its label too, when it has one) and the model's ``"prediction"`` (tagging: a list of
    labels; classification: a label; seq2seq: the decoded text), computed at the run's precision on
    ``device`` (None: the CPU)."""
    from tokenizers import Tokenizer

    from ..tasks.base import pad_rows
    from ..tasks.jsonl import encode_inputs

    ck = load_checkpoint(path, device=device)
    art = ck.meta.get("task_artifacts") or {}
    if "tokenizer" not in art:
        raise CheckpointError(f"{ck.path} was trained on the built-in task {ck.config.task!r}, not on user data: "
                              "nothing to predict from")
    kind = art["kind"]
    ids = encode_inputs(kind, art, records)
    names = art["labels"]
    model = ck.model.eval()
    out = []
    with torch.no_grad(), autocast(_precision(ck), next(model.parameters()).device):
        for i in range(0, len(ids), 64):
            chunk, recs = ids[i : i + 64], records[i : i + 64]
            toks = pad_rows(chunk, PAD).to(next(model.parameters()).device)
            if kind == "seq2seq":
                tgt = Tokenizer.from_str(art["target_tokenizer"])
                rows = model.beam(toks, beam_size) if beam_size else model.greedy(toks)
                out += [{**r, "prediction": tgt.decode(row)} for r, row in zip(recs, rows)]
            elif kind == "tagging":
                pred = model(toks).output.argmax(-1).tolist()
                out += [{**r, "prediction": [names[p] for p in row[: len(ids_)]]}
                        for r, row, ids_ in zip(recs, pred, chunk)]
            else:
                pred = model(toks).output.argmax(-1).tolist()
                out += [{**r, "prediction": names[p]} for r, p in zip(recs, pred)]
    return out


def prediction_accuracy(artifacts: dict, rows: list[dict]) -> tuple[int, int, str] | None:
    """``(right, total, unit)`` of :func:`predict`'s rows against the labels they carry, or None
    when no row has one: classification counts lines, tagging tokens, seq2seq lines whose
    prediction equals the target token for token (under the checkpoint's target tokenizer)."""
    from ..tasks.jsonl import FIELDS

    kind = artifacts["kind"]
    label = FIELDS[kind][1]
    rows = [r for r in rows if label in r]
    if not rows:
        return None
    if kind == "tagging":
        pairs = [(str(a), str(b)) for r in rows for a, b in zip(r[label], r["prediction"])]
        return sum(a == b for a, b in pairs), len(pairs), "tokens"
    if kind == "seq2seq":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(artifacts["target_tokenizer"])
        same = sum(tok.encode(str(r[label])).ids == tok.encode(r["prediction"]).ids for r in rows)
        return same, len(rows), "lines"
    return sum(str(r[label]) == str(r["prediction"]) for r in rows), len(rows), "lines"


def unseen_labels(artifacts: dict, rows: list[dict]) -> list[str]:
    """The labels that :func:`predict`'s rows carry and the checkpoint's model never saw (not among
    the labels it was trained on: it can never predict them, so every one is counted wrong), sorted;
    classification and tagging (seq2seq targets are text: none)."""
    from ..tasks.jsonl import FIELDS

    kind = artifacts["kind"]
    if kind not in ("classification", "tagging"):
        return []
    label, known = FIELDS[kind][1], {str(name) for name in artifacts["labels"]}
    given = (str(tag) for r in rows if label in r for tag in (r[label] if kind == "tagging" else [r[label]]))
    return sorted({tag for tag in given if tag not in known})


def generate(
    path: str | Path,
    prompt: str,
    *,
    max_new_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int = 0,
    cache: bool = True,
    window: int | None = None,
    sinks: int = 4,
    device=None,
):
    """The text a language-model checkpoint (task kind ``lm``, byte-level) writes after
    ``prompt``, as an iterator of pieces yielded as it decodes (whole UTF-8 characters). The
    checkpoint and the options are checked at the call.

    Args:
        path: the checkpoint. prompt: the text to continue (not empty).
        max_new_tokens, temperature, top_k, top_p: as for :meth:`attnlab.models.LanguageModel.generate`.
        seed: the sampling's seed (the same seed, the same text).
        cache: decode with the key / value cache (False: rerun the prefix at each step).
        window, sinks: a bounded StreamingLLM cache of ``sinks`` first tokens plus the last
            ``window`` (None: the full cache).
        device: where the model runs (None: the CPU); the sampling draws on the CPU, so a seed
            gives the same text on any device where the logits agree.
    """
    from ..tasks.docs import encode_bytes

    ck = load_checkpoint(path, device=device)
    if ck.model_config.kind != "lm":
        raise CheckpointError(f"{ck.path} holds a {ck.model_config.kind} model; generate needs a language model (a "
                              "task of kind lm, e.g. docs)")
    if ck.meta.get("task_artifacts", {}).get("codec") != "bytes":
        raise CheckpointError(f"{ck.path}: its task has no text codec (byte-level tasks such as docs have)")
    if not prompt:
        raise ValueError("the prompt is empty: give the text to continue")
    ids = torch.tensor([encode_bytes(prompt)], device=next(ck.model.parameters()).device)
    g = torch.Generator().manual_seed(seed)
    steps = ck.model.generate(ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, generator=g,
                              cache=cache, window=window, sinks=sinks if window is not None else 0)
    return _text_pieces(steps)


def _text_pieces(steps):
    """The UTF-8 text of byte tokens as it completes, whole characters at a time."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    for tok in steps:
        b = int(tok[0]) - FIRST
        if 0 <= b < 256:
            piece = decoder.decode(bytes([b]))
            if piece:
                yield piece
    tail = decoder.decode(b"", final=True)
    if tail:
        yield tail
