"""The delta rule with a read key (``read=``, Comba: Hu et al. 2025): the state is corrected at ``k`` from what it
reads at ``p``. Its three forms equal fla's ``naive_recurrent_comba`` in float64, outputs and final states; packed
documents equal each document alone; ``read=k`` is the delta rule bit for bit; a read key of the wrong shape is
refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnlab.efficient import recurrence
from tests.efficient.test_gated import bthd, fla_naive

B, H, D, DV = 2, 3, 6, 4


def inputs(n=37, b=B, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, dtype=torch.float64, generator=gen)  # noqa: E731
    return {"q": r(b, H, n, D), "k": F.normalize(r(b, H, n, D), dim=-1), "v": r(b, H, n, DV),
            "p": F.normalize(r(b, H, n, D), dim=-1), "beta": torch.rand(b, H, n, dtype=torch.float64, generator=gen),
            "g": -0.5 * torch.rand(b, H, n, dtype=torch.float64, generator=gen),
            "g_channel": -0.5 * torch.rand(b, H, n, D, dtype=torch.float64, generator=gen), "s0": r(b, H, D, DV)}


def reference(x, state):
    """fla's naive_recurrent_comba, in attnlab's (B, H, N, D) layout, q unscaled (scale=1)."""
    o, s = fla_naive("comba").naive_recurrent_comba(
        bthd(x["q"]), bthd(x["k"]), bthd(x["v"]), bthd(x["p"]), bthd(x["beta"]), bthd(x["g"]), scale=1.0,
        initial_state=None if state is None else state.clone(), output_final_state=True)
    return bthd(o), s


def close(actual, expected, tol=1e-10, what=""):
    torch.testing.assert_close(actual, expected, rtol=0.0, atol=tol, msg=lambda m: f"{what}: {m}")


FORMS = [("recurrent", {}), ("parallel", {}), ("chunk", {"chunk": 1}), ("chunk", {"chunk": 5}),
         ("chunk", {"chunk": 16}), ("chunk", {"chunk": 64}), ("chunk", {"chunk": 4, "segment": 12})]


def delta(form, x, g, read, **kw):
    return getattr(recurrence, f"{form}_delta")(x["q"], x["k"], x["v"], x["beta"], g, read=read, **kw)


@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("form,kw", FORMS)
def test_each_form_with_a_read_key_equals_fla_naive_recurrent_comba(form, kw, with_state):
    x = inputs()
    state = x["s0"] if with_state else None
    ref_out, ref_final = reference(x, state)
    out, final = delta(form, x, x["g"], x["p"], state=state, **kw)
    close(out, ref_out, what=f"{form} {kw} output")
    close(final, ref_final, what=f"{form} {kw} final state")


def test_delta_token_with_a_read_key_equals_fla_naive_recurrent_comba():
    x = inputs(n=1)
    ref_out, ref_final = reference(x, x["s0"])
    out, final = recurrence.delta_token(*(x[n][:, :, 0] for n in ("q", "k", "v", "beta", "g")), x["s0"],
                                       read=x["p"][:, :, 0])
    close(out, ref_out[:, :, 0], what="step output")
    close(final, ref_final, what="step state")


@pytest.mark.parametrize("form,kw", [("parallel", {}), ("chunk", {"chunk": 5}), ("chunk", {"chunk": 4, "segment": 12})])
def test_a_per_channel_decay_with_a_read_key_equals_the_recurrent_form(form, kw):
    x = inputs()
    ref_out, ref_final = delta("recurrent", x, x["g_channel"], x["p"], state=x["s0"])
    out, final = delta(form, x, x["g_channel"], x["p"], state=x["s0"], **kw)
    close(out, ref_out, what=f"{form} {kw} output")
    close(final, ref_final, what=f"{form} {kw} final state")


@pytest.mark.parametrize("form,kw", FORMS)
@pytest.mark.parametrize("gate", [None, "g", "g_channel"])
def test_read_k_is_the_delta_rule_bit_for_bit(form, kw, gate):
    x = inputs()
    g = None if gate is None else x[gate]
    without = delta(form, x, g, None, state=x["s0"], **kw)
    with_k = delta(form, x, g, x["k"], state=x["s0"], **kw)
    with_copy = delta(form, x, g, x["k"].clone(), state=x["s0"], **kw)
    for got in (with_k, with_copy):
        assert all(torch.equal(a, b) for a, b in zip(got, without)), f"{form} {kw} {gate}"


def test_delta_token_with_read_k_is_the_delta_token_bit_for_bit():
    x = inputs(n=1)
    args = [x[n][:, :, 0] for n in ("q", "k", "v", "beta", "g")] + [x["s0"]]
    got, want = recurrence.delta_token(*args, read=x["k"][:, :, 0].clone()), recurrence.delta_token(*args)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("segment", [None, 16])
@pytest.mark.parametrize("with_state", [False, True])
def test_a_packed_call_with_a_read_key_equals_each_document_alone(with_state, segment):
    lengths = [5, 0, 17, 1, 9, 40]  # an empty document; lengths that are not whole chunks
    x = inputs(n=sum(lengths), b=1)
    s0 = torch.randn(len(lengths), H, D, DV, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
    out, finals = delta("chunk", x, x["g"], x["p"], state=s0 if with_state else None, chunk=4, cu_seqlens=cu,
                        segment=segment)
    outs, states = [], []
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist())):
        init = s0[i : i + 1] if with_state else None
        if a == b:  # an empty document keeps its initial state
            states.append(s0[i] if with_state else torch.zeros_like(s0[i]))
            continue
        o, s = delta("chunk", {n: t[:, :, a:b] for n, t in x.items() if n != "s0"}, x["g"][:, :, a:b], x["p"][:, :, a:b],
                     state=init, chunk=4)
        outs.append(o)
        states.append(s[0])
    close(out, torch.cat(outs, 2), what="packed output")
    close(finals, torch.stack(states), what="packed final states")


@pytest.mark.parametrize("kw", [{"chunk": 5}, {"chunk": 16}, {"chunk": 4, "segment": 12}])
def test_the_gradient_wrt_the_read_key_of_the_chunkwise_form_equals_the_parallel_forms(kw):
    x = inputs()
    probe = torch.randn(B, H, 37, DV, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    grads = []
    for form, extra in [("parallel", {}), ("chunk", kw)]:
        p = x["p"].clone().requires_grad_(True)
        out, final = delta(form, x, x["g"], p, state=x["s0"], **extra)
        grads.append(torch.autograd.grad((out * probe).sum() + final.square().sum(), p)[0])
    assert grads[0].abs().max() > 1e-3  # the read key reaches the output
    close(grads[1], grads[0], 1e-8, f"chunk {kw} gradient of read")


@pytest.mark.parametrize("form", ["recurrent", "parallel", "chunk"])
@pytest.mark.parametrize("bad", [torch.zeros(B, H, 37, D + 1), torch.zeros(B, H, 36, D), "p"])
def test_a_read_key_of_the_wrong_shape_is_refused(form, bad):
    x = inputs()
    with pytest.raises(ValueError, match="read"):
        delta(form, x, x["g"], bad)


def test_delta_token_refuses_a_read_key_of_the_wrong_shape():
    x = inputs(n=1)
    args = [x[n][:, :, 0] for n in ("q", "k", "v", "beta", "g")] + [x["s0"]]
    with pytest.raises(ValueError, match="read"):
        recurrence.delta_token(*args, read=torch.zeros(B, H, D + 1, dtype=torch.float64))
