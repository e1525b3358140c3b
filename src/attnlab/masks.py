"""Masks (``attnlab.masks``): functions of positions, True = this query may attend to this key.

This module is :mod:`attnlab.core.masks` under its public name (the masks, their combinators and
:func:`block_map`); see there for the convention and the alignment of positions when the numbers
of queries and keys differ.
"""

from .core.masks import *  # noqa: F403
from .core.masks import __all__  # noqa: F401
