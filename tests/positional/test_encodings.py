"""Each positional encoding against its closed form or the paper's numbers."""

import math

import pytest
import torch

from attnlab import positional as P
from attnlab.positional import alibi_slopes, relative_bucket, sinusoidal_table
from tests.helpers import assert_close_rel


def test_registry_names_and_kinds():
    assert P.names() == ["alibi", "floater", "learned", "none", "relative", "rnn", "rope", "sinusoidal"]
    kinds = {n: P.kind_of(n) for n in P.names()}
    assert kinds == {
        "sinusoidal": "input", "learned": "input", "rnn": "input", "floater": "input",
        "relative": "bias", "alibi": "bias", "rope": "rotation", "none": "none",
    }


@pytest.mark.parametrize("dim", [64, 7])
def test_sinusoidal_table_equals_the_closed_form(dim):
    length = 1000
    table = sinusoidal_table(length, dim)
    assert table.shape == (length, dim) and table.dtype == torch.float32
    expect = torch.empty(length, dim, dtype=torch.float64)
    for pos in range(length):
        for d in range(dim):
            i2 = d - d % 2  # the 2i of the pair
            angle = pos / 10000 ** (i2 / dim)
            expect[pos, d] = math.sin(angle) if d % 2 == 0 else math.cos(angle)
    assert (table.double() - expect).abs().max().item() <= 1e-6


def test_sinusoidal_encoding_adds_the_table():
    pe = P.create("sinusoidal", dim=8)
    x = torch.randn(2, 5, 8)
    assert torch.equal(pe(x), x + sinusoidal_table(5, 8))
    pos = torch.tensor([3, 0, 9, 9, 100])
    assert torch.equal(pe.add_to(x, pos), x + sinusoidal_table(101, 8)[pos])


def test_alibi_slopes_are_the_papers_geometric_sequences():
    eight = [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256]
    assert alibi_slopes(8).tolist() == eight
    # 12 heads: the 8 slopes above, then the odd-numbered slopes of 16 heads (2^-0.5, 2^-1.5, ...)
    twelve = eight + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    assert torch.allclose(alibi_slopes(12), torch.tensor(twelve, dtype=torch.float64), rtol=0, atol=1e-15)
    assert alibi_slopes(16)[:2].tolist() == [2**-0.5, 2**-1.0]


@pytest.mark.parametrize("symmetric", [False, True])
def test_alibi_bias_is_slope_times_offset(symmetric):
    pe = P.create("alibi", num_heads=8, symmetric=symmetric)
    table = pe.table(6)  # (H, L, L)
    slopes = alibi_slopes(8)
    for h in range(8):
        for i in range(6):
            for j in range(6):
                expect = slopes[h] * ((-abs(j - i)) if symmetric else (j - i))
                assert table[h, i, j].item() == pytest.approx(expect.item(), abs=1e-7)
    assert (table[:, 3, :3] < 0).all()  # keys before the query are penalised in both forms


def rotation_matrix(pos: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """The block-diagonal R_pos of RoFormer eq. 34, float64."""
    r = torch.zeros(dim, dim, dtype=torch.float64)
    for i in range(dim // 2):
        a = pos * base ** (-2 * i / dim)
        c, s = math.cos(a), math.sin(a)
        r[2 * i, 2 * i], r[2 * i, 2 * i + 1] = c, -s
        r[2 * i + 1, 2 * i], r[2 * i + 1, 2 * i + 1] = s, c
    return r


def test_rope_equals_the_rotation_matrices():
    pe = P.create("rope", dim=8)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64), torch.randn(1, 2, 3, 8, generator=g, dtype=torch.float64)
    qp, kp = torch.tensor([0, 1, 7, 50, 300]), torch.tensor([2, 3, 1000])
    rq, rk = pe.rotate(q, k, qp, kp)
    for i, p in enumerate(qp.tolist()):
        assert torch.allclose(rq[0, :, i], q[0, :, i] @ rotation_matrix(p, 8).T, atol=1e-12)
    for j, p in enumerate(kp.tolist()):
        assert torch.allclose(rk[0, :, j], k[0, :, j] @ rotation_matrix(p, 8).T, atol=1e-12)


def test_rope_half_split_layout_is_a_permutation_of_the_interleaved_one():
    inter, half = P.create("rope", dim=8), P.create("rope", dim=8, interleaved=False)
    x = torch.randn(1, 1, 4, 8, dtype=torch.float64)
    perm = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])  # half layout (i, i + D/2) -> pairs (2i, 2i+1)
    pos = torch.arange(4)
    a = inter.rotate(x[..., perm], x[..., perm], pos, pos)[0]
    b = half.rotate(x, x, pos, pos)[0][..., perm]
    assert torch.allclose(a, b, atol=1e-12)


@pytest.mark.parametrize("shift", [1, 37, 1000, 4000])
def test_rope_score_depends_only_on_the_offset(shift):
    pe = P.create("rope", dim=64)
    g = torch.Generator().manual_seed(shift)
    q, k = torch.randn(1, 4, 6, 64, generator=g), torch.randn(1, 4, 6, 64, generator=g)
    qp, kp = torch.tensor([0, 3, 5, 9, 20, 63]), torch.tensor([1, 2, 40, 9, 0, 63])
    q0, k0 = pe.rotate(q, k, qp, kp)
    q1, k1 = pe.rotate(q, k, qp + shift, kp + shift)
    s0, s1 = (q0 * k0).sum(-1), (q1 * k1).sum(-1)  # (1, 4, 6): score of pair (q_i, k_i)
    scale = (q.norm(dim=-1) * k.norm(dim=-1))  # |q.k| <= |q||k|
    # float32: the angle (m + t) theta carries a rounding error of about (m + t) x 6e-8 rad
    assert ((s0 - s1).abs() / scale).max().item() <= 2e-7 * (shift + 64) + 1e-6
    assert not torch.allclose(q0, q1)  # the rotation itself did move


def test_rope_tables_are_float32_for_bf16_inputs():
    pe = P.create("rope", dim=16)
    q = torch.randn(1, 1, 4, 16).to(torch.bfloat16)
    pos = torch.tensor([257, 1001, 3333, 9999])  # none of these is a bfloat16 number
    rq, _ = pe.rotate(q, q, pos, pos)
    assert rq.dtype == torch.bfloat16
    exact = torch.stack([q[0, 0, i].double() @ rotation_matrix(p, 16).T for i, p in enumerate(pos.tolist())])
    # only the final rounding to bf16 (2^-8 relative) remains; bf16 angles would be off by radians
    assert_close_rel(rq[0, 0].double(), exact, 2**-7, "bf16 rope")


def test_relative_buckets_match_t5():
    off = torch.tensor([0, -3, 3, -8, -20, 20, -200, 200, -127, 1000])
    got = relative_bucket(off, num_buckets=32, max_distance=128, bidirectional=True)
    # by hand from T5's rule: 16 buckets per side, exact below 8, then 8 + floor(log(d/8)/log(16) * 8)
    assert got.tolist() == [0, 3, 19, 8, 10, 26, 15, 31, 15, 31]
    uni = relative_bucket(off, num_buckets=32, max_distance=128, bidirectional=False)
    # 32 buckets for keys at or before the query, exact below 16, later keys in bucket 0
    assert uni.tolist() == [0, 3, 0, 8, 17, 0, 31, 0, 31, 0]


def test_relative_clip_mode_clips_offsets():
    pe = P.create("relative", num_heads=2, mode="clip", max_distance=3)
    assert pe.num_buckets == 7
    assert pe.bucket(torch.tensor([-10, -3, -1, 0, 2, 3, 50])).tolist() == [0, 0, 2, 3, 5, 6, 6]
    table = pe.table(8)
    assert torch.equal(table[:, 0, 5], pe.weight[:, 6].detach()) and torch.equal(table[:, 7, 0], pe.weight[:, 0].detach())
    causal = P.create("relative", num_heads=2, mode="clip", max_distance=3, bidirectional=False)
    assert causal.num_buckets == 4 and causal.bucket(torch.tensor([-9, -2, 0, 4])).tolist() == [3, 2, 0, 0]


def test_learned_raises_beyond_max_len():
    pe = P.create("learned", dim=8, max_len=16)
    pe(torch.randn(1, 16, 8))  # positions 0..15 exist
    with pytest.raises(ValueError, match=r"max_len=16.*position 16"):
        pe(torch.randn(1, 17, 8))
    with pytest.raises(ValueError, match="position 40"):
        pe(torch.randn(1, 2, 8), torch.tensor([3, 40]))
    assert P.create("learned", dim=8).max_len == 512


@pytest.mark.parametrize("name", ["sinusoidal", "rnn", "floater", "relative", "alibi", "rope"])
def test_other_encodings_run_beyond_their_training_length_and_keep_their_prefix(name):
    torch.manual_seed(0)
    pe = P.create(name, dim=8, num_heads=2, max_len=16)
    short, long = pe.table(16), pe.table(64)
    assert torch.isfinite(long).all()
    if pe.kind == "bias":
        assert long.shape == (2, 64, 64) and torch.allclose(long[:, :16, :16], short)
    else:  # the first 16 positions are encoded the same whatever the length asked
        assert long.shape[0] == 64 and torch.allclose(long[:16], short, atol=1e-6)


def test_floater_with_zero_dynamics_is_its_initial_encoding():
    torch.manual_seed(0)
    pe = P.create("floater", dim=16)
    assert not torch.allclose(pe.table(50), sinusoidal_table(50, 16), atol=1e-4)  # it does move at init
    with torch.no_grad():
        for p in pe.dynamics.parameters():
            p.zero_()
    assert torch.allclose(pe.table(50), sinusoidal_table(50, 16), rtol=0, atol=1e-7)
    with torch.no_grad():
        pe.z0.fill_(0.5)  # h = 0: z stays at its initial value at every position
    assert torch.allclose(pe.table(50), sinusoidal_table(50, 16) + 0.5, rtol=0, atol=1e-6)


def test_floater_gradients_reach_the_dynamics():
    torch.manual_seed(0)
    pe = P.create("floater", dim=8, hidden=12)
    x = torch.randn(2, 30, 8)
    (pe(x) ** 2).sum().backward()
    for name, p in pe.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, f"no gradient reached {name}"


def test_floater_solution_follows_the_ode():
    """Against a fine Euler integration of the same dynamics: the solver really solves dz/dt = h."""
    torch.manual_seed(1)
    pe = P.create("floater", dim=4, init_scale=1.0, dt=0.1).double()
    with torch.no_grad():
        pe.z0.normal_()
        z = pe.solve(11)
        y, t, h = pe.z0.clone(), 0.0, 1e-4
        for _ in range(10000):  # to t = 1.0
            y = y + h * pe.dynamics(torch.tensor(t, dtype=torch.float64), y)
            t += h
    assert (z[10] - y).abs().max().item() < 1e-3
    assert (z[10] - z[0]).abs().max().item() > 1e-2


def test_rnn_encoding_depends_on_the_position_only():
    torch.manual_seed(0)
    pe = P.create("rnn", dim=8, cell="gru")
    table = pe.table(20)
    picked = pe.encode(torch.tensor([19, 4, 4]))
    assert torch.allclose(picked, table[[19, 4, 4]], atol=1e-6)
    assert (table[1:] - table[:-1]).abs().amax(-1).min() > 0  # consecutive positions differ


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="unknown positional encoding 'sine'.*sinusoidal"):
        P.create("sine", dim=8)
    with pytest.raises(ValueError, match="pass num_heads"):
        P.create("alibi")
    with pytest.raises(ValueError, match="even"):
        P.create("rope", dim=7)
    with pytest.raises(ValueError, match="dim must be a positive int"):
        P.create("sinusoidal")
    with pytest.raises(ValueError, match="mode must be"):
        P.create("relative", num_heads=2, mode="log")
    with pytest.raises(ValueError, match="cell must be"):
        P.create("rnn", dim=4, cell="transformer")
    pe = P.create("sinusoidal", dim=8)
    with pytest.raises(ValueError, match=r"\(B, L, 8\)"):
        pe(torch.randn(2, 5, 9))
    with pytest.raises(TypeError, match="integer dtype"):
        pe(torch.randn(1, 3, 8), torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        pe(torch.randn(1, 3, 8), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=">= 0"):
        pe(torch.randn(1, 3, 8), torch.tensor([0, -1, 2]))
    with pytest.raises(ValueError, match="already registered"):
        P.register("rope")(P.RoPE)
