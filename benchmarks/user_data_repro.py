"""Is a score on the user's own data a fact? The user-data issue's checks, end to end through the
command line, on two files built here (no download):

    python benchmarks/user_data_repro.py -o benchmarks/results/user-data-repro-2026-11-26-cpu2.json
    PYTHONPATH=OLD/src python benchmarks/user_data_repro.py --skip-nospace --label "before (8397ec4)" -o (the same file)

The tokenizer chosen by the data (issue 58), before and after:

    R=benchmarks/results/user-data-repro-2026-11-27-cpu2.json
    PYTHONPATH=OLD/src python benchmarks/user_data_repro.py --only-tokenizer --label "before (22d0d7f)" -o $R
    python benchmarks/user_data_repro.py --only-tokenizer --label "tokenizer=auto" -o $R
    python benchmarks/user_data_repro.py --only-tokenizer --tokenizer bpe --files lower --label "tokenizer=bpe" -o $R

(its entry "tokenizer=auto, short-text defaults ..." is the second command's run before rows of
characters took the long-document recipe.)

* ``pieces.jsonl``: 1,000 pieces of 300 characters of the standard library's source, labelled by
  package (``json``, ``http``, ``email``, ``logging``; 250 each): real text, where a 100-step run
  is far from saturated. ``attnlab train jsonl`` for 100 steps (no baseline) into run A; then
  ``attnlab eval A`` in five fresh processes with ``PYTHONHASHSEED`` 0-4 (one score, equal to
  train's?); the same training into run B (bitwise equal weights?); and into run C, interrupted
  with SIGINT after its checkpoint of step 40, then ``--resume``d (bitwise equal to A?).
* ``nospace.jsonl``: 1,000 rows of 995 random lowercase letters with one record ``KEY=v`` hidden at
  a random place (``v`` one of A-D, the label): text without spaces. ``attnlab train jsonl`` with
  its defaults, the no-attention baseline beside it.
* ``--only-tokenizer``: ``attnlab --threads 1 train jsonl`` with its defaults, the no-attention
  baseline beside it, on ``lower.jsonl`` (1,200 rows of 300 random lowercase letters with one
  ``KEY=v`` inside, ``v`` one of a-d, the label: the value is a letter like its neighbours) and on
  ``pieces.jsonl`` (ordinary text), with ``--tokenizer`` given as the task option (or not, for the
  code before the option).

The file is given as ``--task-option path=FILE`` so that the same script runs on code from
before ``--data`` existed (``PYTHONPATH=OLD/src python benchmarks/user_data_repro.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import string
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

PACKAGES = ("json", "http", "email", "logging")


def pieces_file(path: Path, per_class: int = 250, piece: int = 300) -> None:
    root = Path(sysconfig.get_paths()["stdlib"])
    with path.open("w") as f:
        for pkg in PACKAGES:
            kept = 0
            for file in sorted((root / pkg).rglob("*.py")):
                text = file.read_text(encoding="utf-8", errors="replace")
                for i in range(0, len(text) - piece + 1, piece):
                    if kept < per_class:
                        f.write(json.dumps({"text": text[i : i + piece], "label": pkg}) + "\n")
                        kept += 1


def nospace_file(path: Path, rows: int = 1000, length: int = 995, seed: int = 1, values: str = "ABCD") -> None:
    r = random.Random(seed)
    with path.open("w") as f:
        for _ in range(rows):
            v = r.choice(values)
            s = "".join(r.choice(string.ascii_lowercase) for _ in range(length))
            at = r.randrange(length)
            f.write(json.dumps({"text": s[:at] + "KEY=" + v + s[at:], "label": v}) + "\n")


def attnlab(*args: str, env: dict | None = None) -> dict:
    """One attnlab command with --json: its last stdout line."""
    res = subprocess.run([sys.executable, "-m", "attnlab", *args, "--json"], capture_output=True, text=True, env=env or os.environ.copy(),
                         check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def interrupted_then_resumed(args: list[str], out: Path, at: int) -> int:
    """Train with ``args`` into ``out``, SIGINT once its checkpoint reaches step ``at``, then --resume; the step it stopped at."""
    proc = subprocess.Popen([sys.executable, "-m", "attnlab", "train", *args, "--out", str(out)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    step = 0
    while proc.poll() is None:
        try:
            step = json.loads((out / "checkpoint" / "config.json").read_text())["step"]
        except (OSError, ValueError, KeyError):
            step = 0
        if step >= at:
            proc.send_signal(signal.SIGINT)
            break
        time.sleep(0.02)
    proc.wait()
    stopped = json.loads((out / "checkpoint" / "config.json").read_text())["step"]
    attnlab("train", *args, "--out", str(out), "--resume")
    return stopped


def same_bytes(a: Path, b: Path) -> bool:
    files = ("model.safetensors", "best.safetensors")
    return all((a / "checkpoint" / f).read_bytes() == (b / "checkpoint" / f).read_bytes() for f in files)


def tokenizer_runs(root: Path, files: list[str], tokenizer: str | None) -> dict:
    """``attnlab --threads 1 train jsonl`` defaults with the baseline on each of ``files`` (``lower``, ``pieces``)."""
    made = {"lower": lambda p: nospace_file(p, rows=1200, length=300, values="abcd"), "pieces": pieces_file}
    found = {}
    for name in files:
        made[name](root / f"{name}.jsonl")
        extra = [] if tokenizer is None else ["--task-option", f"tokenizer={tokenizer}"]
        t = time.perf_counter()
        n = attnlab("--threads", "1", "train", "jsonl", "--task-option", f"path={root / name}.jsonl", *extra,
                    "--out", str(root / f"T-{name}"))
        found[name] = {"model": n["value"], "baseline": n["baseline"]["value"], "baseline_model": n["baseline"]["model"],
                       "steps": n["steps"], "test_size": n["test_size"], "notes": n.get("notes", []), "tokenizer_option": tokenizer,
                       "call_seconds": round(n["seconds"], 1), "wall_seconds": round(time.perf_counter() - t, 1)}
        print(f"{name}: model {n['value']:.4f}, baseline ({n['baseline']['model']}) {n['baseline']['value']:.4f}, {n['steps']} steps; "
              f"{'; '.join(n.get('notes', [])) or 'no notes'}", flush=True)
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", help="JSON file of the results")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--skip-nospace", action="store_true", help="leave out the default-settings run on the unspaced file")
    ap.add_argument("--label", default="this code", help="the key of this run's results in --output (other keys there are kept)")
    ap.add_argument("--only-tokenizer", action="store_true", help="only the default-settings runs of the tokenizer check")
    ap.add_argument("--tokenizer", choices=("auto", "char", "bpe"), help="the tokenizer check's task option (default: not given)")
    ap.add_argument("--files", default="lower,pieces", help="the tokenizer check's files, comma-separated")
    args = ap.parse_args()
    result: dict = {"python": sys.version.split()[0]}
    if args.only_tokenizer:
        with tempfile.TemporaryDirectory() as tmp:
            result["tokenizer"] = tokenizer_runs(Path(tmp), args.files.split(","), args.tokenizer)
    else:
        repro(args, result)
    if args.output:
        out = Path(args.output)
        kept = json.loads(out.read_text()) if out.exists() else {}
        out.write_text(json.dumps({**kept, args.label: result}, indent=1))


def repro(args, result: dict) -> None:
    """The user-data issue's checks: eval in five processes, twice and resumed bitwise, the unspaced file's defaults."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pieces_file(root / "pieces.jsonl")
        common = ["jsonl", "--task-option", f"path={root / 'pieces.jsonl'}", "--steps", str(args.steps), "--eval-every", "20",
                  "--no-baseline"]
        a = attnlab("train", *common, "--out", str(root / "A"))
        evals = [attnlab("eval", str(root / "A"), env={**os.environ, "PYTHONHASHSEED": str(s)})["value"] for s in range(5)]
        attnlab("train", *common, "--out", str(root / "B"))
        stopped = interrupted_then_resumed(common, root / "C", at=40)
        result["pieces"] = {"train": a["value"], "eval_hashseeds_0_4": evals, "train_twice_bitwise": same_bytes(root / "A", root / "B"),
                            "interrupted_at_checkpoint": stopped, "resumed_bitwise": same_bytes(root / "A", root / "C"),
                            "steps": args.steps}
        print(f"pieces: train {a['value']:.4f}; eval in 5 processes {evals}; twice bitwise {result['pieces']['train_twice_bitwise']}; "
              f"interrupted at the checkpoint of step {stopped}, resumed bitwise {result['pieces']['resumed_bitwise']}", flush=True)
        if not args.skip_nospace:
            nospace_file(root / "nospace.jsonl")
            t = time.perf_counter()
            n = attnlab("train", "jsonl", "--task-option", f"path={root / 'nospace.jsonl'}", "--out", str(root / "N"))
            result["nospace"] = {"model": n["value"], "baseline": n["baseline"]["value"], "baseline_model": n["baseline"]["model"],
                                 "steps": n["steps"], "call_seconds": n["seconds"], "wall_seconds": round(time.perf_counter() - t, 1),
                                 "test_size": n["test_size"]}
            print(f"nospace: model {n['value']:.4f}, baseline ({n['baseline']['model']}) {n['baseline']['value']:.4f}, "
                  f"{n['steps']} steps", flush=True)


if __name__ == "__main__":
    main()
