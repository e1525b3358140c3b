"""The README, executed: its Python blocks run, every ``attnlab.*`` name it mentions exists, and
every ``attnlab`` command it shows parses, with each option it names (``--help`` for all, the
short ones for real)."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest
import torch
import typer

from attnlab.cli import app
from tests.cli.helpers import runner

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def _block(words: str) -> str:
    (found,) = [b for b in BLOCKS if words in b]
    return found


def test_the_ten_lines_run_and_give_the_shapes_they_state():
    ns: dict = {}
    exec(_block("import torch, attnlab"), ns)
    assert ns["res"].output.shape == (2, 10, 64) and ns["res"].weights.shape == (2, 4, 10, 10)
    assert ns["out"].shape == (1, 4, 8192, 64) and torch.isfinite(ns["out"]).all()
    assert ns["rope"].positional.name == "rope" and len(ns["enc"].layers) == 2


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
    here = Path(__file__).read_text()
    keys = re.findall(r'_block\("([^"]+)"\)', here)
    assert all(any(key in block for key in keys) for block in BLOCKS), "a README python block no test runs"
    assert len(BLOCKS) >= 3


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


def test_every_attnlab_name_in_the_readme_exists():
    names = sorted(set(re.findall(r"\battnlab(?:\.[A-Za-z_]\w*)+", README)))
    assert len(names) > 20
    missing = []
    for name in names:
        try:
            _resolve(name)
        except (ImportError, AttributeError):
            missing.append(name)
    assert not missing, f"the README names what attnlab does not have: {missing}"


def _command(path: list[str]):
    cmd = typer.main.get_command(app)
    for word in path:
        cmd = cmd.commands[word]
    return cmd


def _shown_commands() -> list[tuple[list[str], set[str], str]]:
    """Every ``attnlab ...`` line the README shows (indented usage lines and inline code): the
    command's path of names, the options it names, the line."""
    lines = re.findall(r"^ {4}(?:torchrun [^\n]*?-m )?(attnlab [^\n]*)$", README, flags=re.M)
    lines += re.findall(r"`(attnlab (?:[a-z-]+)[^`]*)`", README)
    shown = []
    for line in lines:
        words = line.split()[1:]
        path = []
        cmd = typer.main.get_command(app)
        while words and hasattr(cmd, "commands") and words[0] in cmd.commands:
            path.append(words[0])
            cmd = cmd.commands[words.pop(0)]
        options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*|-o)\b", line))
        shown.append((path, options, line))
    return shown


def test_every_command_the_readme_shows_exists_with_the_options_it_names():
    shown = _shown_commands()
    assert len(shown) > 25
    bad = []
    for path, options, line in shown:
        cmd = _command(path)
        if hasattr(cmd, "commands"):
            if options - {"--version", "--help", "--debug"}:
                bad.append(f"{line!r}: not a command")
            continue
        known = {opt for p in cmd.params for opt in (*p.opts, *p.secondary_opts)} | {"--help"}
        if options - known:
            bad.append(f"{line!r}: {sorted(options - known)} not options of 'attnlab {' '.join(path)}'")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("path", sorted({" ".join(p) for p, _, _ in _shown_commands() if p}))
def test_every_command_the_readme_shows_answers_help(path):
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
    assert line in README
    res = runner.invoke(app, shlex.split(line)[1:])
    assert res.exit_code == 0 and expect in res.output, res.output
