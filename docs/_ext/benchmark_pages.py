"""Benchmark pages, generated at every build from ``benchmarks/results/``.

Every file there is named ``<topic>-<date>[-<machine>].<ext>`` (``.txt``, ``.json``, ``.png``).
On ``builder-inited`` this extension writes ``docs/benchmarks/<topic>.md`` for every topic, its
dates newest first, each date's files embedded: a ``.png`` as an image, a ``.txt`` as a literal
block (included from the file itself), a ``.json`` as a table of its records (or its pretty JSON,
cut when long), each with a link to the raw file; and ``docs/benchmarks/index.md`` with the
toctree. Every number on these pages is read from the files: nothing is copied by hand.
``docs/benchmarks/`` is generated (git-ignored); a file is rewritten only when its text changes.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path

NAME = re.compile(r"^(?P<topic>.+?)-(?P<date>\d{4}-\d{2}-\d{2})(?:-(?P<machine>[A-Za-z0-9]+))?\.(?P<ext>txt|json|png)$")
MAX_ROWS = 60  # records shown in a JSON file's table; the raw file has them all
MAX_JSON_LINES = 60  # lines of pretty JSON shown; the raw file has them all
MAX_CELL = 60  # characters of a nested value shown in a table cell
KIND_ORDER = {"png": 0, "txt": 1, "json": 2}


def scan(results: Path, skipped: list[str] | None = None) -> dict[str, list[tuple[str, str | None, Path]]]:
    """Topic -> [(date, machine, path)], from the file names in ``results``; a name that does not
    follow ``<topic>-<date>[-<machine>].<txt|json|png>`` is named in ``skipped``."""
    skipped = [] if skipped is None else skipped
    if not results.is_dir():
        raise FileNotFoundError(f"no benchmark results folder {results} (the benchmark_results setting of docs/conf.py)")
    topics: dict[str, list[tuple[str, str | None, Path]]] = defaultdict(list)
    for path in sorted(results.iterdir()):
        m = NAME.match(path.name)
        if m and m["topic"] != "index":  # index.md is the pages' own index
            topics[m["topic"]].append((m["date"], m["machine"], path))
        else:
            skipped.append(path.name)
    return dict(sorted(topics.items()))


def _cell(value) -> str:
    if isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, (dict, list)):
        text = json.dumps(value, separators=(",", ":"))
        if len(text) > MAX_CELL:
            text = text[: MAX_CELL - 1] + "…"
    elif value is None:
        text = ""
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ").replace("`", "'")


def _table(records: list[dict]) -> list[str]:
    columns: list[str] = []
    for rec in records:
        columns += [k for k in rec if k not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for rec in records[:MAX_ROWS]:
        lines.append("| " + " | ".join(_cell(rec.get(c)) for c in columns) + " |")
    return lines


def _is_records(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(r, dict) for r in value)


def _pretty(value) -> list[str]:
    text = json.dumps(value, indent=2, ensure_ascii=False).splitlines()
    if len(text) <= MAX_JSON_LINES:
        return ["```json", *text, "```"]
    cut = text[:MAX_JSON_LINES] + [f"... ({len(text) - MAX_JSON_LINES} more lines in the raw file)"]
    return ["```text", *cut, "```"]  # no longer valid JSON: not highlighted as JSON


def render_json(path: Path) -> list[str]:
    """A JSON file as markdown: a table per list of records (top level or under a key), the
    rest as pretty JSON, cut when long, with the raw file linked."""
    data = json.loads(path.read_text())
    out: list[str] = []
    parts = {"records": data} if _is_records(data) else data if isinstance(data, dict) else {"value": data}
    rest = {}
    for key, value in parts.items():
        if _is_records(value):
            shown = min(len(value), MAX_ROWS)
            out += ["", f"`{key}`: {len(value)} records" + ("" if shown == len(value) else f", the first {shown} shown") + ":", ""]
            out += _table(value)
        else:
            rest[key] = value
    if rest:
        out += ["", "The file's other fields:" if len(rest) < len(parts) else "", ""]
        out += _pretty(rest)
    return out


def render_topic(topic: str, files: list[tuple[str, str | None, Path]], rel_root: str) -> str:
    dates = sorted({d for d, _, _ in files}, reverse=True)
    lines = [
        f"# {topic}",
        "",
        f"Generated from `benchmarks/results/{topic}-*` by `docs/_ext/benchmark_pages.py`: "
        f"{len(files)} file(s), {len(dates)} date(s), newest first.",
    ]
    for date in dates:
        lines += ["", f"## {date}"]
        here = sorted((f for f in files if f[0] == date), key=lambda f: (KIND_ORDER[f[2].suffix[1:]], f[2].name))
        for _, _, path in here:
            rel = f"{rel_root}/{path.name}"
            lines += ["", f"### `{path.name}`", "", f"Raw file: {{download}}`{path.name} <{rel}>`", ""]
            kind = path.suffix[1:]
            if kind == "png":
                lines += [f"![{topic}, {date}]({rel})"]
            elif kind == "txt":
                lines += [f"```{{literalinclude}} {rel}", ":language: text", "```"]
            else:
                try:
                    lines += render_json(path)
                except (ValueError, UnicodeDecodeError) as exc:  # a damaged file says so on its page
                    lines += [f"(not valid JSON: {exc})"]
    return "\n".join(lines) + "\n"


def render_index(topics: dict[str, list[tuple[str, str | None, Path]]]) -> str:
    lines = [
        "# Benchmark results",
        "",
        "Every page here is generated at build time from the files in `benchmarks/results/`, named "
        "`<topic>-<date>-<machine>.<ext>` (`cpu2`: the project's 2-core CPU machine). The guides say "
        "how each was run and what it shows; these pages hold the files themselves.",
        "",
        "| topic | dates | files |",
        "|---|---|---|",
    ]
    for topic, files in topics.items():
        dates = ", ".join(sorted({d for d, _, _ in files}, reverse=True))
        kinds = ", ".join(sorted({p.suffix[1:] for _, _, p in files}, key=KIND_ORDER.get))
        lines.append(f"| [{topic}]({topic}.md) | {dates} | {kinds} |")
    lines += ["", "```{toctree}", ":hidden:", "", *topics, "```"]
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def generate(srcdir: Path, results: Path, skipped: list[str] | None = None) -> list[str]:
    """Write the pages under ``srcdir/benchmarks`` and remove stale ones; return the topics (the
    file names that are no result, in ``skipped``)."""
    out = srcdir / "benchmarks"
    out.mkdir(exist_ok=True)
    topics = scan(results, skipped)
    rel_root = Path(os.path.relpath(results, out)).as_posix()  # ../../benchmarks/results
    wanted = {"index.md"}
    for topic, files in topics.items():
        _write(out / f"{topic}.md", render_topic(topic, files, rel_root))
        wanted.add(f"{topic}.md")
    _write(out / "index.md", render_index(topics))
    for stale in out.glob("*.md"):
        if stale.name not in wanted:
            stale.unlink()
    return list(topics)


def _on_builder_inited(app) -> None:
    from sphinx.util import logging

    srcdir, skipped = Path(app.srcdir), []
    generate(srcdir, (srcdir / app.config.benchmark_results).resolve(), skipped)
    if skipped:
        logging.getLogger(__name__).info(f"benchmark pages: not <topic>-<date>[-<machine>].<txt|json|png>, left out: {', '.join(skipped)}")


def setup(app):
    app.add_config_value("benchmark_results", "../benchmarks/results", "env")
    app.connect("builder-inited", _on_builder_inited)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
