"""AttentionRNN and LSTMN against float64 step-by-step reimplementations of their equations."""

import math

import pytest
import torch

from attnlab import Additive, recurrent
from attnlab.recurrent import LSTMN, AttentionRNN

B, N, IN, HID = 2, 9, 5, 6


def x_input(seed=0, n=N):
    return torch.randn(B, n, IN, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def softmax_list(scores):
    m = max(scores)
    e = [math.exp(s - m) for s in scores]
    return [v / sum(e) for v in e]


def attention_rnn_reference(cell: AttentionRNN, x: torch.Tensor, align):
    """h_i = tanh(A [x_i; c_{i-1}] + b); alpha_i = softmax_j align(h_i, h_j), j <= i; c_i = sum alpha h_j."""
    A, bias = cell.A.weight.detach().double(), cell.A.bias.detach().double()
    outs, mems, weights = [], [], []
    for b in range(x.shape[0]):
        c = torch.zeros(HID, dtype=torch.float64)
        hs, rows_h, rows_c, rows_w = [], [], [], []
        for i in range(x.shape[1]):
            h = torch.tanh(A @ torch.cat([x[b, i], c]) + bias)
            hs.append(h)
            alpha = softmax_list([align(h, hj) for hj in hs])
            c = sum(a * hj for a, hj in zip(alpha, hs))
            rows_h.append(h)
            rows_c.append(c)
            rows_w.append(alpha + [0.0] * (x.shape[1] - i - 1))
        outs.append(torch.stack(rows_h))
        mems.append(torch.stack(rows_c))
        weights.append(torch.tensor(rows_w, dtype=torch.float64))
    return torch.stack(outs), torch.stack(weights), torch.stack(mems)


def lstmn_reference(cell: LSTMN, x: torch.Tensor):
    """Cheng et al. 2016 eqs. 3-7 with the additive score, tapes starting at h_0 = c_0 = 0."""
    P = cell.query.weight.detach().double()
    W, bw = cell.gates.weight.detach().double(), cell.gates.bias.detach().double()
    wq, wk, v = (t.detach().double()[0] for t in (cell.align.w_q, cell.align.w_k, cell.align.v))
    sig = torch.sigmoid
    outs, mems, weights = [], [], []
    for b in range(x.shape[0]):
        htape = [torch.zeros(HID, dtype=torch.float64)]
        ctape = [torch.zeros(HID, dtype=torch.float64)]
        h_tilde = torch.zeros(HID, dtype=torch.float64)
        rows_h, rows_c, rows_w = [], [], []
        for t in range(x.shape[1]):
            q = P @ torch.cat([x[b, t], h_tilde])
            a = [float(v[:, 0] @ torch.tanh(wq.T @ q + wk.T @ hi)) for hi in htape]
            s = softmax_list(a)
            h_tilde = sum(si * hi for si, hi in zip(s, htape))
            c_tilde = sum(si * ci for si, ci in zip(s, ctape))
            z = W @ torch.cat([h_tilde, x[b, t]]) + bw
            i_g, f_g, o_g, c_hat = z.split(HID)
            c = sig(f_g) * c_tilde + sig(i_g) * torch.tanh(c_hat)
            h = sig(o_g) * torch.tanh(c)
            htape.append(h)
            ctape.append(c)
            rows_h.append(h)
            rows_c.append(c)
            rows_w.append(s + [0.0] * (x.shape[1] - t - 1))
        outs.append(torch.stack(rows_h))
        mems.append(torch.stack(rows_c))
        weights.append(torch.tensor(rows_w, dtype=torch.float64))
    return torch.stack(outs), torch.stack(weights), torch.stack(mems)


def check_rows(weights, n_real=None):
    n = weights.shape[-1]
    assert torch.equal(weights.triu(1), torch.zeros_like(weights)), "weights above the diagonal"
    sums = weights.sum(-1)
    torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=1e-12)
    assert weights.shape[-2:] == (n, n)


@pytest.mark.parametrize("grad", [False, True])
def test_attention_rnn_scaled_dot_equals_its_equations(grad):
    torch.manual_seed(0)
    cell = AttentionRNN(IN, HID).double()
    x = x_input()
    with torch.set_grad_enabled(grad):
        got = cell.steps(x)
    ref = attention_rnn_reference(cell, x, lambda q, k: float(q @ k) / math.sqrt(HID))
    for a, r, what in zip((got.output, got.weights, got.memory), ref, ("h", "alpha", "c")):
        torch.testing.assert_close(a.detach(), r, rtol=0, atol=1e-12, msg=what)
    check_rows(got.weights.detach())


def test_attention_rnn_additive_align_equals_its_equations():
    torch.manual_seed(1)
    cell = AttentionRNN(IN, HID, align="additive").double()
    wq, wk, v = (t.detach()[0] for t in (cell.align.w_q, cell.align.w_k, cell.align.v))
    x = x_input(1)
    got = cell.steps(x)
    ref = attention_rnn_reference(cell, x, lambda q, k: float(v[:, 0] @ torch.tanh(wq.T @ q + wk.T @ k)))
    for a, r in zip((got.output, got.weights, got.memory), ref):
        torch.testing.assert_close(a.detach(), r, rtol=0, atol=1e-12)


def test_attention_rnn_first_summary_is_the_first_state():
    """The lecture: with h_0 = 0, c_1 = h_1."""
    cell = AttentionRNN(IN, HID).double()
    got = cell.steps(x_input())
    torch.testing.assert_close(got.memory[:, 0], got.output[:, 0], rtol=0, atol=0)


@pytest.mark.parametrize("grad", [False, True])
def test_lstmn_equals_the_papers_equations(grad):
    torch.manual_seed(2)
    cell = LSTMN(IN, HID).double()
    assert isinstance(cell.align, Additive)
    x = x_input(2)
    with torch.set_grad_enabled(grad):
        got = cell.steps(x)
    ref = lstmn_reference(cell, x)
    for a, r, what in zip((got.output, got.weights, got.memory), ref, ("h", "s", "c")):
        torch.testing.assert_close(a.detach(), r, rtol=0, atol=1e-12, msg=what)
    check_rows(got.weights.detach())


@pytest.mark.parametrize("cls", [AttentionRNN, LSTMN])
@pytest.mark.parametrize("align", ["dot", "scaled_dot", "cosine", "additive", "bilinear"])
def test_any_score_gives_lower_triangular_rows_that_sum_to_one(cls, align):
    torch.manual_seed(3)
    out = cls(IN, HID, align=align).double().steps(x_input(3))
    check_rows(out.weights.detach())


@pytest.mark.parametrize("cls", [AttentionRNN, LSTMN])
def test_padded_batch_equals_each_sequence_alone_and_ignores_nan_padding(cls):
    torch.manual_seed(4)
    cell = cls(IN, HID).double()
    x = x_input(4).requires_grad_(False)
    lengths = [N, 4]
    mask = torch.arange(N)[None, :] < torch.tensor(lengths)[:, None]
    x = x.masked_fill(~mask[..., None], float("nan")).requires_grad_(True)
    got = cell.steps(x, mask)
    for b, length in enumerate(lengths):
        alone = cell.steps(x[b : b + 1, :length].detach())
        torch.testing.assert_close(got.output[b, :length], alone.output[0], rtol=0, atol=1e-12)
        torch.testing.assert_close(got.weights[b, :length, :length], alone.weights[0], rtol=0, atol=1e-12)
    assert torch.equal(got.output[1, 4:], torch.zeros_like(got.output[1, 4:]))
    assert torch.equal(got.weights[1, 4:], torch.zeros_like(got.weights[1, 4:]))
    got.output.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in cell.parameters())
    assert torch.isfinite(x.grad[mask]).all()


@pytest.mark.parametrize("cls", [AttentionRNN, LSTMN])
def test_truncation_changes_gradients_not_values(cls):
    cell = cls(IN, HID).double()
    x = x_input(5)
    full, cut = cell.steps(x), cell.steps(x, truncate=2)
    torch.testing.assert_close(full.output, cut.output, rtol=0, atol=0)


def test_bad_inputs_are_refused_with_clear_errors():
    cell = AttentionRNN(IN, HID)
    with pytest.raises(ValueError, match=r"shape \(B, N, 5\)"):
        cell(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="prefix"):
        cell(torch.randn(1, 3, IN), torch.tensor([[True, False, True]]))
    with pytest.raises(ValueError, match="bool tensor of shape"):
        cell(torch.randn(1, 3, IN), torch.ones(1, 3))
    with pytest.raises(ValueError, match="unknown align score 'nope'"):
        LSTMN(IN, HID, align="nope")
    with pytest.raises(ValueError, match="hidden_size must be a positive int"):
        LSTMN(IN, 0)
    with pytest.raises(ValueError, match="truncate"):
        cell.steps(torch.randn(1, 3, IN), truncate=-1)
    with pytest.raises(ValueError, match="unknown normaliser"):
        AttentionRNN(IN, HID, normalize="max")


def test_layers_registry():
    assert recurrent.names() == ["attention_rnn", "cnn", "lstm", "lstmn", "rnn", "self_attention"]
    with pytest.raises(ValueError, match="unknown sequence layer 'gru'"):
        recurrent.create("gru", 8)


@pytest.mark.parametrize("name", ["attention_rnn", "cnn", "lstm", "lstmn", "rnn", "self_attention"])
def test_every_layer_maps_b_n_d_to_b_n_d_and_padding_equals_the_shorter_sequence(name):
    torch.manual_seed(6)
    d = 8
    layer = recurrent.create(name, d).double().eval()
    x = torch.randn(2, 7, d, dtype=torch.float64)
    mask = torch.tensor([[True] * 7, [True] * 3 + [False] * 4])
    out = layer(x, mask)
    assert out.shape == (2, 7, d)
    alone = layer(x[1:, :3])
    torch.testing.assert_close(out[1, :3], alone[0], rtol=0, atol=1e-12)
    assert torch.equal(out[1, 3:], torch.zeros_like(out[1, 3:]))
    with pytest.raises(ValueError, match=f"expects inputs of shape \\(B, N, {d}\\)"):
        layer(torch.randn(2, 7, d + 1, dtype=torch.float64))


def test_cnn_options_are_checked():
    with pytest.raises(ValueError, match="odd"):
        recurrent.create("cnn", 8, kernel_size=4)
    with pytest.raises(ValueError, match="num_layers must be a positive int"):
        recurrent.create("cnn", 8, num_layers=0)
