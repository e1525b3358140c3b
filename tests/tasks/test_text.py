"""The byte-level text task: real standard-library source, split by file, balanced."""

import pytest
import torch

from attnlab import tasks
from attnlab.tasks import FIRST
from attnlab.tasks.text import stdlib_files


def test_splits_share_no_source_file_and_are_balanced():
    task = tasks.create("text", length=1024)
    files = task.artifacts["files"]
    assert files["train"] and files["val"] and files["test"]
    assert not set(files["train"]) & set(files["test"]) and not set(files["train"]) & set(files["val"])
    assert not set(files["val"]) & set(files["test"])
    for name in ("train", "val", "test"):
        s = task.split(name)
        counts = torch.bincount(s.labels, minlength=task.num_labels)
        assert s.tokens.shape[1] == 1024 and bool((counts == counts[0]).all()) and int(counts[0]) > 0
        assert int(s.tokens.min()) >= FIRST and int(s.tokens.max()) < FIRST + 256


def test_a_window_is_the_bytes_of_a_file_of_its_package():
    task = tasks.create("text", length=512, size=60)
    s = task.split("test")
    window = bytes((s.tokens[0] - FIRST).tolist())
    package = task.label_names[int(s.labels[0])]
    assert any(window in f.read_bytes() for f in stdlib_files(package))
    assert len(task.split("train")) <= 60


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="length must be an int >= 64"):
        tasks.create("text", length=10)
    with pytest.raises(ValueError, match="no window"):
        tasks.create("text", length=10**7)
