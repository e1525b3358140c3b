"""The packing study: every method timed for every count, the dense mask skipped past its limit,
token counts the sum of the documents; ``attnlab bench packing`` prints and writes them."""

import json

from typer.testing import CliRunner

from attnlab.cli import app
from attnlab.studies import packing


def test_packing_records():
    recs = packing.run((1, 3), min_length=4, max_length=8, embed_dim=16, num_layers=1, num_heads=2, dense_up_to=10, min_repeats=1)
    by = {(r.documents, r.method) for r in recs}
    assert (1, "documents") in by and (3, "padded, one per row") in by and (3, "documents") in by
    for r in recs:
        assert r.seconds > 0 and abs(r.microseconds_per_token - 1e6 * r.seconds / r.tokens) < 1e-6
        if r.method == "dense block-diagonal mask":
            assert r.tokens <= 10
    assert {r.tokens for r in recs if r.documents == 1} == {r.tokens for r in recs if r.documents == 1 and r.method == "documents"}


def test_cli_bench_packing(tmp_path):
    out = tmp_path / "p.json"
    r = CliRunner().invoke(app, ["bench", "packing", "--counts", "2", "--min-length", "4", "--max-length", "6", "--embed-dim", "16",
                                 "--num-layers", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "us per token" in r.output and len(json.loads(out.read_text())["records"]) == 3
    r = CliRunner().invoke(app, ["bench", "packing", "--min-length", "9", "--max-length", "6"])
    assert r.exit_code == 2 and "exceeds" in r.output


def test_the_cpu_by_name_measures_what_the_default_does():
    options = dict(min_length=4, max_length=8, embed_dim=16, num_layers=1, num_heads=2, dense_up_to=10, min_repeats=1)
    fields = ("method", "documents", "tokens", "dim", "layers")  # all but the timings
    default, named = packing.run((1, 3), **options), packing.run((1, 3), **options, device="cpu")
    assert [[r.to_dict()[f] for f in fields] for r in named] == [[r.to_dict()[f] for f in fields] for r in default]
    assert len(default) >= 5 and all(r.seconds > 0 for r in named)
