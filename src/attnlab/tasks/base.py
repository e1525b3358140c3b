"""What a task is: splits of token tensors, a kind of output, a metric; and the task registry.

Every task is generated here from a fixed seed (nothing is downloaded) and holds three splits,
``train``, ``val`` and ``test``, as padded tensors:

* ``tagging`` — a label per token: ``tokens`` ``(S, N)`` and ``labels`` ``(S, N)``, with
  :data:`IGNORE` where a position carries no label (padding, or a token that is not scored);
* ``classification`` — one label per sequence: ``tokens`` ``(S, N)``, ``labels`` ``(S,)``;
* ``seq2seq`` — a new sequence: ``tokens`` ``(S, N)`` the source, ``labels`` ``(S, M)`` the
  target ids ending with EOS, padded with 0 (:mod:`attnlab.models.seq2seq`).

* ``lm`` — language modelling: ``tokens`` ``(S, N)`` and ``labels`` ``(S, N)`` the next token
  at each position (:mod:`attnlab.tasks.docs`).

* ``regression`` — one value per set: ``labels`` ``(S,)`` float (standardised by the task;
  the metric, R^2, does not change under that rescaling).

Inputs come in three forms (``Task.inputs``): ``"tokens"`` (above); ``"features"`` — ``tokens``
is a float tensor ``(S, N, F)`` of vectors (pixels, patches, audio frames) and ``mask``
``(S, N)`` marks the real ones; ``"graph"`` — ``tokens`` ``(S, N, F)`` node features with
``mask``, and per example its ``edges`` ``(2, E_s)`` (source, target; node ``i`` attends to
``j`` along ``j -> i``) and optional ``edge_attr`` ``(E_s, edge_dim)``. A graph task's
``tagging`` labels are per node ``(S, N)``; ``"image"`` — ``tokens`` ``(S, C, H, W)`` float.

Token id :data:`PAD` (0) is padding and :data:`CLS` (1) is reserved for a classifier's summary
token, in every task's vocabulary; a task's own tokens start at :data:`FIRST`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..models.base import CLS, FIRST, IGNORE, PAD
from ..registry import Registry
from ..validate import ArgumentTypeError, positive_int

__all__ = ["PAD", "CLS", "FIRST", "IGNORE", "Split", "Task", "TASKS", "register", "create", "names", "train_defaults",
           "baseline_model", "KINDS", "INPUTS", "DataChangedError", "data_digest", "data_files", "check_saved"]

KINDS = ("tagging", "classification", "seq2seq", "regression", "pair", "lm")
INPUTS = ("tokens", "features", "graph", "image")


@dataclass
class Split:
    """One split: ``tokens`` ``(S, N)`` long (``PAD`` = padding) or ``(S, N, F)`` float vectors,
    ``labels``, and for vector and graph inputs ``mask`` ``(S, N)`` (True = real), ``edges`` and
    ``edge_attr`` (lists, one per example; see the module docstring)."""

    tokens: torch.Tensor
    labels: torch.Tensor
    mask: torch.Tensor | None = None
    edges: list[torch.Tensor] | None = None
    edge_attr: list[torch.Tensor] | None = None

    def __len__(self) -> int:
        return self.tokens.shape[0]


@dataclass
class Task:
    """A generated dataset with its metric.

    Attributes:
        name: the registered name. kind: one of :data:`KINDS`. inputs: one of :data:`INPUTS`;
            feature_dim: F for vector and graph inputs; edge_dim: edge feature width (graphs, or None).
        vocab_size: token ids are ``0 .. vocab_size - 1``. num_labels: label ids ``0 .. num_labels - 1``.
        metric: the name of :meth:`score`'s number (accuracy over scored tokens or sequences).
        splits: ``{"train", "val", "test"}`` -> :class:`Split`.
        options: the generator's options (size, seed, ...) that rebuild it exactly.
        vocab: the token strings (index = id), for display. label_names: likewise for labels.
        baseline: reference accuracies (``{"majority": ...}``, tagging: ``"word_majority"``).
        artifacts: what prediction needs besides the weights (user data: trained tokenizers,
            label names), stored in checkpoints.
        notes: lines the run's summary prints under its score: what the task chose from its data
            and why (user data: the tokenizer), what a score on it is worth (a majority label's score).
    """

    name: str
    kind: str
    vocab_size: int
    num_labels: int
    metric: str
    splits: dict[str, Split]
    options: dict
    vocab: list[str] = field(default_factory=list)
    label_names: list[str] = field(default_factory=list)
    baseline: dict[str, float] = field(default_factory=dict)
    artifacts: dict = field(default_factory=dict)
    inputs: str = "tokens"
    feature_dim: int = 0
    edge_dim: int | None = None
    notes: list[str] = field(default_factory=list)

    def split_size(self, split: str) -> tuple[int, str]:
        """``(count, unit)``: how many things a split's score is measured on: its labelled nodes
        for node tasks on graphs (one graph can hold every split), else its examples."""
        data = self.split(split)
        if self.inputs == "graph" and self.kind == "tagging":
            return int((data.labels != IGNORE).sum()), "nodes"
        return len(data), "examples"

    @property
    def max_len(self) -> int:
        """The longest sequence of any split."""
        if self.inputs == "image":  # pixels
            return max(s.tokens.shape[2] * s.tokens.shape[3] for s in self.splits.values())
        if self.inputs == "tokens":  # (count, N), or (count, 2, N) for pairs
            return max(s.tokens.shape[-1] for s in self.splits.values())
        return max(s.tokens.shape[1] for s in self.splits.values())

    def split(self, name: str) -> Split:
        """The split ``name`` (``train``, ``val`` or ``test``)."""
        if name not in self.splits:
            raise ValueError(f"task {self.name!r} has no split {name!r}; choose one of {', '.join(self.splits)}")
        return self.splits[name]

    def correct(self, logits: torch.Tensor, labels: torch.Tensor) -> tuple[int, int]:
        """``(number correct, number scored)`` of a batch of logits against labels."""
        if self.kind in ("seq2seq", "regression"):
            raise ValueError(f"a {self.kind} task is scored over a whole split (attnlab.training.score), "
                             "not batch by batch")
        pred = logits.argmax(-1)
        if self.kind == "tagging":
            scored = labels != IGNORE
            return int((pred[scored] == labels[scored]).sum()), int(scored.sum())
        return int((pred == labels).sum()), labels.numel()


TASKS: Registry = Registry("task")


def register(name: str, *, train_defaults: dict | Callable[..., dict] | None = None, baseline_model: str | None = "mlp",
             files: tuple[str, ...] | dict[str, str | Callable] = (), rebuild: Callable[..., Task] | None = None):
    """Decorator for a generator function ``(size=..., seed=..., **options) -> Task``.

    Args:
        train_defaults: the task's own training settings (any :class:`attnlab.training.TrainConfig`
            field: steps, lr, model, positional, ...), calibrated on a 2-core CPU; or a function
            ``(**task_options) -> dict`` (taking every option the task takes) for defaults that
            depend on the data, e.g. its length.
        baseline_model: the task's **no-attention baseline**, a backbone that uses no attention
            (default ``"mlp"``: each token alone, pooled for a set; ``"cnn"``, ``"node_mlp"``), or
            None where no such backbone reads the task; see :func:`baseline_model`.
        files: the options that name the user's files the task reads (``jsonl``: ``("path",)``),
            or ``{option: pattern}`` for folders, the pattern naming the files it reads in them (a
            ``Path.glob`` pattern, or ``folder -> files``; ``wav_folder``: its audio files in the
            label folders): their contents' hash
            (:func:`data_digest`) is recorded in the task's artifacts, keys the arena's runs and is
            checked when a run is resumed or scored.
        rebuild: ``(saved, **options) -> Task``: the task built again with what an earlier build
            saved in its artifacts (``saved``: a checkpoint's, e.g. user data's trained tokenizers)
            instead of deriving it from the data anew; see :func:`create`.
    """

    def deco(fn):
        fn.train_defaults = train_defaults if callable(train_defaults) else dict(train_defaults or {})
        fn.baseline_model = baseline_model
        fn.files = dict(files) if isinstance(files, dict) else tuple(files)
        fn.rebuild = rebuild
        TASKS.add(name, fn)
        return fn

    return deco


def train_defaults(name: str, options: dict | None = None) -> dict:
    """The training defaults the task ``name`` registered (a copy; ``{}`` when none), for the task
    built with ``options`` where they depend on its data."""
    found = getattr(TASKS.get(name), "train_defaults", {})
    if callable(found):
        found = found(**(options or {}))
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in found.items()}


def baseline_model(name: str) -> str | None:
    """The model of the task ``name``'s no-attention baseline (``attnlab train --baseline``, the
    arena's variant ``none``): what a score is worth without attention."""
    return getattr(TASKS.get(name), "baseline_model", None)


class DataChangedError(ValueError):
    """The user's file a run was trained on no longer holds what it held then (its hash differs)."""


def _maker(name: str):
    """The registered maker of task ``name``, or None for a task built in Python under another name."""
    return TASKS.get(name) if name in TASKS else None


def data_files(name: str, options: dict) -> dict[str, str]:
    """The user's files or folders the task ``name`` reads with ``options``: ``{option: path}``
    for the options it registered as ``files`` that are set (``{}`` for a generated task)."""
    found = getattr(_maker(name), "files", ())
    return {o: str(options[o]) for o in found if options.get(o)}


def _hash_path(h, path: Path, pattern) -> None:
    if pattern is not None and path.is_dir():  # a folder: the files the task reads in it, by their path inside it
        found = path.glob(pattern) if isinstance(pattern, str) else pattern(path)
        for f in sorted(p for p in found if p.is_file()):
            h.update(str(f.relative_to(path)).encode() + b"\0")
            with f.open("rb") as fh:
                h.update(hashlib.file_digest(fh, "sha256").digest())
    else:
        with path.open("rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())


def data_digest(name: str, options: dict) -> str | None:
    """The SHA-256 (hex) of the contents of the user's files the task ``name`` reads with
    ``options`` (:func:`data_files`; a folder: the files its ``files`` pattern names in it, with
    their paths inside it), or None when it reads none. A file that cannot be read raises
    ``ValueError``."""
    files = data_files(name, options)
    if not files:
        return None
    patterns = getattr(_maker(name), "files", {})
    h = hashlib.sha256()
    for option, path in sorted(files.items()):
        h.update(option.encode() + b"\0")
        try:
            _hash_path(h, Path(path), patterns.get(option) if isinstance(patterns, dict) else None)
        except OSError as e:
            raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
    return h.hexdigest()


def _check_digest(name: str, options: dict, old: str | None, new: str | None, where: str) -> None:
    if old is not None and new is not None and old != new:
        files = ", ".join(data_files(name, options).values())
        raise DataChangedError(
            f"{files} has changed since {where} read it (sha256 {old[:12]} then, {new[:12]} now): its splits and "
            "labels would not be the run's; restore the file, or train a new run on it")


def check_saved(task: Task, saved: dict | None, where: str = "the run") -> None:
    """Refuse a task that is not the one an earlier build saved ``saved`` for (a checkpoint's
    ``task_artifacts``; ``where`` names it in the message): the user's file has changed since
    (:class:`DataChangedError`), or, for a task that reuses what it saved (``rebuild``), its
    tokenizers or labels differ. Nothing to check when ``saved`` is None or empty."""
    if not saved:
        return
    _check_digest(task.name, task.options, saved.get("data_sha256"), task.artifacts.get("data_sha256"), where)
    if getattr(_maker(task.name), "rebuild", None) is not None:
        differ = sorted(k for k in saved if k != "data_sha256" and k in task.artifacts
                        and task.artifacts[k] != saved[k])
        if differ:
            raise ValueError(f"the {task.name} task's {', '.join(differ)} differ from those {where} was trained with; "
                             "build the task from the run's saved artifacts (attnlab.tasks.create(..., "
                             "saved=checkpoint.meta['task_artifacts']))")


def create(name: str, *, saved: dict | None = None, **options) -> Task:
    """Build the task ``name`` (see :func:`names`) with its options (``size``, ``seed``, ...).

    ``saved``: the artifacts an earlier build of the same task and options saved (a checkpoint's
    ``meta["task_artifacts"]``; None: build from the data alone): a task on the user's files
    refuses to build when the files have changed since (:class:`DataChangedError`), and a task
    that derives an encoding from its data (``jsonl``'s tokenizers) reuses the saved one
    instead of deriving it again, and refuses when none was saved.
    """
    import inspect

    make = TASKS.get(name)
    known = list(inspect.signature(make).parameters)
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ArgumentTypeError(f"task {name!r} has no option {', '.join(map(repr, unknown))}; its options: "
                                f"{', '.join(known)}")
    digest = data_digest(name, options)
    if saved:
        _check_digest(name, options, saved.get("data_sha256"), digest, "the run")
    rebuild = getattr(make, "rebuild", None)
    task = rebuild(saved, **options) if saved is not None and rebuild is not None else make(**options)
    if digest is not None:
        task.artifacts["data_sha256"] = digest
    return task


def names() -> list[str]:
    """The registered task names."""
    return TASKS.names()


def pad_rows(rows: list[list[int]], value: int, length: int | None = None) -> torch.Tensor:
    """Right-pad integer rows to one ``(S, N)`` long tensor."""
    n = max((len(r) for r in rows), default=0) if length is None else length
    out = torch.full((len(rows), n), value, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r[:n], dtype=torch.long)
    return out


def split_sizes(size: int) -> dict[str, int]:
    """train / val / test counts for ``size`` training examples (val and test: size / 8, >= 64)."""
    positive_int("size", size)
    held = max(64, size // 8)
    return {"train": size, "val": held, "test": held}
