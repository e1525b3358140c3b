"""Defaults for user data, chosen by measurement on real data: token roles in Python source.

    OMP_NUM_THREADS=1 python benchmarks/user_data.py -o benchmarks/results/user-data-2026-11-22-cpu2.json

The data set is what a user would bring to ``attnlab train jsonl``: 48-token windows of real
source code (the standard library's ``json``, ``http``, ``email``, ``logging``, ``collections``
and ``unittest`` packages, read with Python's own ``tokenize``), each token labelled by its
role, which often depends on its neighbours: a name after ``def`` is a function definition,
after ``class`` a class definition, before ``(`` a call, after ``.`` an attribute, before a
``=`` inside parentheses a keyword argument; keywords, operators, numbers and strings are
themselves. The same identifier takes different roles in different places, so a per-token
model cannot be right everywhere.

Every configuration trains on the same file with the same steps, batch and seed: the
transformer without positions (attnlab's default before this measurement), with each
encoding, wider and deeper, and the two models without attention (``mlp``: each token alone;
``window_mlp``: +-2 neighbours), 600 steps by default. Prints the table and writes the JSON.
"""

from __future__ import annotations

import argparse
import io
import json
import keyword
import sysconfig
import tempfile
import time
import tokenize
from pathlib import Path

PACKAGES = ("json", "http", "email", "logging", "collections", "unittest")
SKIP = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.COMMENT, tokenize.ENDMARKER, tokenize.ENCODING}


def roles(source: str) -> list[tuple[str, str]]:
    """``(token, role)`` for the tokens of one Python source file."""
    toks = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in SKIP]
    out, depth = [], 0
    for i, t in enumerate(toks):
        prev = toks[i - 1].string if i else ""
        nxt = toks[i + 1].string if i + 1 < len(toks) else ""
        if t.type == tokenize.NAME:
            if keyword.iskeyword(t.string):
                role = "KEYWORD"
            elif prev == "def":
                role = "FUNC_DEF"
            elif prev == "class":
                role = "CLASS_DEF"
            elif prev == "." and nxt == "(":
                role = "METHOD_CALL"
            elif prev == ".":
                role = "ATTRIBUTE"
            elif nxt == "(":
                role = "CALL"
            elif nxt == "=" and depth > 0:
                role = "KWARG"
            else:
                role = "NAME"
        elif t.type == tokenize.OP:
            depth += t.string in "([{"
            depth -= t.string in ")]}" and depth > 0
            role = "OP"
        elif t.type == tokenize.NUMBER:
            role = "NUMBER"
        elif t.type == tokenize.STRING or tokenize.tok_name.get(t.type, "").startswith("FSTRING"):
            role = "STRING"
        else:
            role = "OTHER"
        text = t.string if len(t.string) <= 20 else t.string[:20]
        out.append((text.replace("\n", " ") or " ", role))
    return out


def write_dataset(path: Path, window: int = 48) -> int:
    """Write the jsonl file; returns its number of windows."""
    root = Path(sysconfig.get_paths()["stdlib"])
    rows = 0
    with path.open("w") as f:
        for pkg in PACKAGES:
            for file in sorted((root / pkg).rglob("*.py")):
                if "test" in file.relative_to(root / pkg).parts[:-1]:
                    continue
                try:
                    pairs = roles(file.read_text(encoding="utf-8"))
                except (SyntaxError, tokenize.TokenError, UnicodeDecodeError):
                    continue
                for i in range(0, len(pairs) - window + 1, window):
                    chunk = pairs[i : i + window]
                    f.write(json.dumps({"tokens": [t for t, _ in chunk], "labels": [r for _, r in chunk]}) + "\n")
                    rows += 1
    return rows


CONFIGS = {
    "transformer, positional none (the old default)": {"positional": "none"},
    "transformer, sinusoidal": {"positional": "sinusoidal"},
    "transformer, rope": {"positional": "rope"},
    "transformer, alibi": {"positional": "alibi"},
    "transformer, relative": {"positional": "relative"},
    "transformer, rope, dim 128": {"positional": "rope", "embed_dim": 128},
    "transformer, rope, 1 layer": {"positional": "rope", "num_layers": 1},
    "mlp (no attention: each token alone)": {"model": "mlp"},
    "window_mlp (no attention: +-2 tokens)": {"model": "window_mlp"},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", help="JSON file of the results")
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args()
    from attnlab.training import TrainConfig, train

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "roles.jsonl"
        n = write_dataset(data)
        print(f"{n} windows of 48 tokens from {', '.join(PACKAGES)}")
        results = []
        for name, overrides in CONFIGS.items():
            cfg = TrainConfig.for_task("jsonl", task_options={"path": str(data)}, steps=args.steps, **overrides)
            t = time.perf_counter()
            res = train(cfg, Path(tmp) / f"run{len(results)}")
            row = {"config": name, "overrides": overrides, "token_accuracy": res.value, "steps": res.steps,
                   "seconds": round(time.perf_counter() - t, 1), "positional": cfg.positional, "dim": cfg.embed_dim,
                   "layers": cfg.num_layers}
            results.append(row)
            print(f"{name:50s} {res.value:.4f}  ({res.steps} steps, {row['seconds']} s)", flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps({"windows": n, "steps": args.steps, "results": results}, indent=1))


if __name__ == "__main__":
    main()
