"""attnlab explain, checked against the library."""

import json

import pytest
import torch

import attnlab
from tests.cli.helpers import run_ok


@pytest.mark.parametrize("score", attnlab.scores.names())
@pytest.mark.parametrize("normalize", attnlab.normalizers.names())
def test_explain_json_steps_are_consistent_with_attend(score, normalize):
    ex = json.loads(run_ok("explain", "I saw a saw", "--score", score, "--normalize", normalize, "--json"))
    assert ex["tokens"] == ["I", "saw", "a", "saw"]
    q, k, v = (torch.tensor(ex[name], dtype=torch.float64) for name in ("q", "k", "v"))  # (H, N, D)
    weights = torch.tensor(ex["weights"], dtype=torch.float64)
    torch.testing.assert_close(torch.tensor(ex["output"], dtype=torch.float64), (weights @ v)[0])
    if normalize == "softmax":
        torch.testing.assert_close(weights.sum(-1), torch.ones(1, 4, dtype=torch.float64))
    # identical words, no positions: identical rows everywhere
    for name in ("inputs", "output"):
        assert ex[name][1] == ex[name][3]
    if score in ("dot", "scaled_dot", "cosine"):  # plain scores: attend() on the printed Q, K, V agrees
        res = attnlab.attend(q[None], k[None], v[None], score=score, normalize=normalize, return_weights=True)
        torch.testing.assert_close(res.weights[0], weights)


def test_explain_no_self_and_heads():
    ex = json.loads(run_ok("explain", "a b c", "--no-self", "--num-heads", "2", "--json"))
    assert len(ex["q"]) == 2 and len(ex["q"][0][0]) == 2
    for h in range(2):
        for i in range(3):
            assert ex["scores"][h][i][i] is None and ex["weights"][h][i][i] == 0.0
    assert len(ex["output"]) == 3 and len(ex["output"][0]) == 4
    table = run_ok("explain", "I saw a saw")
    for title in ("I — input vectors", "Q = W^q I", "A — scores", "A' — softmax", "O = A' V"):
        assert title in table
