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


def test_bench_masks_layer_step_follows_the_sizes(monkeypatch):
    """Given only short --sizes, the layer's training step runs at the largest of them, not at 131,072."""
    import attnlab.studies.masks as study

    cells = []
    monkeypatch.setattr(study, "_cell", lambda p, n, m, *a: cells.append((p, n, m)) or {"seconds": [0.01, 0.01], "rss": 1})
    res = runner.invoke(app, ["bench", "masks", "--sizes", "512,1024", "--patterns", "window", "--methods", "block-sparse", "--json"])
    assert res.exit_code == 0, res.output
    assert cells == [("window", 512, "block-sparse"), ("window", 1024, "block-sparse"), ("window", 1024, "layer_step")]
    cells.clear()
    res = runner.invoke(app, ["bench", "masks", "--sizes", "512", "--patterns", "window", "--methods", "block-sparse", "--layer-step", "0"])
    assert res.exit_code == 0 and cells == [("window", 512, "block-sparse")]


def _cell_row(pattern, n, seconds):
    return {"pattern": pattern, "n": n, "method": "block-sparse", "mode": "fwd_bwd", "seconds": seconds, "rss_bytes": 2**20,
            "map_bytes": 64, "dense_bytes": n * n, "density": 0.5}


def test_bench_masks_says_why_a_slope_is_missing(tmp_path):
    """No block-sparse times in 4K-32K: a sentence saying so, never a slope line with nothing after its colon."""
    from attnlab.studies.masks import slopes

    short = [_cell_row("window", 1024, 0.1), _cell_row("window", 2048, 0.2)]
    stored = tmp_path / "short.json"
    stored.write_text(json.dumps({"records": short, "slopes": slopes(short), "flex": []}))
    res = runner.invoke(app, ["bench", "masks", "--from", str(stored)])
    text = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert "no block-sparse slope against N: it is fitted over N in 4K-32K, and fewer than two block-sparse times fall there" in text
    assert "log-log slope against N over 4K-32K" not in text
    mixed = short + [_cell_row("causal", 4096, 0.1), _cell_row("causal", 8192, 0.4)]
    stored.write_text(json.dumps({"records": mixed, "slopes": slopes(mixed), "flex": []}))
    text = " ".join(runner.invoke(app, ["bench", "masks", "--from", str(stored)]).output.split())
    assert "slope against N over 4K-32K: causal 2.00; none for window (fewer than two block-sparse times in 4K-32K)" in text


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_cell_process_is_told_the_device_and_a_gpu_cell_reports_its_allocator_peak(monkeypatch, device):
    import attnlab.studies.masks as masks

    specs = []

    def child(module, spec, what, env=None):
        specs.append(spec)
        return {"seconds": [0.2, 0.1], "rss": 1000} if spec["device"] == "cpu" else {"seconds": [0.2, 0.1], "rss": None, "peak": 2000}

    monkeypatch.setattr(masks, "measure_in_child", child)
    recs = masks.run([256], ["window"], ["block-sparse"], layer_step=512, **({} if device == "cpu" else {"device": device}))
    assert [(s["method"], s["device"]) for s in specs] == [("block-sparse", device), ("layer_step", device)]
    memory = [(r.rss_bytes, r.peak_bytes) for r in recs]
    assert memory == ([(1000, None)] * 2 if device == "cpu" else [(None, 2000)] * 2)
