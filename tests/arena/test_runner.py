"""The arena grid: deterministic plans, resumable runs, failures recorded, a SIGKILL survived."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from attnlab import tasks
from attnlab.arena import PRESETS, Preset, TaskSetting, attention_maps, plan, run_grid
from attnlab.arena.presets import LOOKUP_LEVELS, LOOKUP_STEPS, TEXT_STEPS
from attnlab.arena.store import Store
from attnlab.models import build_model
from attnlab.training import TrainConfig, model_config

TINY = Preset({"pos": TaskSetting({"size": 200}, {"steps": 40, "eval_every": 20, "embed_dim": 32, "num_layers": 1})},
              ("dense", "linformer"))


def test_plans_are_deterministic_and_checked(tmp_path):
    a, b = plan("quick"), plan("quick")
    quick = PRESETS["quick"]
    assert [s.run_id for s in a] == [s.run_id for s in b]
    assert len(a) == sum(len(t.variants or quick.variants) * len(t.seeds or (0,)) * max(1, len(t.levels)) for t in quick.tasks.values())
    text = [s for s in a if s.task == "text"]  # the real-text task: the baseline beside dense, step-budgeted
    assert {"dense", "none"} <= {s.variant for s in text} and all(s.config.seconds is None and s.config.steps == TEXT_STEPS for s in text)
    lookup = [s for s in a if s.task == "lookup"]  # the long task attention must solve: two seeds, causal, three levels, in steps
    assert {s.seed for s in lookup} == {0, 1} and all(s.config.seconds is None and s.config.steps == LOOKUP_STEPS
                                                      and (s.config.causal or s.variant == "none") for s in lookup)
    assert {json.dumps(s.level) for s in lookup} == {json.dumps(lv) for lv in LOOKUP_LEVELS}
    assert all(s.config.task_options == {"size": 512, **s.level} for s in lookup)  # the level's options are the run's
    assert len({s.run_id for s in a}) == len(a)
    two = plan("quick", tasks=["lookup"], variants=["dense"], seeds=[0, 1])
    assert [s.seed for s in two] == [0] * 3 + [1] * 3 and len({s.run_id for s in two}) == 6 and two[0].run_id == next(
        s.run_id for s in a if s.task == "lookup" and s.variant == "dense" and s.seed == 0)
    local = next(s for s in a if s.variant == "local" and s.task == "lookup")
    assert local.config.attention_options == {"window": 4} and local.config.causal  # typed field since issue 14
    with pytest.raises(ValueError, match="unknown variant 'fast'"):
        plan("quick", variants=["fast"])
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        plan("quick", tasks=["nope"])
    with pytest.raises(ValueError, match="unknown preset"):
        plan("huge")
    (tmp_path / "d.jsonl").write_text('{"text": "a b", "label": 0}\n')
    assert plan("quick", tasks=["jsonl"], variants=["dense"], data=str(tmp_path / "d.jsonl"))[0].config.task_options == {
        "path": str(tmp_path / "d.jsonl")}
    with pytest.raises(ValueError, match="cannot read .*none.jsonl"):  # the file's contents key its runs: read at planning
        plan("quick", tasks=["jsonl"], variants=["dense"], data=str(tmp_path / "none.jsonl"))


def test_precision_is_each_tasks_own_or_the_one_asked_for_and_old_run_ids_stay():
    import dataclasses
    import hashlib
    import json

    from attnlab.arena.planning import _run_id

    quick = plan("quick")
    assert {s.config.precision for s in quick} == {"fp32"}  # the default run: the same numbers on a CPU with or without native bf16
    assert {s.config.precision for s in plan("quick", precision="bf16")} == {"bf16"}
    with pytest.raises(ValueError, match="precision must be one of"):
        plan("quick", precision="fp8")
    cfg = TrainConfig.for_task("pos", steps=10)  # at the values every run had before the fields existed: the id it had then
    fields = dataclasses.asdict(cfg)
    for later in ("seconds", "precision", "compile", "pretrain_steps", "pretrain_share"):
        del fields[later]
    for old, new in (("dim", "embed_dim"), ("heads", "num_heads"), ("layers", "num_layers")):  # the names the sizes had then
        fields[old] = fields.pop(new)
    assert _run_id(cfg) == hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
    assert _run_id(dataclasses.replace(cfg, precision="bf16")) != _run_id(cfg)
    assert _run_id(dataclasses.replace(cfg, pretrain_steps=5)) != _run_id(cfg)


def test_the_none_variant_is_each_tasks_model_without_attention():
    specs = plan("quick", tasks=["recall", "digits", "speech"], variants=["dense", "none"])
    none = {s.task: s.config for s in specs if s.variant == "none"}
    assert none["recall"].model == "mlp" and none["digits"].model == "cnn" and "speech" not in none  # speech has none: skipped
    assert none["recall"].steps == next(s.config.steps for s in specs if s.task == "recall" and s.variant == "dense")


def test_a_time_budgeted_plan_gives_every_variant_the_same_seconds_and_its_own_ids():
    from attnlab.training.config import TIME_BUDGET_STEPS

    steps = plan(TINY)
    timed = plan(TINY, seconds=20)
    assert all(s.config.seconds == 20.0 and s.config.steps == TIME_BUDGET_STEPS and s.config.patience is None for s in timed)
    assert {s.run_id for s in timed}.isdisjoint(s.run_id for s in steps)
    assert all(s.config.seconds is None and s.config.steps == 40 for s in steps)
    assert plan(TINY, seconds=20)[0].run_id == timed[0].run_id


def _model(attention, **opts):
    task = tasks.create("pos", size=64)
    torch.manual_seed(0)
    cfg = TrainConfig.for_task("pos", attention=attention, **({"model_options": {"attention_options": opts}} if opts else {}))
    return build_model(model_config(cfg, task)).double().eval(), task


def _check_map_is_the_first_layers_weights(attention):
    """The first test example's map of ``attention``'s model equals its first layer's weights (mean over heads)."""
    model, task = _model(attention)
    maps = attention_maps(model, task, count=1)
    toks = task.split("test").tokens[:1]
    toks = toks[:, : int((toks != 0).sum())]
    with torch.no_grad():
        weights = model(toks, return_weights=True).weights
    torch.testing.assert_close(maps[0], weights[0][0].mean(0).float(), rtol=1e-5, atol=1e-6)
    return task


def test_effective_map_of_dense_is_its_weights_and_local_is_a_band():
    _check_map_is_the_first_layers_weights("dense")
    model, task = _model("local", window=1)
    band = attention_maps(model, task, count=1)[0]
    n = band.shape[0]
    far = torch.ones(n, n, dtype=torch.bool).triu(2) | torch.ones(n, n, dtype=torch.bool).tril(-2)
    assert bool((band[far] == 0).all()) and torch.allclose(band.sum(-1), torch.ones(n))


def test_a_mixer_that_forms_scores_maps_its_weights_and_a_gated_one_has_none():
    task = _check_map_is_the_first_layers_weights("fox")  # a mixer: its weights from the whole layer's call in the model
    assert attention_maps(_model("gated_deltanet")[0], task, count=1) == []


def test_grid_stores_each_run_once_and_skips_it_next_time(tmp_path):
    specs = plan(TINY, seeds=[0])
    events = []
    store = run_grid(specs, tmp_path, on_event=lambda kind, spec, **i: events.append((kind, spec.variant)))
    rows = {r["variant"]: r for r in store.rows()}
    assert rows["dense"]["status"] == "done" and rows["dense"]["steps"] == 40 and rows["dense"]["peak_bytes"] > 0
    assert rows["dense"]["params"] > 0 and rows["dense"]["steps_per_second"] > 0
    assert (tmp_path / "runs" / rows["dense"]["run_id"] / "attention.safetensors").exists()
    assert ("start", "dense") in events and ("end", "linformer") in events
    events.clear()
    run_grid(specs, tmp_path, on_event=lambda kind, spec, **i: events.append((kind, spec.variant)))
    assert events == [("skip", "dense"), ("skip", "linformer")] and len(store.rows()) == 2


def test_a_variant_without_a_causal_form_is_named_in_the_plan_with_its_reason(tmp_path):
    pre = Preset({"recall": TaskSetting({"size": 100, "pairs": 2, "queries": 2, "num_keys": 8, "num_values": 8}, {"steps": 5})},
                 ("nystrom",))
    assert plan(pre) == []  # a preset plans a variant only where its capabilities fit; asked for by name, the plan says why not
    asked = plan(pre, variants=["nystrom", "dense"])
    assert [s.variant for s in asked] == ["dense"]
    assert asked.notes == ["recall / nystrom left out: nystrom has no causal form and recall is trained causally"]
    run_grid(asked, tmp_path)
    from attnlab.arena.report import plan_notes

    assert plan_notes(tmp_path) == asked.notes  # kept for the report


_KILLABLE = """
import json, sys
from attnlab.arena import Preset, TaskSetting, plan, run_grid
task, options, train = json.loads(sys.argv[2])
run_grid(plan(Preset({task: TaskSetting(options, train)}, ("dense", "linear"))), sys.argv[1])
"""

GRIDS = {
    "pos": ({"size": 400}, {"steps": 500, "eval_every": 10, "embed_dim": 32, "num_layers": 1, "patience": 10**6}),
    # a long task: 1024-byte windows of real text
    "text": ({"size": 48, "length": 1024}, {"steps": 50, "eval_every": 10, "embed_dim": 16, "num_heads": 2, "num_layers": 1,
                                              "batch_size": 4, "patience": 10**6}),
}


@pytest.mark.slow
@pytest.mark.parametrize("task", GRIDS)
def test_sigkill_mid_run_then_rerun_resumes(tmp_path, task):
    import json

    out = tmp_path / "arena"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    options, train = GRIDS[task]
    proc = subprocess.Popen([sys.executable, "-c", _KILLABLE, str(out), json.dumps([task, options, train])], env=env)
    specs = plan(Preset({task: TaskSetting(options, train)}, ("dense", "linear")))
    total = train["steps"]
    second = out / "runs" / specs[1].run_id / "checkpoint" / "config.json"
    deadline = time.time() + 240
    try:
        while time.time() < deadline and not second.exists():  # the first run is stored, the second has a checkpoint
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert second.exists(), "the grid did not reach its second run in time"
    store = Store(out / "results.sqlite")
    assert [r["variant"] for r in store.rows()] == ["dense"]
    killed_at = json.loads(second.read_text())["step"]
    assert 0 < killed_at < total
    events = []
    run_grid(specs, out, on_event=lambda kind, spec, **i: events.append(kind))
    assert events[0] == "skip" and "start" in events
    rows = store.rows()
    assert sorted(r["variant"] for r in rows) == ["dense", "linear"] and all(r["status"] == "done" for r in rows)
    meta = json.loads(second.read_text())
    assert meta["step"] == total and meta["resumes"] == [killed_at]  # continued from the checkpoint, not from step 0
    assert not list((out / "runs" / specs[1].run_id).glob("checkpoint.tmp-*"))


@pytest.mark.slow
def test_worker_processes_run_the_grid_and_the_main_process_stores_it(tmp_path):
    events = []
    store = run_grid(plan(TINY), tmp_path, workers=2, on_event=lambda kind, spec, **i: events.append((kind, spec.variant)))
    rows = store.rows()
    assert sorted(r["variant"] for r in rows) == ["dense", "linformer"] and all(r["status"] == "done" for r in rows)
    serial = run_grid(plan(TINY), tmp_path / "serial")
    by = {r["variant"]: r["value"] for r in serial.rows()}
    assert {r["variant"]: r["value"] for r in rows} == by  # same runs, same results, whichever process ran them
    assert sorted(k for k, _ in events) == ["end", "end", "start", "start"]
