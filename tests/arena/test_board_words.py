"""The board's words: setting labels name only what differs, a swept budget is named as swept,
a share of peak above 100 % is not printed as a fact, and the report's cost table says "-" (not
"-x") where a projected row has no speed."""

import json

import pytest

from attnlab.arena.board import leaderboard
from attnlab.arena.report import build_report, peak_share
from attnlab.arena.store import Store


def _row(run_id, value, config, variant="dense", sweep=None, peak_fraction=None, seed=0):
    return {"run_id": run_id, "task": "lookup", "variant": variant, "seed": seed, "config": config, "status": "done",
            "metric": "query_accuracy", "value": value, "train_seconds": 1.0, "steps": config.get("steps", 10), "steps_per_second": 10.0,
            "peak_bytes": 1000, "params": 10, "error": None, "history": [], "sweep": sweep or {}, "level": {},
            "peak_fraction": peak_fraction, "precision": "fp32"}


def test_settings_are_told_apart_by_the_options_that_differ_in_a_few_words():
    rows = [_row("a", 0.9, {"steps": 10, "task_options": {"size": 512}}),
            _row("b", 0.7, {"steps": 10, "task_options": {"size": 512, "keys": 4, "length": 512}})]
    labels = sorted(e["setting"] for e in leaderboard(rows)["tasks"]["lookup"])
    assert labels == ["keys=4, length=512", "keys=default, length=default"]  # not task_options={...} JSON, not size
    many = [_row(str(i), 0.5, {"steps": 10, "lr": i, "batch_size": i, "warmup": i, "seed": 0, "embed_dim": i}) for i in (1, 2)]
    assert sorted(e["setting"] for e in leaderboard(many)["tasks"]["lookup"]) == ["batch_size=1, embed_dim=1, lr=1, 1 more",
                                                                                   "batch_size=2, embed_dim=2, lr=2, 1 more"]


def test_a_swept_budget_is_named_as_swept_not_as_its_chosen_point():
    rows = [_row(f"{n}-{s}", v, {"steps": n}, sweep={"steps": n}, seed=s) for n, v in ((30, 0.5), (90, 0.9), (120, 0.95)) for s in (0,)]
    (entry,) = leaderboard(rows)["tasks"]["lookup"]
    assert entry["budget"] == "30 steps or 90 steps or 120 steps (swept)"


def test_a_share_of_peak_above_100_percent_is_a_caveat_not_a_figure():
    rows = [_row("a", 0.9, {"steps": 10}, peak_fraction=1.1), _row("b", 0.8, {"steps": 10}, variant="linear", peak_fraction=0.3)]
    entries = {e["variant"]: e for e in leaderboard(rows)["tasks"]["lookup"]}
    assert peak_share(entries["dense"]["peak_fraction"], "fp32") == "-" and peak_share(0.3, "fp32") == "30% fp32"
    assert any("above 100%" in c and "110%" in c for c in entries["dense"]["caveats"]) and not entries["linear"]["caveats"]


def test_the_report_s_cost_table_has_no_ratio_without_a_number_and_counts_one_thread(tmp_path):
    Store(tmp_path / "results.sqlite").add(_row("a", 0.9, {"steps": 10}))
    rows = [{"variant": v, "length": n, "seconds": s, "peak_bytes": b, "params": 1} for v, n, s, b in
            (("dense", 1024, 0.1, 100), ("dense", 4096, 0.4, 400), ("dense_naive", 1024, 0.2, 1000), ("dense_naive", 4096, 0.9, 16000))]
    rows.append({"variant": "dense_naive", "length": 16384, "seconds": None, "peak_bytes": 256000, "params": 1, "projected": True,
                 "from": [1024, 4096]})
    rows.append({"variant": "dense", "length": 16384, "seconds": 2.0, "peak_bytes": 1600, "params": 1})
    table = {"task": "lookup", "key": "a folder from before grid.json", "threads": 1, "cpu": "x", "rows": rows}
    (tmp_path / "cost.json").write_text(json.dumps(table))
    page, board = build_report(tmp_path)
    html = page.read_text()
    assert "-x" not in html and "1 thread)" in html and "1 threads" not in html
    assert board["cost"]["variants"]["dense_naive"]["16384"]["speed"] is None


@pytest.mark.parametrize("fraction, shown", [(None, "-"), (0.12, "12% bf16"), (1.0, "100% bf16"), (1.56, "-")])
def test_peak_share_in_words(fraction, shown):
    assert peak_share(fraction, "bf16") == shown
