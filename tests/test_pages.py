"""The README and the documentation pages, executed: their Python blocks run, every ``attnlab.*``
name they mention exists, and every ``attnlab`` command they show parses, with each option it
names (``--help`` for all, the short ones for real).

The pages: ``README.md`` and every ``docs/**/*.md`` except the generated ones (``docs/benchmarks/``,
written from ``benchmarks/results/`` at build time, and the build output ``docs/_build/``). A Python
block is run by a test of its own (found by ``_block`` and a few of its words, with assertions on what it states)
or, if no such test names it, by :func:`test_every_other_python_block_runs` in a fresh namespace."""

from __future__ import annotations

import importlib
import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import torch
import typer

from attnlab.cli import app
from tests.cli.helpers import runner

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GENERATED = {"benchmarks", "_build"}  # docs/ folders written by the build, not by hand


def _pages() -> dict[str, str]:
    paths = [ROOT / "README.md"]
    paths += sorted(p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).parts[0] not in GENERATED)
    return {p.relative_to(ROOT).as_posix(): p.read_text() for p in paths}


PAGES = _pages()
README = PAGES["README.md"]
TEXT = "\n\n".join(PAGES.values())  # every page, for the names and the commands
BLOCKS: dict[str, list[str]] = {}  # each distinct Python block -> the pages that show it (the ten lines: two)
for _page, _text in PAGES.items():
    for _b in re.findall(r"```python\n(.*?)```", _text, flags=re.S):
        BLOCKS.setdefault(_b, []).append(_page)
SPECIFIC = re.findall(r'_block\("([^"]+)"\)', Path(__file__).read_text())  # the blocks with tests of their own


def _block(words: str) -> str:
    (found,) = [b for b in BLOCKS if words in b]
    return found


def test_the_ten_lines_run_and_give_the_shapes_they_state():
    ns: dict = {}
    exec(_block("import torch, attnlab"), ns)
    assert ns["res"].output.shape == (2, 10, 64) and ns["res"].weights.shape == (2, 4, 10, 10)
    assert ns["out"].shape == (1, 4, 8192, 64) and torch.isfinite(ns["out"]).all()
    assert ns["rope"].positional.name == "rope" and len(ns["enc"].layers) == 2


@pytest.mark.slow
def test_the_masks_block_computes_what_it_states():
    """Rows of both calls recomputed by hand in float64 from the rule the comments state."""
    ns: dict = {}
    exec(_block("masks.block_map(sliding"), ns)
    q, k, v = (t.detach().double()[0] for t in (ns["q"], ns["k"], ns["v"]))
    assert ns["bm"].nbytes() == 12544 and round(ns["bm"].density(), 3) == 0.035
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (ns["q"], ns["k"], ns["v"]))
    starts = [0, 4096, 12288]
    for i in (0, 4095, 4096, 4700, 12288 + 511, 16383):
        doc = max(s for s in starts if s <= i)
        keys = torch.arange(max(doc, i - 512), i + 1)
        s = 30.0 * torch.tanh(torch.einsum("hd,hkd->hk", q[:, i], k[:, keys]) / 8 / 30.0)
        want = torch.einsum("hk,hkd->hd", torch.softmax(s, -1), v[:, keys])
        assert (ns["out"][0, :, i].double() - want).abs().max() < 1e-4
        keys = torch.arange(max(0, i - 256), min(16384, i + 257))
        s = torch.einsum("hd,hkd->hk", q[:, i], k[:, keys]) / 8
        want = torch.einsum("hk,hkd->hd", torch.softmax(s, -1), v[:, keys])
        assert (ns["near"][0, :, i].double() - want).abs().max() < 1e-4


def test_the_transformers_block_generates_what_sdpa_generates_and_the_variant_changes_it():
    pytest.importorskip("transformers")
    ns: dict = {}
    exec(_block("import attnlab.integrations.transformers"), ns)
    model, ids = ns["model"], ns["ids"]
    assert ns["exact"].shape == (1, 25) and ns["local"].shape == (1, 25)
    model.set_attn_implementation("sdpa")
    assert torch.equal(model.generate(ids, max_new_tokens=20, do_sample=False), ns["exact"])
    assert not torch.equal(ns["local"], ns["exact"])


def test_the_gated_block_decodes_what_the_chunkwise_form_computes():
    ns: dict = {}
    exec(_block("layer.new_cache()"), ns)  # its own asserts: cache = full forward, constant bytes
    assert ns["cache"].seen == 100 and ns["full"].shape == (2, 100, 64)


def test_the_pretrained_block_runs(minilm):
    ns: dict = {}
    exec(_block("pretrained.load("), ns)
    assert ns["emb"].shape == (2, 384)
    assert any(getattr(mod, "name", None) == "longformer" for mod in ns["fast"].model.modules())
    assert not any(getattr(mod, "name", None) == "longformer" for mod in ns["m"].model.modules())


def test_the_ring_attention_block_runs_in_a_one_process_group(tmp_path):
    import torch.distributed as dist

    from attnlab import reference_attention

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        n = 13
        q, k, v = (torch.randn(1, 2, n, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) for i in range(3))
        ns = {"n": n, "q": q, "k": k, "v": v}
        exec(_block("ring_attend("), ns)
        ref, _ = reference_attention(q, k, v, mask=torch.ones(n, n, dtype=torch.bool).tril())
        torch.testing.assert_close(ns["whole"][..., :n, :], ref)
    finally:
        dist.destroy_process_group()


def test_every_python_block_is_run_by_a_test():
    """Each specific test's words find exactly one block; every block is run, by its own test or by
    the generic one below."""
    for key in SPECIFIC:
        assert len([b for b in BLOCKS if key in b]) == 1, f"_block({key!r}) must find exactly one block"
    assert len(SPECIFIC) >= 6  # the blocks whose results are asserted, not only run
    assert len(BLOCKS) >= len(SPECIFIC) + 2  # and blocks only the generic test runs
    assert "import torch, attnlab" in README and "docs/index.md" in BLOCKS[_block("import torch, attnlab")]


def _generic_blocks() -> list[tuple[str, str]]:
    """(an id: the page and the block's first line, the block) for every block no specific test runs."""
    out = []
    for block, pages in BLOCKS.items():
        if not any(key in block for key in SPECIFIC):
            first = next((line for line in block.splitlines() if line.strip() and not line.startswith(("import", "from"))), "")
            out.append((f"{pages[0]}: {first[:40]}", block))
    return out


@pytest.mark.parametrize("block", [b for _, b in _generic_blocks()], ids=[i for i, _ in _generic_blocks()])
def test_every_other_python_block_runs(block):
    """A block without a test of its own runs as shown, in a fresh namespace (its own asserts hold)."""
    exec(compile(block, "<docs block>", "exec"), {"__name__": "__docs__"})


def _resolve(name: str):
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_attnlab_name_on_each_page_exists(page):
    names = sorted(set(re.findall(r"\battnlab(?:\.[A-Za-z_]\w*)+", PAGES[page])))
    missing = []
    for name in names:
        try:
            _resolve(name)
        except (ImportError, AttributeError):
            missing.append(name)
    assert not missing, f"{page} names what attnlab does not have: {missing}"


def test_the_pages_name_much_of_attnlab():
    assert len(set(re.findall(r"\battnlab(?:\.[A-Za-z_]\w*)+", README))) > 5
    assert len(set(re.findall(r"\battnlab(?:\.[A-Za-z_]\w*)+", TEXT))) > 20


def _command(path: list[str]):
    cmd = typer.main.get_command(app)
    for word in path:
        cmd = cmd.commands[word]
    return cmd


def _command_lines(text: str) -> list[str]:
    """The ``attnlab ...`` lines a page shows: indented usage lines (with ``torchrun ... -m`` in
    front or not), lines of fenced shell blocks, and inline code."""
    lines = re.findall(r"^ {4}(?:torchrun [^\n]*?-m )?(attnlab [^\n]*)$", text, flags=re.M)
    for body in re.findall(r"```(?:bash|console|shell|sh)\n(.*?)```", text, flags=re.S):
        lines += re.findall(r"^(?:\$ )?(?:torchrun [^\n]*?-m )?(attnlab [^\n]*)$", body, flags=re.M)
    lines += re.findall(r"`(attnlab (?:[a-z-]+)[^`]*)`", text)
    return lines


def _shown_commands() -> list[tuple[list[str], set[str], str]]:
    """Every ``attnlab ...`` line the pages show: the command's path of names, the options it
    names, the line (with its page)."""
    shown = []
    for page, text in PAGES.items():
        for line in _command_lines(text):
            words = line.split()[1:]
            path = []
            cmd = typer.main.get_command(app)
            root = {opt: p for p in cmd.params for opt in p.opts}
            while words and words[0] in root:  # the root's own options before the command: attnlab --threads 1 train ...
                param = root[words.pop(0)]
                if not param.is_flag and words:
                    words.pop(0)
            while words and hasattr(cmd, "commands") and words[0] in cmd.commands:
                path.append(words[0])
                cmd = cmd.commands[words.pop(0)]
            options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-o)\b", " ".join(words)))
            shown.append((path, options, f"{page}: {line}"))
    return shown


def test_every_command_the_pages_show_exists_with_the_options_it_names():
    shown = _shown_commands()
    assert len(shown) > 25 and any(line.startswith("README.md: ") for _, _, line in shown)
    bad = []
    for path, options, line in shown:
        cmd = _command(path)
        if hasattr(cmd, "commands"):
            if options - {"--version", "--help"}:
                bad.append(f"{line!r}: not a command")
            continue
        known = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
        if options - known:
            bad.append(f"{line!r}: {sorted(options - known)} not options of 'attnlab {' '.join(path)}'")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", sorted({" ".join(p) for p, _, _ in _shown_commands() if p}))
def test_every_command_the_pages_show_answers_help(path):
    res = runner.invoke(app, [*path.split(), "--help"])
    assert res.exit_code == 0 and "Usage" in res.output, res.output


@pytest.mark.parametrize(
    "line, expect",
    [
        ("attnlab --version", "attnlab "),
        ('attnlab explain "I saw a saw"', "saw"),
    ],
)
def test_the_short_commands_run_for_real(line, expect):
    assert line in TEXT
    res = runner.invoke(app, shlex.split(line)[1:])
    assert res.exit_code == 0 and expect in res.output, res.output


def _benchmark_pages():
    spec = importlib.util.spec_from_file_location("benchmark_pages", DOCS / "_ext" / "benchmark_pages.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_benchmark_pages_are_written_from_the_files(tmp_path):
    """One page per topic, its dates newest first, each file embedded from the file itself (a JSON
    file's records as a table of its own numbers); pages of topics that are gone are removed."""
    pages = _benchmark_pages()
    results, docs = tmp_path / "benchmarks" / "results", tmp_path / "docs"
    results.mkdir(parents=True)
    docs.mkdir()
    (results / "speed-2026-01-02-cpu2.txt").write_text("variant  seconds\ndense    1.25\n")
    (results / "speed-2026-03-04-cpu2.json").write_text('{"records": [{"variant": "dense", "seconds": 0.123456}], "slope": 1.97}')
    (results / "speed-2026-03-04-cpu2.png").write_bytes(b"\x89PNG")
    (results / "viewer-law-2026-01-02.png").write_bytes(b"\x89PNG")
    (results / "notes.md").write_text("not a result")
    (results / "index-2026-01-02-cpu2.txt").write_text("a topic named like the pages' own index")
    (docs / "benchmarks").mkdir()
    (docs / "benchmarks" / "gone.md").write_text("# gone\n")
    skipped: list[str] = []
    assert pages.generate(docs, results, skipped) == ["speed", "viewer-law"]
    assert skipped == ["index-2026-01-02-cpu2.txt", "notes.md"]
    with pytest.raises(FileNotFoundError, match="no benchmark results folder"):
        pages.generate(docs, tmp_path / "none")
    speed = (docs / "benchmarks" / "speed.md").read_text()
    assert speed.index("## 2026-03-04") < speed.index("## 2026-01-02")
    assert "| dense | 0.1235 |" in speed and '"slope": 1.97' in speed
    assert "```{literalinclude} ../../benchmarks/results/speed-2026-01-02-cpu2.txt" in speed
    assert "![speed, 2026-03-04](../../benchmarks/results/speed-2026-03-04-cpu2.png)" in speed
    assert "{download}`speed-2026-03-04-cpu2.json <../../benchmarks/results/speed-2026-03-04-cpu2.json>`" in speed
    index = (docs / "benchmarks" / "index.md").read_text()
    assert "[viewer-law](viewer-law.md)" in index and "\nspeed\nviewer-law\n" in index
    assert not (docs / "benchmarks" / "gone.md").exists()


def test_every_benchmark_topic_is_linked_from_a_guide():
    topics = _benchmark_pages().scan(ROOT / "benchmarks" / "results")
    guides = "\n".join(text for page, text in PAGES.items() if page.startswith("docs/guides/"))
    assert len(topics) > 20
    unlinked = [t for t in topics if f"(../benchmarks/{t}.md)" not in guides]
    assert not unlinked, f"benchmark topics no guide links to: {unlinked}"


def test_make_install_installs_everything_and_runs_nothing_and_the_readme_says_so():
    """Issue 58: the only install-only target was the file ``make .venv/bin/attnlab``."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    makefile = (ROOT / "Makefile").read_text()
    phony = re.search(r"^\.PHONY:(.*)$", makefile, re.M).group(1).split()
    rule = re.search(r"^install:(.*)\n(.*)", makefile, re.M)
    assert "install" in phony and rule.group(1).split() == ["system", "$(BIN)/attnlab"] and not rule.group(2).startswith("\t")
    dry = subprocess.run(["make", "-n", "install"], cwd=ROOT, capture_output=True, text=True)
    assert dry.returncode == 0 and "pytest" not in dry.stdout and "arena" not in dry.stdout, dry.stdout + dry.stderr
    section = README.split("## Set-up: the two commands", 1)[1].split("\n## ", 1)[0]
    setup = next(block for block in section.split("\n\n") if block.startswith("    make "))  # the section's commands
    assert [line.split()[1] for line in setup.splitlines() if line.startswith("    make ")] == ["demo", "test"]
    assert "`make install`" in README.split("For the edit-test loop", 1)[1].split("\n\n")[0]
