"""The retrieval task: pairs of real standard-library windows, related = same package; splits by
file; balanced; and the two-tower model that reads them."""

import pytest
import torch

from attnlab import tasks
from attnlab.tasks import FIRST
from attnlab.tasks.text import stdlib_files


def test_splits_share_no_source_file_and_pairs_are_labelled_by_package():
    task = tasks.create("retrieval", length=512, size=200)
    files = task.artifacts["files"]
    assert not set(files["train"]) & set(files["test"]) and not set(files["train"]) & set(files["val"])
    assert not set(files["val"]) & set(files["test"])
    contents = {name: {f: open(f, "rb").read() for f in fs} for name, fs in files.items()}
    packages = sorted({p for p in ("asyncio", "email", "importlib", "multiprocessing", "unittest", "xml") if stdlib_files(p)})
    owner = {str(f): p for p in packages for f in stdlib_files(p)}
    for name in ("train", "val", "test"):
        s = task.split(name)
        assert s.tokens.shape[1:] == (2, 512) and float(s.labels.float().mean()) == 0.5  # balanced
        for i in range(0, len(s), max(1, len(s) // 25)):  # a sample of pairs: each side is bytes of a file of this split
            sides = []
            for side in range(2):
                window = bytes((s.tokens[i, side] - FIRST).tolist())
                found = [f for f, data in contents[name].items() if window in data]
                assert found, f"{name} pair {i} side {side} is in no file of its split"
                sides.append({owner[f] for f in found})
            assert bool(sides[0] & sides[1]) == bool(s.labels[i])  # related = from the same package


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="length must be an int >= 64"):
        tasks.create("retrieval", length=8)
    with pytest.raises(ValueError, match="choose a shorter length"):
        tasks.create("retrieval", length=10**7)


def test_the_two_towers_encode_each_side_alone():
    from attnlab.models import PairClassifier, build_model
    from attnlab.training import TrainConfig, model_config

    task = tasks.create("retrieval", length=128, size=40)
    torch.manual_seed(0)
    cfg = TrainConfig.for_task("retrieval", embed_dim=16, num_heads=2, num_layers=1, task_options=task.options)
    model = build_model(model_config(cfg, task))
    model = model.double().eval()
    assert isinstance(model, PairClassifier)
    a, b, c = task.split("test").tokens[0, 0], task.split("test").tokens[0, 1], task.split("test").tokens[1, 1]
    short = b.clone()
    short[60:] = 0  # a padded second document
    pairs = torch.stack([torch.stack([a, b]), torch.stack([a, short]), torch.stack([c, a])])
    logits = model(pairs).output
    u = [model.encode(t[None]).output[0] for t in (a, b, short, c)]
    head = model.head
    want = torch.stack([head(torch.cat([x, y, x * y, x - y])) for x, y in ((u[0], u[1]), (u[0], u[2]), (u[3], u[0]))])
    torch.testing.assert_close(logits, want, rtol=1e-12, atol=1e-12)
    # the first document's vector does not depend on its partner, nor the partner's padding on padded positions
    torch.testing.assert_close(model.encode(short[None, :60]).output[0], u[2], rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match=r"shape \(B, 2, N\)"):
        model(a[None])
    # weights: the first tower's, one (B, H, N, N) tensor per block
    (w,) = model(pairs[:, :, :60], return_weights=True).weights
    assert w.shape == (3, 2, 60, 60)
    (w_a,) = model.backbone(pairs[:1, 0, :60], pairs[:1, 0, :60] == 0, return_weights=True).weights
    torch.testing.assert_close(w[:1], w_a, rtol=1e-12, atol=1e-12)
