"""``text``: byte-level document classification at 1K-4K bytes, on real documents that every
machine has: the source of Python's own standard library (no download).

An example is a window of ``length`` bytes (one byte a token, ``FIRST + byte``) cut from one
module of a standard-library package; the label is the package: ``asyncio``, ``email``,
``importlib``, ``multiprocessing``, ``unittest``, ``xml`` (those present; their test folders
left out). Deciding needs what the Long Range Arena's byte-level text task needs: vocabulary and
style spread over thousands of characters, no word boundaries given.

Training windows overlap (stride ``length / 4``); validation and test windows do not. Splits
are drawn **by file**: every module belongs to one split only, so no test window comes
from a file seen in training (a test checks it). Each split takes the same number of windows
from every package (the smallest package sets it), so chance is ``1 / classes``.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import torch

from ..validate import int_at_least, positive_int
from .base import FIRST, Split, Task, register

__all__ = ["PACKAGES", "make_text", "package_data", "package_windows", "present_packages", "stdlib_files"]

PACKAGES = ("asyncio", "email", "importlib", "multiprocessing", "unittest", "xml")
"""The standard-library packages whose modules are the classes (those present on the machine)."""


def stdlib_files(package: str) -> list[Path]:
    """The ``.py`` files of a standard-library package, its test folders left out, sorted."""
    root = Path(sysconfig.get_paths()["stdlib"])
    folder = root / package
    return sorted(f for f in folder.rglob("*.py")
                  if not any(p.startswith("test") for p in f.relative_to(folder).parts[:-1]))


def _windows(path: Path, length: int, stride: int | None = None) -> list[bytes]:
    data = path.read_bytes()
    return [data[i : i + length] for i in range(0, len(data) - length + 1, stride or length)]


def present_packages(classes: int, task: str) -> list[str]:
    """The first ``classes`` of :data:`PACKAGES` this machine's standard library has (with at
    least three modules each); ``ValueError`` naming ``task`` if fewer than two."""
    present = [p for p in PACKAGES if len(stdlib_files(p)) >= 3][:classes]
    if len(present) < 2:
        raise ValueError(f"the standard library at {sysconfig.get_paths()['stdlib']} lacks the packages of the {task} "
                         f"task ({', '.join(PACKAGES)})")
    return present


def package_windows(rng: np.random.Generator, packages: list[str], length: int) -> tuple[dict, dict]:
    """Windows of ``length`` bytes per split and package, split **by file**.

    Each package's modules go whole to test, then val (each until it holds 10 % of the
    package's windows), the rest to train. Returns ``(windows, files)``: ``windows[split][p]``
    the list of windows of package ``packages[p]`` (training windows overlap, stride
    ``length / 4``; the others do not), ``files[split]`` the files of each split.
    """
    by_split: dict[str, list[list[bytes]]] = {"train": [], "val": [], "test": []}
    files_of: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for pkg in packages:
        files = stdlib_files(pkg)
        windows = [_windows(files[i], length) for i in range(len(files))]
        total = sum(len(w) for w in windows)
        parts: dict[str, list[int]] = {"test": [], "val": [], "train": []}
        for i in rng.permutation(len(files)):  # whole files: test, then val, each until it holds 10 %
            held = next((n for n in ("test", "val")
                         if sum(len(windows[j]) for j in parts[n]) < max(1, total // 10)), "train")
            parts[held if windows[i] or held == "train" else "train"].append(int(i))
        for name, idx in parts.items():
            files_of[name] += [str(files[i]) for i in idx]
            if name == "train":  # training windows overlap (stride length / 4): four times the examples
                by_split[name].append([w for i in idx for w in _windows(files[i], length, max(1, length // 4))])
            else:
                by_split[name].append([w for i in idx for w in windows[i]])
    return by_split, files_of


def package_data(task: str, *, size: int, seed: int, length: int, classes: int):
    """The options of a standard-library task checked, then ``(packages, rng, windows, files)``:
    the packages present, the task's random generator after the split, and
    :func:`package_windows`' two dicts."""
    positive_int("size", size)
    int_at_least("length", length, 64)
    int_at_least("classes", classes, 2)
    present = present_packages(classes, task)
    rng = np.random.default_rng(seed)
    return (present, rng, *package_windows(rng, present, length))


@register("text", train_defaults={"steps": 1500, "batch_size": 8, "lr": 2e-3, "warmup": 20, "embed_dim": 64,
                                  "num_layers": 2, "pooling": "mean", "positional": "sinusoidal", "eval_every": 250})
def make_text(size: int = 2000, seed: int = 0, length: int = 2048, classes: int = 6) -> Task:
    """The ``text`` task: at most ``size`` training windows of ``length`` bytes from ``classes``
    standard-library packages (see the module docstring).

    Args:
        size: the most training windows. seed: the split of the files and the draw of the windows.
        length: bytes per window. classes: the standard-library packages, the labels (at most 6).
    """
    present, rng, by_split, files_of = package_data("text", size=size, seed=seed, length=length, classes=classes)
    splits = {}
    for name, per_class in by_split.items():
        cap = min(len(w) for w in per_class)
        if name == "train":
            cap = min(cap, max(1, size // len(present)))
        rows, labels = [], []
        for label, windows in enumerate(per_class):
            for i in rng.permutation(len(windows))[:cap]:
                rows.append(np.frombuffer(windows[i], dtype=np.uint8))
                labels.append(label)
        if cap == 0:
            raise ValueError(f"length={length} leaves no window in the {name} split of some package; "
                             "choose a shorter length")
        tokens = torch.from_numpy(np.stack(rows).astype(np.int64)) + FIRST
        splits[name] = Split(tokens, torch.tensor(labels, dtype=torch.long))
    return Task(
        name="text", kind="classification", vocab_size=FIRST + 256, num_labels=len(present), metric="accuracy",
        splits=splits, options={"size": size, "seed": seed, "length": length, "classes": classes}, label_names=present,
        baseline={"chance": 1 / len(present)}, artifacts={"files": files_of},
    )
