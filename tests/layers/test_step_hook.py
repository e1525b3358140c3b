"""MultiHeadAttention.register_step_hook: the arena's way to see the attention step's inputs
without replacing a method on a live instance."""

import pytest
import torch

from attnlab import MultiHeadAttention, efficient, masks


def test_the_hook_sees_what_the_step_receives_and_recomputes_the_output():
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 4, positional="rope", max_len=32).double()
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    seen = []
    handle = layer.register_step_hook(lambda mod, q, k, v, kw: seen.append((mod, q, k, v, kw)))
    out = layer(x, mask=masks.causal()).output
    (mod, q, k, v, kw), = seen
    assert mod is layer and q.shape == (2, 4, 9, 4) and k.shape == v.shape == (2, 4, 9, 4)
    handle.remove()  # the step's own call runs the hooks too, whoever calls it
    again = layer.merge_heads(layer.step(q, k, v, **kw).output)  # rotated heads and the causal mask: the same output
    torch.testing.assert_close(again, out, rtol=0, atol=1e-12)
    layer(x)
    assert len(seen) == 1


def test_with_a_cache_the_hook_sees_the_held_keys():
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 4)
    cache = layer.new_cache()
    shapes = []
    layer.register_step_hook(lambda mod, q, k, v, kw: shapes.append((q.shape[2], k.shape[2])))
    x = torch.randn(1, 6, 16)
    layer(x[:, :4], cache=cache)
    layer(x[:, 4:5], cache=cache)
    layer(x[:, 5:6], cache=cache)
    assert shapes == [(4, 4), (1, 5), (1, 6)]


def test_an_efficient_variants_hook_sees_its_own_step():
    layer = efficient.create("local", embed_dim=16, num_heads=4, window=2)
    calls = []
    layer.register_step_hook(lambda mod, q, k, v, kw: calls.append(kw.get("mask")))
    layer(torch.randn(1, 8, 16))
    assert len(calls) == 1


def test_a_grouped_copy_starts_without_the_hooks_and_a_hook_cannot_change_the_step():
    layer = MultiHeadAttention(16, 4)
    calls = []
    layer.register_step_hook(lambda mod, q, k, v, kw: calls.append(mod) or kw.clear())
    x = torch.randn(1, 5, 16)
    layer(x, mask=masks.causal())
    assert calls == [layer]
    torch.testing.assert_close(layer(x, mask=masks.causal()).output, layer(x, mask=masks.causal()).output)
    hooked = layer(x, mask=masks.causal()).output  # kw.clear() on its copy: the causal mask still applies
    without = MultiHeadAttention(16, 4)
    without.load_state_dict(layer.state_dict())
    torch.testing.assert_close(hooked, without(x, mask=masks.causal()).output, rtol=0, atol=0)
    calls.clear()
    layer.grouped(2)(x)
    assert calls == []


def test_clear_step_hooks_removes_every_hook():
    layer = MultiHeadAttention(16, 4)
    calls = []
    for _ in range(2):
        layer.register_step_hook(lambda mod, q, k, v, kw: calls.append(mod))
    layer.clear_step_hooks()
    layer(torch.randn(1, 5, 16))
    assert calls == []


def test_a_hook_that_is_not_callable_is_refused_when_registered():
    layer = MultiHeadAttention(16, 4)
    with pytest.raises(TypeError, match="a step hook is a callable .* got int"):
        layer.register_step_hook(3)
    layer(torch.randn(1, 3, 16))  # nothing was registered: the forward pass still runs
    assert not layer.step._hooks
