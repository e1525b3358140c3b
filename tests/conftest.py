"""Hypothesis profile for the whole suite (helpers live in tests/helpers.py)."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "attnlab",
    deadline=None,
    max_examples=int(os.environ.get("ATTNLAB_HYPOTHESIS_EXAMPLES", "60")),
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,  # the same examples every run: CI is reproducible
)
settings.load_profile("attnlab")


