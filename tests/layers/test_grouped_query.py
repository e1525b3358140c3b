"""Grouped-query and multi-query attention (num_kv_heads): G = H is today's layer; grouped heads
equal the same layer with each key / value head repeated for its query heads (float64)."""

import pytest
import torch

from attnlab import MultiHeadAttention, attend, efficient
from attnlab.core import masks

E, H = 32, 4


def repeated(m: MultiHeadAttention) -> MultiHeadAttention:
    """The H-head layer whose key / value heads are ``m``'s G heads, each repeated for its H / G query heads."""
    full = MultiHeadAttention(E, H, score=m.step.score_name, normalize=m.step.normalize,
                              positional=None if m.positional is None else m.positional, head_mode=m.head_mode).double()
    r, d = H // m.num_kv_heads, m.head_dim
    with torch.no_grad():
        for name in ("q_proj", "out_proj"):
            getattr(full, name).load_state_dict(getattr(m, name).state_dict())
        for name in ("k_proj", "v_proj"):
            src, dst = getattr(m, name), getattr(full, name)
            if m.head_mode == "split":
                dst.weight.copy_(src.weight.view(m.num_kv_heads, d, E).repeat_interleave(r, 0).reshape(E, E))
                dst.bias.copy_(src.bias.view(m.num_kv_heads, d).repeat_interleave(r, 0).reshape(E))
            else:
                dst.load_state_dict(src.state_dict())
        if m.head_mode == "project":
            full.head_q.copy_(m.head_q)
            full.head_k.copy_(m.head_k.repeat_interleave(r, 0))
            full.head_v.copy_(m.head_v.repeat_interleave(r, 0))
        full.step.score.load_state_dict(m.step.score.state_dict())  # learnable scores (additive): the same weights
    return full


def test_g_equal_h_is_todays_layer():
    torch.manual_seed(0)
    a = MultiHeadAttention(E, H)
    torch.manual_seed(0)
    b = MultiHeadAttention(E, H, num_kv_heads=H)
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}
    x = torch.randn(2, 7, E)
    assert torch.equal(a(x).output, b(x).output)


@pytest.mark.parametrize("g", [1, 2])
@pytest.mark.parametrize(
    "options",
    [{}, {"score": "cosine"}, {"score": "additive"}, {"normalize": "relu"}, {"positional": "rope"}, {"positional": "alibi"},
     {"head_mode": "project"}],
    ids=["sdpa", "cosine", "additive", "relu", "rope", "alibi", "project"],
)
def test_grouped_heads_equal_explicitly_repeated_keys_and_values(g, options):
    torch.manual_seed(0)
    m = MultiHeadAttention(E, H, num_kv_heads=g, **options).double()
    full = repeated(m)
    if options.get("positional") in ("rope", "alibi"):
        full.positional = m.positional
    x = torch.randn(2, 9, E, dtype=torch.float64, requires_grad=True)
    mask = masks.and_masks(masks.padding([9, 6]).dense(9, 9), masks.causal().dense(9))
    for kwargs in ({}, {"mask": mask}):
        out, ref = m(x, **kwargs), full(x, **kwargs)
        assert (out.output - ref.output).abs().max() < 1e-10
        (gx,) = torch.autograd.grad(out.output.square().sum(), x)
        (rx,) = torch.autograd.grad(ref.output.square().sum(), x)
        assert (gx - rx).abs().max() < 1e-10
    w, rw = m(x, return_weights=True).weights, full(x, return_weights=True).weights
    assert (w - rw).abs().max() < 1e-12


def test_attend_takes_grouped_keys_on_the_fused_and_the_chunked_path():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 5, 8, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 7, 8, generator=gen, dtype=torch.float64) for _ in range(2))
    mask = masks.padding([7, 4]).dense(7, 7)
    for backend in ("auto", "chunked"):
        out = attend(q, k, v, mask=mask, backend=backend).output
        ref = attend(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), mask=mask, backend=backend).output
        assert (out - ref).abs().max() < 1e-12
    with pytest.raises(ValueError, match="G key heads dividing H"):
        attend(q, k[:, :1].expand(2, 4, 7, 8), v[:, :1].expand(2, 4, 7, 8))
    with pytest.raises(ValueError, match="G key heads dividing H"):
        attend(q, k[:, :0], v[:, :0])
    # empty queries, keys or batches with grouped keys: zeros of the query heads' shape
    assert attend(q[:, :, :0], k, v).output.shape == (2, 6, 0, 8)
    assert attend(q, k[:, :, :0], v[:, :, :0]).output.abs().sum() == 0
    assert attend(q[:0], k[:0], v[:0]).output.shape == (0, 6, 5, 8)


def test_an_efficient_variant_is_handed_repeated_heads():
    torch.manual_seed(0)
    dense = MultiHeadAttention(E, H, num_kv_heads=2).double()
    local = efficient.create("local", embed_dim=E, num_heads=H, num_kv_heads=2, window=16).double()
    local.load_state_dict(dense.state_dict())
    x = torch.randn(2, 9, E, dtype=torch.float64)
    assert (local(x).output - dense(x).output).abs().max() < 1e-10  # window >= N: exact


def test_conversion_mean_pools_each_groups_key_and_value_heads():
    torch.manual_seed(0)
    m = MultiHeadAttention(E, H).double()
    x = torch.randn(2, 7, E, dtype=torch.float64)
    assert torch.equal(m.grouped(H)(x).output, m(x).output)
    g = m.grouped(2)
    assert g.num_kv_heads == 2 and g.k_proj.weight.shape == (16, E) and m.num_kv_heads == H  # the original is untouched
    d = m.head_dim
    for name in ("k_proj", "v_proj"):
        w = getattr(m, name).weight
        for group in range(2):
            heads = [w[h * d : (h + 1) * d] for h in (2 * group, 2 * group + 1)]
            assert torch.allclose(getattr(g, name).weight[group * d : (group + 1) * d], (heads[0] + heads[1]) / 2)
    mq = m.grouped(1)
    assert (mq(x).output - repeated(mq)(x).output).abs().max() < 1e-10


def test_bad_head_counts_are_refused():
    with pytest.raises(ValueError, match="num_kv_heads must divide num_heads"):
        MultiHeadAttention(E, H, num_kv_heads=3)
    with pytest.raises(ValueError, match="num_kv_heads must be"):
        MultiHeadAttention(E, H, num_kv_heads=0)
    with pytest.raises(ValueError, match="derives its keys from the queries"):
        efficient.create("reformer", embed_dim=E, num_heads=H, num_kv_heads=2)
    with pytest.raises(ValueError, match="no grouped heads"):
        MultiHeadAttention(E, H, num_kv_heads=2).to_torch()
