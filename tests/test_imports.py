"""The house plan's import rules, read from the source: no cycle, nothing imports upward.

Every ``import`` / ``from ... import`` of every module under src/attnlab (function-local ones
included: a lazy import is still a dependency) becomes an edge between attnlab modules. The
floors, bottom to top, are :data:`FLOORS`; a module may import its own floor or below.
"""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
PKG = SRC / "attnlab"

FLOORS = [
    {"registry", "validate", "profiling", "extras", "devices"},  # helpers with no attnlab dependency
    {"core", "masks", "scores", "normalizers", "score_mods"},  # the functional core and its public faces
    {"distributed"},  # sequence parallelism: ring attention on the core's scores and normalisers
    {"positional"},
    {"layers"},
    {"efficient"},
    {"models"},
    {"pretrained", "integrations"},  # trained weights loaded into models; attnlab inside other libraries' models
    {"recurrent", "audio"},
    {"tasks"},
    {"objectives"},
    {"training"},
    {"studies", "arena", "viz", "explain"},
    {"cli", "__main__", "__init__"},
]
"""Top-level parts of attnlab from the bottom floor up (``__init__`` is the public API on top)."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_package(name: str) -> bool:
    return (SRC / Path(*name.split(".")) / "__init__.py").exists()


def _exists(name: str) -> bool:
    return _is_package(name) or (SRC / Path(*name.split("."))).with_suffix(".py").exists()


def _imports(path: Path, name: str | None = None) -> set[str]:
    """The attnlab modules ``path`` (the module ``name``, default: its place in the package) imports
    (a ``from pkg import sub`` of a submodule counts as ``pkg.sub``)."""
    name = name or _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "attnlab"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "attnlab":
                continue
            subs = [f"{target}.{a.name}" for a in node.names if _exists(f"{target}.{a.name}")]
            out |= set(subs) if subs and len(subs) == len(node.names) else {target, *subs}
    out.discard(name)
    return out


GRAPH = {_module_name(p): _imports(p) for p in sorted(PKG.rglob("*.py"))}


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _floor(module: str) -> int:
    part = _part(module)
    for i, floor in enumerate(FLOORS):
        if part in floor:
            return i
    raise AssertionError(f"{module}: part {part!r} has no floor in FLOORS (add it to tests/test_imports.py)")


def test_the_graph_was_read():
    assert len(GRAPH) > 80 and "attnlab.core.attend" in GRAPH["attnlab.layers.multihead"]
    assert "attnlab.models.base" in GRAPH["attnlab.tasks.base"]


def test_no_import_cycle():
    seen, stack, cycles = {}, [], []

    def visit(m):
        seen[m] = "open"
        stack.append(m)
        for n in sorted(GRAPH.get(m, ())):
            if n not in GRAPH:
                continue
            if seen.get(n) == "open":
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in seen:
                visit(n)
        stack.pop()
        seen[m] = "done"

    for m in sorted(GRAPH):
        if m not in seen:
            visit(m)
    # a package's __init__ importing its own submodules, which import siblings, is not a cycle
    # through the package itself unless a submodule imports the package __init__ back: counted
    assert cycles == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_nothing_imports_a_higher_floor():
    upward = [f"{m} -> {n}" for m, ns in GRAPH.items() if _part(m) != "__init__" for n in ns
              if n in GRAPH and _part(n) != "__init__" and _floor(n) > _floor(m)]
    assert upward == [], "upward imports:\n" + "\n".join(sorted(upward))


@pytest.mark.parametrize(
    ("part", "forbidden"),
    [
        ("core", {"positional", "layers", "efficient", "models", "recurrent", "tasks", "objectives", "training", "studies", "arena", "viz",
                  "cli"}),
        ("models", {"training", "arena", "tasks", "objectives", "studies", "cli"}),
        ("cli", set()),
    ],
)
def test_named_rules(part, forbidden):
    bad = [f"{m} -> {n}" for m, ns in GRAPH.items() if _part(m) == part for n in ns if _part(n) in forbidden]
    assert bad == [], "\n".join(bad)


def test_tasks_import_only_the_shared_base_of_models():
    bad = [f"{m} -> {n}" for m, ns in GRAPH.items() if _part(m) == "tasks" for n in ns
           if _part(n) == "models" and n != "attnlab.models.base"]
    assert bad == [], "\n".join(bad)


def test_only_the_cli_imports_the_cli():
    bad = [f"{m} -> {n}" for m, ns in GRAPH.items() if _part(m) not in ("cli", "__main__") for n in ns if _part(n) == "cli"]
    assert bad == [], "\n".join(bad)


def test_the_rules_catch_a_violation(tmp_path):
    """The reader sees relative, absolute and function-local imports (else the rules above pass vacuously)."""
    fake = tmp_path / "_probe_for_test.py"  # read as a module of attnlab.core, outside the package (other workers scan it)
    fake.write_text("def f():\n    from ..training import train\n    import attnlab.tasks\n    from .. import models\n")
    got = _imports(fake, "attnlab.core._probe_for_test")
    assert {"attnlab.training", "attnlab.tasks", "attnlab.models"} <= got
