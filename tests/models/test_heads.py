"""Backbones and heads: what each one can see, padding, and the encoder's attention variants."""

import pytest
import torch

from attnlab import masks, models
from attnlab.models import Encoder, SequenceLabeler, SetClassifier, build_model
from attnlab.models.base import BACKBONES


def backbone(name, **opts):
    torch.manual_seed(0)
    return BACKBONES.get(name)(30, 16, **opts).double()


def influence(model, tokens, pos):
    """Which input positions change the output at ``pos`` (by gradient through the embeddings)."""
    emb = model.embed.weight
    x = model.embed(tokens).detach().requires_grad_(True)
    model.embed.forward = lambda t: x  # feed the same vectors, with a gradient
    out = model(tokens, tokens == 0).output
    probe = torch.randn(out.shape[-1], generator=torch.Generator().manual_seed(0), dtype=out.dtype)
    (g,) = torch.autograd.grad(out[0, pos] @ probe, x)  # not .sum(): a LayerNorm output sums to 0
    del model.embed.forward
    assert emb is model.embed.weight
    return set(torch.nonzero(g[0].abs().sum(-1)).flatten().tolist())


def test_registry():
    assert models.names() == ["audio_transformer", "cnn", "conformer", "graph_transformer", "lm", "mlp", "node_mlp", "pixels",
                              "transformer", "vit", "window_mlp"]


def test_mlp_sees_one_word_window_mlp_its_neighbours_transformer_all():
    tokens = torch.randint(2, 30, (1, 9))
    assert influence(backbone("mlp"), tokens, 4) == {4}
    assert influence(backbone("window_mlp", window=2), tokens, 4) == {2, 3, 4, 5, 6}
    assert influence(backbone("window_mlp", window=1), tokens, 0) == {0, 1}
    assert influence(backbone("transformer", num_layers=1, positional="rope"), tokens, 4) == set(range(9))


@pytest.mark.parametrize("name", ["mlp", "window_mlp", "transformer"])
def test_padding_does_not_change_real_positions(name):
    opts = {"positional": "sinusoidal", "max_len": 16} if name == "transformer" else {}
    model = SequenceLabeler(backbone(name, **opts), 5).double().eval()
    short = torch.randint(2, 30, (1, 5))
    padded = torch.cat([short, torch.zeros(1, 3, dtype=torch.long)], 1)
    torch.testing.assert_close(model(padded).output[:, :5], model(short).output, rtol=0, atol=1e-12)
    clf = SetClassifier(backbone(name, **opts), 3).double().eval()
    torch.testing.assert_close(clf(padded).output, clf(short).output, rtol=0, atol=1e-12)
    if name == "transformer":
        cls = SetClassifier(backbone(name, **opts), 3, pooling="cls").double().eval()
        torch.testing.assert_close(cls(padded).output, cls(short).output, rtol=0, atol=1e-12)


def test_build_model_and_bad_options():
    m = build_model({"kind": "classification", "model": "mlp", "vocab_size": 10, "num_labels": 4, "embed_dim": 8,
                     "options": {"num_layers": 1}})
    assert isinstance(m, SetClassifier) and m(torch.tensor([[2, 3, 0]])).output.shape == (1, 4)
    with pytest.raises(ValueError, match="unknown task kind"):
        build_model({"kind": "nope", "model": "mlp", "vocab_size": 10, "num_labels": 4, "embed_dim": 8})
    with pytest.raises(ValueError, match="unknown model 'gru'"):
        build_model({"kind": "tagging", "model": "gru", "vocab_size": 10, "num_labels": 4, "embed_dim": 8})
    with pytest.raises(ValueError, match="pooling"):
        SetClassifier(backbone("mlp"), 2, pooling="max")
    with pytest.raises(TypeError):
        backbone("mlp", attention="local")


def test_encoder_with_an_efficient_variant_in_its_exact_limit_equals_dense():
    torch.manual_seed(0)
    dense = Encoder(16, 4, 2).double()
    local = Encoder(16, 4, 2, attention="local", attention_options={"window": 64}).double()
    local.load_state_dict(dense.state_dict())
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    pad = masks.padding(torch.tensor([11, 7])).dense(11, 11)
    out_d, out_l = dense(x, mask=pad).output, local(x, mask=pad).output
    torch.testing.assert_close(out_l[0], out_d[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(out_l[1, :7], out_d[1, :7], rtol=0, atol=1e-12)


def test_causal_encoder_equals_dense_with_a_causal_mask_for_both_kinds():
    torch.manual_seed(0)
    ref = Encoder(16, 4, 1).double()
    x = torch.randn(1, 9, 16, dtype=torch.float64)
    expected = ref(x, mask=masks.causal().dense(9)).output
    for opts in ({}, {"attention": "local", "attention_options": {"window": 64}}):
        enc = Encoder(16, 4, 1, causal=True, **opts).double()
        enc.load_state_dict(ref.state_dict())
        torch.testing.assert_close(enc(x).output, expected, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="attention_options apply to efficient variants"):
        Encoder(16, 4, 1, attention_options={"window": 3})
