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
    records = run([variant, "dense"], pairs=[2], embed_dims=[8], steps=4, seconds=30)
    assert [(r.variant, r.pairs, r.length, r.dim) for r in records] == [(variant, 2, 6, 8), ("dense", 2, 6, 8)]
    assert all(0.0 <= r.accuracy <= 1.0 and r.steps == 4 and r.chance == 1 / 32 for r in records)


def test_an_ablation_names_its_options_and_measures_their_state():
    (rec,) = run(["deltanet"], pairs=[2], embed_dims=[8], steps=2, seconds=30, options={"deltanet": {"conv_size": 0}})
    assert rec.variant == "deltanet conv_size=0" and rec.state_floats == 4 * 2 * 2  # no convolution: the 2 x 2 states alone


def test_from_reads_the_records_back_and_the_chart_has_a_panel_per_pair_count(tmp_path):
    import json
    import struct

    from attnlab.cli import app
    from tests.cli.helpers import runner

    recs = [{"variant": v, "pairs": p, "length": 3 * p, "dim": d, "state_floats": 16 * d, "accuracy": a, "steps": 10,
             "train_seconds": 1.0, "chance": 1 / 32} for v, a in (("dense", 0.9), ("deltanet", 0.5)) for p in (8, 16) for d in (32, 64)]
    widths = {}
    for count, chosen in ((1, [r for r in recs if r["pairs"] == 8]), (2, recs)):
        src = tmp_path / f"r{count}.json"
        src.write_text(json.dumps({"records": chosen}))
        res = runner.invoke(app, ["bench", "recall", "--from", str(src), "--plot", str(tmp_path / f"r{count}.png"), "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout) == {"records": chosen}  # JSON alone on stdout, the records unchanged
        png = (tmp_path / f"r{count}.png").read_bytes()
        assert png[:4] == b"\x89PNG"
        widths[count] = struct.unpack(">I", png[16:20])[0]
    assert widths[2] > 1.6 * widths[1]  # one panel per number of pairs
