"""Property tests that iterate the registries: every score, normaliser, mask kind, positional
encoding and attention variant is drawn by hypothesis, so a new one is covered the day it is
registered.

Each property draws its registry entry itself, so the long profile's example count is per
property over all entries: ``pytest tests/properties --hypothesis-profile=long`` (10,000 examples
per property; ``make properties``). The default profile (``tests/conftest.py``) runs 60.

Properties:

* ``attend`` with any score x normaliser, random shapes (0, 1, odd, N != M), float32 / float64 /
  bfloat16, random masks with dead rows, padding, causal and window masks, NaN in padded keys and
  values: finite output, equal to the float64 reference; finite gradients equal to the reference's.
* every efficient variant on a random padded batch, NaN in the padding: each sequence's outputs and
  input gradients equal those of the sequence alone (batch invariance), and are finite; the
  variants that cannot be batch-invariant are listed with the reason, and their outputs stay finite.
* every positional encoding inside ``MultiHeadAttention``: the same batch invariance, gradients too.
* every variant has an exact limit (or a stated reason why it has none), and in it equals dense
  attention, outputs and gradients, at random lengths and paddings.
"""

from __future__ import annotations

import functools

import torch
from hypothesis import given
from hypothesis import strategies as st

from attnlab import MultiHeadAttention, attend, efficient, masks, positional, reference_attention
from attnlab.core import normalize as normalizers
from attnlab.core import scores
from tests.efficient.test_batch_invariance import NOT_BATCH_INVARIANT
from tests.helpers import assert_close_rel

E, H = 16, 4

TOLERANCE = {torch.float64: 1e-9, torch.float32: 2e-5, torch.bfloat16: 0.1}
"""Error allowed relative to the float64 reference's magnitude, per input dtype (bfloat16 has an
8-bit mantissa: 2^-8 per rounding, a few roundings per output)."""

MASK_KINDS = ("none", "random", "dead_rows", "padding", "causal", "window")


@st.composite
def attention_problems(draw):
    """q, k, v, a mask, a score (by name, or a fresh module for the learnable ones), a normaliser."""
    b, h = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    n, m = draw(st.integers(0, 7)), draw(st.integers(0, 7))
    d, dv = draw(st.sampled_from([1, 2, 3, 4])), draw(st.sampled_from([1, 3, 4]))
    dtype = draw(st.sampled_from([torch.float64, torch.float32, torch.bfloat16]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q, k = torch.randn(b, h, n, d, generator=g), torch.randn(b, h, m, d, generator=g)
    v = torch.randn(b, h, m, dv, generator=g)
    kind = draw(st.sampled_from(MASK_KINDS))
    mask, padded = None, None
    if kind == "random":
        mask = torch.rand(b, 1, n, m, generator=g) > draw(st.sampled_from([0.2, 0.6, 0.95]))
    elif kind == "dead_rows":
        mask = torch.rand(n, m, generator=g) > 0.3
        mask[torch.rand(n, generator=g) > 0.5] = False
    elif kind == "padding":
        lengths = torch.tensor(draw(st.lists(st.integers(0, m), min_size=b, max_size=b)))
        mask = masks.padding(lengths).dense(m, m)
        padded = ~mask.expand(b, h, 1, m)[:, :, 0, :, None]  # (B, H, M, 1): keys no query may see
        k, v = k.masked_fill(padded, float("nan")), v.masked_fill(padded, float("nan"))
    elif kind == "causal":
        mask = masks.causal().dense(n, m)
    elif kind == "window":
        mask = masks.window(draw(st.integers(0, 3)), causal=draw(st.booleans())).dense(n, m)
    name = draw(st.sampled_from(scores.names()))
    score = name
    if name in ("additive", "bilinear"):
        torch.manual_seed(0)
        score = scores.create(name, head_dim=d, num_heads=h).double()
    norm = draw(st.sampled_from(normalizers.names()))
    return q.to(dtype), k.to(dtype), v.to(dtype), mask, padded, score, norm


def _clean(t, padded):
    """The reference sees zeros where the inputs hold NaN padding (it must not matter what is there)."""
    return t if padded is None else t.masked_fill(padded, 0.0)


@given(attention_problems())
def test_attend_with_every_score_and_normaliser_equals_the_float64_reference(problem):
    q, k, v, mask, padded, score, norm = problem
    module = score if isinstance(score, torch.nn.Module) else None
    if module is not None:
        module.to(q.dtype)
    res = attend(q, k, v, score=score, normalize=norm, mask=mask)
    assert res.output.dtype == q.dtype
    if module is not None:
        module.double()
    ref, _ = reference_attention(q, _clean(k, padded), _clean(v, padded), score=score, normalize=norm, mask=mask)
    assert_close_rel(res.output.double(), ref, TOLERANCE[q.dtype], f"{score}/{norm}/{q.dtype}", floor=TOLERANCE[q.dtype] * 1e-2)


@given(attention_problems())
def test_gradients_through_every_score_and_normaliser_are_finite_and_equal_the_reference(problem):
    q, k, v, mask, padded, score, norm = problem
    if q.dtype == torch.bfloat16 or 0 in (q.shape[2], k.shape[2]):
        return  # bfloat16 gradients are the float32 path's; empty shapes have nothing to differentiate
    q, k, v = (t.double().requires_grad_(True) for t in (q, k, v))
    out = attend(q, k, v, score=score, normalize=norm, mask=mask, backend="chunked", block_size=3).output
    upstream = torch.randn_like(out)
    if not out.requires_grad:  # every pair masked: a constant zero output
        assert not out.any()
        return
    got = torch.autograd.grad(out, (q, k, v), upstream, allow_unused=True)
    qr, kr, vr = (t.detach().requires_grad_(True) for t in (q, _clean(k, padded), _clean(v, padded)))
    ref, _ = reference_attention(qr, kr, vr, score=score, normalize=norm, mask=mask)
    want = torch.autograd.grad(ref, (qr, kr, vr), upstream, allow_unused=True) if ref.requires_grad else (None,) * 3
    for what, t, a, r in zip("qkv", (q, k, v), got, want):
        a = torch.zeros_like(t) if a is None else a
        r = torch.zeros_like(t) if r is None else r
        if padded is not None and what != "q":
            assert not a.masked_select(padded).any(), f"gradient reaches padded {what}"
            a, r = a.masked_fill(padded, 0.0), r.masked_fill(padded, 0.0)
        assert_close_rel(a, r, 1e-8, f"grad {what} {score}/{norm}")


# ---------------------------------------------------------------- layers: batch invariance


@functools.cache
def _variant(name: str) -> MultiHeadAttention:
    torch.manual_seed(0)
    return efficient.create(name, embed_dim=E, num_heads=H, max_len=32).double().eval()


@functools.cache
def _encoded(name: str) -> MultiHeadAttention:
    torch.manual_seed(0)
    mha = MultiHeadAttention(E, H, positional=name, max_len=32).double().eval()
    if name == "relative":  # its bias starts at zero: make it matter
        with torch.no_grad():
            mha.positional.weight.normal_()
    return mha


@st.composite
def padded_batches(draw):
    """A batch of 1-3 sequences, right-padded to a common length with NaN, and its padding mask."""
    lengths = draw(st.lists(st.integers(1, 19), min_size=1, max_size=3))
    pad_to = max(lengths) + draw(st.integers(0, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    x = torch.randn(len(lengths), pad_to, E, dtype=torch.float64, generator=g)
    for row, length in enumerate(lengths):
        x[row, length:] = float("nan")
    return x, lengths, masks.padding(torch.tensor(lengths)).dense(pad_to, pad_to)


def _batch_invariance(layer, x, lengths, mask, exact: bool):
    """Each row of the padded batch against the same sequence alone: outputs and input gradients."""
    xb = x.clone().requires_grad_(True)
    torch.manual_seed(1)  # variants that draw (performer's features) draw the same every call
    out = layer(xb, mask=mask).output
    upstream = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(2))
    upstream = upstream.masked_fill(~mask[:, 0, 0, :, None], 0.0)  # the loss reads the valid rows only
    (out * upstream).sum().backward()
    assert xb.grad is not None
    for row, length in enumerate(lengths):
        assert torch.isfinite(out[row, :length]).all(), "the NaN padding reached a valid output"
        assert torch.isfinite(xb.grad[row, :length]).all(), "the NaN padding reached a valid position's gradient"
        xa = x[row : row + 1, :length].clone().requires_grad_(True)
        torch.manual_seed(1)
        alone = layer(xa).output
        (alone * upstream[row : row + 1, :length]).sum().backward()
        if exact:
            assert_close_rel(out[row, :length].detach(), alone[0].detach(), 1e-10, f"row {row} output")
            assert_close_rel(xb.grad[row, :length], xa.grad[0], 1e-9, f"row {row} input gradient")


@given(st.sampled_from(efficient.names()), padded_batches())
def test_every_variant_is_batch_invariant_with_nan_padding(name, batch):
    x, lengths, mask = batch
    _batch_invariance(_variant(name), x, lengths, mask, exact=name not in NOT_BATCH_INVARIANT)


@given(st.sampled_from(positional.names()), padded_batches())
def test_every_positional_encoding_is_batch_invariant_with_nan_padding(name, batch):
    x, lengths, mask = batch
    _batch_invariance(_encoded(name), x, lengths, mask, exact=True)


# ---------------------------------------------------------------- exact limits


def _eye(n):
    return torch.eye(n, dtype=torch.float64)


EXACT_LIMITS: dict[str, object] = {
    "dense": lambda n: ({}, {}),
    "dense_naive": lambda n: ({}, {}),
    "local": lambda n: ({"window": n - 1}, {}),
    "longformer": lambda n: ({"window": 1, "global_tokens": n}, {}),
    "bigbird": lambda n: ({"window": 1, "global_tokens": n, "random_blocks": 1}, {}),
    "nystrom": lambda n: ({"landmarks": n, "pinv": "exact"}, {}),
    # forget gates held open (sigmoid(40) = 1 - 4e-18): no decay, dense attention
    "fox": lambda n: ({}, {"fgate_proj.weight": torch.zeros(H, E, dtype=torch.float64), "fgate_proj.bias": torch.full((H,), 40.0,
                                                                                                              dtype=torch.float64)}),
    "linformer": lambda n: ({"max_len": n, "k": n}, {"proj_k": _eye(n), "proj_v": _eye(n)}),
    "reformer": "one bucket, one hash round and one chunk give shared-QK attention (keys are the normalised queries), "
                "not dense attention: tests/efficient/test_variants.py checks it against that formula",
    "performer": "FAVOR+ is an unbiased random-feature estimate of the softmax kernel with no finite exact setting; its error "
                 "shrinking with the number of features is tested in tests/efficient/test_variants.py",
    "linear": "a different kernel (elu + 1), not an approximation of softmax: tests/efficient/test_variants.py checks its "
              "formula and its RNN form",
    **{name: "a gated recurrence, not an approximation of softmax: tests/efficient/test_gated.py (and its own test file) check "
             "its parallel, chunkwise and recurrent forms against each other and against its equations written as a loop"
       for name in efficient.select(mixer=True, forms_scores=False)},
}
"""Every variant's exact limit: ``n -> (options, weights to load)`` where it equals dense softmax
attention, or the reason it has none (and where its own formula is tested)."""


def test_every_registered_variant_states_its_exact_limit():
    assert sorted(EXACT_LIMITS) == efficient.names()


@given(st.sampled_from(sorted(k for k, v in EXACT_LIMITS.items() if callable(v))), st.integers(1, 13), st.data())
def test_every_variant_in_its_exact_limit_equals_dense_attention(name, n, data):
    options, weights = EXACT_LIMITS[name](n)
    torch.manual_seed(0)
    dense = efficient.create("dense", embed_dim=E, num_heads=H).double()
    layer = efficient.create(name, embed_dim=E, num_heads=H, **options).double()
    layer.load_state_dict({**dense.state_dict(), **weights}, strict=False)
    lengths = data.draw(st.lists(st.integers(1, n), min_size=1, max_size=2))
    x = torch.randn(len(lengths), n, E, dtype=torch.float64, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 999))))
    mask = masks.padding(torch.tensor(lengths)).dense(n, n)
    results = []
    for module in (layer, dense):
        xi = x.clone().requires_grad_(True)
        out = module(xi, mask=mask).output
        valid = mask[:, 0, 0, :, None]
        (out.square() * valid).sum().backward()
        results.append((out * valid, xi.grad))
    (out, grad), (ref, grad_ref) = results
    assert_close_rel(out.detach(), ref.detach(), 1e-10, f"{name} output")
    # Nystrom's gradient passes through pinv(A), A = softmax(Q K^T / sqrt(D)) of each sequence: the
    # derivative of a pseudo-inverse amplifies round-off by about cond(A)^2 (cond up to 7e5 at n = 13)
    tol = max(1e-9, 1e-12 * _kernel_condition(dense, x, lengths) ** 2) if name == "nystrom" else 1e-9
    assert_close_rel(grad, grad_ref, tol, f"{name} gradient")


def _kernel_condition(dense, x, lengths) -> float:
    """The largest condition number of softmax(Q K^T / sqrt(D)) over the sequences (valid part) and heads."""
    worst = 1.0
    with torch.no_grad():
        for row, length in enumerate(lengths):
            xs = x[row : row + 1, :length]
            q, k = (proj(xs).view(1, length, H, E // H).transpose(1, 2) for proj in (dense.q_proj, dense.k_proj))
            a = torch.softmax(q @ k.transpose(-1, -2) / (E // H) ** 0.5, dim=-1)
            worst = max(worst, float(torch.linalg.cond(a).max()))
    return worst
