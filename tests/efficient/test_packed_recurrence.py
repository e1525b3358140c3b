"""Packed documents in the chunkwise forms (``cu_seqlens``): no state crosses a boundary, so a
packed call equals each document run alone, outputs, final states and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab import efficient, masks
from attnlab.efficient import recurrence, scan
from tests.helpers import assert_close_rel

LENGTHS = [5, 0, 17, 1, 9, 40]  # an empty document; lengths that are not whole chunks
GATES = [("gated", None), ("gated", "head"), ("gated", "channel"), ("delta", None), ("delta", "head"), ("delta", "channel")]


def packed_inputs(lengths, h=2, d=4, dv=3, seed=0):
    n = sum(lengths)
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, dtype=torch.float64, generator=g)  # noqa: E731
    return {"q": r(1, h, n, d), "k": F.normalize(r(1, h, n, d), dim=-1), "v": r(1, h, n, dv),
            "beta": torch.rand(1, h, n, dtype=torch.float64, generator=g),
            "head": -0.5 * torch.rand(1, h, n, dtype=torch.float64, generator=g),
            "channel": -0.5 * torch.rand(1, h, n, d, dtype=torch.float64, generator=g),
            "s0": r(len(lengths), h, d, dv)}


def call(family, x, gate, sl=slice(None), state=None, **kw):
    fn = getattr(recurrence, f"chunk_{family}")
    pick = lambda t: t[:, :, sl]  # noqa: E731
    args = [pick(x["q"]), pick(x["k"]), pick(x["v"])] + ([pick(x["beta"])] if family == "delta" else [])
    return fn(*args, None if gate is None else pick(x[gate]), state=state, **kw)


@pytest.mark.parametrize("family,gate", GATES)
@pytest.mark.parametrize("with_state", [False, True])
def test_a_packed_call_equals_each_document_alone(family, gate, with_state):
    x = {k: t.clone().requires_grad_(True) for k, t in packed_inputs(LENGTHS).items()}
    cu = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()])
    out, finals = call(family, x, gate, state=x["s0"] if with_state else None, chunk=8, cu_seqlens=cu)
    outs, states = [], []
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        s0 = x["s0"][i : i + 1] if with_state else None
        if a == b:  # an empty document keeps its initial state
            states.append(x["s0"][i] if with_state else torch.zeros_like(x["s0"][i]))
            continue
        o, s = call(family, x, gate, slice(a, b), state=s0, chunk=8)
        outs.append(o)
        states.append(s[0])
    ref_out, ref_finals = torch.cat(outs, 2), torch.stack(states)
    assert_close_rel(out, ref_out, 1e-10, "packed output")
    assert_close_rel(finals, ref_finals, 1e-10, "packed final states")
    probe = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    names = [n for n in ("q", "k", "v", "beta", gate, "s0") if n is not None and (n != "beta" or family == "delta")]
    got = torch.autograd.grad((out * probe).sum() + finals.square().sum(), [x[n] for n in names], allow_unused=True)
    want = torch.autograd.grad((ref_out * probe).sum() + ref_finals.square().sum(), [x[n] for n in names], allow_unused=True)
    for name, a, b in zip(names, got, want):
        if b is not None:
            assert_close_rel(a, b, 1e-10, f"packed gradient of {name}")


def test_a_state_does_cross_when_the_documents_are_not_given():
    """The test above could pass if the kernels never carried state: here they must."""
    x = packed_inputs([10, 10])
    joined, _ = call("delta", x, "head", chunk=4)
    split, _ = call("delta", x, "head", chunk=4, cu_seqlens=torch.tensor([0, 10, 20]))
    assert torch.equal(joined[:, :, :10], split[:, :, :10])
    assert (joined[:, :, 10:] - split[:, :, 10:]).abs().max() > 1e-3


@pytest.mark.parametrize("bad,match", [
    (torch.tensor([0, 5, 20]), r"rise from 0 to the sequence length 21, got \[0, 5, 20\]"),
    (torch.tensor([0, 12, 5, 21]), r"rise from 0 to the sequence length 21"),
    (torch.tensor([0.0, 21.0]), "1-D integer tensor of S \\+ 1 offsets"),
    (torch.tensor([21]), "1-D integer tensor of S \\+ 1 offsets"),
])
def test_offsets_that_do_not_describe_the_sequence_are_refused(bad, match):
    x = packed_inputs([21])
    with pytest.raises(ValueError, match=match):
        call("delta", x, None, cu_seqlens=bad)


def test_packing_wants_a_batch_of_one_and_a_state_per_document():
    x = packed_inputs([4, 4])
    cu = torch.tensor([0, 4, 8])
    q2 = x["q"].expand(2, -1, -1, -1)
    with pytest.raises(ValueError, match="batch of one, got a batch of 2"):
        recurrence.chunk_gated(q2, q2, x["v"].expand(2, -1, -1, -1), cu_seqlens=cu)
    with pytest.raises(ValueError, match=r"state must have shape \(S, H, D, Dv\) = \(2, 2, 4, 3\), one per document"):
        call("gated", x, None, state=x["s0"][:1], cu_seqlens=cu)


GATED_LAYERS = efficient.select(family="gated")


@pytest.mark.parametrize("name", GATED_LAYERS)
@pytest.mark.parametrize("causal", [True, False])
def test_a_gated_layer_attends_packed_documents_in_one_call(name, causal, monkeypatch):
    """Two rows of documents (one row with a gap after its documents), rope at the positions
    within each document, both scans when bidirectional: each document as if alone, with the
    recurrence called once per scan, not once per document."""
    torch.manual_seed(0)
    m = efficient.create(name, embed_dim=16, num_heads=2, causal=causal, positional="rope", chunk=4).double()
    x = torch.randn(2, 12, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    rows = [[5, 1, 6], [7, 3]]
    calls = []
    forms = scan.DELTA_FORMS if m.delta else scan.GATED_FORMS  # the recurrence's forms, as the mixer's scan finds them
    original = forms["chunk"]
    assert original is (recurrence.chunk_delta if m.delta else recurrence.chunk_gated)
    monkeypatch.setitem(forms, "chunk", lambda *a, **kw: calls.append(kw.get("cu_seqlens")) or original(*a, **kw))
    out = m(x, mask=masks.Documents(rows, causal=causal)).output
    assert len(calls) == (1 if causal else 2) and calls[0].tolist() == [0, 5, 6, 12, 19, 22]
    for r, row in enumerate(rows):
        start = 0
        for length in row:
            alone = m(x[r : r + 1, start : start + length]).output[0]
            assert_close_rel(out[r, start : start + length], alone, 1e-10, f"{name} row {r} document at {start}")
            start += length
    assert torch.equal(out[1, 10:], torch.zeros_like(out[1, 10:]))  # the gap after the documents


@pytest.mark.parametrize(("name", "mode"), [("gated_deltanet", "chunk"), ("gated_deltanet", "parallel"),
                                           ("deltaproduct", "chunk")])
def test_a_gated_layer_with_packed_documents_rotates_at_the_positions_given(name, mode):
    """Packed documents with positions given: rope rotates at those positions (here twice the
    within-document ones, which a relative encoding does not take for the default), in the
    chunkwise form as in the reference form run per document (DeltaProduct: always per document)."""
    torch.manual_seed(0)
    m = efficient.create(name, embed_dim=16, num_heads=2, causal=True, positional="rope", chunk=4,
                         mode=mode).double()
    x = torch.randn(1, 11, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    docs = masks.Documents([[5, 6]], causal=True)
    given = 2 * docs.positions(11)
    out = m(x, mask=docs, positions=given).output
    for start, length in ((0, 5), (5, 6)):
        alone = m(x[:, start : start + length], positions=2 * torch.arange(length)).output
        assert_close_rel(out[:, start : start + length], alone, 1e-10, f"{name} {mode} document at {start}")
    default = m(x, mask=docs).output
    assert (out - default).abs().max() > 1e-3  # the positions given are not the default's


def test_the_short_convolution_restarts_at_each_document():
    g = torch.Generator().manual_seed(2)
    x, w, b = torch.randn(1, 3, 9, generator=g), torch.randn(3, 4, generator=g), torch.randn(3, generator=g)
    cu = torch.tensor([0, 2, 9])
    out = recurrence.causal_conv(x, w, b, cu_seqlens=cu)
    ref = torch.cat([recurrence.causal_conv(x[..., :2], w, b), recurrence.causal_conv(x[..., 2:], w, b)], -1)
    assert_close_rel(out, ref, 1e-6, "packed convolution")
    assert (recurrence.causal_conv(x, w, b)[..., 2:5] - ref[..., 2:5]).abs().max() > 1e-3  # unpacked, it reads across


@pytest.mark.parametrize("gate", [None, "head", "channel"])
def test_one_decoding_step_is_one_token_of_the_recurrent_form(gate):
    x = packed_inputs([3])
    s0 = x["s0"]
    pick = lambda t: None if t is None else t[:, :, 0]  # noqa: E731 - the first token, (B, H, ...)
    g = None if gate is None else x[gate]
    pairs = ((recurrence.delta_token, recurrence.recurrent_delta, (x["beta"],)), (recurrence.gated_token, recurrence.recurrent_gated, ()))
    for step, form, extra in pairs:
        ref, ref_s = form(x["q"][:, :, :1], x["k"][:, :, :1], x["v"][:, :, :1], *(t[:, :, :1] for t in extra),
                          None if g is None else g[:, :, :1], state=s0)
        out, s = step(pick(x["q"]), pick(x["k"]), pick(x["v"]), *map(pick, extra), pick(g), s0)
        assert torch.equal(out, ref[:, :, 0]) and torch.equal(s, ref_s)


def test_a_decoding_step_names_inputs_that_do_not_fit():
    x = packed_inputs([3])
    q, k, v, beta, s0 = (x[n][:, :, 0] if n != "s0" else x[n] for n in ("q", "k", "v", "beta", "s0"))
    with pytest.raises(ValueError, match="a decoding step needs the state"):
        recurrence.delta_token(q, k, v, beta, None, None)
    with pytest.raises(ValueError, match=r"state must have shape \(B, H, D, Dv\) = \(1, 2, 4, 3\), got \(1, 2, 3, 3\)"):
        recurrence.gated_token(q, k, v, None, s0[:, :, :3])
    with pytest.raises(ValueError, match=r"beta must have shape \(B, H, N\) = \(1, 2, 1\)"):
        recurrence.delta_token(q, k, v, beta[:, :1], None, s0)
    with pytest.raises(ValueError, match=r"q, k, v must be \(B, H, N, D\) tensors"):
        recurrence.gated_token(q[0], k, v, None, s0)


def test_the_short_convolution_refuses_offsets_that_do_not_describe_the_sequence():
    x, w = torch.randn(1, 3, 9), torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"rise from 0 to the sequence length 9, got \[0, 2, 8\]"):
        recurrence.causal_conv(x, w, cu_seqlens=torch.tensor([0, 2, 8]))
    with pytest.raises(ValueError, match="batch of one, got a batch of 2"):
        recurrence.causal_conv(x.expand(2, -1, -1), w, cu_seqlens=torch.tensor([0, 9]))
