"""The attnlab command, run as a user would (typer's CliRunner), checked against the library."""

import json

import pytest
import torch
from typer.testing import CliRunner

import attnlab
from attnlab.cli import app

runner = CliRunner()


def run_ok(*args):
    res = runner.invoke(app, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def test_version():
    assert run_ok("--version").strip() == f"attnlab {attnlab.__version__}"


@pytest.mark.parametrize("score", attnlab.scores.names())
@pytest.mark.parametrize("normalize", attnlab.normalizers.names())
def test_explain_json_steps_are_consistent_with_attend(score, normalize):
    ex = json.loads(run_ok("explain", "I saw a saw", "--score", score, "--normalize", normalize, "--json"))
    assert ex["tokens"] == ["I", "saw", "a", "saw"]
    q, k, v = (torch.tensor(ex[name], dtype=torch.float64) for name in ("q", "k", "v"))  # (H, N, D)
    weights = torch.tensor(ex["weights"], dtype=torch.float64)
    torch.testing.assert_close(torch.tensor(ex["output"], dtype=torch.float64), (weights @ v)[0])
    if normalize == "softmax":
        torch.testing.assert_close(weights.sum(-1), torch.ones(1, 4, dtype=torch.float64))
    # identical words, no positions: identical rows everywhere
    for name in ("inputs", "output"):
        assert ex[name][1] == ex[name][3]
    if score in ("dot", "scaled_dot", "cosine"):  # plain scores: attend() on the printed Q, K, V agrees
        res = attnlab.attend(q[None], k[None], v[None], score=score, normalize=normalize, return_weights=True)
        torch.testing.assert_close(res.weights[0], weights)


def test_explain_no_self_and_heads():
    ex = json.loads(run_ok("explain", "a b c", "--no-self", "--heads", "2", "--json"))
    assert len(ex["q"]) == 2 and len(ex["q"][0][0]) == 2
    for h in range(2):
        for i in range(3):
            assert ex["scores"][h][i][i] is None and ex["weights"][h][i][i] == 0.0
    assert len(ex["output"]) == 3 and len(ex["output"][0]) == 4
    table = run_ok("explain", "I saw a saw")
    for title in ("I — input vectors", "Q = W^q I", "A — scores", "A' — softmax", "O = A' V"):
        assert title in table


@pytest.mark.parametrize(
    "args, words",
    [
        (["explain", "x y", "--heads", "3"], "heads must be a positive divisor of dim=4"),
        (["explain", "x y", "--score", "euclid"], "unknown score 'euclid'"),
        (["explain", "x y", "--normalize", "max"], "unknown normaliser 'max'"),
        (["explain", "   "], "no tokens"),
        (["bench", "attention", "--sizes", "a,b"], "--sizes must be comma-separated integers"),
        (["bench", "attention", "--configs", "dot+max"], "unknown --configs"),
    ],
)
def test_bad_arguments_give_one_line_errors(args, words):
    res = runner.invoke(app, args)
    assert res.exit_code == 2
    assert words in res.output and "Traceback" not in res.output


def test_bench_attention_json_records():
    out = run_ok("bench", "attention", "--sizes", "16,24", "--configs", "scaled_dot+softmax,scaled_dot+relu", "--modes", "fwd_bwd", "--repeats", "1", "--json")
    records = json.loads(out[out.index("["):])
    assert {r["impl"] for r in records} == {"attend", "sdpa", "naive", "attend_chunked"}
    assert len(records) == (4 + 2) * 2
    for r in records:
        assert set(r) >= {"impl", "path", "n", "mode", "seconds", "peak_bytes"}
        assert r["mode"] == "fwd_bwd" and r["n"] in (16, 24) and r["seconds"] > 0
    backend = {(r["path"], r["impl"]): r["backend"] for r in records}
    assert backend[("scaled_dot+softmax", "attend")] == "sdpa"
    assert backend[("scaled_dot+relu", "attend")] == "chunked"


def test_bench_attention_draws_a_chart(tmp_path):
    png = tmp_path / "charts" / "bench.png"
    out = tmp_path / "records.json"
    run_ok("bench", "attention", "--sizes", "16,32", "--configs", "scaled_dot+relu", "--modes", "fwd", "--repeats", "1",
           "-o", str(out), "--plot", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert len(json.loads(out.read_text())) == 4  # the records file was written too


def test_chart_of_no_records_is_an_error(tmp_path):
    from attnlab.viz import plot_attention_benchmark

    with pytest.raises(ValueError, match="no benchmark records"):
        plot_attention_benchmark([], tmp_path / "x.png")


@pytest.mark.parametrize("name", ["sinusoidal", "learned", "rnn", "floater", "relative", "alibi", "rope"])
def test_plot_positional_writes_a_png(name, tmp_path):
    path = tmp_path / f"{name}.png"
    run_ok("plot", "positional", name, "--length", "40", "--dim", "16", "--heads", "3", "-o", str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, words",
    [
        (["plot", "positional", "sine"], "unknown positional encoding 'sine'"),
        (["plot", "positional", "none"], "nothing to draw"),
        (["plot", "positional", "rope", "--dim", "7"], "even"),
    ],
)
def test_plot_positional_errors(args, words):
    res = runner.invoke(app, args)
    assert res.exit_code == 2 and words in " ".join(res.output.split())


def test_compare_vit_cnn_writes_records_and_a_chart(tmp_path):
    import json

    from typer.testing import CliRunner

    from attnlab.cli import app

    res = CliRunner().invoke(app, ["compare", "vit-cnn", "--fractions", "0.1", "--models", "cnn", "--seeds", "0", "--steps", "20",
                                   "-o", str(tmp_path / "c.json"), "--plot", str(tmp_path / "c.png")])
    assert res.exit_code == 0, res.output
    recs = json.loads((tmp_path / "c.json").read_text())["records"]
    assert [r["model"] for r in recs] == ["cnn"] and recs[0]["fraction"] == 0.1
    assert (tmp_path / "c.png").stat().st_size > 5000
    bad = CliRunner().invoke(app, ["compare", "vit-cnn", "--models", "transformer", "--seeds", "0"])
    assert bad.exit_code == 2 and "does not read images" in " ".join(bad.output.split())


def test_arena_runs_stores_reports_and_skips_on_rerun(tmp_path):
    import sqlite3

    from typer.testing import CliRunner

    from attnlab.cli import app

    args = ["arena", "--tasks", "pos", "--variants", "dense", "--out", str(tmp_path)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "pos (token_accuracy)" in res.output and (tmp_path / "report.html").exists()
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0
    with sqlite3.connect(tmp_path / "results.sqlite") as con:
        assert con.execute("SELECT COUNT(*), MIN(status) FROM runs").fetchone() == (1, "done")
    (tmp_path / "report.html").unlink()
    rebuilt = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert rebuilt.exit_code == 0 and (tmp_path / "report.html").exists()
    bad = CliRunner().invoke(app, ["arena", "--variants", "fast", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "unknown variant 'fast'" in bad.output
    nodata = CliRunner().invoke(app, ["arena", "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path)])
    assert nodata.exit_code == 2 and "no such file" in " ".join(nodata.output.split())
    missing = CliRunner().invoke(app, ["report", str(tmp_path / "none")])
    assert missing.exit_code == 2 and "no results.sqlite" in " ".join(missing.output.split())
