"""Writes the training checkpoints of tests/training/test_checkpoints_v2.py, each with what the code
that wrote it computed from it (expected.json beside the runs):

- ``before-step/``: written by the code before the attention step became an object the layer
  holds (commit e70159d), one run of every variant whose layer's keys moved under ``step.``
  then (and exact attention with a learnable score): trained 2 steps, with ``attnlab eval``'s
  test score, the logits of the first test examples, the parameters' order (the optimizer's)
  and the losses of a resume to 4 steps.
- ``with-step/``: written by the code after that change (0b51d2e), one run of every registered
  variant: the best weights and config.json (what ``attnlab eval`` reads), its score and logits.
- ``before-mixers/``: the same, written by the code before the gated family became sequence
  mixers (with the device in config.json), so that the redesign must load what it wrote.
- ``before-mixers-resume/``: written by that code too (commit 709a633), a run of a few of those
  mixers (:data:`RESUMED`) as ``before-step/`` holds them: trained 2 steps with the optimizer's
  state, the parameters' order then (the layer's ``step.*`` names) and the losses of a resume
  to 4 steps, so that the redesign must resume what it wrote.

Run from the repository root, with the same environment:

    git worktree add /tmp/old e70159d
    PYTHONPATH=/tmp/old/src python tests/data/checkpoints-v2/make.py before-step
    git worktree remove --force /tmp/old
    git worktree add /tmp/premixer 709a633
    PYTHONPATH=/tmp/premixer/src python tests/data/checkpoints-v2/make.py before-mixers-resume
    git worktree remove --force /tmp/premixer
    python tests/data/checkpoints-v2/make.py with-step|before-mixers [VARIANT ...]

Naming variants (a variant added since) writes theirs alone and keeps the other runs.
"""

import dataclasses
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from typer.testing import CliRunner

import attnlab
from attnlab import efficient, objectives, tasks
from attnlab.cli import app
from attnlab.layers.multihead import MultiHeadAttention
from attnlab.training import TrainConfig, load_checkpoint, train

HERE = Path(__file__).resolve().parent
LAYER_KEYS = ("q_proj.", "k_proj.", "v_proj.", "out_proj.", "head_q", "head_k", "head_v", "positional.", "step.")
SMALL = {"ff_dim": 16}  # a narrow feed-forward layer: the fixture stays small
EXTRA = {"dense-additive": ("dense", {"score": "additive"})}  # a learnable score: the step's, at the layer's top level before
RESUMED = ("gated_deltanet", "mamba2", "deltaproduct", "fox")  # a delta rule, an SSM, a composed scan, a softmax: mixers today


def config(attention: str, model_options: dict, steps: int) -> TrainConfig:
    return TrainConfig.for_task("listops", task_options={"size": 32, "max_length": 16}, attention=attention,
                                model_options={**SMALL, **model_options},
                                steps=steps, eval_every=1, embed_dim=16, num_heads=2, num_layers=1, warmup=1, batch_size=8)


def moved(model) -> bool:
    """Whether an attention layer of ``model`` holds keys that are not the layer's own (a step's, before)."""
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    return any(not k.startswith(LAYER_KEYS) for layer in layers for k in layer.state_dict())


def computed(folder: Path) -> dict:
    """``attnlab eval FOLDER --json``'s score, and the logits of the first 4 test examples."""
    res = CliRunner().invoke(app, ["eval", str(folder), "--json"])
    assert res.exit_code == 0, res.output
    ck = load_checkpoint(folder)
    task = tasks.create(ck.config.task, **ck.config.task_options)
    inputs, _ = objectives.collate(task, task.split("test"), torch.arange(4))
    torch.manual_seed(0)  # what a variant draws at each call (reformer's rotations)
    with torch.no_grad():
        logits = ck.model.eval()(**inputs).output
        torch.manual_seed(0)
        in_float64 = ck.model.double()(**inputs).output  # the anchor of a redesign: equal within 1e-12
    return {"attention": ck.config.attention, "model_options": ck.config.model_options, "value": json.loads(res.stdout)["value"],
            "logits": logits.tolist(), "logits_float64": in_float64.tolist()}


def before_step(out: Path) -> dict:
    runs = {}
    for case, (name, options) in {**{n: (n, {}) for n in efficient.names()}, **EXTRA}.items():
        cfg = config(name, options, steps=2)
        train(cfg, out / case)
        ck = load_checkpoint(out / case)
        if not moved(ck.model):
            shutil.rmtree(out / case)
            continue
        runs[case] = resumed(out / case, cfg)
        print(case, runs[case]["value"])
    return {"code": "e70159d", "registered": efficient.names(), "runs": runs}


def resumed(folder: Path, cfg: TrainConfig) -> dict:
    """What :func:`computed` gives of the run of 2 steps in ``folder``, its parameters' names in the
    order the model lists them (the optimizer's) and the losses of a resume to 4 steps."""
    ck = load_checkpoint(folder)
    run = {**computed(folder), "parameters": [k for k, _ in ck.model.named_parameters()]}
    with tempfile.TemporaryDirectory() as tmp:  # the resume the old code made of it
        shutil.copytree(folder, Path(tmp) / folder.name)
        train(dataclasses.replace(cfg, steps=4), Path(tmp) / folder.name, resume=True)
        run["resumed_losses"] = load_checkpoint(Path(tmp) / folder.name).meta["losses"][2:]
    return run


def before_mixers_resume(out: Path) -> dict:
    runs = {}
    for name in RESUMED:
        cfg = config(name, {}, steps=2)
        train(cfg, out / name)
        runs[name] = resumed(out / name, cfg)
        print(name, runs[name]["value"])
    source = Path(attnlab.__file__).parent  # the code that wrote them (PYTHONPATH's checkout)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=source).stdout.strip()
    return {"code": head, "registered": efficient.names(), "runs": runs}


def with_step(out: Path, names: list[str]) -> dict:
    runs = json.loads((out / "expected.json").read_text())["runs"] if names else {}
    for name in names or efficient.names():
        shutil.rmtree(out / name, ignore_errors=True)
        train(config(name, {}, steps=2), out / name)
        for f in ("model.safetensors", "state.pt"):  # eval reads neither: the fixture stays small
            (out / name / "checkpoint" / f).unlink()
        runs[name] = computed(out / name)
        print(name, runs[name]["value"])
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout.strip()
    return {"code": f"{head} and the working tree", "registered": efficient.names(), "runs": dict(sorted(runs.items()))}


def main():
    which, names = sys.argv[1], sys.argv[2:]
    out = HERE / which
    if which in ("before-step", "before-mixers-resume"):
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        expected = before_step(out) if which == "before-step" else before_mixers_resume(out)
    else:
        if not names:
            shutil.rmtree(out, ignore_errors=True)
        out.mkdir(exist_ok=True)
        expected = with_step(out, names)
    expected["torch"] = torch.__version__
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main()
