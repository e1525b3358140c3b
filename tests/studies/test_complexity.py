"""The measured columns of the CNN / RNN / self-attention comparison agree with the textbook."""

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from attnlab import recurrent
from attnlab.cli import app
from attnlab.studies.complexity import FIT_SIZES, TEXTBOOK, exponents, fit_ranges, path_length, run, sequential_steps
from attnlab.studies.distance import TriggerTask

K = 3


@pytest.mark.parametrize("n", [16, 64])
def test_path_lengths_match_the_textbook(n):
    assert path_length("cnn", n) == math.ceil((n - 1) / (K - 1))  # causal kernel 3: k - 1 positions per layer
    assert path_length("rnn", n) == n - 1
    assert path_length("lstm", n) == n - 1
    assert path_length("self_attention", n) == 1
    # the tape puts every earlier state one hand-over away
    assert path_length("attention_rnn", n) == 1
    assert path_length("lstmn", n) == 1


def test_a_centred_cnn_moves_half_as_far_per_layer():
    from attnlab.studies import complexity

    n = 17
    layer = lambda depth: recurrent.create("cnn", 8, num_layers=depth, kernel_size=3).double()  # noqa: E731
    x = torch.randn(1, n, 8, dtype=torch.float64, requires_grad=True)

    def reaches(depth):
        torch.manual_seed(0)
        (g,) = torch.autograd.grad(layer(depth)(x)[0, n - 1].sum(), x)
        return bool(g[0, 0].abs().max() > 0)

    assert complexity._first_true(reaches, 1, n) == n - 1  # one position per layer each way


def test_sequential_steps_grow_with_n_only_for_recurrent_layers():
    steps = {}
    for name in ("cnn", "self_attention", "rnn", "lstm", "attention_rnn", "lstmn"):
        layer = recurrent.create(name, 16, **({"causal": True} if name == "cnn" else {})).eval()
        steps[name] = [sequential_steps(layer, torch.randn(1, n, 16)) for n in (8, 32)]
    for name in ("cnn", "self_attention"):
        assert steps[name][0] == steps[name][1], name
    for name in ("rnn", "lstm", "attention_rnn", "lstmn"):
        small, large = steps[name]
        assert large >= 3.5 * small, name  # about 4x the chain for 4x the positions


def test_run_records_and_exponents():
    recs = run([32, 64], ["cnn", "rnn"], embed_dim=8, path_sizes=(16,), min_repeats=1, target_seconds=0.01)
    assert [(r.layer, r.n) for r in recs] == [("cnn", 16), ("rnn", 16), ("cnn", 32), ("rnn", 32), ("cnn", 64), ("rnn", 64)]
    at16 = {r.layer: r for r in recs if r.n == 16}
    assert at16["cnn"].seconds is None and at16["cnn"].path_length == 8 and at16["rnn"].path_length == 15
    assert all(r.seconds > 0 and r.path_length is None for r in recs if r.n != 16)
    e = exponents(recs, fit_from=32)
    assert set(e) == {"cnn", "rnn"} and all(isinstance(v, float) for v in e.values())
    fake = [{"layer": "x", "n": n, "seconds": 1e-6 * n**2} for n in (1024, 2048, 4096)]
    assert exponents(fake)["x"] == pytest.approx(2.0)
    assert set(TEXTBOOK) == {"cnn", "rnn", "lstm", "self_attention", "attention_rnn", "lstmn"}


def test_each_layer_is_fitted_where_its_leading_term_dominates():
    # a CNN-like layer: a fixed cost of 1 ms up to 8K positions, linear work beyond it
    cnn = [{"layer": "cnn", "n": n, "seconds": max(8e-4, 1e-7 * n)} for n in (1024, 2048, 4096, *FIT_SIZES["cnn"])]
    assert exponents(cnn, fit_from=1024)["cnn"] < 0.8  # the old fit over everything from 1024
    assert exponents(cnn)["cnn"] == pytest.approx(1.0)
    assert fit_ranges(cnn) == {"cnn": (8192, 262144)}
    sa = [{"layer": "self_attention", "n": n, "seconds": 1e-9 * n**2 + 1e-7 * n} for n in (1024, 2048, *FIT_SIZES["self_attention"])]
    assert exponents(sa)["self_attention"] == pytest.approx(2.0, abs=0.05) and fit_ranges(sa)["self_attention"] == (4096, 32768)
    assert set(FIT_SIZES) == set(TEXTBOOK)


def test_fit_sizes_time_only_the_layer_they_belong_to():
    recs = run([32], ["cnn", "rnn"], embed_dim=8, path_sizes=(), min_repeats=1, target_seconds=0.01, fit_sizes={"cnn": (64, 128)})
    assert [(r.layer, r.n) for r in recs] == [("cnn", 32), ("rnn", 32), ("cnn", 64), ("cnn", 128)]
    assert all(r.seconds > 0 for r in recs)  # each layer timed in its own process
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        run([32], ["cnn"], rounds=0)


def test_complexity_cli_json_and_files(tmp_path):
    res = CliRunner().invoke(
        app, ["complexity", "--sizes", "32,64", "--layers", "cnn,self_attention", "--path-sizes", "16", "--embed-dim", "8", "--json",
              "--no-fit", "-o", str(tmp_path)]
    )
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]
    per_n = [r for r in lines if "n" in r]
    per_layer = [r for r in lines if "exponent" in r]
    assert {(r["layer"], r["n"]) for r in per_n} == {(layer, n) for layer in ("cnn", "self_attention") for n in (16, 32, 64)}
    assert all(set(r) == {"layer", "n", "seconds", "sequential_steps", "path_length"} for r in per_n)
    assert {r["layer"] for r in per_layer} == {"cnn", "self_attention"}
    assert all(r["fit_range"] is None and r["exponent"] is None for r in per_layer)  # nothing timed in their ranges or from 1024
    assert (tmp_path / "complexity.png").stat().st_size > 0
    stored = json.loads((tmp_path / "complexity.json").read_text())
    assert len(stored["records"]) == 6


def test_complexity_cli_times_the_fit_ranges_only_without_own_sizes(monkeypatch):
    """A user's own --sizes are not followed by the fit ranges (up to 256K) unless --fit asks, and the command says so;
    a layer left without an exponent gets a sentence saying why."""
    import attnlab.studies.complexity as study

    asked = []

    def fake_run(sizes, layers, *, fit_sizes, on_record, **kwargs):
        asked.append((list(sizes), fit_sizes))
        recs = [study.ComplexityRecord(layer, n, 1e-3, 3, None) for n in sizes for layer in layers]
        for r in recs:
            on_record(r)
        return recs

    monkeypatch.setattr(study, "run", fake_run)
    res = CliRunner().invoke(app, ["complexity", "--sizes", "64,128", "--layers", "cnn", "--path-sizes", ""])
    assert res.exit_code == 0, res.output
    assert asked.pop() == ([64, 128], None)
    assert "--sizes given: the fit ranges (CNN 8K-256K" in res.stderr and "add --fit to time them too" in res.stderr
    assert "no time exponent (·) for cnn: fewer than two lengths timed in the layer's fit range" in " ".join(res.stdout.split())
    res = CliRunner().invoke(app, ["complexity", "--sizes", "64,128", "--layers", "cnn", "--path-sizes", "", "--fit"])
    assert res.exit_code == 0 and asked.pop() == ([64, 128], FIT_SIZES) and "not timed" not in res.output
    res = CliRunner().invoke(app, ["complexity", "--layers", "cnn", "--path-sizes", ""])
    assert res.exit_code == 0 and asked.pop() == ([64, 128, 256, 512, 1024, 2048, 4096, 8192], FIT_SIZES) and "not timed" not in res.output


def test_complexity_cli_rejects_unknown_layers():
    res = CliRunner().invoke(app, ["complexity", "--layers", "gru"])
    assert res.exit_code == 2
    assert "unknown --layers ['gru']" in " ".join(res.output.split())


def test_trigger_task_labels_the_query_with_the_trigger():
    task = TriggerTask(6)
    tokens, labels = task.batch(64, torch.Generator().manual_seed(0))
    assert tokens.shape == labels.shape == (64, 7)
    assert torch.equal(labels[:, -1], tokens[:, 0])
    assert (tokens[:, 0] < task.classes).all() and (tokens[:, -1] == task.query_token).all()
    middle = tokens[:, 1:-1]
    assert ((middle >= task.classes) & (middle < task.query_token)).all()
    assert (labels[:, :-1] == task.classes).all()
    with pytest.raises(ValueError, match="distance must be a positive int"):
        TriggerTask(0)


def test_distance_cli_trains_scores_and_plots(tmp_path):
    png = tmp_path / "d.png"
    res = CliRunner().invoke(
        app,
        ["bench", "distance", "--distances", "3", "--layers", "rnn,self_attention", "--steps", "2", "--seeds", "0,1",
         "--json", "--plot", str(png)],
    )
    assert res.exit_code == 0, res.output
    recs = json.loads(res.stdout)["records"]
    assert {(r["layer"], r["seed"]) for r in recs} == {(layer, s) for layer in ("rnn", "self_attention") for s in (0, 1)}
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["steps"] == 2 for r in recs)
    assert png.stat().st_size > 0
    stored = tmp_path / "d.json"
    stored.write_text(json.dumps({"records": recs}))
    res = CliRunner().invoke(app, ["bench", "distance", "--from", str(stored)])
    assert res.exit_code == 0, res.output
    assert "self_attention" in res.output and "distance 3" in res.output
    res = CliRunner().invoke(app, ["bench", "distance", "--from", str(tmp_path / "nope.json")])
    assert res.exit_code == 1 and "not a records file" in " ".join(res.output.split())  # a missing file: run time
    res = CliRunner().invoke(app, ["bench", "distance", "--layers", "gru"])
    assert res.exit_code == 2 and "unknown --layers ['gru']" in " ".join(res.output.split())


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_timing_process_is_told_the_device_and_the_steps_stay_on_the_cpu(monkeypatch, device):
    """The forward times come from a process on ``device``; the sequential steps are traced here on
    the CPU, the same whatever the device."""
    import attnlab.studies.complexity as complexity

    specs = []

    def child(module, spec, what, env=None):
        specs.append(spec)
        return {str(n): 0.5 for n in spec["sizes"]}

    monkeypatch.setattr(complexity, "measure_in_child", child)
    recs = run([8, 16], ("rnn",), path_sizes=(), **({} if device == "cpu" else {"device": device}))
    assert [s["device"] for s in specs] == [device]
    assert [(r.n, r.seconds) for r in recs] == [(8, 0.5), (16, 0.5)]
    assert recs[1].sequential_steps > recs[0].sequential_steps  # traced on the CPU: one step per position
