"""The chunkwise forms in segments (``segment``): under autograd each segment is computed again
in the backward from the state entering it. In float64 a segmented call equals the reference
forms (outputs, final states, every gradient), packed documents crossing segment boundaries
included; the layers equal themselves unsegmented; the backward keeps less than the unsegmented
form does."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab import efficient, masks
from attnlab.efficient import chunking, recurrence
from tests.helpers import assert_close_rel

GATES = [("gated", None), ("gated", "head"), ("gated", "channel"), ("delta", None), ("delta", "head"), ("delta", "channel")]
LAYERS = ["retnet", "gla", "deltanet", "gated_deltanet", "mamba2", "kda"]


def inputs(n, docs=1, h=2, d=4, dv=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, dtype=torch.float64, generator=g)  # noqa: E731
    x = {"q": r(1, h, n, d), "k": F.normalize(r(1, h, n, d), dim=-1), "v": r(1, h, n, dv),
         "beta": torch.rand(1, h, n, dtype=torch.float64, generator=g),
         "head": -0.5 * torch.rand(1, h, n, dtype=torch.float64, generator=g),
         "channel": -0.5 * torch.rand(1, h, n, d, dtype=torch.float64, generator=g), "s0": r(docs, h, d, dv)}
    return {name: t.requires_grad_(True) for name, t in x.items()}


def run(form, family, x, gate, **kw):
    args = [x["q"], x["k"], x["v"]] + ([x["beta"]] if family == "delta" else []) + [None if gate is None else x[gate]]
    out, final = getattr(recurrence, f"{form}_{family}")(*args, **kw)
    names = [n for n in ("q", "k", "v", "beta", gate, "s0") if n is not None and (n != "beta" or family == "delta")]
    probe = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad((out * probe).sum() + final.square().sum(), [x[n] for n in names], allow_unused=True)
    return out, final, dict(zip(names, grads))


def assert_same(got, want, what):
    assert_close_rel(got[0], want[0], 1e-10, f"{what} output")
    assert_close_rel(got[1], want[1], 1e-10, f"{what} final state")
    for name, g in want[2].items():
        if g is not None:
            assert_close_rel(got[2][name], g, 1e-10, f"{what} gradient of {name}")


@pytest.mark.parametrize("family,gate", GATES)
@pytest.mark.parametrize("chunk,segment", [(8, 8), (8, 24), (4, 30), (16, 40)])
def test_a_segmented_call_equals_the_parallel_form(family, gate, chunk, segment):
    x = inputs(71)
    want = run("parallel", family, x, gate, state=x["s0"])
    assert_same(run("chunk", family, x, gate, state=x["s0"], chunk=chunk, segment=segment), want, f"segment {segment}")


@pytest.mark.parametrize("family,gate", GATES)
@pytest.mark.parametrize("with_state", [False, True])
def test_packed_documents_cross_segment_boundaries(family, gate, with_state):
    lengths = [5, 0, 17, 1, 9, 40, 3, 30]  # an empty document, documents longer than a segment
    x = inputs(sum(lengths), docs=len(lengths))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    kw = {"state": x["s0"] if with_state else None, "chunk": 8, "cu_seqlens": cu}
    want = run("chunk", family, x, gate, segment=None, **kw)
    for segment in (8, 16, 40):
        assert_same(run("chunk", family, x, gate, segment=segment, **kw), want, f"packed, segment {segment}")


def test_segments_lie_on_chunk_boundaries_and_split_documents_into_pieces():
    assert chunking.segment_bounds(70, 8, 20) == [(0, 16), (16, 32), (32, 48), (48, 64), (64, 70)]
    assert chunking.segment_bounds(70, 8, None) == [(0, 70)]
    assert chunking.segment_bounds(70, 8, 100) == [(0, 70)]
    # documents of 5, 0 and 20 positions in chunks of 4, laid out as 2 + 0 + 5 chunks, 3 chunks a
    # segment: the third document begins in the first segment, goes through the second, ends in the third
    parts = chunking._segments(25, 4, 12, torch.tensor([0, 5, 5, 25]))
    assert parts == [(0, 9, [(5, 0, 0), (4, 2, None)]), (9, 21, [(12, None, None)]), (21, 25, [(4, None, 2)])]


def test_the_backward_keeps_less_than_the_unsegmented_form():
    """Saved tensors of one forward (distinct storages beyond the inputs): the segmented form
    keeps the states entering its segments, the unsegmented one every chunk's intermediates."""
    x = inputs(2048, h=2, d=16, dv=16)
    inputs_ = {t.untyped_storage().data_ptr() for t in x.values()}

    def saved(segment):
        seen = {}

        def pack(t):
            ptr = t.untyped_storage().data_ptr()
            if ptr not in inputs_:
                seen[ptr] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            recurrence.chunk_delta(x["q"], x["k"], x["v"], x["beta"], x["head"], chunk=16, segment=segment)
        return sum(seen.values())

    assert saved(256) < saved(None) / 10


def test_a_segment_must_be_positive():
    x = inputs(20)
    with pytest.raises(ValueError, match="segment"):
        recurrence.chunk_gated(x["q"], x["k"], x["v"], chunk=4, segment=0)
    with pytest.raises(ValueError, match="segment"):
        efficient.create("retnet", embed_dim=16, num_heads=2, segment=-1)
    assert efficient.create("retnet", embed_dim=16, num_heads=2, segment=0).segment is None  # 0: one segment


def grads(m, x, **kw):
    xi = x.clone().requires_grad_(True)
    out = m(xi, **kw).output
    probe = torch.randn(out.shape, dtype=out.dtype, generator=torch.Generator().manual_seed(1))
    params = [p for _, p in m.named_parameters()]
    return out.detach(), torch.autograd.grad((out * probe).sum(), [xi, *params], allow_unused=True)


def assert_layer_same(m, x, what, **kw):
    m.segment = None
    want = grads(m, x, **kw)
    for segment in (8, 12):
        m.segment = segment
        got = grads(m, x, **kw)
        assert_close_rel(got[0], want[0], 1e-10, f"{what}, segment {segment}: output")
        for (name, _), g, r in zip([("x", None), *m.named_parameters()], got[1], want[1]):
            if r is not None:
                assert_close_rel(g, r, 1e-10, f"{what}, segment {segment}: gradient of {name}")


@pytest.mark.parametrize("name", LAYERS)
@pytest.mark.parametrize("causal", [True, False])
def test_a_segmented_layer_equals_itself_in_one_segment(name, causal):
    """Both scans, rope, the short convolution across segment boundaries, key padding (at the
    ends of the rows: the convolution counts positions) and packed documents."""
    torch.manual_seed(0)
    m = efficient.create(name, embed_dim=32, num_heads=4, causal=causal, chunk=4, positional="rope").double()
    x = torch.randn(2, 37, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert_layer_same(m, x, name)
    flags = torch.ones(2, 37, dtype=torch.bool)
    flags[0, 33:], flags[1, :4] = False, False
    assert_layer_same(m, x, f"{name} padded", mask=masks.valid_keys(flags))
    assert_layer_same(m, x, f"{name} packed", mask=masks.Documents([[5, 1, 17, 11], [7, 3, 20]], causal=causal))


@pytest.mark.parametrize("name", ["gated_deltanet", "mamba2"])
def test_a_segmented_prefill_continues_the_cache(name):
    torch.manual_seed(0)
    m = efficient.create(name, embed_dim=32, num_heads=4, causal=True, chunk=4, segment=8).double()
    x = torch.randn(2, 30, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    full = m(x).output
    cache = m.new_cache()
    outs = [m(x[:, :3], cache=cache).output, m(x[:, 3:21], cache=cache).output]  # the second prefill: three segments
    outs += [m(x[:, t : t + 1], cache=cache).output for t in range(21, 30)]
    assert_close_rel(torch.cat(outs, 1), full, 1e-10, f"{name} prefill and decoding")


@pytest.mark.parametrize("matrix", [True, False])
def test_linear_scan_equals_the_recurrence_written_as_a_loop(matrix):
    """Two rows (documents) over six chunks in float64: the states entering each chunk, the final
    states and every gradient equal ``S_{t+1} = A_t S_t + B_t`` run by autograd step by step."""
    g = torch.Generator().manual_seed(3)
    m, t, d, dv = 3, 6, 4, 2
    rows = torch.randn(2, m, d, dv, dtype=torch.float64, generator=g).requires_grad_()
    shape = (m, t, d, d) if matrix else (m, t, d, 1)
    carry = (0.5 * torch.randn(*shape, dtype=torch.float64, generator=g)).requires_grad_()
    writes = torch.randn(m, t, d, dv, dtype=torch.float64, generator=g).requires_grad_()
    begins, ends = {0: 0, 3: 1}, {2: 0, 5: 1}
    starts, finals = chunking.linear_scan(rows, carry, writes, begins, ends, matrix)
    want_starts, want_finals, s = [], [None, None], None
    for c in range(t):
        s = rows[begins[c]] if c in begins else s
        want_starts.append(s)
        s = (carry[:, c] @ s if matrix else carry[:, c] * s) + writes[:, c]
        if c in ends:
            want_finals[ends[c]] = s
    want = (torch.stack(want_starts, 1), torch.stack(want_finals))
    probe = [torch.randn(x.shape, dtype=torch.float64, generator=g) for x in want]
    got_grads = torch.autograd.grad(sum((x * p).sum() for x, p in zip((starts, finals), probe)), [rows, carry, writes])
    want_grads = torch.autograd.grad(sum((x * p).sum() for x, p in zip(want, probe)), [rows, carry, writes])
    for got, exp, what in zip((starts, finals, *got_grads), (*want, *want_grads), ("starts", "finals", "d rows", "d carry", "d writes")):
        assert_close_rel(got, exp, 1e-12, what)


def test_linear_scan_refuses_shapes_and_chunks_that_do_not_match():
    rows, writes = torch.zeros(1, 2, 3, 3), torch.zeros(2, 4, 3, 3)
    with pytest.raises(ValueError, match="do not match writes"):
        chunking.linear_scan(rows, torch.zeros(2, 5, 3, 3), writes, {0: 0}, {3: 0}, True)
    with pytest.raises(ValueError, match="outside 0..3"):
        chunking.linear_scan(rows, torch.zeros(2, 4, 3, 3), writes, {0: 0}, {4: 0}, True)
