"""attnlab attention, view and bench pretrained, as a user runs them."""

import json
from pathlib import Path

import pytest

from attnlab import pretrained
from attnlab.cli import app
from attnlab.pretrained.heads import attention_map, find_links
from tests.cli.helpers import run_ok, runner

pytest.importorskip("transformers")  # the tiny model folder is written by transformers
SENTENCE = "the law will never be perfect but its application should be just"


def fails(*args, code=2) -> str:
    """The one error line of ``attnlab *args``, which exits with ``code`` (2: a usage error, 1: a failure at run time)."""
    res = runner.invoke(app, list(args))
    assert res.exit_code == code, res.output
    assert "Traceback" not in res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert lines[0].startswith("error:"), res.output  # one error, at the start (rich may wrap it)
    return " ".join(res.output.split())


def test_attention_find_names_the_strongest_heads(tiny_bert):
    data = json.loads(run_ok("attention", SENTENCE, "--model", str(tiny_bert), "--find", "its law", "--top", "3", "--json"))
    ref = find_links(attention_map(pretrained.load(tiny_bert), SENTENCE), "its", "law", 3)
    assert [(x["layer"], x["head"], x["weight"]) for x in data["links"]] == [(r.layer + 1, r.head + 1, r.weight) for r in ref]
    text = run_ok("attention", SENTENCE, "--model", str(tiny_bert), "--find", "its", "--find", "law")
    assert f"layer {ref[0].layer + 1}, head {ref[0].head + 1}: 'its' gives {ref[0].weight:.2f}" in " ".join(text.split())


def test_attention_table_shows_each_tokens_strongest_key(tiny_bert):
    text = run_ok("attention", "attention is all you need", "--model", str(tiny_bert), "--layer", "2")
    assert "layer 2:" in text and "layer 1:" not in text and "4:you" in text


def test_attention_errors_are_one_line(tiny_bert):
    assert "unknown model 'no-such-model'" in fails("attention", SENTENCE, "--model", "no-such-model", code=1)  # no such folder
    assert "'cats' is not among the tokens" in fails("attention", SENTENCE, "--model", str(tiny_bert), "--find", "cats law")
    assert "--find takes two words" in fails("attention", SENTENCE, "--model", str(tiny_bert), "--find", "law")
    long = " ".join(["law"] * 80)
    assert "--truncate" in fails("attention", long, "--model", str(tiny_bert))
    assert "64:" not in run_ok("attention", long, "--model", str(tiny_bert), "--truncate", "--layer", "1") and "63:[SEP]" in run_ok(
        "attention", long, "--model", str(tiny_bert), "--truncate", "--layer", "1")


def test_view_writes_a_page_for_a_model_or_a_checkpoint(tmp_path, tiny_bert):
    out = run_ok("view", SENTENCE, "--model", str(tiny_bert), "-o", str(tmp_path / "a.html"))
    assert "14 tokens, 2 layers x 4 heads" in " ".join(out.split()) and (tmp_path / "a.html").stat().st_size > 1000
    ck = Path(__file__).resolve().parents[1] / "data" / "checkpoints-v1" / "pos-transformer"
    assert "not in task 'pos''s vocabulary: zzz" in fails("view", "zzz", "--checkpoint", str(ck), "-o", str(tmp_path / "b.html"))
    (tmp_path / "dir").mkdir()
    assert "Is a directory" in fails("view", SENTENCE, "--model", str(tiny_bert), "-o", str(tmp_path / "dir"), code=1)
    assert not list(tmp_path.glob("*.tmp"))  # the temporary file is removed
    (tmp_path / "gpt").mkdir()
    (tmp_path / "gpt" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert "model_type 'gpt2'" in fails("view", SENTENCE, "--model", str(tmp_path / "gpt"), code=1)


@pytest.mark.slow
def test_bench_pretrained_writes_records_a_chart_and_reports_them_again(tmp_path, tiny_bert):
    out_json, png = tmp_path / "r.json", tmp_path / "r.png"
    text = run_ok("bench", "pretrained", "--model", str(tiny_bert), "--variants", "local,linear", "--lengths", "32",
                  "--pairs", "12", "--budgets", "1", "--no-memory", "-o", str(out_json), "--plot", str(png))
    recs = json.loads(out_json.read_text())["records"]
    assert [(r["variant"], r["budget"]) for r in recs] == [("dense", "trained"), ("local", "window=16"), ("linear", "(none)")]
    assert png.stat().st_size > 10_000 and "N = 32 tokens, 12 docstring pairs" in " ".join(text.split())
    again = run_ok("bench", "pretrained", "--from", str(out_json))
    assert "window=16" in again and "(none)" in again
    assert "unknown" in fails("bench", "pretrained", "--model", str(tiny_bert), "--variants", "fast")
    del recs[0]  # no trained-model row: not a report of this command
    out_json.write_text(json.dumps({"records": recs}))
    assert "no trained-model (dense) record at N=32" in fails("bench", "pretrained", "--from", str(out_json), code=1)
    out_json.write_text(json.dumps({"records": [{"variant": "dense"}]}))
    assert "a record lacks model" in fails("bench", "pretrained", "--from", str(out_json), code=1)


def test_a_bad_config_is_one_line(tmp_path, tiny_bert):
    import shutil

    folder = tmp_path / "bad"
    shutil.copytree(tiny_bert, folder)
    cfg = json.loads((folder / "config.json").read_text())
    for key, value, message in (("num_hidden_layers", 0, "num_hidden_layers must be"), ("pad_token_id", 10_000, "pad_token_id must be in"),
                                ("hidden_act", "swish", "hidden_act 'swish'")):
        (folder / "config.json").write_text(json.dumps({**cfg, key: value}))
        assert message in fails("attention", SENTENCE, "--model", str(folder), code=1)  # a damaged model folder
    (folder / "config.json").write_text("[1, 2]")
    assert "not a JSON object" in fails("attention", SENTENCE, "--model", str(folder), code=1)


def test_bench_pretrained_measures_a_decoder_by_perplexity(tmp_path, tiny_decoder):
    out_json, png = tmp_path / "d.json", tmp_path / "d.png"
    text = run_ok("bench", "pretrained", "--model", str(tiny_decoder), "--variants", "local", "--lengths", "32", "--windows", "4",
                  "--budgets", "1", "-o", str(out_json), "--plot", str(png))
    recs = json.loads(out_json.read_text())["records"]
    assert [(r["variant"], r["budget"]) for r in recs] == [("sdpa", "trained"), ("attnlab", "exact"), ("local", "window=16")]
    assert "4 held-out windows" in " ".join(text.split()) and png.stat().st_size > 10_000
    assert "window=16" in run_ok("bench", "pretrained", "--from", str(out_json))
    assert ("unknown --variants ['nystrom']; a causal language model takes a variant with a causal form"
            in fails("bench", "pretrained", "--model", str(tiny_decoder), "--variants", "nystrom"))
