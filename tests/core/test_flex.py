"""FlexAttention as a backend of ``attend``: the BlockMask built from a block map, and the checked kernel.

On the CPU FlexAttention runs its eager operator (PyTorch's reference math and autograd) with a
mask that reads the BlockMask's tile lists as the compiled kernels do, so these tests see the
BlockMask: a tile it leaves out is never computed, a FULL tile is computed unmasked.
"""

import dataclasses

import pytest
import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from attnlab import attend, masks
from attnlab.core import kernels
from attnlab.core.attend import FLEX
from attnlab.core.blockmap import block_map
from attnlab.core.flex import FLEX_BLOCK, block_mask, flex_attend, tiles
from attnlab.core.maskfn import EMPTY, FULL, PARTIAL

N = 200  # not a multiple of any tile below


def every_third(b, h, q_idx, kv_idx):
    """A plain callable: FlexAttention's mask_mod, unknown to attnlab's structure."""
    return ((q_idx - kv_idx) % 3 == 0) | (kv_idx < 5)


CASES = {  # name: (mask, batch, key heads, block_size, queries, keys)
    "window": (masks.window(20), 1, 2, 32, N, N),
    "look-back window": (masks.window(40, causal=True), 1, 2, None, N, N),
    "causal": (masks.causal(), 1, 2, 32, N, N),
    "longformer": (masks.window(10) | masks.global_tokens([0, 77]), 1, 2, 32, N, N),
    "bigbird": (masks.window(10) | masks.global_tokens(2) | masks.random_blocks(2, 16, seed=1), 1, 2, 16, N, N),
    "documents": (masks.Documents([[50, 90, 60], [120, 80]], causal=True), 2, 4, 32, N, N),
    "prefix lm": (masks.prefix_lm(37), 1, 2, 32, N, N),
    "plain callable": (every_third, 1, 2, 32, N, N),
    "padding": (masks.padding([150, 0]) & masks.window(30), 2, 2, 32, N, N),  # row 1: no key at all
    "causal, more queries than keys": (masks.causal(), 1, 4, 32, N, 130),  # the first 70 queries see no key
}


def _qkv(b, g, n, m, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, 4, n, 16, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(b, g, m, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    return q, k, v


@pytest.mark.parametrize("name", list(CASES))
def test_flex_equals_the_block_sparse_path_forward_and_backward(name):
    mask, b, g, block, n, m = CASES[name]
    q, k, v = _qkv(b, g, n, m)
    if name == "padding":  # keys no query sees hold NaN: it must not leak
        k[:, :, 150:], v[:, :, 150:] = float("nan"), float("nan")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    got = attend(q, k, v, mask=mask, backend="flex", block_size=block).output
    want = attend(q, k, v, mask=mask, backend="chunked", block_size=block).output
    assert torch.isfinite(got).all()
    assert (got - want).abs().max() < 1e-12, name
    ct = torch.randn_like(got)
    grads = torch.autograd.grad(got, (q, k, v), ct)
    wants = torch.autograd.grad(want, (q, k, v), ct)
    for which, a, w in zip("qkv", grads, wants):
        assert torch.isfinite(a).all() and (a - w).abs().max() < 1e-12, (name, which)
    if name in ("padding", "causal, more queries than keys"):  # rows with no key: zeros and zero gradients
        live = masks.as_mask(mask).dense(n, m, batch=b).reshape(b, 1, n, m).any(-1).expand(-1, 4, -1)  # (B, H, N)
        assert (~live).any() and got.abs().amax(-1)[~live].max() == 0
        assert grads[0].abs().amax(-1)[~live].max() == 0
        assert got.abs().amax(-1)[live].min() > 0


def test_the_block_mask_lists_the_block_maps_tiles():
    mask = masks.window(10) | masks.global_tokens([0, 77]) | masks.Documents([[60, 100, 40]])
    bmap = block_map(mask, N, heads=2, block_size=(32, 16))
    nq, nk = bmap.shape
    rows = bmap.rows(0, nq)  # (Bm, Hm, NQ, NK)
    assert {EMPTY, PARTIAL, FULL} <= set(rows.unique().tolist())
    blocks = block_mask(bmap)
    assert blocks.BLOCK_SIZE == (32, 16) and blocks.seq_lengths == (N, N) and blocks.mask_mod is bmap.mask
    assert blocks.kv_indices.dtype == blocks.kv_num_blocks.dtype == torch.int32
    assert blocks.kv_indices.shape == (*rows.shape[:2], nq, nk) and blocks.full_kv_indices.shape == blocks.kv_indices.shape
    assert torch.equal(blocks.to_dense().bool(), rows != EMPTY)
    full = BlockMask.from_kv_blocks(blocks.full_kv_num_blocks, blocks.full_kv_indices)
    assert torch.equal(full.to_dense().bool(), rows == FULL)
    assert torch.equal(tiles(blocks), rows)
    assert blocks.q_indices is not None  # the lists the backward pass reads, transposed by FlexAttention


def test_the_block_mask_equals_flex_attentions_own_where_the_tiles_divide_the_length():
    mask = masks.window(10) | masks.global_tokens([0, 77])
    bmap = block_map(mask, 192, block_size=32)
    ours, theirs = block_mask(bmap), create_block_mask(mask, None, None, 192, 192, device="cpu", BLOCK_SIZE=32)
    assert torch.equal(ours.to_dense(), theirs.to_dense())
    assert torch.equal(tiles(ours), tiles(theirs))


def _drop_one_full_tile(blocks: BlockMask) -> BlockMask:
    full = blocks.full_kv_num_blocks.clone()
    row = int((full[0, 0] > 0).nonzero()[-1])
    full[0, 0, row] -= 1  # the row's last FULL tile is no longer listed
    return BlockMask.from_kv_blocks(blocks.kv_num_blocks, blocks.kv_indices, full, blocks.full_kv_indices,
                                    BLOCK_SIZE=blocks.BLOCK_SIZE, mask_mod=blocks.mask_mod, seq_lengths=blocks.seq_lengths)


def test_the_registered_kernel_passes_its_check_and_a_wrong_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path))
    assert FLEX in kernels.kernels_for("longformer") and FLEX.devices == ("cuda",)
    assert not kernels.serves(FLEX, "cpu", torch.float32, backward=True)  # not a device it serves
    q, k, v, maps = FLEX.sample("cpu", torch.float32, torch.Generator().manual_seed(0))
    assert len(maps) == 4 and k.shape[1] < q.shape[1]  # a window, global tokens, a nested or, random blocks
    for bmap in maps:
        assert bmap.block == (FLEX_BLOCK, FLEX_BLOCK)
        assert {EMPTY, PARTIAL, FULL} <= set(bmap.rows(0, bmap.shape[0]).unique().tolist())
    on_cpu = dataclasses.replace(FLEX, devices=("cpu",))
    kernels.forget()
    try:
        good = kernels.verdict(on_cpu, "cpu", torch.float32)  # checked, and kept on disk
        assert good is not None and good.forward and good.backward, good
        assert len(good.errors) == 4 + 3 and max(good.errors.values()) < 1e-5  # 4 outputs; q, k, v's gradients of all four
        assert kernels.serves(on_cpu, "cpu", torch.float32, backward=True) and (tmp_path / "kernels.json").exists()
    finally:
        kernels.forget()

    def wrong_on(which):  # one FULL tile dropped from one of the masks: the check of the rest cannot hide it
        return lambda q, k, v, maps: tuple(flex_attend(q, k, v, m, **({"blocks": _drop_one_full_tile(block_mask(m))} if i == which else {}))
                                           for i, m in enumerate(maps))

    for which in range(len(maps)):
        bad = kernels.check(dataclasses.replace(on_cpu, run=wrong_on(which)), "cpu", torch.float32)
        assert not bad.forward and not bad.backward and bad.errors[f"output {which}"] > 1e-3, bad.reason


@pytest.mark.parametrize(("options", "need"), [
    ({"normalize": "relu"}, "softmax over a dot-product score"),
    ({"score_mod": lambda s, b, h, i, j: s}, "no score_mod"),
    ({"bias": torch.zeros(8, 8)}, "no bias"),
    ({"dropout_p": 0.1}, "no dropout"),
    ({"return_weights": True}, "return_weights=False"),
])
def test_backend_flex_refuses_what_it_cannot_compute(options, need):
    q = k = v = torch.zeros(1, 2, 8, 4)
    with pytest.raises(ValueError, match=f"backend='flex' needs {need}"):
        attend(q, k, v, mask=masks.window(2), backend="flex", **options)


@pytest.mark.slow
def test_the_compiled_cpu_kernel_reads_the_block_mask():
    """torch.compile's FlexAttention kernel reads the tile lists themselves (FULL tiles unmasked,
    missing tiles skipped), not the mask: the BlockMask gives attend's result there, and a FULL
    tile left out changes it."""
    mask = masks.causal()
    bmap = block_map(mask, N, block_size=32)
    q, k, v = (t.float() for t in _qkv(1, 4, N, N))
    compiled = torch.compile(flex_attention, dynamic=False)
    with torch.no_grad():
        theirs = create_block_mask(lambda b, h, i, j: j <= i, None, None, N, N, device="cpu", BLOCK_SIZE=32)
        if (compiled(q, k, v, block_mask=theirs) - flex_attention(q, k, v, block_mask=theirs)).abs().max() > 1e-4:
            pytest.skip("torch's compiled CPU FlexAttention disagrees with its own eager kernel on its own causal mask here "
                        "(seen with the AVX2 kernel paths forced on an AVX-512 CPU): torch's code, not attnlab's")
        want = attend(q, k, v, mask=bmap, backend="chunked").output
        assert (compiled(q, k, v, block_mask=block_mask(bmap)) - want).abs().max() < 1e-5
        assert (compiled(q, k, v, block_mask=_drop_one_full_tile(block_mask(bmap))) - want).abs().max() > 1e-2


@pytest.mark.parametrize("right", [True, False])
def test_attend_is_served_by_a_passing_flex_and_falls_back_from_a_failing_one_with_one_warning(right, monkeypatch, fresh_verdicts):
    """End to end through ``attend(backend="auto")``, FlexAttention let onto the CPU: where it
    matched the block-sparse path it computes the call; where it did not (one FULL tile dropped),
    it is refused once, with one warning, and the call is what attend computed before, bit for bit."""
    import importlib
    import warnings

    attend_module = importlib.import_module("attnlab.core.attend")  # the module (attnlab.core.attend is the function)
    flex_module = importlib.import_module("attnlab.core.flex")

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 300, 32, generator=g, requires_grad=True) for _ in range(3))
    mask = masks.window(64, causal=True)
    own = attend(q, k, v, mask=mask, backend="chunked").output
    before = attend(q, k, v, mask=mask).output  # what attend computes on the CPU without FlexAttention
    calls = []

    def counted(q, k, v, bmap, scale=None, **kw):
        calls.append(1)
        blocks = None if right else _drop_one_full_tile(block_mask(bmap))
        return flex_attend(q, k, v, bmap, scale, **({} if right else {"blocks": blocks}), **kw)

    monkeypatch.setattr(flex_module, "flex_attend", counted)
    monkeypatch.setattr(flex_module, "SERVED_ON", ("cpu",))
    monkeypatch.setattr(attend_module, "FLEX", dataclasses.replace(
        FLEX, devices=("cpu",), run=lambda q, k, v, maps: tuple(counted(q, k, v, m) for m in maps)))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        first = attend(q, k, v, mask=mask).output
    fallbacks = [w for w in said if issubclass(w.category, kernels.KernelFallbackWarning)]
    checked = len(calls)
    again = attend(q, k, v, mask=mask).output
    if right:
        assert not fallbacks and len(calls) == checked + 1  # served: the call went to FlexAttention
        assert torch.allclose(again, own, atol=1e-5) and torch.allclose(first, own, atol=1e-5)
        again.sum().backward()
        assert q.grad is not None and torch.isfinite(q.grad).all()
    else:
        assert len(fallbacks) == 1 and "torch.flex_attention on cpu" in str(fallbacks[0].message)
        assert len(calls) == checked  # refused: never called again
        assert torch.equal(first, before) and torch.equal(again, before)


def _devices(mask, out=None) -> list[str]:
    """The device types of every tensor ``mask`` and the masks it holds read."""
    out = [] if out is None else out
    for value in vars(mask).values():
        parts = value if isinstance(value, tuple) else (value,)
        for part in parts:
            if isinstance(part, torch.Tensor):
                out.append(part.device.type)
            elif isinstance(part, masks.Mask):
                _devices(part, out)
    return out


@pytest.mark.parametrize("name", ["longformer", "bigbird", "documents", "padding"])
def test_the_mask_flexattention_compiles_reads_tensors_of_the_maps_device_only(name):
    """Triton refuses a mask function that copies a tensor to the GPU inside it (a buffer in a
    pointwise subgraph: what a lent H100 raised for global tokens), so the BlockMask's mask
    function holds its tensors on the device of the map; "meta" stands in for a GPU here."""
    mask, b, h, block, n, m = CASES[name]
    mask = mask.bind(n, m)
    on_cpu = _devices(mask)
    assert on_cpu and set(on_cpu) == {"cpu"}
    moved = block_mask(block_map(mask, n, m, batch=b, heads=h, block_size=block).to("meta")).mask_mod
    assert _devices(moved) == ["meta"] * len(on_cpu)
    assert set(_devices(mask)) == {"cpu"}  # the mask itself is left as it was
    assert mask.to("cpu") is mask  # nothing to move: the same mask
