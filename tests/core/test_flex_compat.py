"""FlexAttention's mask and score functions run unchanged on attnlab, and attnlab's on FlexAttention.

attention-gym (pytorch-labs, on PyPI as ``attn-gym``) is the library of FlexAttention
mask_mods and score_mods: fourteen of its mask_mods go through ``attend`` block-sparse and
give, in float64, the reference under FlexAttention's own dense mask of the same callable
(``create_mask``), outputs and gradients, and FlexAttention's (eager) output; its score_mods
(ALiBi, tanh soft-capping) give FlexAttention's output; attnlab's library masks build
FlexAttention block masks and give attend's output. (FlexAttention runs forward only on CPU.)
"""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention

from attnlab import attend, masks, reference_attention, score_mods

gym_masks = pytest.importorskip("attn_gym.masks")
gym_mods = pytest.importorskip("attn_gym.mods")

H, D = 2, 8


def _offsets(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])


def gym_cases():
    """(name, mask_mod, N, M, batch): fourteen of attention-gym's mask_mods with their arguments."""
    offs = _offsets([7, 13, 9, 19])  # 48 tokens in 4 documents
    is_global = torch.zeros(48, dtype=torch.bool)
    is_global[[0, 20]] = True
    intervals = torch.tensor([[0, 20], [16, 40]])  # cross-attention: 40 text queries, 2 images of 12 tokens
    return [
        ("causal", gym_masks.causal_mask, 48, 48, 1),
        ("sliding_window", gym_masks.generate_sliding_window(5), 48, 48, 1),
        ("document causal", gym_masks.generate_doc_mask_mod(gym_masks.causal_mask, offs), 48, 48, 1),
        ("packed causal documents", gym_masks.generate_packed_causal_doc_mask_mod(offs), 48, 48, 1),
        ("global sliding window", gym_masks.generate_global_sliding_window(3, is_global), 48, 48, 1),
        ("prefix lm", gym_masks.generate_prefix_lm_mask(9), 48, 48, 1),
        ("dilated sliding window", gym_masks.generate_dilated_sliding_window(8, 2), 48, 48, 1),
        ("natten", gym_masks.generate_natten(8, 6, 3, 3), 48, 48, 1),
        ("tiled natten", gym_masks.generate_tiled_natten(8, 6, 3, 3, 2, 2), 48, 48, 1),
        ("shared prefix", gym_masks.generate_shared_prefix_mask_mod(offs, torch.tensor([0, 0, 2, 2])), 48, 48, 1),
        ("block diffusion", gym_masks.generate_block_diffusion_mask(24, 4), 48, 48, 1),
        ("batchify", gym_masks.batchify_mask_mod(gym_masks.causal_mask, 12), 48, 48, 1),
        ("svg spatial head", gym_masks.generate_spatial_head_mask_mod(4, 4, 11, 1, round_width=4), 48, 48, 1),
        ("flamingo cross-attention", gym_masks.generate_vision_cross_attention_mask_mod(intervals, 12), 40, 24, 2),
    ]


def _qkv(b, n, m, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, H, x, D, generator=g, dtype=torch.float64, requires_grad=grad) for x in (n, m, m)]


@pytest.mark.parametrize("name,mod,n,m,b", gym_cases(), ids=[c[0] for c in gym_cases()])
def test_attention_gym_mask_mods_run_unchanged_and_equal_flex_attention(name, mod, n, m, b):
    q, k, v = _qkv(b, n, m)
    dense = create_mask(mod, b, H, n, m, device="cpu")  # FlexAttention's own evaluation of the callable
    ref, _ = reference_attention(q, k, v, mask=dense)
    for block in (8, (5, 3)):
        out = attend(q, k, v, mask=mod, block_size=block).output
        assert (out - ref).abs().max() < 1e-10, (name, block)
        g = torch.randn_like(out)
        got = torch.autograd.grad(out, (q, k, v), g)
        want = torch.autograd.grad(ref, (q, k, v), g, retain_graph=True)
        assert max((a - w).abs().max().item() for a, w in zip(got, want)) < 1e-10, (name, block)
    bm = masks.block_map(mod, n, m, batch=b, heads=H, block_size=8)
    if name not in ("svg spatial head",):  # every other one leaves whole tiles out
        assert bm.density() < 1.0, name
    qd, kd, vd = (t.detach() for t in (q, k, v))  # FlexAttention has no backward on CPU: inputs without gradients
    flex = flex_attention(qd, kd, vd, block_mask=create_block_mask(mod, b, H, n, m, device="cpu"))
    live = dense.any(-1, keepdim=True)  # FlexAttention gives 0 to rows with no key too
    assert ((flex - attend(qd, kd, vd, mask=mod).output) * live).abs().max() < 1e-10, name


def test_a_mask_mod_is_evaluated_one_scalar_at_a_time_as_in_flex_attention():
    """flamingo's mask reads ``intervals[image][0]``: correct for a scalar image index (FlexAttention
    vmaps the callable), wrong if the callable were called on broadcast index tensors; attnlab
    evaluates plain callables under vmap too, and finds which depend on the head."""
    intervals = torch.tensor([[0, 20], [16, 40]])
    mod = gym_masks.generate_vision_cross_attention_mask_mod(intervals, 12)
    want = create_mask(mod, 1, 1, 40, 24, device="cpu")[0, 0]
    assert torch.equal(masks.as_mask(mod).dense(40, 24), want)

    def per_head(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + h

    bm = masks.block_map(per_head, 32, batch=2, heads=3, block_size=8)
    assert bm.state.shape[:2] == (1, 3)  # one map per head, the same for every batch row
    assert torch.equal(masks.as_mask(per_head).dense(32, heads=3)[0, 2], create_mask(per_head, 1, 3, 32, 32, device="cpu")[0, 2])


def test_attention_gym_score_mods_equal_flex_attention_and_the_library_ones():
    q, k, v = _qkv(1, 40, 40, seed=1, grad=False)
    causal = create_block_mask(gym_masks.causal_mask, None, None, 40, 40, device="cpu")
    for gym, ours in ((gym_mods.generate_alibi_bias(H), score_mods.alibi(H)), (gym_mods.generate_tanh_softcap(3), score_mods.softcap(3))):
        want = flex_attention(q, k, v, score_mod=gym, block_mask=causal)
        for mod in (gym, ours):
            got = attend(q, k, v, score_mod=mod, mask=masks.causal(), block_size=8).output
            assert (got - want).abs().max() < 1e-6  # gym's ALiBi slopes are float32, the library's float64


LIBRARY = {
    "causal": masks.causal(),
    "window": masks.window(5),
    "look-back window": masks.window(5, causal=True),
    "dilated window": masks.dilated_window(8, 2),
    "documents": masks.Documents([7, 13, 9, 19], causal=True),
    "prefix lm": masks.prefix_lm(9),
    "longformer": masks.window(3) | masks.global_tokens([0, 20]),
    "bigbird": (masks.window(3) | masks.global_tokens(2) | masks.random_blocks(2, 8, seed=1)).bind(48, 48),
    "no self": masks.causal() & masks.no_self(),
}


@pytest.mark.parametrize("name", list(LIBRARY))
def test_library_masks_build_flex_attention_block_masks(name):
    mask = LIBRARY[name]
    q, k, v = _qkv(1, 48, 48, seed=2, grad=False)
    flex = flex_attention(q, k, v, block_mask=create_block_mask(mask, None, None, 48, 48, device="cpu"))
    ours = attend(q, k, v, mask=mask, block_size=8).output
    live = mask.dense(48).any(-1, keepdim=True)
    assert ((flex - ours) * live).abs().max() < 1e-10
    assert torch.equal(create_mask(mask, 1, 1, 48, 48, device="cpu")[0, 0], mask.dense(48))
