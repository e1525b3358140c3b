"""A seeded layer of every variant draws the same initial weights as the code before the sequence
mixers (709a633): each tensor's size, sum and sum of squares, under the names of today (a mixer's
``step.`` prefix gone, FoX's score under ``attention.``). The fixture was written by the code of
then: ``torch.manual_seed(0)``, then ``efficient.create(name, embed_dim=16, num_heads=4, **options)``
for the options below, and Mamba-2 with ``ngroups=2, state_size=8``."""

import json
from pathlib import Path

import pytest
import torch

from attnlab import efficient

EXPECTED = json.loads((Path(__file__).resolve().parent.parent / "data" / "seeded-weights-before-mixers.json").read_text())
OPTIONS = ({}, {"causal": True}, {"num_kv_heads": 2}, {"positional": "learned", "max_len": 16})


def _built():
    for name in efficient.names():
        for opts in OPTIONS:
            key = f"{name}{sorted(opts.items())}"
            if key in EXPECTED["layers"]:
                yield key, name, opts
    yield "mamba2-grouped", "mamba2", {"ngroups": 2, "state_size": 8}


@pytest.mark.parametrize(("key", "name", "options"), list(_built()), ids=lambda v: v if isinstance(v, str) else "")
def test_a_seeded_layer_draws_the_weights_of_before_the_mixers(key, name, options):
    torch.manual_seed(0)
    layer = efficient.create(name, embed_dim=16, num_heads=4, **options)
    got = {k: [t.numel(), t.double().sum().item(), t.double().square().sum().item()] for k, t in layer.state_dict().items()}
    want = EXPECTED["layers"][key]
    assert got.keys() == want.keys()
    for k, (n, total, squares) in want.items():
        assert got[k][0] == n and got[k][1] == pytest.approx(total, abs=1e-9) and got[k][2] == pytest.approx(squares, abs=1e-9), k


NEW_SINCE = {"comba"}  # variants added by the redesign: no weights of before to keep


def test_every_variant_of_before_is_in_the_fixture():
    assert {k.split("[")[0] for k in EXPECTED["layers"]} - {"mamba2-grouped"} == set(efficient.names()) - NEW_SINCE
