"""The optional families of dependencies (pip extras), and the clear error when one is missing.

``pip install attnlab`` installs the core: torch, typer, rich, matplotlib, safetensors and
tokenizers. A task family that needs more imports it through :func:`require`, which names the
extra to install when the package is not there.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "MissingExtraError", "require"]

EXTRAS = {
    "audio": ("librosa", "soundfile"),
    "graphs": ("networkx",),
    "molecules": ("rdkit",),
    "digits": ("scikit-learn",),
    "ode": ("torchdiffeq",),
}
"""Each extra and the distributions it installs (``pip install 'attnlab[audio]'``; ``[all]`` for every one)."""


class MissingExtraError(ImportError):
    """An optional package is not installed; the message names the extra that installs it."""


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import ``module``, or raise :class:`MissingExtraError`: ``what`` needs it, install ``attnlab[extra]``.

    Args:
        module: the import name (``"rdkit"``, ``"sklearn.datasets"``).
        extra: a key of :data:`EXTRAS`.
        what: the feature that needs it, for the message (``"the molecules task"``).
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; expected one of {', '.join(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(f"{what} needs {module.split('.')[0]}, which is not installed: pip install "
                                f"'attnlab[{extra}]' (or 'attnlab[all]')") from e
