"""When a score means less than it seems: the exact limits of the three caveats."""

import pytest

from attnlab import tasks
from attnlab.training.caveats import BUSY_RATIO, MIN_STEPS, MIN_TEST, busy, few_steps, tiny_test


def test_tiny_test_split_below_its_limit_only():
    assert tiny_test(MIN_TEST) is None
    assert tiny_test(MIN_TEST - 1) == (f"the test split has only {MIN_TEST - 1} examples: one example moves the score by "
                                       f"{1 / (MIN_TEST - 1):.3f}; use more data (at least {MIN_TEST}) for a score that means something")
    assert tiny_test(2, "nodes", "val").startswith("the val split has only 2 nodes: one node moves the score by 0.500")


def test_few_steps_only_for_time_budgets():
    assert few_steps(MIN_STEPS - 1, timed=False) is None  # a step budget is what the user asked for
    assert few_steps(MIN_STEPS, timed=True) is None
    assert f"only {MIN_STEPS - 1} optimizer steps" in few_steps(MIN_STEPS - 1, timed=True)


def test_busy_against_the_median_of_the_same_setup():
    assert busy(5.0, []) is None and busy(None, [10.0]) is None  # nothing to compare
    assert busy(BUSY_RATIO * 10.0, [9.0, 10.0, 30.0]) is None  # exactly at the limit: not flagged
    assert busy(4.9, [9.0, 10.0, 30.0]) .startswith("this run made 4.9 steps/s, 0.49x the 10.0 steps/s")


@pytest.mark.parametrize("task, expected", [("karate", (12, "nodes")), ("pos", (500, "examples"))])
def test_split_size_counts_what_the_score_is_measured_on(task, expected):
    # karate: the 12 labelled test members of one graph (README); pos: 500 test sentences
    assert tasks.create(task).split_size("test") == expected
