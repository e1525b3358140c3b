"""The device check (``attnlab bench device``) on the CPU: parity of every variant against the
float64 reference, backends, speed rows, the arena's comparison with the stored CPU scores, and
the command's refusals and JSON file."""

import functools
import json
import time

import pytest
import torch

from attnlab import arena as arena_pkg
from attnlab import efficient
from attnlab.cli import app
from attnlab.studies import device_check as dc
from attnlab.studies import device_speed as ds
from tests.cli.helpers import runner


@pytest.fixture(scope="module")
def check():
    return dc.run("cpu", lengths=[64], arena=False, repeats=1)


def test_every_variant_has_fp32_and_bf16_parity_rows_and_fp32_matches_float64(check):
    rows = check["parity"]
    for name in efficient.names():
        mine = [r for r in rows if r["variant"] == name]
        forms = {r["causal"] for r in mine}
        assert forms == ({False, True} if efficient.capabilities(name).causal is not None else {False}), name
        assert {r["precision"] for r in mine} == {"fp32", "bf16"}, name
        for r in mine:
            assert r["error"] is None, (name, r["error"])
            assert r["backend"] and r["why"], name
            if r["precision"] == "fp32":  # float32 on the CPU against float64: rounding only
                assert 0 < r["output_error"] < 1e-4 and 0 < r["grad_error"] < 1e-4, r
                assert r["within"]
            else:  # bfloat16 autocast: visibly coarser than float32, yet a finite difference
                assert 1e-4 < r["output_error"] < 1.0 and 1e-4 < r["grad_error"] < 1.0, r
    assert {r["backend"] for r in rows if r["variant"] == "dense"} == {"torch sdpa"}


def test_the_speed_rows_hold_positive_times_for_every_variant_and_sdpa(check):
    rows = check["speed"]
    assert {(r["variant"], r["precision"]) for r in rows} == {(v, p) for v in ["sdpa", *efficient.names()] for p in ("fp32", "bf16")}
    for r in rows:
        assert r["n"] == 64 and r["status"] == "ok", r
        assert r["seconds"] > 0 and r["repeats"] == 1 and r["peak_bytes"] > 0, r
        assert (r["vs_sdpa"] is None) == (r["variant"] == "sdpa") and (r["vs_sdpa"] is None or r["vs_sdpa"] > 0)
    assert check["arena"] is None
    env = check["environment"]
    assert env["torch"] == torch.__version__ and env["device"] == "cpu" and "triton" not in env  # Triton is imported on CUDA only
    assert check["settings"]["speed_heads"] == 4 and check["settings"]["lengths"] == [64]


def test_a_slow_or_failing_cell_skips_the_longer_lengths_and_a_deadline_skips_the_rest(monkeypatch):
    calls = []

    def fake_cell(name, n, precision, ctx):
        calls.append((name, n, precision))
        status = "out of memory" if name == "local" and n == 32 else "ok"
        seconds = 99.0 if name == "sdpa" and precision == "bf16" else 0.01
        return {"variant": name, "n": n, "precision": precision, "status": status, "seconds": seconds if status == "ok" else None,
                "peak_bytes": None, "vs_sdpa": None, "note": None}

    monkeypatch.setattr(ds, "_speed_cell", fake_cell)
    rows = ds.speed("cpu", [16, 32, 64], ["local", "dense"], cell_seconds=10.0)
    skipped = {(r["variant"], r["n"], r["precision"]): r["note"] for r in rows if r["status"] == "skipped"}
    assert skipped[("local", 64, "fp32")] == "out of memory at N=32" and ("local", 32, "fp32") not in skipped
    assert skipped[("sdpa", 32, "bf16")] == "99.00 s at N=16: at least 198.0 s at N=32, over 10 s" and ("sdpa", 32, "fp32") not in skipped
    assert ("local", 64, "fp32") not in calls and ("dense", 64, "bf16") in calls
    late = ds.speed("cpu", [16], ["local"], deadline=0.0)
    assert [r["status"] for r in late] == ["skipped"] * 4 and late[0]["note"] == "the speed section's deadline passed"
    monkeypatch.setattr(ds, "_speed_cell", lambda name, n, precision, ctx: {**fake_cell(name, n, precision, ctx), "seconds": 0.4})
    near = ds.speed("cpu", [8, 16], [], deadline=time.monotonic() + 1.0)  # 0.4 s at 8: two calls at 16 need 1.6 s
    assert [r["status"] for r in near] == ["ok", "ok", "skipped", "skipped"]
    assert near[2]["note"] == "0.40 s at N=8: two calls at N=16 would pass the speed section's deadline"


def test_the_stored_cpu_scores_are_read_per_variant_and_level():
    ref = dc.cpu_reference()
    assert ref is not None and ref["file"].endswith(".json")
    dense = ref["scores"]["dense"]
    assert 0.5 < dense["value"] <= 1.0 and len(dense["levels"]) == 3
    assert json.dumps({"keys": 8, "repeats": 32}, sort_keys=True) in dense["levels"]


def test_each_variant_and_level_is_set_beside_the_cpus_stored_score():
    ref = dc.cpu_reference()
    stored = ref["scores"]["dense"]["levels"]
    entries = [{"variant": "dense", "value": 0.5, "levels": [{"level": {"repeats": 32, "keys": 8}, "value": 0.6},
                                                             {"level": {"keys": 99, "repeats": 1}, "value": 0.4}]},
               {"variant": "nosuch", "value": 0.25, "levels": None, "error": "it failed"}]
    dense, other = dc.compare_with_cpu(entries, ref)
    assert dense["cpu"] == ref["scores"]["dense"]["value"] and dense["difference"] == pytest.approx(0.5 - dense["cpu"])
    known, unknown = dense["levels"]
    assert known["cpu"] == stored['{"keys": 8, "repeats": 32}'] and known["difference"] == pytest.approx(0.6 - known["cpu"])
    assert unknown["cpu"] is None and unknown["difference"] is None
    assert other == {"variant": "nosuch", "device": 0.25, "cpu": None, "difference": None, "levels": [], "error": "it failed"}
    assert dc.compare_with_cpu(entries[:1], None)[0]["cpu"] is None


def test_the_arena_section_trains_lookup_here_and_compares(monkeypatch):
    real_plan = arena_pkg.plan
    one_level = {"lookup": {"size": 32, "keys": 8, "repeats": 32}}  # one short run: the plumbing, not the score
    monkeypatch.setattr(arena_pkg, "plan", lambda preset, **kw: real_plan(preset, **kw, variants=["dense"], seeds=[0], steps=2,
                                                                                   task_options=one_level))
    lines = []
    a = dc.arena_check("cpu", workers=1, say=lines.append)
    assert a["runs"] == 1 and a["failed"] == 0 and a["wall_seconds"] > 0 and a["reference"].endswith(".json")
    (dense,) = a["variants"]
    assert dense["variant"] == "dense" and 0 <= dense["device"] <= 1 and dense["cpu"] > 0.9  # two steps: far below the stored run
    assert dense["difference"] == pytest.approx(dense["device"] - dense["cpu"])
    assert len(lines) == 1 and lines[0].startswith("arena [1/1] lookup dense seed 0")


def test_a_device_this_machine_lacks_is_one_line_and_exit_2():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    res = runner.invoke(app, ["bench", "device", "--device", "cuda"])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no CUDA device" in lines[0], res.stderr


def test_the_command_writes_the_json_it_prints_a_table_for(monkeypatch, tmp_path):
    monkeypatch.setattr(dc, "run", functools.partial(dc.run, variants=["dense"], repeats=1))
    path = tmp_path / "check.json"
    res = runner.invoke(app, ["bench", "device", "--device", "cpu", "--lengths", "32", "--no-arena", "-o", str(path)])
    assert res.exit_code == 0, res.output
    data = json.loads(path.read_text())
    assert set(data) >= {"device", "environment", "settings", "parity", "speed", "arena", "wall_seconds"}
    assert data["arena"] is None and {r["variant"] for r in data["parity"]} == {"dense"}
    assert {r["n"] for r in data["speed"]} == {32} and all(r["seconds"] > 0 for r in data["speed"])
    assert "parity against float64" in res.stdout and "forward + backward" in res.stdout and str(path) in res.stdout
    assert "parity dense" in res.stderr  # progress lines
    res = runner.invoke(app, ["bench", "device", "--device", "cpu", "--no-speed", "--no-arena", "--json"])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    assert printed["speed"] is None and len(printed["parity"]) == 4  # two forms, two precisions each


def test_the_parity_rows_are_written_after_each_variant_so_a_stopped_check_keeps_them():
    seen = []
    dc.run("cpu", variants=["dense", "linear"], arena=False, speed_section=False,
           on_update=lambda d: seen.append(sorted({r["variant"] for r in d["parity"]})))
    assert [] in seen and ["dense"] in seen and seen[-1] == ["dense", "linear"]
    assert seen.index(["dense"]) < seen.index(["dense", "linear"])
