"""``pathfinder``: are the two dots connected by one dashed curve? Our own generator after
Linsley et al. 2018 ("Learning long-range spatial dependencies with horizontal gated recurrent
units", the Long Range Arena's Pathfinder task), each image flattened to a sequence of pixels,
one pixel a token: 32 x 32 = 1024 tokens (``resolution=64``: 4096).

An image holds ``distractors + 2`` curves of the same length, drawn as dashes (``dash`` pixels
on, ``gap`` off, so that no flood fill of the ink follows a curve), and two dots (3 x 3 plus
signs). No curve touches another (a crossing would change the ink count by class and make
the label ambiguous):

* **connected** (label 1): one curve carries both dots, one at each end; ``distractors + 1``
  curves carry none;
* **not connected** (label 0): two curves carry one dot each; ``distractors`` carry none.

Both classes have the same number of curves, dots and (in expectation) ink, so counting pixels
says nothing (a test fits a logistic regression on pixel histograms); the classes alternate, so
every split is balanced. Tokens: ``FIRST`` (background), ``FIRST + 1`` (ink).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..validate import choice, int_at_least, positive_int
from .base import FIRST, Split, Task, register, split_sizes

__all__ = ["make_pathfinder", "draw_example"]

_STEP = 1.0  # pixels per curve step


def _curve(rng: np.random.Generator, size: int, length: int, max_turn: float) -> np.ndarray | None:
    """Points ``(length + 1, 2)`` of a smooth random walk inside the canvas, or None if it left it."""
    margin = 2.0
    p = rng.uniform(margin, size - 1 - margin, 2)
    angle = rng.uniform(0, 2 * math.pi)
    points = [p.copy()]
    for _ in range(length):
        angle += rng.uniform(-max_turn, max_turn)
        p = p + _STEP * np.array([math.cos(angle), math.sin(angle)])
        if not (margin <= p[0] <= size - 1 - margin and margin <= p[1] <= size - 1 - margin):
            return None
        points.append(p.copy())
    return np.array(points)


def _pixels(points: np.ndarray, dash: int, gap: int) -> list[tuple[int, int]]:
    """The pixels the dashed curve inks: runs of ``dash`` steps drawn, ``gap`` skipped."""
    out, period = [], dash + gap
    for i, (y, x) in enumerate(points):
        if gap == 0 or i % period < dash:
            out.append((int(round(y)), int(round(x))))
    return list(dict.fromkeys(out))


def _dot(center: np.ndarray) -> list[tuple[int, int]]:
    y, x = int(round(center[0])), int(round(center[1]))
    return [(y, x), (y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)]


def _near(pixels, taken: np.ndarray) -> bool:
    """Whether any pixel is within one pixel (8-neighbourhood) of ink already drawn."""
    size = taken.shape[0]
    for y, x in pixels:
        if taken[max(0, y - 1) : min(size, y + 2), max(0, x - 1) : min(size, x + 2)].any():
            return True
    return False


def draw_example(rng: np.random.Generator, connected: bool, *, resolution: int = 32, distractors: int = 2,
                 dash: int = 3, gap: int = 2, tries: int = 200, return_dots: bool = False):
    """One ``(resolution, resolution)`` bool image (see the module docstring); curves that would
    touch existing ink are redrawn, and the whole image after ``tries`` failed curves.
    With ``return_dots``: ``(image, [(y, x) of each dot centre])``."""
    length = int(0.6 * resolution)
    max_turn = 0.35
    for _ in range(100):
        ink = np.zeros((resolution, resolution), dtype=bool)
        centres: list[tuple[int, int]] = []
        ok = True
        for c in range(distractors + 2):
            for _ in range(tries):
                pts = _curve(rng, resolution, length, max_turn)
                if pts is None:
                    continue
                dots = []
                if connected and c == 0:
                    dots = _dot(pts[0]) + _dot(pts[-1])
                elif not connected and c < 2:
                    dots = _dot(pts[rng.integers(2) * -1])
                pix = _pixels(pts, dash, gap) + dots
                if _near(pix, ink):
                    continue
                for y, x in pix:
                    ink[y, x] = True
                centres += [dots[i] for i in range(0, len(dots), 5)]  # each plus sign starts with its centre
                break
            else:
                ok = False
                break
        if ok:
            return (ink, centres) if return_dots else ink
    raise RuntimeError(f"could not place {distractors + 2} curves without touching on a {resolution} x "
                       f"{resolution} canvas")


@register("pathfinder", train_defaults={"steps": 2000, "batch_size": 32, "lr": 1e-3, "embed_dim": 64, "num_layers": 2,
                                        "pooling": "cls", "positional": "sinusoidal", "eval_every": 250})
def make_pathfinder(size: int = 2000, seed: int = 0, resolution: int = 32, distractors: int = 2, dash: int = 3,
                    gap: int = 2) -> Task:
    """The ``pathfinder`` task: ``size`` training images of ``resolution`` x ``resolution`` pixels,
    as token sequences of ``resolution ** 2`` (see the module docstring).

    Args:
        size: training images (val and test: size / 8 each, at least 64). seed: the generator's.
        resolution: pixels per side (32: 1,024 tokens; 64: 4,096).
        distractors: curves that carry no dot. dash: pixels drawn per dash. gap: pixels left out between dashes.
    """
    choice("resolution", resolution, (16, 32, 64))
    int_at_least("distractors", distractors, 0)
    positive_int("dash", dash)
    int_at_least("gap", gap, 0)
    rng = np.random.default_rng(seed)
    splits = {}
    for name, count in split_sizes(size).items():
        labels = np.arange(count) % 2  # alternating: every split balanced
        images = np.stack([draw_example(rng, bool(y), resolution=resolution, distractors=distractors, dash=dash,
                                        gap=gap) for y in labels])
        tokens = torch.from_numpy(images.reshape(count, -1).astype(np.int64)) + FIRST
        splits[name] = Split(tokens, torch.from_numpy(labels.astype(np.int64)))
    return Task(
        name="pathfinder", kind="classification", vocab_size=FIRST + 2, num_labels=2, metric="accuracy", splits=splits,
        options={"size": size, "seed": seed, "resolution": resolution, "distractors": distractors,
                 "dash": dash, "gap": gap},
        vocab=["<pad>", "<cls>", "background", "ink"], label_names=["not connected", "connected"],
        baseline={"chance": 0.5},
    )
