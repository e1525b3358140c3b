"""Scoring under the run's seed: the same draws whatever the caller's generator, which is left as it was."""

import pytest
import torch

from attnlab.training.draws import drawn_from


def test_the_draws_inside_are_the_seed_s_and_the_caller_s_state_comes_back():
    torch.manual_seed(0)
    expected = torch.rand(3)
    for caller in (1, 2):
        torch.manual_seed(caller)
        before = torch.get_rng_state()
        with drawn_from(0):
            assert torch.equal(torch.rand(3), expected)
        assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("seed", ["0", 1.5, True, None])
def test_a_seed_that_is_not_an_int_is_refused(seed):
    with pytest.raises(TypeError, match="seed must be an int"), drawn_from(seed):
        pass
