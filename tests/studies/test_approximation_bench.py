"""The approximation benchmark: errors shrink with the budget and vanish in the exact limits."""

import pytest

from attnlab.studies.approximation import run_approximation


def test_errors_shrink_with_budget_and_vanish_where_exact():
    recs = run_approximation(128, ["local", "nystrom", "performer"], seeds=1)
    by = {}
    for r in recs:
        by.setdefault(r.variant, []).append(r.error)
    # local: window 16, 64, then >= N - 1 (128 capped): exact
    assert by["local"][0] > by["local"][1] > by["local"][-1] and by["local"][-1] < 1e-12
    assert by["nystrom"][0] > by["nystrom"][-1]
    assert by["performer"][0] > by["performer"][-1]
    with pytest.raises(ValueError, match="unknown variant 'flash'"):
        run_approximation(64, ["flash"])


def test_bench_approximation_command():
    import json

    from typer.testing import CliRunner

    from attnlab.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["bench", "approximation", "--n", "64", "--variants", "local,linear", "--seeds", "1", "--json"])
    assert res.exit_code == 0, res.output
    recs = json.loads(res.stdout)
    assert [(r["variant"], r["budget"]) for r in recs] == [("local", 16), ("local", 64), ("linear", 0)]
    assert recs[1]["error"] < 1e-12  # window 64 >= N - 1: exact
    table = runner.invoke(app, ["bench", "approximation", "--n", "64", "--variants", "local", "--seeds", "1"])
    assert table.exit_code == 0 and "16:" in table.stdout
    bad = runner.invoke(app, ["bench", "approximation", "--variants", "flash"])
    assert bad.exit_code == 2 and "unknown --variants" in bad.output


def test_the_cpu_by_name_is_the_default():
    """``device="cpu"`` given is what the study did before it took a device: the same errors, bit for bit."""
    default = run_approximation(64, ["local", "performer"], seeds=1)
    named = run_approximation(64, ["local", "performer"], seeds=1, device="cpu")
    assert [r.to_dict() for r in named] == [r.to_dict() for r in default] and len(default) == 4
