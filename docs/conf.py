"""Sphinx configuration of attnlab's documentation site.

Build it with ``make docs`` (or ``sphinx-build -W --keep-going -b html docs docs/_build/html``) and
open ``docs/_build/html/index.html``. The pages are Markdown (MyST); the API reference comes from
the docstrings (autodoc + napoleon, Google style); the benchmark pages are generated from
``benchmarks/results/`` by ``_ext/benchmark_pages.py``, the table of attention variants from the
registry by ``_ext/variant_table.py``.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(DOCS / "_ext"))

# attnlab installed (make installs it editable into .venv) or, failing that, the source tree
if importlib.util.find_spec("attnlab") is None:
    sys.path.insert(0, str(ROOT / "src"))

try:
    release = _version("attnlab")
except PackageNotFoundError:  # a source tree that is not installed: pyproject.toml says
    import tomllib

    release = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
version = ".".join(release.split(".")[:2])

project = "attnlab"
author = "the attnlab authors"
copyright = "attnlab authors"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_parser",
    "benchmark_pages",
    "variant_table",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = [
    "_build",
    "Thumbs.db",
    ".DS_Store",
]

# -- MyST ------------------------------------------------------------------------------------
myst_heading_anchors = 4  # [text](page.md#a-heading) links, as on GitHub
myst_enable_extensions = ["colon_fence"]

# -- autodoc / napoleon ----------------------------------------------------------------------
autodoc_default_options = {
    "members": True,
    "undoc-members": False,
    "show-inheritance": True,
    "member-order": "bysource",
}
autodoc_typehints = "description"  # hints beside the parameters, not in long signatures
autodoc_typehints_description_target = "documented"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_class_signature = "mixed"
autoclass_content = "class"
# every optional extra is installed by `make`; a bare install mocks what is missing
autodoc_mock_imports = [
    name
    for name in ("librosa", "soundfile", "rdkit", "sklearn", "torchdiffeq", "networkx", "transformers")
    if importlib.util.find_spec(name) is None
]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_attr_annotations = True
# "Attributes:" sections as fields of their class: autodoc documents a dataclass's fields as
# members too, and two descriptions of one attribute are a duplicate-object warning
napoleon_use_ivar = True
# Docstrings name torch, numpy and standard-library objects with Sphinx roles; without
# intersphinx (no network at build time) those cannot resolve, so unresolved references are
# plain text rather than warnings.
nitpicky = False

# -- HTML ------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"attnlab {release}"
html_static_path: list[str] = []
html_theme_options = {"navigation_with_keys": True}


# -- Docstrings: several names to one description -------------------------------------------
_SECTION = re.compile(r"^(\s*)Attributes:\s*$")
_MANY_NAMES = re.compile(r"^(\s*)([A-Za-z_]\w*(?:\s*,\s*[A-Za-z_]\w*)+)(\s*:(?:\s|$))")


def _join_attribute_names(lines: list[str]) -> None:
    """``k, v: ...`` in an "Attributes:" section becomes ``k,v: ...``: napoleon writes each entry as
    ``:ivar NAME:``, and a space inside NAME would make its first word a type (a cross-reference to
    whatever attribute is called ``k``)."""
    section = None  # the indent of the open "Attributes:" header
    for i, line in enumerate(lines):
        m = _SECTION.match(line)
        if m:
            section = len(m[1])
            continue
        if section is None or not line.strip():
            continue
        if len(line) - len(line.lstrip()) <= section:
            section = None
            continue
        m = _MANY_NAMES.match(line)
        if m:
            lines[i] = m[1] + ",".join(n.strip() for n in m[2].split(",")) + m[3] + line[m.end():]


def _attribute_names(app, what, name, obj, options, lines):
    _join_attribute_names(lines)


def setup(app):
    app.connect("autodoc-process-docstring", _attribute_names, priority=100)  # before napoleon (500)
