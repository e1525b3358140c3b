"""A language model trained on the ``docs`` text: it beats the unigram model, keeps the weights
of its lowest validation perplexity, and ``attnlab generate`` streams reproducible text with or
without the cache."""

import json

import pytest
from typer.testing import CliRunner

from attnlab.cli import app
from attnlab.training import TrainConfig, load_checkpoint, train

TINY = ["--task-option", "length=64", "--size", "400", "--embed-dim", "32", "--num-layers", "1", "--num-heads", "2", "--batch-size", "16"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("lm")
    r = CliRunner().invoke(app, ["train", "docs", *TINY, "--steps", "120", "--eval-every", "40", "--lr", "0.005", "--out", str(out),
                                 "--json"])
    assert r.exit_code == 0, r.output
    return out, json.loads(r.stdout.strip().splitlines()[-1])


def test_learns_real_text_better_than_unigram(trained):
    out, summary = trained
    assert summary["metric"] == "perplexity"
    ck = load_checkpoint(out)
    vals = [h["val"] for h in ck.meta["history"]]
    from attnlab import tasks

    unigram = tasks.create("docs", length=64, size=400).baseline["unigram"]
    assert min(vals) < 0.75 * unigram, (vals, unigram)
    assert summary["value"] < unigram
    # the best weights are those of the lowest validation perplexity
    from attnlab.training import evaluate

    assert evaluate(out, "val").value == pytest.approx(min(vals), rel=1e-6)


def test_generate_streams_the_same_text_with_and_without_cache(trained):
    out, _ = trained
    run = lambda *a: CliRunner().invoke(app, ["generate", str(out), "The ", "--max-new-tokens", "40", *a])  # noqa: E731
    greedy = run("--temperature", "0")
    assert greedy.exit_code == 0, greedy.output
    assert greedy.output.startswith("The ") and len(greedy.output) > 20
    assert run("--temperature", "0", "--no-cache").output == greedy.output
    a, b = run("--seed", "3", "--top-k", "20"), run("--seed", "3", "--top-k", "20")
    assert a.output == b.output and a.output != run("--seed", "4", "--top-k", "20").output
    bounded = run("--temperature", "0", "--window", "16", "--sinks", "2", "--max-new-tokens", "80")
    assert bounded.exit_code == 0 and bounded.output.startswith("The ")


def test_generate_refuses_other_checkpoints_and_empty_prompts(trained, tmp_path):
    out, _ = trained
    r = CliRunner().invoke(app, ["generate", str(out), ""])
    assert r.exit_code == 2 and "the text is empty" in r.output
    train(TrainConfig.for_task("recall", task_options={"size": 64}, steps=1, eval_every=1, embed_dim=16, num_layers=1, num_heads=2),
          tmp_path)
    r = CliRunner().invoke(app, ["generate", str(tmp_path), "x"])
    assert r.exit_code == 1 and "needs a language model" in " ".join(r.output.split())  # a checkpoint of another kind: run time


def test_the_arena_refuses_a_perplexity_task():
    from attnlab.arena import plan

    with pytest.raises(ValueError, match="lower is better"):
        plan("quick", tasks=["docs"])
