"""When a score means less than it seems: too few test examples, too few steps, a busy machine.

``attnlab train`` prints these caveats beside its score and the arena's leaderboard marks the
cells they apply to; the thresholds are here, in one place.
"""

from __future__ import annotations

import statistics

__all__ = ["BUSY_RATIO", "MIN_STEPS", "MIN_TEST", "busy", "few_steps", "tiny_test"]

MIN_TEST = 30
"""A test split with fewer examples (or nodes) than this is tiny: one example moves accuracy by more than 3 points."""

MIN_STEPS = 50
"""A time-budgeted run that got fewer optimizer steps than this was stopped before it learnt much."""

BUSY_RATIO = 0.5
"""A time-budgeted run whose steps per second fell below this fraction of the same configuration's
earlier runs ran on a busy machine: it got fewer steps than its budget buys."""


def tiny_test(size: int, unit: str = "examples", split: str = "test") -> str | None:
    """A caveat when a score is measured on fewer than :data:`MIN_TEST` examples of ``split`` (None otherwise)."""
    if size >= MIN_TEST:
        return None
    one = unit[:-1] if unit.endswith("s") else unit
    return (f"the {split} split has only {size} {unit}: one {one} moves the score by {1 / max(size, 1):.3f}; "
            f"use more data (at least {MIN_TEST}) for a score that means something")


def few_steps(steps: int, timed: bool) -> str | None:
    """A caveat when a time-budgeted run took fewer than :data:`MIN_STEPS` steps (None otherwise)."""
    if not timed or steps >= MIN_STEPS:
        return None
    return (f"the time budget allowed only {steps} optimizer steps (fewer than {MIN_STEPS}): the score says little; "
            "give more seconds")


def busy(steps_per_second: float | None, earlier: list[float]) -> str | None:
    """A caveat when a run's speed is under :data:`BUSY_RATIO` of the median of ``earlier`` runs'
    speeds of the same configuration (None otherwise, or when there are none to compare with)."""
    earlier = [x for x in earlier if x]
    if not steps_per_second or not earlier:
        return None
    typical = statistics.median(earlier)
    if steps_per_second >= BUSY_RATIO * typical:
        return None
    return (f"this run made {steps_per_second:.1f} steps/s, {steps_per_second / typical:.2f}x the {typical:.1f} "
            "steps/s of the same configuration's other runs: the machine was busy and the run got fewer steps than its "
            "budget buys")
