"""Packed documents: the block-diagonal mask, attention document by document (equal to the dense
block-diagonal mask with positions restarting per document), and a packed batch's loss and
gradients equal to the same documents padded, one per row (float64)."""

import pytest
import torch

from attnlab import MultiHeadAttention, efficient, masks
from attnlab.core.masks import Documents
from attnlab.models import ModelConfig, build_model, pack
from attnlab.models.base import IGNORE
from attnlab.models.config import AttentionSpec, PositionalSpec

E, H = 16, 4
ROWS = [[5, 3, 7], [9, 4]]  # two packed rows of 16 tokens: the first full but one, the second with 3 of padding
T = 16


def test_document_mask_is_block_diagonal_and_composes():
    m = Documents([2, 3]).dense(5)
    want = torch.zeros(5, 5, dtype=torch.bool)
    want[:2, :2] = True
    want[2:, 2:] = True
    assert torch.equal(m, want)
    assert torch.equal(Documents([2, 3], causal=True).dense(5), m & masks.causal().dense(5))
    assert torch.equal(Documents([2, 3], window=1).dense(5), m & masks.window(1).dense(5))
    many = Documents(ROWS).dense(T)
    assert many.shape == (2, 1, T, T) and not bool(many[1, 0, 13:].any()) and not bool(many[1, 0, :, 13:].any())
    assert Documents([3, 2]).positions(6).tolist() == [[0, 1, 2, 0, 1, 0]]
    for bad in ([0, 3], [2.5], [-1]):
        with pytest.raises(ValueError, match="integers >= 1"):
            Documents(bad)
    with pytest.raises(ValueError, match="add up to 17"):
        Documents(ROWS + [[17]]).check(3, T)
    with pytest.raises(ValueError, match="describe 2 row"):
        Documents(ROWS).check(3, T)


def dense_rows(layer, x, docs):
    """The reference: each row alone with the dense block-diagonal mask and restarting positions."""
    outs = []
    for b, row in enumerate(docs.lengths):
        pos = docs.positions(T)[b]
        mask = Documents(row, causal=docs.causal, window=docs.window).dense(T)
        outs.append(layer(x[b : b + 1], mask=mask, positions=pos, key_positions=pos).output)
    return torch.cat(outs)


def real(docs):
    keep = torch.zeros(docs.rows, T, dtype=torch.bool)
    for b, row in enumerate(docs.lengths):
        keep[b, : sum(row)] = True
    return keep


@pytest.mark.parametrize("pe", [None, "rope", "alibi", "sinusoidal", "relative"])
@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 2)])
def test_documents_equal_the_dense_block_diagonal_mask(pe, causal, window):
    torch.manual_seed(0)
    layer = MultiHeadAttention(E, H, positional=pe, num_kv_heads=2).double()
    x = torch.randn(2, T, E, dtype=torch.float64, requires_grad=True)
    docs = Documents(ROWS, causal=causal, window=window)
    out = layer(x, mask=docs).output
    ref = dense_rows(layer, x, docs)
    keep = real(docs)
    assert (out - ref)[keep].abs().max() < 1e-12
    assert out[~keep].abs().max() == 0  # padding: no attention output
    g1 = torch.autograd.grad(out[keep].square().sum(), [x, layer.q_proj.weight])
    g2 = torch.autograd.grad(ref[keep].square().sum(), [x, layer.q_proj.weight])
    assert all((a - b).abs().max() < 1e-10 for a, b in zip(g1, g2))


@pytest.mark.parametrize("name,opts", [("local", {"window": 3}), ("linear", {}), ("performer", {"seed": 0})])
def test_efficient_variants_attend_each_document_alone(name, opts):
    torch.manual_seed(1)
    layer = efficient.create(name, embed_dim=E, num_heads=H, causal=True, positional="rope", **opts).double()
    x = torch.randn(2, T, E, dtype=torch.float64)
    docs = Documents(ROWS, causal=True)
    out = layer(x, mask=docs).output
    at = 0
    for n in ROWS[0]:  # each document of the first row run alone
        alone = layer(x[:1, at : at + n]).output
        assert (out[:1, at : at + n] - alone).abs().max() < 1e-12
        at += n
    if name == "local":  # a pattern on the block-sparse engine: its causal window and any documents mask combine
        assert torch.equal(layer(x, mask=Documents(ROWS)).output, out)
    else:  # an approximation runs each document with its own (causal) method
        with pytest.raises(ValueError, match="its own pattern"):
            layer(x, mask=Documents(ROWS))


def lm(attention, pe, **opts):
    torch.manual_seed(2)
    cfg = ModelConfig(kind="lm", model="lm", num_labels=30, embed_dim=E, vocab_size=30, num_layers=2, num_heads=H, max_len=64,
                      attention=AttentionSpec(attention, opts), positional=PositionalSpec(pe))
    return build_model(cfg).double()


@pytest.mark.parametrize("attention,pe,opts", [("dense", "rope", {}), ("dense", "learned", {}), ("dense", "alibi", {}),
                                               ("local", "rope", {"window": 4}), ("linear", "sinusoidal", {})])
def test_packed_batch_has_the_loss_and_gradients_of_the_padded_batch(attention, pe, opts):
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(2, 30, (n,), generator=g).tolist() for n in (5, 3, 7, 9, 4, 6)]
    tokens, labels, docs = pack(seqs, T)
    assert docs.lengths == ((5, 3, 7), (9, 4), (6,)) and (labels != IGNORE).sum() == sum(len(s) - 1 for s in seqs)
    model = lm(attention, pe, **opts)
    ce = torch.nn.functional.cross_entropy

    packed_logits = model(tokens, documents=docs).output
    packed = ce(packed_logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
    gp = torch.autograd.grad(packed, list(model.parameters()), allow_unused=True)

    longest = max(map(len, seqs))
    padded_tokens = torch.zeros(len(seqs), longest, dtype=torch.long)
    padded_labels = torch.full((len(seqs), longest), IGNORE)
    for i, s in enumerate(seqs):
        padded_tokens[i, : len(s)] = torch.tensor(s)
        padded_labels[i, : len(s) - 1] = torch.tensor(s[1:])
    padded = ce(model(padded_tokens).output.flatten(0, 1), padded_labels.flatten(), ignore_index=IGNORE)
    gd = torch.autograd.grad(padded, list(model.parameters()), allow_unused=True)
    assert abs(float((packed - padded).detach())) < 1e-12
    for a, b in zip(gp, gd):
        assert (a is None and b is None) or (a - b).abs().max() < 1e-10


def test_pack_refuses_what_does_not_fit():
    with pytest.raises(ValueError, match="does not fit"):
        pack([[3] * 20], 16)
    with pytest.raises(ValueError, match="does not fit"):
        pack([[]], 16)


def test_pack_refuses_nothing():
    with pytest.raises(ValueError, match="nothing to pack"):
        pack([], 16)
