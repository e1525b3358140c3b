"""attnlab bench masks: every (pattern, N, method) cell measured in its own process, the block map
far smaller than the dense mask, FlexAttention timed beside the block-sparse forward, a report
re-read with --from, and bad input refused."""

import json

import pytest

from attnlab.cli import app
from tests.cli.helpers import runner


@pytest.mark.slow
def test_bench_masks_measures_every_cell_and_reads_its_report_back(tmp_path):
    rec_file, png = tmp_path / "masks.json", tmp_path / "masks.png"
    res = runner.invoke(app, ["bench", "masks", "--sizes", "512,1024", "--patterns", "window,causal", "--repeats", "1",
                              "--dense-up-to", "512", "--flex-up-to", "512", "--layer-step", "1024", "-o", str(rec_file),
                              "--plot", str(png)])
    assert res.exit_code == 0, res.output
    data = json.loads(rec_file.read_text())
    cells = {(r["pattern"], r["n"], r["method"]) for r in data["records"]}
    for p in ("window", "causal"):
        assert {(p, 512, "dense mask"), (p, 512, "block-sparse"), (p, 1024, "block-sparse")} <= cells
        assert (p, 1024, "dense mask") not in cells  # only up to --dense-up-to
    assert ("causal", 1024, "pytorch causal") in cells and ("window", 1024, "pytorch causal") not in cells
    assert ("window", 512, "flex") in cells and ("window", 1024, "flex") not in cells  # only up to --flex-up-to
    for r in data["records"]:
        if r["mode"] == "fwd_bwd":
            assert r["seconds"] > 0 and r["rss_bytes"] is not None and r["map_bytes"] < r["dense_bytes"] / 10
    window = next(r for r in data["records"] if r["pattern"] == "window" and r["n"] == 1024)
    assert 0 < window["density"] < 0.5  # a window of 256 at 1024: most tiles never computed
    flex = data["flex"][0]
    assert flex["pattern"] == "window" and flex["ours"] > 0 and flex["flex"] > 0
    assert any(r["mode"] == "layer_step" and r["n"] == 1024 and r["seconds"] > 0 for r in data["records"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = runner.invoke(app, ["bench", "masks", "--from", str(rec_file)])
    assert again.exit_code == 0 and "block-sparse / FlexAttention" in again.output and "window" in again.output


def test_bench_masks_refuses_bad_input(tmp_path):
    res = runner.invoke(app, ["bench", "masks", "--patterns", "windw"])
    assert res.exit_code != 0 and "--patterns" in res.output and "windw" in res.output
    res = runner.invoke(app, ["bench", "masks", "--methods", "sparse"])
    assert res.exit_code != 0 and "--methods" in res.output
    res = runner.invoke(app, ["bench", "masks", "--sizes", "0"])
    assert res.exit_code != 0 and "--sizes" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"records": [{"n": 4}]}')
    res = runner.invoke(app, ["bench", "masks", "--from", str(bad)])
    assert res.exit_code != 0 and "not a records file written by 'attnlab bench masks -o'" in " ".join(res.output.split())
