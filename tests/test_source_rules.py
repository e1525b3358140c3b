"""House rules read from the source of src/attnlab: no module uses another module's private names,
no function is longer than :data:`MAX_FUNCTION_LINES` lines (no file over 450 lines:
tests/core/test_blockmap.py), and no docstring or comment carries a dated figure
(:data:`DATED_FIGURE`: measurements belong in benchmarks/results/).

Private: a name with a leading underscore that is not a dunder (``__init__``, ``__dict__`` are
public). A module may use its own private names; it may not

- import one from another attnlab module (``from .x import _helper``; importing a submodule
  under a private alias, ``from . import local as _local``, imports the public module ``local``:
  the rule is about the name imported, not the alias);
- read one as an attribute of an imported attnlab module or class (``masks._helper``,
  ``RingContext._plans``);
- read a private attribute of any other object (``layer._check_input``, ``ctx._plans``) unless
  this module defines that name itself (on ``self``, in a class body, as a function): the
  detectable case of "another class's private attribute" (``self``, ``cls``, ``super()`` and
  ``type(self)`` are the module's own).

Third-party private names (``typer._click``, ``torch.utils._pytree``, ``t._version``) follow the
same rules; where the third party has no public alternative they are in :data:`ALLOWED`, each with
its reason. ``getattr`` / ``hasattr`` / ``setattr`` / ``delattr`` with a literal name count as
attribute access.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import NamedTuple

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PKG = SRC / "attnlab"
MAX_FUNCTION_LINES = 80
"""The longest a function or method may be, counted from its first statement after the docstring to its end."""

ALLOWED = {
    ("attnlab.cli.errors", "typer._click"):
        "typer >= 0.26 vendors click as typer._click and raises its exceptions; the click package is no longer a typer "
        "dependency and its classes are others (typer 0.29: no public path to NoArgsIsHelpError / ClickException)",
    ("attnlab.studies.complexity", "torch.utils._python_dispatch"):
        "TorchDispatchMode, the hook that sees every aten op, has no public module in torch (2.13)",
    ("attnlab.studies.complexity", "torch.utils._pytree"):
        "tree_leaves of a dispatch call's (args, kwargs): torch 2.13 has no public pytree module",
    ("attnlab.studies.complexity", "._schema"):
        "an OpOverload's schema (which outputs alias or write their inputs) is only exposed as func._schema",
    ("attnlab.profiling", "._scaled_dot_product_flash_attention_for_cpu"):
        "the name of PyTorch's CPU flash-attention ATen op (ATen names its internal ops with an underscore)",
    ("attnlab.profiling", "._scaled_dot_product_flash_attention_for_cpu_backward"): "its backward op, likewise",
    ("attnlab.core.sparse", "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu"):
        "the fused CPU kernel the block-sparse engine calls: an ATen op whose name starts with an underscore",
    ("attnlab.core.sparse", "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward"): "its backward op, likewise",
    ("attnlab.layers.projection", "._version"):
        "a tensor's version counter (bumped by every in-place write) is only exposed as Tensor._version",
    ("attnlab.positional.floater", "._version"):
        "a tensor's version counter (bumped by every in-place write) is only exposed as Tensor._version",
    ("attnlab.integrations.transformers", "._attn_implementation"):
        "transformers 5 reads and sets the attention in force as config._attn_implementation (no public getter)",
}
"""``(module, private name)`` -> why there is no public alternative. The name: the dotted path for a
module or an imported object, ``.attr`` for an attribute of any other object."""


class Use(NamedTuple):
    line: int
    name: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.name}"


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_module(dotted: str) -> bool:
    """Whether ``dotted`` names a module or package of attnlab."""
    path = SRC / Path(*dotted.split("."))
    return (path / "__init__.py").exists() or path.with_suffix(".py").exists()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _target(node: ast.ImportFrom, package: str) -> str:
    """The absolute module of a ``from ... import``."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _bindings(tree: ast.AST, package: str) -> dict[str, str]:
    """Every name an import binds (function-local imports included), to the dotted path it stands for."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                bound[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            target = _target(node, package)
            for a in node.names:
                bound[a.asname or a.name] = f"{target}.{a.name}"
    return bound


def _own(tree: ast.AST) -> set[str]:
    """The private names the module defines: functions, classes, assigned names, attributes set on ``self`` / ``cls``."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
            own.add(node.attr)
    return {n for n in own if is_private(n)}


def _is_self(node: ast.AST) -> bool:
    """``self``, ``cls``, ``super()``, ``type(self)``: the object's own class (or its bases)."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id == "super" or (node.func.id == "type" and len(node.args) == 1 and _is_self(node.args[0]))
    return False


def _dotted(node: ast.AST, bound: dict[str, str]) -> str | None:
    """The dotted path of ``a.b.c`` when its root ``a`` is a name an import bound, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in bound:
        return ".".join([bound[node.id], *reversed(parts)])
    return None


def _attribute(obj: ast.AST, attr: str, bound: dict[str, str], own: set[str]) -> str | None:
    """What reading the private ``attr`` of ``obj`` uses (None when it is allowed by the rules)."""
    if _is_self(obj):
        return None
    path = _dotted(obj, bound)
    if path is not None:  # an imported module or object: attnlab's or a third party's
        full = f"{path}.{attr}"
        return None if path.split(".")[0] == "attnlab" and _is_module(full) else full
    return None if attr in own else f".{attr}"


ATTRIBUTE_FUNCTIONS = ("getattr", "hasattr", "setattr", "delattr")


def _literal_attribute(node: ast.AST) -> str | None:
    """The attribute name of ``getattr(obj, "name", ...)`` (``hasattr``, ``setattr``, ``delattr``), else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ATTRIBUTE_FUNCTIONS):
        return None
    if len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
        return node.args[1].value
    return None


def private_uses(source: str, module: str, is_package: bool = False) -> list[Use]:
    """The uses of other modules' private names in ``source``, the code of attnlab module ``module``."""
    tree = ast.parse(source)
    package = module if is_package else module.rpartition(".")[0]
    bound, own = _bindings(tree, package), _own(tree)
    uses = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _target(node, package)
            if target.split(".")[0] == "attnlab":
                names = [f"{target}.{a.name}" for a in node.names if is_private(a.name)]
                uses += [Use(node.lineno, name) for name in names if not _is_module(name)]
                continue
            if any(is_private(p) for p in target.split(".")):
                uses.append(Use(node.lineno, target))
            uses += [Use(node.lineno, f"{target}.{a.name}") for a in node.names if is_private(a.name)]
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] != "attnlab" and any(is_private(p) for p in parts):
                    uses.append(Use(node.lineno, a.name))
        elif isinstance(node, ast.Attribute) and is_private(node.attr):
            name = _attribute(node.value, node.attr, bound, own)
            if name is not None:
                uses.append(Use(node.lineno, name))
        elif (attr := _literal_attribute(node)) is not None and is_private(attr):
            name = _attribute(node.args[0], attr, bound, own)
            if name is not None:
                uses.append(Use(node.lineno, name))
    return sorted(set(uses))


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``{qualified name: lines}`` of the functions and methods of ``source`` longer than ``limit``
    lines, counted from the first statement after the docstring (its decorators included) to the end."""
    out = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                body = child.body
                if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                    body = body[1:]
                if body:
                    first = min([body[0].lineno] + [d.lineno for d in getattr(body[0], "decorator_list", [])])
                    if (n := child.end_lineno - first + 1) > limit:
                        out[name] = n
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return out


FILES = sorted(PKG.rglob("*.py"))


@functools.cache  # the two tests that read it share one pass over the source
def _found() -> dict[tuple[str, str], list[Use]]:
    found: dict[tuple[str, str], list[Use]] = {}
    for path in FILES:
        module = _module_name(path)
        for use in private_uses(path.read_text(), module, is_package=path.name == "__init__.py"):
            found.setdefault((module, use.name), []).append(use)
    return found


def test_no_module_uses_another_modules_private_names():
    found = _found()
    bad = [f"{module}: {use}" for (module, name), uses in sorted(found.items()) if (module, name) not in ALLOWED for use in uses]
    assert not bad, "private names of other modules:\n" + "\n".join(bad)


def test_every_allowed_private_name_is_still_used():
    found = _found()
    stale = [key for key in ALLOWED if key not in found]
    assert not stale, f"allowed but no longer used (remove them from ALLOWED): {stale}"


def test_no_function_is_longer_than_80_lines():
    long = {f"{path.relative_to(SRC)}: {name}": n for path in FILES for name, n in long_functions(path.read_text()).items()}
    assert not long, long


POSITIONAL_LIMIT = 6
"""The most positional parameters of a private helper (``self`` / ``cls`` not counted): more go by
name (keyword-only) or travel in a small named context."""

# (module path, function) allowed over the limit: none (the recurrence's chunk functions take their state, offsets
# and chunk length by name)
MANY_POSITIONAL: set[tuple[str, str]] = set()


def many_positional(source: str) -> list[tuple[str, int]]:
    """The private functions and lambdas of ``source`` with more than :data:`POSITIONAL_LIMIT`
    positional parameters, as (name, count)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            name = getattr(node, "name", "<lambda>")
            count = len([a for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")])
            if name.startswith("_") and not name.startswith("__") or name == "<lambda>":
                if count > POSITIONAL_LIMIT:
                    out.append((name, count))
    return out


def test_no_private_helper_takes_more_than_6_positional_parameters():
    found = {(str(path.relative_to(PKG)), name) for path in FILES for name, _ in many_positional(path.read_text())}
    assert not found - MANY_POSITIONAL, sorted(found - MANY_POSITIONAL)
    assert not MANY_POSITIONAL - found, f"no longer over the limit: remove from MANY_POSITIONAL {MANY_POSITIONAL - found}"


@pytest.mark.parametrize(("source", "expected"), [
    ("def _f(a, b, c, d, e, f, g): pass", [("_f", 7)]),
    ("def _f(a, b, c, d, e, f, *, g): pass", []),
    ("class A:\n    def _m(self, a, b, c, d, e, f): pass", []),
    ("def public(a, b, c, d, e, f, g): pass", []),
    ("run = lambda a, b, c, d, e, f, g: a", [("<lambda>", 7)]),
])
def test_the_positional_parameter_counter(source, expected):
    assert many_positional(source) == expected


LINE_LIMIT = 120
"""The longest line of the package's source (tests and benchmarks keep ruff's wider limit)."""


def test_no_source_line_is_longer_than_120_characters():
    long = [f"{path.relative_to(SRC)}:{no}" for path in FILES
            for no, line in enumerate(path.read_text().splitlines(), 1) if len(line) > LINE_LIMIT]
    assert not long, long


# ------------------------------------------------------------------------ the checkers themselves


@pytest.mark.parametrize(
    ("source", "module", "expected"),
    [
        # (a) importing another module's private name, relative or absolute, function-local too
        ("from ..core.attend import _helper\n", "attnlab.layers.probe", ["attnlab.core.attend._helper"]),
        ("def f():\n    from attnlab.masks import _private as p\n", "attnlab.layers.probe", ["attnlab.masks._private"]),
        ("from . import _nothing_here\n", "attnlab.efficient.probe", ["attnlab.efficient._nothing_here"]),
        # (b) a private name read from an imported attnlab module
        ("from ..core import masks\nmasks._helper()\n", "attnlab.layers.probe", ["attnlab.core.masks._helper"]),
        ("import attnlab.core.masks as m\nm._helper\n", "attnlab.layers.probe", ["attnlab.core.masks._helper"]),
        ("import attnlab.core\nattnlab.core.masks._helper\n", "attnlab.layers.probe", ["attnlab.core.masks._helper"]),
        # (c) a private attribute of an imported class, or of another object the module does not define
        ("from ..distributed.context import RingContext\nRingContext._plans\n", "attnlab.layers.probe",
         ["attnlab.distributed.context.RingContext._plans"]),
        ("def f(layer, x):\n    layer._check_input(x)\n", "attnlab.layers.probe", ["._check_input"]),
        ("def f(new):\n    new._step_hooks.clear()\n", "attnlab.layers.probe", ["._step_hooks"]),
        ("class A:\n    def f(self):\n        return self.proj._cache\n", "attnlab.layers.probe", ["._cache"]),
        ("def f(ctx):\n    return getattr(ctx, '_plans', None)\n", "attnlab.layers.probe", ["._plans"]),
        # third parties: private modules, names and attributes
        ("from typer._click import exceptions\n", "attnlab.cli.probe", ["typer._click"]),
        ("import typer\ntyper._click.exceptions\n", "attnlab.cli.probe", ["typer._click"]),
        ("import torch._refs\n", "attnlab.core.probe", ["torch._refs"]),
        ("from torch.utils._pytree import tree_leaves\n", "attnlab.core.probe", ["torch.utils._pytree"]),
        ("import torch\ntorch.ops.aten._op\n", "attnlab.core.probe", ["torch.ops.aten._op"]),
        ("from transformers import Llama\nLlama._from_config(c)\n", "attnlab.studies.probe", ["transformers.Llama._from_config"]),
        ("def f(t):\n    return t._version\n", "attnlab.core.probe", ["._version"]),
    ],
)
def test_the_private_name_checker_catches(source, module, expected):
    assert [u.name for u in private_uses(source, module)] == expected


@pytest.mark.parametrize(
    ("source", "module", "is_package"),
    [
        # a public submodule imported under a private alias (registration), relative and absolute
        ("from . import local as _local\n_local.LocalAttention\n", "attnlab.efficient", True),
        ("from attnlab.efficient import local as _local\n", "attnlab.layers.probe", False),
        ("import attnlab.efficient.local as _local\n", "attnlab.layers.probe", False),
        # the module's own private names, on self, cls, super(), type(self) or any object
        ("class A:\n    _n = 1\n    def __init__(self):\n        self._x = 1\n        super()._setup()\n"
         "    def f(self, other):\n        return other._x + type(self)._n + self._y\n", "attnlab.layers.probe", False),
        ("def _helper():\n    pass\n\ndef f(mod):\n    return mod._helper\n", "attnlab.layers.probe", False),
        # dunders are not private
        ("import torch\ndef f(x):\n    return x.__dict__, torch.__version__, x.__class__.__name__\n", "attnlab.layers.probe", False),
        ("from attnlab import __version__\n", "attnlab.layers.probe", False),
        # public names of other modules
        ("from ..core.attend import attend\nfrom ..core import masks\nmasks.causal()\n", "attnlab.layers.probe", False),
    ],
)
def test_the_private_name_checker_allows(source, module, is_package):
    assert private_uses(source, module, is_package=is_package) == []


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines()) + "\n"


def test_the_function_length_checker_counts_from_the_first_statement_after_the_docstring():
    docstring = '    """' + "\n".join(["doc"] * 30) + '"""\n'
    body = "    x = 1\n" * 79 + "    return x\n"  # 80 lines: the limit
    assert long_functions("def f():\n" + docstring + body) == {}
    over = "class A:\n    def g(self):\n" + _indent(docstring + body + "    pass\n")
    assert long_functions(over) == {"A.g": 81}
    nested = "def outer():\n    def inner():\n" + _indent(body + "    pass\n") + "    return inner\n"
    assert long_functions(nested) == {"outer": 83, "outer.inner": 81}


# ------------------------------------------------------------------------ no dated figure in src/ (issue 60)

UNIT = r"(?:ns|us|µs|ms|s|secs?|seconds?|mins?|minutes?|h|hours?|[KMGT]iB|[kKMGT]B)(?![\w/^])"
"""A unit of time or memory, as a word of its own (not ``s/step``, ``MB/s``, ``seconds_per_step``)."""
NUMBER = r"(?<![\w.^])\d[\d,]*(?:\.\d+)?"
"""A number standing alone: not part of a name (``fp32``), a version (``2.13.0``) or a power (``2^23``)."""
TIMED = r"(?:took|takes|taking|ran in|runs in|measured at|measured in)"
RATIO = r"(?:faster|slower|quicker|the time|as fast|as slow|as long)"
DATED_FIGURE = re.compile("|".join(f"(?:{rule})" for rule in (
    r"(?<![\w-])20\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])(?![\w-])",  # a date: 2026-11-26
    rf"(?<![\w.^])\d+\.\d+\s?{UNIT}",  # a decimal amount: 0.17 s, 9.48 GB
    rf"(?:\b(?:about|around|roughly|nearly|almost|approximately)\s+|[~≈]\s?){NUMBER}\s?{UNIT}",  # about 500 MiB
    rf"\b{TIMED}\s+{NUMBER}\s?(?:ms|s|seconds?|minutes?|hours?)(?!\w)",  # took 20 minutes
    rf"{NUMBER}\s?{UNIT},?\s+(?:against|vs\.?|versus|for one)\s",  # 100 s for one product, 3 s against 4 s
    rf"{NUMBER}\s?(?:x|×|times)\s+{RATIO}\b",  # 10x slower, 2.6x the time
)))
"""A measurement quoted in prose: a date, or an amount of time or memory that reads as measured (a
decimal, an approximate or timed one, one compared against another, a speed ratio). A whole number
with its unit stays allowed: that is how a setting reads (``25 ms windows``, ``at most 32 MiB``)."""


def dated_figures(text: str) -> list[tuple[int, str]]:
    """``(line, figure)`` of every match of :data:`DATED_FIGURE` in ``text`` (a figure may span lines)."""
    return [(text.count("\n", 0, m.start()) + 1, " ".join(m.group().split())) for m in DATED_FIGURE.finditer(text)]


def test_no_dated_figure_in_src():
    files = sorted(p for p in PKG.rglob("*") if p.suffix in (".py", ".html") and "__pycache__" not in p.parts)
    found = [f"{p.relative_to(SRC)}:{line}: {figure!r}" for p in files for line, figure in dated_figures(p.read_text())]
    assert not found, ("measurements belong in benchmarks/results/; say what the code does and why, and name the "
                       "results file or benchmark page:\n" + "\n".join(found))


@pytest.mark.parametrize("text", [
    "the lookup scores, measured 2026-11-26",
    "(at 16K: 0.17 s, against 0.42 s)",
    "one chunkwise scan of Gated DeltaNet kept about 500 MiB",
    "its N x N weights make each step ~13 s",
    "Transformer 9.48 GB vs Linformer 0.99 GB at 4K",
    "an RNN step came out 10x slower",
    "rope at width 128 0.958 (2.6x\nthe time)",
    "The defaults took 20 minutes on a 2-core CPU",
    "an AVX2-only CPU: 100 s for one 2048^3 product",
    "The CNN's fixed cost per call (about 0.08 ms)",
    "  # backward at N = 16K: 0.16 s, against\n  # 0.20 s on a transposed view",
])
def test_the_dated_figure_detector_catches(text):
    assert dated_figures(text), text


@pytest.mark.parametrize("text", [
    "timeout: seconds per step, or None",
    '["variant", "N", "seconds", "peak MiB", "speed-up"]',
    "torch 2.13 has no public pytree module; fla 0.6.0; Python 3.11",
    "assert err < 1e-9, within 1e-12 in float64",
    "a 64K-token document, 16K tokens, N = 16384, 2^23 elements",
    "25 ms windows, every 10 ms: 100 frames per second",
    "a block above its mmap threshold (at most 32 MiB); 4 MiB in fp32; 8 GiB where /proc/meminfo does not say",
    "more while they fit 4 s; one for a step over 20 s",
    "its padded slots stay within 1.3x of the tiles; a ratio: ``1.23x``",
    "Yang, Kautz & Hatamizadeh 2025; Tay et al. 2021, Table 2",
    'f"{ratio:.2f}x faster" if ratio >= 1 else f"({self.seconds:.3g} s each)"',
    "at 16K one step takes tens of seconds; results in benchmarks/results/segments-*",
    "``step 21, 12 s of 30 s,``; benchmarks/results/<topic>-YYYY-MM-DD-<cpu>.txt",
])
def test_the_dated_figure_detector_allows(text):
    assert dated_figures(text) == [], text
