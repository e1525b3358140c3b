"""The way from a layer to its math (issue 60): how many attnlab functions and files one forward
runs through, and how deep the stack is at the recurrence, measured with ``sys.setprofile``.

The issue's targets hold for the gated family: gated_deltanet and mamba2 run through at most 40
functions in at most 8 files, the stack at the recurrence at most 8 frames deep (before the
redesign: gated_deltanet 70 functions in 15 files, 8 frames; mamba2 69, 15, 8). The other bounds
are today's counts, which may not grow (before: retnet 66, 15; deltaproduct 71, 15, 10; dense 39,
14; local 53, 18): dense's target of 20 functions is not reached (its way runs through
``attnlab.attend``'s checks and backend choice, and the score's protocol). benchmarks/call_path.py
prints every variant's counts. Comprehensions count as part of their function (Python 3.12
inlines them), so the stack at the recurrence is one frame shallower than a count of Python
3.11's frames.
"""

import sys

import pytest
import torch

from attnlab import efficient
from attnlab.profiling import call_path
from attnlab.validate import positive_int

TARGETS = ("chunk_delta", "chunk_gated")  # the recurrences, as benchmarks/call_path.py

# variant: (functions, files, attnlab frames at the recurrence or None)
BOUNDS = {"gated_deltanet": (40, 8, 6), "mamba2": (39, 8, 6), "retnet": (37, 8, 6), "deltaproduct": (39, 8, 7),
          "comba": (40, 9, 6), "dense": (30, 10, None), "local": (46, 16, None)}


def test_call_path_counts_each_function_once_with_its_calls_and_the_depth_of_a_target():
    path = call_path(lambda: [positive_int("n", 3), positive_int("n", 4)], ("is_int",))
    assert path.functions == {"validate.py:positive_int": 2, "validate.py:int_at_least": 2, "validate.py:is_int": 2}
    assert path.files == {"validate.py"} and path.calls == 6
    assert path.depth == {"is_int": 2}  # positive_int -> int_at_least -> is_int: two attnlab frames below it


def test_call_path_restores_the_profiler_when_the_call_raises():
    with pytest.raises(ValueError):
        call_path(lambda: positive_int("n", 0))
    assert sys.getprofile() is None


def test_call_path_sets_the_profiler_of_before_again():
    def before(frame, event, arg):
        return None

    sys.setprofile(before)
    try:
        call_path(lambda: positive_int("n", 3))
        assert sys.getprofile() is before
    finally:
        sys.setprofile(None)


@pytest.mark.parametrize(("fn", "targets", "message"), [
    (3, (), "a function of no arguments, got int"),
    (lambda: None, "chunk_delta", "a tuple of function names"),  # a string would match by its letters
    (lambda: None, ("chunk_delta", 1), "a tuple of function names"),
])
def test_call_path_refuses_what_it_cannot_measure(fn, targets, message):
    with pytest.raises(TypeError, match=message):
        call_path(fn, targets)


@pytest.mark.parametrize("name", BOUNDS)
def test_one_forward_runs_through_no_more_functions_files_and_frames_than_before(name):
    torch.manual_seed(0)
    layer = efficient.create(name, embed_dim=32, num_heads=4)
    x = torch.randn(1, 128, 32)
    layer(x)  # the first call may import and register
    path = call_path(lambda: layer(x), TARGETS)
    functions, files, depth = BOUNDS[name]
    assert len(path.functions) <= functions, sorted(path.functions)
    assert len(path.files) <= files, sorted(path.files)
    if depth is None:
        assert path.depth == {}
    else:
        assert set(path.depth) <= set(TARGETS) and max(path.depth.values()) <= depth
