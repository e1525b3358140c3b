"""``local`` attention's banded computation (attend under a window mask, block-sparse): exact
against a float64 dense reference, gradients included, at the ends of the sequence, with
padding, with any input layout, on the fused kernel and without it."""

import importlib
import itertools

import pytest
import torch

from attnlab import attend, masks
from attnlab.efficient.local import banded_attention
from attnlab.profiling import peak_bytes


def dense_reference(q, k, v, allowed):
    """softmax(q k^T / sqrt(D)) v over the allowed pairs, in float64; a row without keys is 0."""
    s = (q.double() @ k.double().transpose(-1, -2)) * q.shape[-1] ** -0.5
    s = s.masked_fill(~allowed, float("-inf"))
    live = allowed.any(-1, keepdim=True)
    p = torch.softmax(s.masked_fill(~live, 0.0), -1).masked_fill(~live, 0.0)
    return p @ v.double()


def inputs(b, h, n, d, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g, dtype=dtype).requires_grad_(True) for _ in range(3)]


CASES = list(itertools.product((1, 7, 33, 70), (0, 2, 9, 40), (None, 4, 16), (False, True)))


@pytest.mark.parametrize("n,w,block,causal", CASES)
def test_equals_dense_float64_reference_with_gradients(n, w, block, causal):
    q, k, v = inputs(2, 3, n, 8)
    valid = torch.ones(2, n, dtype=torch.bool)
    valid[1, n // 2 :] = False  # padded keys in the second sequence (every key when n = 1)
    allowed = masks.window(w, causal=causal).dense(n) & valid[:, None, None, :]
    out = banded_attention(q, k, v, w, causal=causal, valid=valid, block=block)
    ref = dense_reference(q, k, v, allowed)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)
    g = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), g)
    want = torch.autograd.grad(ref, (q, k, v), g)
    for a, r, name in zip(got, want, "qkv"):
        torch.testing.assert_close(a, r, rtol=0, atol=1e-11, msg=f"d{name}")


def test_queries_whose_window_is_all_padding_get_zeros_and_no_gradient():
    n, w = 40, 3
    q, k, v = inputs(1, 2, n, 4)
    valid = torch.ones(1, n, dtype=torch.bool)
    valid[0, 10:30] = False  # queries 13..26 see only padded keys
    out = banded_attention(q, k, v, w, valid=valid, block=4)
    assert torch.equal(out[0, :, 13:27], torch.zeros_like(out[0, :, 13:27]))
    assert out[0, :, 12].abs().sum() > 0 and out[0, :, 27].abs().sum() > 0
    (dq,) = torch.autograd.grad(out.sum(), (q,))
    assert torch.equal(dq[0, :, 13:27], torch.zeros_like(dq[0, :, 13:27]))


@pytest.mark.parametrize("b,pattern", [(2, "window"), (1, "window"), (1, "longformer")])
def test_any_input_layout_gives_the_same_result(b, pattern):
    """Heads as a layer makes them, views of a fused (B, N, 3, H, D) projection: one batch row
    gives views that no reshape can make contiguous (the tiles are gathered or viewed from them)."""
    n, h, d, w = 48, 3, 8, 6  # whole tiles: no padding copy, the kernel and the gathers read the views
    g = torch.Generator().manual_seed(1)
    fused = torch.randn(b, n, 3, h, d, generator=g, dtype=torch.float64, requires_grad=True)
    q, k, v = (fused[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, N, D) views, not contiguous
    assert not q.is_contiguous()
    mask = masks.window(w) if pattern == "window" else masks.window(w) | masks.global_tokens([3, 30])
    out = attend(q, k, v, mask=mask, block_size=8).output
    (g_fused,) = torch.autograd.grad(out.square().sum(), (fused,))
    qc, kc, vc = (t.detach().contiguous().requires_grad_(True) for t in (q, k, v))
    ref = attend(qc, kc, vc, mask=mask, block_size=8).output
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-13)
    g_ref = torch.autograd.grad(ref.square().sum(), (qc, kc, vc))
    for i, r in enumerate(g_ref):
        torch.testing.assert_close(g_fused[:, :, i].transpose(1, 2), r, rtol=0, atol=1e-12)


def test_without_the_fused_kernel_the_written_out_scores_give_the_same_result(monkeypatch):
    """What other devices run (PyTorch without the fused CPU kernel): scores written out one chunk
    at a time, FlashAttention's backward through the log-sum-exp."""
    q, k, v = inputs(1, 2, 30, 4)
    expected = banded_attention(q, k, v, 5, causal=True, block=4)
    g = torch.randn_like(expected)
    want = torch.autograd.grad(expected, (q, k, v), g)
    monkeypatch.setattr(importlib.import_module("attnlab.core.attend"), "FUSED", False)
    out = banded_attention(q, k, v, 5, causal=True, block=4)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-13)
    for a, r in zip(torch.autograd.grad(out, (q, k, v), g), want):
        torch.testing.assert_close(a, r, rtol=0, atol=1e-12)


def test_bfloat16_stays_close_to_float32():
    q, k, v = (t.detach().float() for t in inputs(1, 2, 300, 16))
    ref = banded_attention(q, k, v, 20)
    low = banded_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), 20)
    assert low.dtype == torch.bfloat16
    assert (low.float() - ref).abs().max() < 3e-2


def test_the_window_map_keeps_the_tiles_around_the_diagonal():
    """A window of w over tiles of b: each interior tile row keeps 2 ceil(w / b) + 1 key tiles:
    w = 20, b = 8: offsets within 20 of every query of the tile only for the 3 middle tiles (the
    tiles two away reach offsets 9..23), so 2 partial tiles at each end."""
    bm = masks.block_map(masks.window(20), 640, block_size=8)
    assert bm.index.shape[-1] == 2 * 3 + 1 and int(bm.count[0, 0, 10]) == 7
    assert bm.index[0, 0, 10].tolist() == list(range(7, 14))
    assert bm.state[0, 0, 10].tolist() == [masks.PARTIAL] * 2 + [masks.FULL] * 3 + [masks.PARTIAL] * 2


def test_mismatched_lengths_are_refused():
    q, k, v = inputs(1, 1, 5, 4)
    with pytest.raises(ValueError, match="as many keys as queries"):
        banded_attention(q, k[:, :, :4], v[:, :, :4], 2)


def test_training_memory_is_linear_not_quadratic():
    """fwd+bwd live-tensor peak (beyond inputs) at N = 8192, w = 64, D = 16: far below one N x N
    fp32 tensor (256 MiB), and about 4x the peak at N = 2048 (linear, not 16x)."""

    def peak(n):
        q, k, v = (t.detach().float().requires_grad_(True) for t in inputs(1, 1, n, 16))

        def run():
            banded_attention(q, k, v, 64).sum().backward()

        return peak_bytes(run)

    small, large = peak(2048), peak(8192)
    if small is None:
        pytest.skip("the profiler reports no memory events here")
    assert large < (8192 * 8192 * 4) / 16
    assert large < 6 * small
