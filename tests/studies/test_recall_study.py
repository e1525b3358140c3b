"""``attnlab bench recall``: the state sizes are the caches' own, and a run trains and scores every cell."""

import pytest

from attnlab.studies.recall import WINDOW, run, state_floats


def test_state_sizes_are_what_each_cache_holds():
    d, h = 32, 4
    hd = d // h
    # the gated family: one D x D state per head (no convolution: retnet, gla; width-4 convolution: 3 tokens of q, k, v)
    assert state_floats("retnet", d, h, 50) == state_floats("retnet", d, h, 500) == h * hd * hd
    assert state_floats("gated_deltanet", d, h, 50) == h * hd * hd + 3 * 3 * d
    assert state_floats("linear", d, h, 500) == h * hd * (hd + 1)  # S and z
    assert state_floats("local", d, h, 500) == state_floats("local", d, h, 50) > 2 * (WINDOW + 1) * d  # the window (and its positions)
    assert state_floats("dense", d, h, 512) >= 2 * 512 * d > state_floats("dense", d, h, 64)  # every token's key and value


@pytest.mark.parametrize("variant", ["gated_deltanet"])
def test_a_run_trains_and_scores_every_cell(variant):
    records = run([variant, "dense"], pairs=[2], dims=[8], steps=4, seconds=30)
    assert [(r.variant, r.pairs, r.length, r.dim) for r in records] == [(variant, 2, 6, 8), ("dense", 2, 6, 8)]
    assert all(0.0 <= r.accuracy <= 1.0 and r.steps == 4 and r.chance == 1 / 32 for r in records)


def test_an_ablation_names_its_options_and_measures_their_state():
    (rec,) = run(["deltanet"], pairs=[2], dims=[8], steps=2, seconds=30, options={"deltanet": {"conv_size": 0}})
    assert rec.variant == "deltanet conv_size=0" and rec.state_floats == 4 * 2 * 2  # no convolution: the 2 x 2 states alone
