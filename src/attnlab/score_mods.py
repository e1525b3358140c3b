"""Score functions (``attnlab.score_mods``): ``score_mod(score, b, h, q_idx, kv_idx) -> score``.

This module is :mod:`attnlab.core.score_mods` under its public name.
"""

from .core.score_mods import *  # noqa: F403
from .core.score_mods import __all__  # noqa: F401
