"""The benchmark's own instruments: the naive implementation and the memory probe."""

import pytest
import torch

from attnlab import Additive, reference_attention
from attnlab.studies.attention import Record, naive_attention, ratios
from tests.helpers import assert_close_rel


@pytest.mark.parametrize("score, norm", [("scaled_dot", "softmax"), ("cosine", "softmax"), ("scaled_dot", "relu"), ("additive", "softmax")])
def test_naive_implementation_equals_reference(score, norm):
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 5, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 3)
    s = Additive(4, num_heads=2) if score == "additive" else score
    ref, _ = reference_attention(q, k, v, score=s, normalize=norm)
    assert_close_rel(naive_attention(q, k, v, s, norm), ref, 1e-5)



def test_ratios_are_against_sdpa_then_naive():
    recs = [
        Record("sdpa", "p", "sdpa", 8, "fwd", 1.0, 100, 1),
        Record("naive", "p", "naive", 8, "fwd", 4.0, 400, 1),
        Record("attend", "p", "sdpa", 8, "fwd", 1.5, 100, 1),
    ]
    got = {(r["impl"], r["vs"]): (r["time_ratio"], r["memory_ratio"]) for r in ratios(recs)}
    assert got[("attend", "sdpa")] == (1.5, 1.0)
    assert got[("attend", "naive")] == (0.375, 0.25)
    assert got[("naive", "sdpa")] == (4.0, 4.0)
