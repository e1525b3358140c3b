"""Every variant's training checkpoint loads, scores and resumes, in each layout it was written in:
before the layer held its attention step (the step's keys at the layer's top level, the
optimizer's state in the parameters' order of then), after it (``attn.step.*``), and before the
gated family, DeltaProduct and FoX became sequence mixers (the layer's step held the mixer's
parameters: ``attn.step.*`` then, ``attn.*`` today; their logits also in float64, to 1e-12: the
anchor of that redesign; and a few with the optimizer's state, resumed as that code resumed them).

tests/data/checkpoints-v2/ was written with make.py beside it (its docstring says how): each run
with the test score ``attnlab eval`` gave (compared float for float: a count of right answers),
the logits of the first test examples and, for the runs with the optimizer's state
(``before-step/``, ``before-mixers-resume/``), the order of the parameters and the losses of a
resume to 4 steps (both compared to float32 rounding, as in test_checkpoint_compat: another CPU's
kernels round differently).
"""

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnlab import efficient, objectives, tasks
from attnlab.cli import app
from attnlab.layers.migration import parameters_before_step, parameters_with_step
from attnlab.layers.mixer import SequenceMixer
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.models import build_model
from attnlab.training import CheckpointError, evaluate, load_checkpoint, train
from tests.cli.helpers import runner

DATA = Path(__file__).resolve().parent.parent / "data" / "checkpoints-v2"
WRITTEN = ("before-step", "with-step", "before-mixers", "before-mixers-resume")
EXPECTED = {w: json.loads((DATA / w / "expected.json").read_text()) for w in WRITTEN}
BEFORE = EXPECTED["before-step"]["runs"]
RESUMED = EXPECTED["before-mixers-resume"]["runs"]
RUNS = [(w, case) for w, e in EXPECTED.items() for case in e["runs"]]
MIXER_KEYS_THEN = (("step.scan.", ""), ("step.score.", "attention.score."), ("score.", "attention.score."), ("step.", ""))
"""A mixer's keys of then, as today's mixer names them: its parameters were its layer's step's
(``step.*``; DeltaProduct's under the scan it held, ``step.scan.*``), FoX's score its exact
attention's (``step.score.*``, before the step ``score.*``)."""


def _moved(written: str, case: str) -> bool:
    """Whether the run ``case`` written in the layout ``written`` holds keys today's model names otherwise:
    a step's written before the layer held it, a mixer's written while a layer held it as its step (a
    variant added since has its run of ``with-step/`` written by today's code: make.py with-step NAME)."""
    name = EXPECTED[written]["runs"][case]["attention"]
    mixer = efficient.capabilities(name).mixer
    if written == "before-step":
        return not mixer
    return mixer and name in EXPECTED["before-mixers"]["registered"]


def _today(key: str, model) -> str:
    """A key written in an earlier layout, as today's model names it (make.py's layouts mirrored,
    not the model's load hooks: those are what is tested)."""
    state = model.state_dict()
    if key in state:
        return key
    for name, layer in model.named_modules():
        rest = key[len(name) + 1:]
        if not key.startswith(name + "."):
            continue
        if isinstance(layer, MultiHeadAttention) and f"{name}.step.{rest}" in state:  # a step's, before the layer held it
            return f"{name}.step.{rest}"
        if isinstance(layer, SequenceMixer):
            for old, new in MIXER_KEYS_THEN:
                if rest.startswith(old) and f"{name}.{new}{rest[len(old):]}" in state:
                    return f"{name}.{new}{rest[len(old):]}"
    return key


@pytest.mark.parametrize("written, case", RUNS)
def test_eval_gives_the_score_the_code_that_wrote_the_run_gave(written, case):
    res = runner.invoke(app, ["eval", str(DATA / written / case), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["value"] == EXPECTED[written]["runs"][case]["value"]


@pytest.mark.parametrize("written, case", RUNS)
def test_the_weights_load_whole_and_predict_the_same(written, case):
    folder = DATA / written / case
    ck = load_checkpoint(folder)
    file = load_file(str(folder / "checkpoint" / "best.safetensors"))
    build_model(ck.model_config).load_state_dict(file, strict=True)  # the layer's hook maps every key: none missing, none left
    state = ck.model.state_dict()
    mapped = {_today(k, ck.model): v for k, v in file.items()}
    assert len(mapped) == len(file) and mapped.keys() == state.keys() and all(torch.equal(v, state[k]) for k, v in mapped.items())
    assert (set(file) != set(state)) == _moved(written, case)  # a run whose keys moved since holds the keys of then
    task = tasks.create(ck.config.task, **ck.config.task_options)
    inputs, _ = objectives.collate(task, task.split("test"), torch.arange(4))
    torch.manual_seed(0)  # as make.py: what a variant draws at each call (reformer's rotations)
    with torch.no_grad():
        logits = ck.model.eval()(**inputs).output
    torch.testing.assert_close(logits, torch.tensor(EXPECTED[written]["runs"][case]["logits"]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", EXPECTED["before-mixers"]["runs"])
def test_a_run_of_before_the_mixers_computes_the_same_in_float64(case):
    ck = load_checkpoint(DATA / "before-mixers" / case)
    task = tasks.create(ck.config.task, **ck.config.task_options)
    inputs, _ = objectives.collate(task, task.split("test"), torch.arange(4))
    torch.manual_seed(0)  # as make.py
    with torch.no_grad():
        logits = ck.model.double().eval()(**inputs).output
    expected = torch.tensor(EXPECTED["before-mixers"]["runs"][case]["logits_float64"], dtype=torch.float64)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("case", BEFORE)
def test_a_run_of_before_resumes_as_it_did_then(case, tmp_path):
    shutil.copytree(DATA / "before-step" / case, tmp_path / case)
    ck = load_checkpoint(tmp_path / case, weights="last", with_state=True)
    assert parameters_before_step(ck.model) == [_today(k, ck.model) for k in BEFORE[case]["parameters"]]  # the optimizer's order then
    result = train(dataclasses.replace(ck.config, steps=4), tmp_path / case, resume=True)
    assert (result.steps, result.steps_run) == (4, 2)
    losses = load_checkpoint(tmp_path / case).meta["losses"][2:]  # the second one after a step of the resumed optimizer
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(BEFORE[case]["resumed_losses"]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", RESUMED)
def test_a_run_of_before_the_mixers_resumes_as_it_did_then(case, tmp_path):
    shutil.copytree(DATA / "before-mixers-resume" / case, tmp_path / case)
    ck = load_checkpoint(tmp_path / case, weights="last", with_state=True)
    then = [_today(k, ck.model) for k in RESUMED[case]["parameters"]]
    assert parameters_with_step(ck.model) == then  # the optimizer's order then
    assert (then != [k for k, _ in ck.model.named_parameters()]) == (case != "fox")  # reordered: FoX listed its own last then too
    result = train(dataclasses.replace(ck.config, steps=4), tmp_path / case, resume=True)
    assert (result.steps, result.steps_run) == (4, 2)
    losses = load_checkpoint(tmp_path / case).meta["losses"][2:]  # the second one after a step of the resumed optimizer
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(RESUMED[case]["resumed_losses"]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("written", ["before-step", "before-mixers-resume"])
def test_a_run_of_before_resumes_from_the_command_line(written, tmp_path):
    shutil.copytree(DATA / written / "mamba2", tmp_path / "run")
    res = runner.invoke(app, ["train", "listops", "--out", str(tmp_path / "run"), "--resume", "--steps", "3"])
    assert res.exit_code == 0, res.output
    assert "after 3 steps" in " ".join(res.stdout.split()) and load_checkpoint(tmp_path / "run").meta["step"] == 3


def test_every_variant_has_a_run_and_every_moved_one_a_run_of_before():
    assert sorted(EXPECTED["with-step"]["runs"]) == sorted(efficient.names()), "a variant with no run: make.py with-step NAME"
    mixers, then_mixers = set(efficient.select(mixer=True)), EXPECTED["before-mixers"]["registered"]
    assert sorted(EXPECTED["before-mixers"]["runs"]) == sorted(then_mixers)  # every variant then: each mixer of today as a step
    assert set(RESUMED) <= mixers & set(then_mixers)
    then = set(EXPECTED["before-step"]["registered"])
    moved, held = set(), set()  # the variants whose keys moved under the layer's step.; those whose step holds keys today
    for name in then & set(efficient.names()):
        if any(".step." in k for k in load_file(str(DATA / "with-step" / name / "checkpoint" / "best.safetensors"))):
            moved.add(name)
        if any(".step." in k for k in load_checkpoint(DATA / "with-step" / name).model.state_dict()):
            held.add(name)
    assert moved == {r["attention"] for r in BEFORE.values() if "score" not in r["model_options"]}
    assert held == moved - mixers  # the mixers' keys left the step again: their runs of before-step hold today's


def _damaged(tmp_path, edit) -> Path:
    shutil.copytree(DATA / "before-mixers-resume" / "fox", tmp_path / "run")  # keys of then: attn.step.fgate_proj.*
    for name in ("best.safetensors", "model.safetensors"):
        f = tmp_path / "run" / "checkpoint" / name
        tensors = load_file(str(f))
        edit(tensors)
        save_file(tensors, str(f))
    return tmp_path / "run"


def test_a_tensor_removed_or_renamed_is_named(tmp_path):
    def edit(t):
        t["backbone.encoder.layers.0.attn.forget.weight"] = t.pop("backbone.encoder.layers.0.attn.step.fgate_proj.weight")
        del t["head.bias"]

    run = _damaged(tmp_path, edit)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(run)
    said = str(e.value)
    assert "does not hold the weights of the model its config.json describes" in said
    assert "2 tensors of the model missing: " in said and "attn.fgate_proj.weight" in said and "head.bias" in said
    assert "attn.step.fgate_proj" not in said  # named as today's model names it (its bias, of then, loaded)
    assert "1 tensor the model does not have: backbone.encoder.layers.0.attn.forget.weight" in said
    res = runner.invoke(app, ["eval", str(run)])
    assert res.exit_code == 1 and "head.bias" in res.output  # a damaged checkpoint: run time


def test_a_tensor_of_another_shape_is_named(tmp_path):
    run = _damaged(tmp_path, lambda t: t.update({"head.weight": t["head.weight"][:3]}))
    with pytest.raises(CheckpointError, match=r"1 tensor of another shape: head\.weight \(3, 16\) in the file, \(10, 16\) in the model"):
        load_checkpoint(run)


def test_an_optimizer_state_of_other_parameters_is_refused(tmp_path):
    shutil.copytree(DATA / "before-step" / "mamba2", tmp_path / "run")
    f = tmp_path / "run" / "checkpoint" / "state.pt"
    state = torch.load(f, weights_only=True)
    opt = state["optimizer"]
    opt["state"][0], opt["state"][3] = opt["state"][3], opt["state"][0]  # two parameters of other shapes swapped
    torch.save(state, f)
    with pytest.raises(CheckpointError, match="the optimizer's state does not match the model's parameters"):
        load_checkpoint(tmp_path / "run", weights="last", with_state=True)


def test_eval_of_a_variant_that_draws_at_each_call_is_the_same_in_any_process():
    values = []
    for seed in range(4):  # the generator as another process would leave it
        torch.manual_seed(seed)
        before = torch.get_rng_state()
        values.append(evaluate(DATA / "with-step" / "reformer").value)
        assert torch.equal(torch.get_rng_state(), before)  # the caller's generator left as it was
    assert values == [EXPECTED["with-step"]["runs"]["reformer"]["value"]] * 4


def test_train_s_test_score_is_eval_s_for_a_variant_that_draws_at_each_call(tmp_path):
    from attnlab.training import TrainConfig

    for seed in (0, 1):
        cfg = TrainConfig.for_task("listops", task_options={"size": 32, "max_length": 16}, attention="reformer", steps=2, eval_every=2,
                                   embed_dim=16, num_heads=2, num_layers=1, warmup=1, batch_size=8, seed=seed)
        torch.manual_seed(100 + seed)  # whatever the caller's generator holds
        result = train(cfg, tmp_path / str(seed))
        assert result.value == evaluate(tmp_path / str(seed)).value
