"""The approximation benchmark: errors shrink with the budget and vanish in the exact limits."""

import pytest

from attnlab.bench.approximation import run_approximation


def test_errors_shrink_with_budget_and_vanish_where_exact():
    recs = run_approximation(128, ["local", "nystrom", "performer"], seeds=1)
    by = {}
    for r in recs:
        by.setdefault(r.variant, []).append(r.error)
    # local: window 16, 64, then >= N - 1 (128 capped): exact
    assert by["local"][0] > by["local"][1] > by["local"][-1] and by["local"][-1] < 1e-12
    assert by["nystrom"][0] > by["nystrom"][-1]
    assert by["performer"][0] > by["performer"][-1]
    with pytest.raises(ValueError, match="unknown variant 'flash'"):
        run_approximation(64, ["flash"])
