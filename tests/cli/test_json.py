"""Every command's --json: stdout holds JSON and nothing else (one object, or JSON lines where the
command says so), whatever the command and the libraries under it print while they work."""

import json
import subprocess
import sys

import pytest

from attnlab.cli import app
from tests.cli.helpers import runner
from tests.cli.test_boundary import BAD, _commands

# command -> the cheapest real invocation (placeholders from the `runs` fixture and tmp_path); every one with --json
JSON = {
    "explain": ["explain", "I saw a saw"],
    "attention": ["attention", "the cat sat"],
    "view": ["view", "the cat sat", "-o", "{tmp}/v.html"],
    "bench attention": ["bench", "attention", "--sizes", "16", "--configs", "scaled_dot+relu", "--modes", "fwd", "--repeats", "1"],
    "bench positional": ["bench", "positional", "--encodings", "learned", "--steps", "2", "--seeds", "0", "--train-length", "16",
                         "--test-lengths", "16"],
    "bench scaling": ["bench", "scaling", "--sizes", "64", "--variants", "dense", "--repeats", "1", "--rounds", "1", "--no-flex",
                      "--no-memory"],
    "bench masks": ["bench", "masks", "--sizes", "256", "--patterns", "window", "--repeats", "1", "--dense-up-to", "256",
                    "--flex-up-to", "1", "--layer-step", "0"],
    "bench approximation": ["bench", "approximation", "--n", "32", "--variants", "local", "--seeds", "1"],
    "bench distance": ["bench", "distance", "--distances", "3", "--layers", "rnn", "--steps", "2", "--seeds", "0"],
    "bench recall": ["bench", "recall", "--variants", "deltanet", "--pairs", "2", "--embed-dims", "8", "--steps", "2"],
    "bench graph": ["bench", "graph", "--nodes", "50", "--edges", "100", "--in-dim", "8", "--num-heads", "2", "--head-dim", "4",
                    "--repeats", "1", "--no-memory"],
    "bench audio": ["bench", "audio", "--seconds", "1", "--embed-dim", "16", "--num-heads", "2", "--num-layers", "1", "--repeats", "1",
                    "--no-memory"],
    "bench pretrained": ["bench", "pretrained", "--variants", "local", "--lengths", "32", "--pairs", "4", "--budgets", "1", "--no-memory"],
    "bench decode": ["bench", "decode", "--contexts", "16", "--new-tokens", "3", "--embed-dim", "16", "--num-layers", "1",
                     "--num-heads", "2", "--stream-lengths", ""],
    "bench packing": ["bench", "packing", "--counts", "2", "--min-length", "4", "--max-length", "6", "--embed-dim", "16",
                      "--num-layers", "1"],
    "bench ring": ["bench", "ring", "--lengths", "64", "--processes", "1", "--embed-dim", "16", "--num-heads", "2", "--num-layers", "1",
                   "--repeats", "1"],
    "bench peak": ["bench", "peak"],
    "bench precision": ["bench", "precision", "--variants", "local", "--sizes", "32", "--tokens", "64", "--embed-dim", "16",
                        "--num-heads", "2", "--repeats", "1"],
    "plot positional": ["plot", "positional", "rope", "--dim", "8", "--length", "8", "-o", "{tmp}/p.png"],
    "complexity": ["complexity", "--sizes", "32", "--layers", "cnn", "--path-sizes", "16", "--embed-dim", "8", "--no-fit", "--rounds", "1"],
    "arena": ["arena", "--tasks", "karate", "--variants", "dense", "--budget-seconds", "1", "--out", "{tmp}/arena"],
    "report": ["report", "{tmp}/arena"],
    "compare vit-cnn": ["compare", "vit-cnn", "--fractions", "0.1", "--models", "cnn", "--seeds", "0", "--steps", "2"],
    "train": ["train", "pos", "--size", "64", "--steps", "2", "--eval-every", "2", "--embed-dim", "16", "--num-layers", "1",
              "--num-heads", "2", "--out", "{tmp}/train"],
    "eval": ["eval", "{pos}"],
    "predict": ["predict", "{jsonl}", "{data}"],
    "generate": ["generate", "{docs}", "The", "--max-new-tokens", "5", "--temperature", "0"],
    "list": ["list", "variants"],
    "backends": ["backends"],
    "bench device": ["bench", "device", "--device", "cpu", "--no-arena", "--no-speed"],
}
LINES = {"predict", "complexity"}  # JSON lines: one object per input line / per record


def test_every_command_has_a_json_case():
    assert sorted(JSON) == sorted(_commands()) == sorted(BAD)


@pytest.mark.parametrize("command", list(JSON))
def test_json_stdout_parses(command, runs, tmp_path):
    if command == "report":
        assert runner.invoke(app, [a.format(tmp=tmp_path) for a in JSON["arena"]]).exit_code == 0
    args = [a.format(tmp=tmp_path, **runs) for a in JSON[command]] + ["--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines, f"{command} --json printed nothing"
    if command in LINES:
        values = [json.loads(line) for line in lines]
    else:
        assert len(lines) == 1, res.stdout[:500]
        values = [json.loads(lines[0])]
    assert all(isinstance(v, (dict, list)) and v for v in values)


def test_native_output_goes_to_stderr_under_json():
    """File descriptor 1 itself is sent to stderr while a --json command runs: what native code (the
    tokenizers library's progress bars) writes there cannot reach the JSON."""
    code = ("import os, sys; from attnlab.cli.common import json_stdout, print_json\n"
            "with json_stdout(True):\n    os.write(1, b'native noise\\n'); print('python noise'); print_json({'a': 1})\n"
            "print('after')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout == '{"a": 1}\nafter\n'
    assert "native noise" in res.stderr and "python noise" in res.stderr


@pytest.mark.slow
def test_train_and_eval_json_in_a_real_process(runs, tmp_path):
    """The issue's finding: `train jsonl ... --json 2>/dev/null` began with empty lines (tokenizers' bars)."""
    cmd = [sys.executable, "-m", "attnlab", "train", "jsonl", "--task-option", f"path={runs['data']}", "--steps", "2", "--eval-every", "2",
           "--embed-dim", "16", "--num-layers", "1", "--num-heads", "2", "--out", str(tmp_path / "j"), "--json"]
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True)
    summary = json.loads(res.stdout)  # the whole of stdout
    assert res.stdout.count("\n") == 1 and summary["task"] == "jsonl" and summary["baseline"]["model"] == "window_mlp"
    res = subprocess.run([sys.executable, "-m", "attnlab", "eval", str(tmp_path / "j"), "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, check=True)
    assert json.loads(res.stdout)["value"] == summary["value"]
