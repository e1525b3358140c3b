"""Score functions written as plain functions over learnable tensors (FlexAttention's idiom:
``lambda s, b, h, q, k: s + table[h, q - k]``) get exact gradients on the dense and block-sparse
paths (the ring's are in tests/distributed/test_ring.py), or are refused; never silently none."""

import functools
import types

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnlab import attend, masks
from attnlab.core.reference import reference_attention
from attnlab.core.score_mods import ScoreMod, alibi_slopes, learnable_tensors

F64 = torch.float64
H = 2


def _qkv(n, m=None, d=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, H, x, d, generator=gen, dtype=F64) for x in (n, m or n, m or n))


def _grads(mod, params, mask, q, k, v, block_size=None, weights=False):
    """(output, [grad of each param]) through attend, and the same through the float64 reference."""
    got = []
    for which in ("attend", "reference"):
        for p in params:
            p.grad = None
        if which == "attend":
            res = attend(q, k, v, score_mod=mod, mask=mask, block_size=block_size, return_weights=weights)
            out = res.output
        else:
            out = reference_attention(q, k, v, score_mod=mod, mask=mask)[0]
        out.backward(torch.ones_like(out) + torch.arange(out.shape[-2], dtype=F64)[:, None], retain_graph=True)  # rows weighted unequally
        got.append((out.detach(), [p.grad.clone() for p in params]))
    return got


MASKS = {
    "none": None,
    "causal": masks.causal(),
    "window": masks.window(3),
    "documents": masks.Documents([7, 3, 10], causal=True),
}


@pytest.mark.parametrize("mask", MASKS, ids=list(MASKS))
@pytest.mark.parametrize("block_size", [None, 4])
def test_a_relative_bias_table_captured_by_a_lambda_gets_the_reference_gradient(mask, block_size):
    n = 20
    table = torch.randn(H, 2 * n - 1, dtype=F64, requires_grad=True)
    mod = lambda s, b, h, q, k: s + table[h, q - k + n - 1]  # noqa: E731
    (out, (g,)), (ref, (g_ref,)) = _grads(mod, [table], MASKS[mask], *_qkv(n), block_size=block_size)
    assert (out - ref).abs().max() < 1e-10
    assert g_ref.abs().sum() > 0 and (g - g_ref).abs().max() < 1e-10


def test_the_weights_path_and_repeated_runs_agree_bitwise():
    n = 12
    table = torch.randn(H, 2 * n - 1, dtype=F64, requires_grad=True)
    mod = lambda s, b, h, q, k: s + table[h, q - k + n - 1]  # noqa: E731
    runs = [_grads(mod, [table], masks.causal(), *_qkv(n), block_size=4, weights=w)[0][1][0] for w in (False, False, True)]
    assert torch.equal(runs[0], runs[1])  # deterministic: the same tiles, summed in the same order
    assert (runs[0] - runs[2]).abs().max() < 1e-12  # return_weights runs plain autograd: the same gradient


class _Slopes:
    """A score function as a bound method of an object holding its tensor."""

    def __init__(self):
        self.slopes = alibi_slopes(H).to(F64).requires_grad_(True)

    def mod(self, s, b, h, q, k):
        return s + self.slopes[h] * (k - q)


_GLOBAL_SCALE = torch.tensor(0.7, dtype=F64, requires_grad=True)


def _global_mod(s, b, h, q, k):
    return s * _GLOBAL_SCALE


def _default_mod(s, b, h, q, k, gate=torch.tensor([0.5, -1.0], dtype=F64, requires_grad=True)):  # noqa: B008
    return s + gate[h]


def _partial_mod(cap, s, b, h, q, k):
    return cap * torch.tanh(s / cap)


def test_every_way_of_capturing_a_tensor_is_followed():
    weight = torch.randn(H, 39, dtype=F64, requires_grad=True)
    derived = weight * 2  # a tensor computed from a parameter: the gradient goes through it to the parameter
    cap = torch.tensor(3.0, dtype=F64, requires_grad=True)
    obj = _Slopes()
    cases = {
        "closure over a derived tensor": (lambda s, b, h, q, k: s + derived[h, q - k + 19], weight),
        "default argument": (_default_mod, _default_mod.__defaults__[0]),
        "bound method": (obj.mod, obj.slopes),
        "global": (_global_mod, _GLOBAL_SCALE),
        "functools.partial": (functools.partial(_partial_mod, cap), cap),
        "ScoreMod": (ScoreMod(lambda s, b, h, q, k: s + weight[h, q - k + 19], params=[weight]), weight),
    }
    q, k, v = _qkv(20, seed=3)
    for name, (mod, param) in cases.items():
        found = learnable_tensors(mod)
        assert any(t is param for t in found) or (name.startswith("closure") and any(t is derived for t in found)), name
        (out, (g,)), (ref, (g_ref,)) = _grads(mod, [param], masks.causal(), q, k, v, block_size=8)
        assert g_ref.abs().sum() > 0 and (g - g_ref).abs().max() < 1e-10, name


class _Slotted:
    __slots__ = ("table",)

    def __init__(self, table):
        self.table = table


def test_a_learnable_tensor_the_function_reaches_but_attnlab_cannot_is_refused_by_name():
    hidden = _Slotted(torch.randn(H, dtype=F64, requires_grad=True))  # no __dict__: nothing to follow
    mod = lambda s, b, h, q, k, held=hidden: s + held.table[h]  # noqa: E731
    q, k, v = _qkv(8)
    with pytest.raises(ValueError, match=r"cannot reach.*ScoreMod\(fn, params=\[\.\.\.\]\)"):
        attend(q, k, v, score_mod=mod)
    with torch.no_grad():  # no gradient asked: nothing to lose, so it runs
        attend(q, k, v, score_mod=mod)
    ok = ScoreMod(mod, params=[hidden.table])  # the fix the message names
    out = attend(q, k, v, score_mod=ok).output
    out.sum().backward()
    assert hidden.table.grad is not None and hidden.table.grad.abs().sum() > 0


def _library_as_closures(n):
    """The library's score functions (attnlab.score_mods: ALiBi, soft-capping, the relative bias
    of offset_bias) rewritten as plain closures over learnable tensors."""
    slopes = alibi_slopes(H).to(F64).requires_grad_(True)
    cap = torch.tensor(2.0, dtype=F64, requires_grad=True)
    table = (0.3 * torch.randn(H, 2 * n - 1, dtype=F64)).requires_grad_(True)
    return {
        "alibi": (lambda s, b, h, q, k: s + slopes[h] * (k - q), slopes),
        "softcap": (lambda s, b, h, q, k: cap * torch.tanh(s / cap), cap),
        "relative": (lambda s, b, h, q, k: s + table[h, q - k + n - 1], table),
    }


@given(n=st.integers(1, 17), which=st.sampled_from(["alibi", "softcap", "relative"]), mask=st.sampled_from(list(MASKS)),
       block=st.sampled_from([None, 2, 5]), seed=st.integers(0, 2**16))
def test_property_the_librarys_score_functions_as_closures_get_the_reference_gradient(n, which, mask, block, seed):
    torch.manual_seed(seed)
    mod, param = _library_as_closures(n)[which]
    rule = MASKS[mask] if mask != "documents" else masks.Documents([max(n // 2, 1), n - max(n // 2, 1)] if n > 1 else [1])
    (out, (g,)), (ref, (g_ref,)) = _grads(mod, [param], rule, *_qkv(n, seed=seed), block_size=block)
    assert (out - ref).abs().max() < 1e-10
    assert (g - g_ref).abs().max() < 1e-10


weight = torch.nn.Parameter(torch.ones(3))  # a global that shares its name with an attribute below


def test_only_loaded_globals_are_followed_not_attribute_names_that_match_one():
    holder = types.SimpleNamespace(weight=torch.tensor([0.5, 2.0], dtype=F64, requires_grad=True))
    found = learnable_tensors(lambda s, b, h, q, k: s * holder.weight[h])
    assert len(found) == 1 and found[0] is holder.weight  # not the module's global `weight`
    assert any(t is weight for t in learnable_tensors(lambda s, b, h, q, k: s * weight[h]))


def test_the_weights_path_needs_no_check_plain_autograd_reaches_every_tensor():
    hidden = _Slotted(torch.randn(H, dtype=F64, requires_grad=True))
    mod = lambda s, b, h, q, k, held=hidden: s + held.table[h]  # noqa: E731
    q, k, v = _qkv(8)
    attend(q, k, v, score_mod=mod, return_weights=True).output.sum().backward()
    assert hidden.table.grad is not None and hidden.table.grad.abs().sum() > 0
