"""The digits task: scikit-learn's images, fixed held-out splits, the training-fraction knob."""

import pytest
import torch

from attnlab import tasks


def _key(img):
    return tuple((img.flatten() * 16).round().long().tolist())


def test_digits_are_sklearns_images_split_without_overlap():
    from sklearn.datasets import load_digits

    data = load_digits()
    task = tasks.create("digits")
    assert task.inputs == "image" and task.num_labels == 10
    sizes = {k: len(v) for k, v in task.splits.items()}
    assert sum(sizes.values()) == 1797 and abs(sizes["test"] - 0.2 * 1797) < 10
    truth = {}
    for img, y in zip(data.images, data.target):
        truth.setdefault(tuple(int(v) for v in img.flatten()), set()).add(int(y))
    for split in task.splits.values():
        assert split.tokens.shape[1:] == (1, 8, 8) and float(split.tokens.max()) <= 1.0
        for img, y in zip(split.tokens[:50], split.labels[:50]):
            assert int(y) in truth[_key(img)]
    counts = torch.bincount(task.split("test").labels, minlength=10)
    assert int(counts.min()) >= 34  # stratified: ~36 of each digit


def test_train_fraction_keeps_held_out_splits_and_subsets_training():
    full, part = tasks.create("digits", seed=1), tasks.create("digits", seed=1, train_fraction=0.1)
    assert torch.equal(full.split("test").tokens, part.split("test").tokens)
    assert torch.equal(full.split("val").tokens, part.split("val").tokens)
    assert abs(len(part.split("train")) - 0.1 * len(full.split("train"))) <= 10
    assert set(torch.unique(part.split("train").labels).tolist()) == set(range(10))
    have = {_key(i) for i in full.split("train").tokens}
    assert all(_key(i) in have for i in part.split("train").tokens)
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="train_fraction"):
            tasks.create("digits", train_fraction=bad)


def test_cnn_learns_digits(tmp_path):
    from attnlab.training import TrainConfig, train

    res = train(TrainConfig.for_task("digits", model="cnn", steps=400, eval_every=100), tmp_path)
    assert res.value >= 0.93 and res.attention == "none"


def test_compare_records_and_refuses_non_image_models():
    from attnlab.studies.vit_cnn import run

    recs = run([0.1], ["cnn"], seeds=[0], steps=30)
    assert len(recs) == 1 and recs[0].train_size == len(tasks.create("digits", train_fraction=0.1).split("train"))
    assert 0.0 <= recs[0].accuracy <= 1.0 and recs[0].steps <= 30
    with pytest.raises(ValueError, match="does not read images"):
        run([0.1], ["transformer"])
    with pytest.raises(ValueError, match="fractions"):
        run([2.0], ["cnn"])
