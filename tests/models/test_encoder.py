"""The Encoder against torch.nn.TransformerEncoder with the same weights."""

import dataclasses
import json

import pytest
import torch
from torch import nn

from attnlab import MultiHeadAttention, masks
from attnlab.models import Encoder, EncoderConfig
from tests.helpers import assert_close_rel


def torch_encoder(norm_first: bool, activation: str):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, 24, dropout=0.0, activation=activation, batch_first=True, norm_first=norm_first)
    final = nn.LayerNorm(16) if norm_first else None
    enc = nn.TransformerEncoder(layer, 3, norm=final, enable_nested_tensor=False)
    with torch.no_grad():  # LayerNorm starts at (1, 0): move it, so that copying it is tested
        for name, p in enc.named_parameters():
            if "norm" in name:
                p.normal_(1.0 if name.endswith("weight") else 0.0, 0.2)
    return enc.double().eval()


def copy_into(ours: Encoder, theirs: nn.TransformerEncoder) -> None:
    with torch.no_grad():
        for mine, t in zip(ours.layers, theirs.layers):
            mine.attn.load_state_dict(MultiHeadAttention.from_torch(t.self_attn).state_dict())
            for a, b in ((mine.ff.linear1, t.linear1), (mine.ff.linear2, t.linear2), (mine.norm1, t.norm1), (mine.norm2, t.norm2)):
                a.load_state_dict(b.state_dict())
        if theirs.norm is not None:
            ours.final_norm.load_state_dict(theirs.norm.state_dict())


@pytest.mark.parametrize("norm_first", [True, False])
@pytest.mark.parametrize("activation", ["gelu", "relu"])
@pytest.mark.parametrize("masked", [False, True])
def test_encoder_equals_torch_transformer_encoder(norm_first, activation, masked):
    theirs = torch_encoder(norm_first, activation)
    ours = Encoder(16, 4, 3, ff_dim=24, norm_first=norm_first, activation=activation).double().eval()
    copy_into(ours, theirs)
    x = torch.randn(2, 9, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    mask = masks.causal().dense(9) if masked else None
    expect = theirs(x, mask=None if mask is None else ~mask)  # torch: True = not allowed
    assert_close_rel(ours(x, mask=mask).output, expect, 1e-12, "encoder output")


def test_encoder_returns_weights_per_block_and_its_config_round_trips():
    enc = Encoder(16, 4, 2, positional="rope", dropout=0.1, score="cosine")
    out = enc.eval()(torch.randn(1, 5, 16), return_weights=True)
    assert len(out.weights) == 2 and out.weights[0].shape == (1, 4, 5, 5)
    assert torch.allclose(out.weights[1].sum(-1), torch.ones(1, 4, 5))
    cfg = json.loads(json.dumps(dataclasses.asdict(enc.config)))
    again = Encoder.from_config(EncoderConfig(**cfg))
    assert again.config == enc.config
    assert enc.layers[0].attn.positional is enc.layers[1].attn.positional  # one encoding, shared


def test_encoder_bad_input():
    with pytest.raises(TypeError, match="unknown Encoder option.*heads"):
        Encoder(16, 4, 2, heads=3)
    with pytest.raises(ValueError, match="num_layers"):
        Encoder(16, 4, 0)
    with pytest.raises(ValueError, match="activation"):
        Encoder(16, 4, 1, activation="tanh")
    with pytest.raises(ValueError, match=r"\(B, N, 16\)"):
        Encoder(16, 4, 1)(torch.randn(2, 5, 8))
    with pytest.raises(ValueError, match="unknown positional encoding"):
        Encoder(16, 4, 1, positional="abs")
