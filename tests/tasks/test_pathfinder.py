"""The pathfinder generator: balanced, right labels, and not solvable by counting pixels."""

import numpy as np
import pytest
import torch

from attnlab import tasks
from attnlab.tasks import FIRST
from attnlab.tasks.pathfinder import draw_example


def test_splits_are_balanced_pixel_sequences_and_reproducible():
    task = tasks.create("pathfinder", size=128, seed=1)
    for name in ("train", "val", "test"):
        s = task.split(name)
        assert s.tokens.shape[1] == 32 * 32 and set(s.tokens.unique().tolist()) <= {FIRST, FIRST + 1}
        assert int(s.labels.sum()) * 2 == len(s.labels)  # half connected, half not
    again = tasks.create("pathfinder", size=128, seed=1)
    assert torch.equal(again.split("test").tokens, task.split("test").tokens)
    assert not torch.equal(tasks.create("pathfinder", size=128, seed=2).split("test").tokens, task.split("test").tokens)
    assert tasks.create("pathfinder", size=64, resolution=64).split("train").tokens.shape[1] == 4096


def test_the_dots_are_joined_by_ink_exactly_when_the_label_says_connected():
    """With solid curves (gap 0) connectivity is a flood fill of the ink: it must match the label."""
    from scipy import ndimage

    rng = np.random.default_rng(0)
    for i in range(40):
        connected = bool(i % 2)
        img, dots = draw_example(rng, connected, gap=0, return_dots=True)
        assert len(dots) == 2
        parts, _ = ndimage.label(img, structure=np.ones((3, 3)))
        same = parts[dots[0]] == parts[dots[1]] != 0
        assert same == connected


def test_pixel_counts_do_not_give_the_label_away():
    from sklearn.linear_model import LogisticRegression

    task = tasks.create("pathfinder", size=600, seed=3)

    def histograms(split):
        s = task.split(split)
        ink = (s.tokens == FIRST + 1).sum(1, keepdim=True).float()
        return torch.cat([ink, s.tokens.shape[1] - ink], 1).numpy(), s.labels.numpy()

    x, y = histograms("train")
    xt, yt = histograms("test")
    clf = LogisticRegression().fit((x - x.mean(0)) / x.std(0), y)
    acc = clf.score((xt - x.mean(0)) / x.std(0), yt)
    assert acc < 0.65, acc  # chance is 0.5; a pixel-count shortcut would score far higher


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="resolution must be one of"):
        tasks.create("pathfinder", resolution=30)
    with pytest.raises(ValueError, match="distractors must be an int >= 0"):
        tasks.create("pathfinder", distractors=-1)
