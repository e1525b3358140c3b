"""The scaling benchmark's bookkeeping (fits, ratios) and its command on tiny sizes."""

import json

import pytest
from typer.testing import CliRunner

from attnlab.cli import app
from attnlab.studies.scaling import Record, relative, run, slopes

runner = CliRunner()


def test_slopes_fit_power_laws_exactly():
    recs = [Record("a", n, "fwd_bwd", 1e-9 * n**2, 100 * n, 1) for n in (1024, 4096, 8192, 16384)]
    recs += [Record("b", n, "fwd_bwd", 3e-6 * n, None, 1) for n in (4096, 8192)]
    s = slopes(recs)
    assert s["a"]["time_slope"] == pytest.approx(2.0) and s["a"]["memory_slope"] == pytest.approx(1.0)
    assert s["b"]["time_slope"] == pytest.approx(1.0) and s["b"]["memory_slope"] is None


def test_relative_is_long_range_arena_speed_and_memory():
    recs = [Record("dense", 4096, "fwd_bwd", 2.0, 400, 1), Record("x", 4096, "fwd_bwd", 0.5, 100, 1)]
    assert relative(recs) == [{"variant": "x", "n": 4096, "speedup": 4.0, "memory_ratio": 0.25}]


@pytest.mark.slow
def test_run_measures_every_variant_and_refuses_unknown_ones():
    recs = run([64, 128], ["dense", "local", "linformer"], min_repeats=1, target_seconds=0.0, memory=False, flex=False, rounds=2)
    assert [(r.variant, r.n) for r in recs] == [(v, n) for n in (64, 128) for v in ("dense", "local", "linformer")]
    assert all(r.seconds > 0 and r.mode == "fwd_bwd" for r in recs)
    assert all(r.seconds_min <= r.seconds <= r.seconds_max and r.allocator == "keep" for r in recs)  # timed in a child process
    assert all(r.repeats >= 2 for r in recs)  # the timed steps of both rounds
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        run([64], ["local"], rounds=0)
    with pytest.raises(ValueError, match="unknown variant 'flash'"):
        run([64], ["flash"])
    with pytest.raises(ValueError, match="unknown allocator 'jemalloc'"):
        run([64], ["local"], allocator="jemalloc")


@pytest.mark.slow
def test_bench_scaling_command(tmp_path):
    out, png = tmp_path / "s.json", tmp_path / "s.png"
    res = runner.invoke(
        app,
        ["bench", "scaling", "--sizes", "64,128", "--variants", "dense,performer", "--repeats", "1", "--no-flex",
         "--allocator", "system", "--rounds", "1", "-o", str(out), "--plot", str(png), "--json"],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data == json.loads(out.read_text())
    assert {(r["variant"], r["n"]) for r in data["records"]} == {("dense", 64), ("dense", 128), ("performer", 64), ("performer", 128)}
    assert all(r["peak_bytes"] > 0 for r in data["records"])  # measured in a child process
    assert set(data["slopes"]) == {"dense", "performer"} and data["relative"][0]["variant"] == "performer"
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert all(r["allocator"] == "system" and r["faults"] >= 0 for r in data["records"])
    bad = runner.invoke(app, ["bench", "scaling", "--variants", "flash"])
    assert bad.exit_code == 2 and "unknown --variants" in bad.output
    bad = runner.invoke(app, ["bench", "scaling", "--allocator", "keep,system"])
    assert bad.exit_code == 2 and "'keep,system' is not one of 'keep', 'system'" in bad.output


def test_bench_scaling_from_a_records_file(tmp_path):
    recs = [Record(v, n, "fwd_bwd", t, 1 << 20, 1).to_dict() for v, t in (("dense", 2.0), ("linear", 0.5)) for n in (4096, 8192)]
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"records": recs, "slopes": {}, "relative": [], "peers": []}))
    res = runner.invoke(app, ["bench", "scaling", "--from", str(path), "--plot", str(tmp_path / "c.png")])
    assert res.exit_code == 0, res.output
    assert "linear" in res.stdout and (tmp_path / "c.png").exists()
    bad = runner.invoke(app, ["bench", "scaling", "--from", str(tmp_path / "missing.json")])
    assert bad.exit_code == 1 and "not a records file" in " ".join(bad.output.split())  # a missing file: run time


def test_a_chart_without_memory_says_so_and_warns_nothing(tmp_path):
    import warnings

    from attnlab.viz.bench import plot_scaling

    recs = [Record("local", n, "fwd_bwd", 1e-5 * n, None, 1, seconds_min=9e-6 * n, seconds_max=1.1e-5 * n).to_dict() for n in (256, 512)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "no artists with labels" warning reached the user before
        path = plot_scaling(recs, tmp_path / "s.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_child_processes_are_told_the_device(monkeypatch, device):
    """Every timing and memory process gets the device in its spec (the CPU when none is named)."""
    import attnlab.studies.scaling as scaling

    specs = []

    def child(module, spec, what, env=None):
        specs.append(spec)
        return {v: {"seconds": [0.2, 0.1], "faults": None} for v in spec["variants"]} if spec["job"] == "time" else 4096

    monkeypatch.setattr(scaling, "measure_in_child", child)
    recs = run([64], ["dense", "local"], min_repeats=1, flex=False, rounds=1, **({} if device == "cpu" else {"device": device}))
    assert [s["job"] for s in specs] == ["time", "peak", "peak"] and {s["device"] for s in specs} == {device}
    assert [(r.variant, r.seconds, r.peak_bytes) for r in recs] == [("dense", 0.1, 4096), ("local", 0.1, 4096)]
