"""Issue 50: the arena's verdict, reproducible and discriminating.

Step budgets (``--budget-steps``), per-task options (``--task-option TASK.KEY=VALUE``), the same
score for one run id under two thread counts, difficulty levels averaged as MAD does, an average
over tasks that never ranks a variant with fewer tasks above one with more, the cost measured at
long lengths beside the fused and the materialising dense, and the new-user findings of
2026-11-26 (a swept step count labelled a time budget, dropped runs unsaid, charts blank or
unlabelled, attention maps a black square at 1K)."""

import json
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from attnlab.arena import (
    LiveGrid,
    Preset,
    TaskSetting,
    attention_maps,
    budget_of,
    build_report,
    leaderboard,
    parse_task_options,
    plan,
    run_grid,
)
from attnlab.arena.cost import REFERENCE, cost_summary, measure_cost, ratios
from attnlab.cli import app
from attnlab.training import load_checkpoint

runner = CliRunner()

SMALL = {"size": 64, "length": 96, "keys": 2, "repeats": 4, "gap": 8, "queries": 8, "num_keys": 8, "noise": 4}
"""A lookup small enough to train in a second: 2 or 4 keys, 96 tokens."""

TRAIN = {"steps": 4, "eval_every": 2, "embed_dim": 16, "num_heads": 2, "batch_size": 2, "patience": 10**6}


def _preset(**more) -> Preset:
    return Preset({"lookup": TaskSetting(SMALL, TRAIN, ("dense", "linear", "none"), seeds=(0,),
                                         levels=({"keys": 2}, {"keys": 4}), **more)}, ("dense", "linear", "none"))


def test_budget_steps_replaces_every_budget_and_a_swept_step_count_is_a_step_budget():
    timed = Preset({"lookup": TaskSetting(SMALL, {"seconds": 20.0, "eval_every": 2})}, ("dense",))
    assert {s.config.seconds for s in plan(timed)} == {20.0}
    stepped = plan(timed, steps=7)
    assert {(s.config.steps, s.config.seconds) for s in stepped} == {(7, None)}
    assert budget_of(json.loads(json.dumps(stepped[0].config.__dict__))) == "7 steps"
    # the finding: --sweep steps=30 on a time-budgeted task kept its 20 s and was labelled "20 s per run, time-budgeted"
    swept = plan(timed, sweep={"steps": [30]})
    assert {(s.config.steps, s.config.seconds) for s in swept} == {(30, None)}
    with pytest.raises(ValueError, match="steps or in seconds, not both"):
        plan(timed, steps=5, seconds=5.0)
    res = runner.invoke(app, ["arena", "--budget-steps", "5", "--budget-seconds", "5", "--out", "unused"])
    assert res.exit_code == 2 and "give one budget" in res.output


def test_a_task_option_reaches_its_task_and_one_a_level_sets_replaces_the_levels():
    opts = parse_task_options(["lookup.keys=32", "lookup.length=2048", "text.length=512"])
    assert opts == {"lookup": {"keys": 32, "length": 2048}, "text": {"length": 512}}
    grid = plan("quick", tasks=["lookup", "text"], variants=["dense"], seeds=[0], task_options=opts)
    lookup = [s for s in grid if s.task == "lookup"]
    assert len(lookup) == 1 and lookup[0].config.task_options == {"size": 512, "keys": 32, "length": 2048} and lookup[0].level == {}
    assert [s.config.task_options for s in grid if s.task == "text"] == [{"length": 512}]
    assert any("keys=32 given, so it runs at that setting alone, in place of its difficulty levels" in n for n in grid.notes)
    kept = plan("quick", tasks=["lookup"], variants=["dense"], seeds=[0], task_options=parse_task_options(["lookup.gap=64"]))
    assert [s.config.task_options["gap"] for s in kept] == [64, 64, 64] and len({json.dumps(s.level) for s in kept}) == 3
    for bad, said in ((["lookup.kes=3"], "lookup has no option 'kes'; it takes"), (["keys=3"], "takes TASK.KEY=VALUE"),
                      (["nope.keys=3"], "unknown task 'nope'")):
        with pytest.raises(ValueError, match=said):
            parse_task_options(bad)
    with pytest.raises(ValueError, match="not a task of this grid"):
        plan("quick", tasks=["text"], task_options={"lookup": {"keys": 8}})
    res = runner.invoke(app, ["arena", "--tasks", "text", "--task-option", "text.lenght=5", "--out", "unused"])
    assert res.exit_code == 2 and "text has no option 'lenght'" in " ".join(res.output.split())


def test_the_same_run_id_gives_the_same_score_under_two_thread_counts(tmp_path):
    """The reproducibility rule: a step-budgeted run is the same computation whatever the threads."""
    (spec,) = plan(Preset({"lookup": TaskSetting(SMALL, TRAIN)}, ("dense",)))
    before = torch.get_num_threads()
    scores = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            store = run_grid([spec], tmp_path / f"t{threads}")
            (row,) = store.rows()
            weights = load_checkpoint(tmp_path / f"t{threads}" / "runs" / spec.run_id).model.state_dict()
            scores.append((row["run_id"], row["value"], [h["val"] for h in row["history"]], weights))
    finally:
        torch.set_num_threads(before)
    (id1, v1, h1, w1), (id2, v2, h2, w2) = scores
    assert id1 == id2 and v1 == v2 and h1 == h2
    assert all(torch.equal(w1[k], w2[k]) for k in w1)  # bitwise: not only the rounded score


def _board_rows():
    def row(i, task, variant, value, seed=0, level=None, sps=10.0, peak=1000):
        return {"run_id": str(i), "task": task, "variant": variant, "seed": seed, "status": "done", "metric": "accuracy",
                "value": value, "steps": 10, "steps_per_second": sps, "peak_bytes": peak, "params": 1, "train_seconds": 1.0,
                "error": None, "history": [], "level": level or {},
                "config": {"steps": 10, "task_options": {**(level or {}), "size": 8}}}
    return row


def test_a_variant_s_score_is_its_mean_over_levels_with_each_level_shown():
    row = _board_rows()
    rows = [row(1, "lookup", "dense", 1.0, 0, {"keys": 8}), row(2, "lookup", "dense", 0.9, 0, {"keys": 32}),
            row(3, "lookup", "dense", 0.8, 1, {"keys": 8}), row(4, "lookup", "dense", 0.9, 1, {"keys": 32}),
            row(5, "lookup", "linear", 0.9, 0, {"keys": 8}), row(6, "lookup", "linear", 0.5, 0, {"keys": 32})]
    (dense, linear) = leaderboard(rows)["tasks"]["lookup"]
    assert dense["variant"] == "dense" and dense["setting"] == ""  # the levels are one cell, not one setting each
    assert dense["value"] == pytest.approx(0.9) and [p["value"] for p in dense["levels"]] == pytest.approx([0.9, 0.9])
    assert dense["spread"] == pytest.approx(0.0707106, abs=1e-6)  # the sd over seeds of each seed's mean over the levels: 0.95, 0.85
    assert [p["level"] for p in linear["levels"]] == [{"keys": 8}, {"keys": 32}] and linear["value"] == pytest.approx(0.7)


def test_the_average_never_ranks_a_variant_with_fewer_tasks_above_one_with_more():
    """The finding: performer (1 task, 0.991) and retnet (0.999) stood above dense (2 tasks, 0.642)."""
    row = _board_rows()
    rows = [row(1, "lookup", "dense", 0.985), row(2, "text", "dense", 0.298), row(3, "lookup", "performer", 0.991),
            row(4, "lookup", "retnet", 0.999), row(5, "text", "none", 0.482), row(6, "lookup", "none", 0.495)]
    avg = leaderboard(rows)["average"]
    assert [(e["variant"], e["ranked"]) for e in avg] == [("dense", True), ("none", True), ("retnet", False), ("performer", False)]
    retnet = next(e for e in avg if e["variant"] == "retnet")
    assert retnet["tasks"] == 1 and retnet["of"] == 2 and retnet["dense_same_tasks"] == pytest.approx(0.985)


def test_a_grid_without_dense_says_so_and_still_averages():
    """The finding: --variants linear,linformer gave '-' columns, an empty average and three blank panels, with no word why."""
    grid = plan("quick", tasks=["text"], variants=["linear", "linformer"])
    assert grid.notes == ["text: no dense run, so no speed or memory is compared there (dense is the reference)"]
    row = _board_rows()
    board = leaderboard([row(1, "text", "linear", 0.3), row(2, "text", "linformer", 0.2), row(3, "pos", "linear", 0.5),
                         row(4, "pos", "linformer", 0.4)])
    assert [e["variant"] for e in board["average"]] == ["linear", "linformer"] and board["average"][0]["speed"] is None


def test_a_run_a_task_cannot_take_is_named_in_the_plan(tmp_path):
    """The finding: --tasks translate,karate --variants dense,none dropped none on translate without a word."""
    grid = plan("quick", tasks=["translate", "karate"], variants=["dense", "none"])
    assert sorted((s.task, s.variant) for s in grid) == [("karate", "dense"), ("karate", "none"), ("translate", "dense")]
    assert grid.notes == ["translate / none left out: translate has no no-attention baseline (no backbone without attention "
                          "reads it; a seq2seq decoder attends its encoder)"]
    res = runner.invoke(app, ["arena", "--tasks", "translate", "--variants", "none", "--out", str(tmp_path), "--budget-steps", "1"],
                        catch_exceptions=False)
    assert res.exit_code == 2 and "the grid has no run (translate / none left out" in " ".join(res.output.split())


def test_cost_is_measured_at_each_length_beside_the_fused_and_the_materialising_dense(tmp_path):
    small = {k: v for k, v in SMALL.items() if k != "length"}
    train = {k: TRAIN[k] for k in ("embed_dim", "num_heads")}
    table = measure_cost(tmp_path, "lookup", ["dense", "linear", "none"], lengths=(96, 192, 384), task_options=small, train=train,
                         reference_up_to=192)
    got = {(r["variant"], r["length"]): r for r in table["rows"]}
    assert set(got) == {(v, n) for v in ("dense", "linear", "none", REFERENCE) for n in (96, 192, 384)}
    naive = got[(REFERENCE, 384)]
    assert naive["projected"] and naive["seconds"] is None  # beyond reference_up_to: projected, never timed
    (n1, p1), (n2, p2) = ((n, got[(REFERENCE, n)]["peak_bytes"]) for n in (96, 192))
    c = (p2 / n2 - p1 / n1) / (n2 - n1)
    assert naive["peak_bytes"] == int((p1 / n1 - c * n1) * 384 + c * 384**2)  # b N + c N^2 through the two measured lengths
    at = ratios(table, 192)
    assert at["dense"]["speed"] == 1.0 and at["dense"]["memory"] == 1.0
    assert at[REFERENCE]["memory"] > 1.5  # the N x N weights: more than the fused dense already at 192 tokens
    assert all(at[v]["memory_vs_naive"] < 1 for v in ("dense", "linear", "none"))
    again = measure_cost(tmp_path, "lookup", ["dense", "linear", "none"], lengths=(96, 192, 384), task_options=small, train=train,
                         reference_up_to=192, on_progress=lambda v, n: pytest.fail(f"{v} at {n} measured again"))
    assert len(again["rows"]) == len(table["rows"])  # a rerun keeps what was measured
    summary = cost_summary(again)
    assert summary["lengths"] == [96, 192, 384] and summary["variants"][REFERENCE]["384"]["projected"]


def test_the_report_has_the_difficulty_curve_the_cost_chart_and_maps_of_the_scored_rows(tmp_path, monkeypatch):
    grid = plan(_preset(cost=(96, 192)))
    assert len(grid) == 3 * 2 and grid.cost["lengths"] == (96, 192)  # variants x levels
    run_grid(grid, tmp_path)
    measure_cost(tmp_path, grid.cost["task"], grid.cost["variants"], lengths=grid.cost["lengths"],
                 task_options=grid.cost["task_options"], train=grid.cost["train"])
    import attnlab.arena.charts as charts

    legends = {}
    save = charts._save

    def keep(fig, path):
        legends[str(path).rsplit("/", 1)[-1]] = [t.get_text() for ax in fig.axes if ax.get_legend() for t in ax.get_legend().get_texts()]
        return save(fig, path)

    monkeypatch.setattr(charts, "_save", keep)
    page, board = build_report(tmp_path)
    html = page.read_text()
    assert "Score against difficulty" in html and "Where efficient attention pays" in html and (tmp_path / "cost.png").exists()
    assert [p["level"] for p in board["tasks"]["lookup"][0]["levels"]] == [{"keys": 2}, {"keys": 4}]
    assert set(legends["levels.png"]) == {"dense", "linear", "none"}
    assert board["cost"]["variants"]["dense"]["192"]["speed"] == 1.0
    # the maps: the 8 scored reads of each example (positions 16-23: 2 keys x 4 repeats + a gap of 8), over the keys up to the last
    spec = next(s for s in grid if s.variant == "dense")
    from attnlab import tasks

    maps = attention_maps(load_checkpoint(tmp_path / "runs" / spec.run_id).model, tasks.create("lookup", **spec.config.task_options))
    assert [tuple(m.shape) for m in maps] == [(8, 24), (8, 24)]  # not a 96 x 96 square


def test_the_curves_chart_names_each_setting(tmp_path, monkeypatch):
    """The finding: one unlabelled line per variant over runs of different budgets and sweep values."""
    import attnlab.arena.charts as charts

    hist = [{"step": 2, "val": 0.5, "loss": 1.0, "seconds": 1.0}]
    rows = [{"run_id": i, "task": "pos", "variant": "dense", "seed": 0, "status": "done", "history": hist} for i in ("a", "b")]
    seen = {}
    monkeypatch.setattr(charts, "_save", lambda fig, path: seen.setdefault("labels", [t.get_text() for t in
                                                                                    fig.axes[0].get_legend().get_texts()]))
    charts.plot_curves(rows, tmp_path / "c.png", {"a": "dense (steps=10)", "b": "dense (steps=20)"})
    assert seen["labels"] == ["dense (steps=10)", "dense (steps=20)"]


def test_a_missing_or_failed_level_leaves_the_mean_undefined_and_a_level_run_by_option_is_that_level():
    row = _board_rows()
    lv = [{"keys": 8, "repeats": 32}, {"keys": 32, "repeats": 8}]
    rows = [row(1, "lookup", "dense", 1.0, 0, lv[0]), row(2, "lookup", "dense", 0.9, 0, lv[1]),
            row(3, "lookup", "linear", 0.9, 0, lv[0])]  # linear's 32-key run never finished (Ctrl-C)
    board = leaderboard(rows)
    linear = next(e for e in board["tasks"]["lookup"] if e["variant"] == "linear")
    assert linear["value"] is None and "keys=32, repeats=8: no finished run" in linear["error"] and linear["speed"] is None
    # the same run planned by --task-option lookup.keys=32 --task-option lookup.repeats=8 is stored without a level: it is that level
    by_option = {**row(4, "lookup", "linear", 0.5, 0), "config": {"steps": 10, "task_options": {"keys": 32, "repeats": 8, "size": 8}}}
    linear = next(e for e in leaderboard([*rows, by_option])["tasks"]["lookup"] if e["variant"] == "linear")
    assert linear["value"] == pytest.approx(0.7) and [p["value"] for p in linear["levels"]] == [0.9, 0.5]


def test_a_sweep_s_range_over_levels_is_over_each_point_s_mean_over_the_levels():
    row = _board_rows()
    rows = []
    for i, (lr, keys, value) in enumerate([(1e-3, 8, 0.99), (1e-3, 32, 0.41), (3e-3, 8, 0.9), (3e-3, 32, 0.5)]):
        r = row(i, "lookup", "dense", value, 0, {"keys": keys})
        r["config"]["lr"], r["sweep"] = lr, {"lr": lr}
        rows.append(r)
    (e,) = leaderboard(rows)["tasks"]["lookup"]
    assert (e["sweep"]["low"], e["sweep"]["high"]) == (pytest.approx(0.7), pytest.approx(0.7))  # 0.70 and 0.70, not 0.41-0.99


def test_the_live_grid_shows_a_failed_level_as_failed():
    specs = [SimpleNamespace(run_id=f"r{k}", task="lookup", variant="dense", seed=0, config=SimpleNamespace(seconds=None), sweep={},
                             level={"keys": k}) for k in (8, 32)]
    grid = LiveGrid(specs, clock=lambda: 0.0)
    grid.on_event("end", specs[0], row={"status": "done", "value": 0.9, "metric": "accuracy"})
    grid.on_event("end", specs[1], row={"status": "failed", "value": None, "error": "boom"})
    assert grid.cell("lookup", "dense") == "[red]failed[/]"  # not "0.900 (1/2)", as if a run were still to come


def test_the_cost_measurement_always_has_its_fused_dense():
    grid = plan("quick", tasks=["lookup"], variants=["linear", "local"], seeds=[0])
    assert grid.cost["variants"] == ["dense", "linear", "local"]


def test_bad_cost_and_budget_input_is_refused_with_its_reason(tmp_path):
    from attnlab.arena.cost import cpu_name

    for bad, said in (({"variants": ["fast"]}, "unknown variant 'fast'"), ({"variants": ["dense"], "lengths": (0,)}, "length must be"),
                      ({"variants": ["dense"], "lengths": ()}, "at least one length")):
        with pytest.raises(ValueError, match=said):
            measure_cost(tmp_path, "lookup", **bad)
    assert not (tmp_path / "cost.json").exists()  # refused before anything was measured or written
    assert cpu_name().endswith(torch.backends.cpu.get_cpu_capability())  # the kernels the seconds were measured with
    # a budget given twice (the option and a swept budget field) would leave one of them silently unused
    with pytest.raises(ValueError, match="--sweep steps and a --budget-steps"):
        plan("quick", tasks=["text"], steps=10, sweep={"steps": [30]})
    with pytest.raises(ValueError, match="--sweep seconds and a --budget-seconds"):
        plan("quick", tasks=["text"], seconds=5.0, sweep={"seconds": [3.0]})


def test_the_cost_runs_on_the_device_the_grid_trained_on(tmp_path):
    """No store (or a grid on the CPU): the CPU, the table as before; a grid whose runs trained on
    CUDA: the cost follows it there, and a machine without CUDA refuses it rather than measuring
    the CPU instead; a device named outright wins."""
    from attnlab.arena.cost import grid_device, measure_one
    from attnlab.arena.store import Store
    from attnlab.devices import DeviceError

    small = {k: v for k, v in SMALL.items() if k != "length"}
    train = {k: TRAIN[k] for k in ("embed_dim", "num_heads")}
    assert grid_device(tmp_path) == "cpu"
    default = measure_one("lookup", "dense", 96, task_options=small, train=train)
    named = measure_one("lookup", "dense", 96, task_options=small, train=train, device="cpu")
    same = ("variant", "length", "params")  # the profiler's peak of a second call can differ by a lazy buffer: within 5 %
    assert {k: named[k] for k in same} == {k: default[k] for k in same} and abs(named["peak_bytes"] / default["peak_bytes"] - 1) < 0.05
    assert named["peak_bytes"] > 0 and set(named) == {"variant", "length", "seconds", "peak_bytes", "params"}
    Store(tmp_path / "results.sqlite").add({"run_id": "a", "task": "lookup", "variant": "dense", "seed": 0, "status": "failed",
                                            "config": {"device": "cuda"}, "error": "x"})
    assert grid_device(tmp_path) == "cuda"
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="no CUDA device"):
            measure_cost(tmp_path, "lookup", ["dense"], lengths=(96,), task_options=small, train=train)
    table = measure_cost(tmp_path, "lookup", ["dense"], lengths=(96,), task_options=small, train=train, reference=None, device="cpu")
    assert [r["variant"] for r in table["rows"]] == ["dense"] and "device" not in table and table["cpu"]
