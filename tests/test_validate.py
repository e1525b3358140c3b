"""The shared argument checks: what they accept, what they return, how they say no."""

import pytest

from attnlab.validate import choice, int_at_least, is_int, number_above, optional_int, positive_int, probability


def test_ints_are_ints_and_never_bools():
    assert is_int(3) and is_int(0) and not is_int(True) and not is_int(2.0) and not is_int(None)
    assert positive_int("n", 3) == 3 and int_at_least("w", 0, 0) == 0
    for bad in (0, -1, True, 2.0, "3", None):
        with pytest.raises(ValueError, match=r"^n must be a positive int, got "):
            positive_int("n", bad)
    with pytest.raises(ValueError, match=r"^w must be an int >= 0, got -1$"):
        int_at_least("w", -1, 0)


def test_optional_int_allows_none():
    assert optional_int("block", None) is None and optional_int("block", 4) == 4 and optional_int("t", 0, 0) == 0
    with pytest.raises(ValueError, match=r"^block must be None or a positive int, got 0$"):
        optional_int("block", 0)
    with pytest.raises(ValueError, match=r"^truncate must be None or an int >= 0, got False$"):
        optional_int("truncate", False, 0)


def test_numbers_and_probabilities():
    assert number_above("base", 10000, 1) == 10000.0 and isinstance(number_above("dt", 1, 0), float)
    for bad in (1, 0.5, True, "2", None):
        with pytest.raises(ValueError, match=r"^base must be a number > 1, got "):
            number_above("base", bad, 1)
    assert probability("p", 0) == 0.0 and probability("p", 1, inclusive_one=True) == 1.0
    for bad in (1.0, -0.1, True, "0.1"):
        with pytest.raises(ValueError, match=r"^p must be a number in \[0, 1\), got "):
            probability("p", bad)
    assert choice("mode", "a", ("a", "b")) == "a"
    with pytest.raises(ValueError, match="mode must be one of 'a', 'b', got 'c'"):
        choice("mode", "c", ("a", "b"))
