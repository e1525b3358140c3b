"""Conformer: truncated attention at w >= N is full attention; padding never leaks."""

import pytest
import torch

from attnlab.models import build_model
from attnlab.models.audio import ConformerBackbone
from attnlab.models.conformer import Conformer, ConvModule


def test_local_window_covering_everything_equals_dense():
    torch.manual_seed(0)
    dense = Conformer(16, 2, 2, positional="rope").double().eval()
    local = Conformer(16, 2, 2, positional="rope", attention="local", attention_options={"window": 40}).double().eval()
    local.load_state_dict(dense.state_dict())
    x = torch.randn(2, 23, 16, dtype=torch.float64)
    torch.testing.assert_close(local(x).output, dense(x).output, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("attention", ["dense", "local"])
def test_padded_batch_equals_each_sequence_alone(attention):
    torch.manual_seed(0)
    opts = {"attention_options": {"window": 3}} if attention == "local" else {}
    model = ConformerBackbone(5, 16, num_heads=2, num_layers=2, attention=attention, positional="rope", max_len=64, conv_kernel=5, **opts)
    model = model.double().eval()
    a, b = torch.randn(1, 9, 5, dtype=torch.float64), torch.randn(1, 14, 5, dtype=torch.float64)
    x = torch.zeros(2, 14, 5, dtype=torch.float64)
    x[0, :9], x[1] = a[0], b[0]
    x[0, 9:] = float("nan")  # padding must not leak, not even NaN
    pad = torch.zeros(2, 14, dtype=torch.bool)
    pad[0, 9:] = True
    out = model(x, pad).output
    torch.testing.assert_close(out[0], model(a).output[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out[1], model(b).output[0], rtol=1e-10, atol=1e-10)


def test_conv_module_sees_only_its_kernel():
    conv = ConvModule(8, kernel_size=5).eval()
    x = torch.randn(1, 20, 8, requires_grad=True)
    probe = torch.randn(8)
    (g,) = torch.autograd.grad(conv(x)[0, 10] @ probe, x)
    assert set(g[0].abs().sum(-1).nonzero().flatten().tolist()) == set(range(8, 13))
    with pytest.raises(ValueError, match="odd"):
        ConvModule(8, kernel_size=4)


def test_speech_model_config_builds_a_classifier_with_weights():
    cfg = {"kind": "classification", "inputs": "features", "model": "conformer", "feature_dim": 40, "num_labels": 10, "embed_dim": 32,
           "options": {"num_heads": 4, "num_layers": 1, "attention": "local", "attention_options": {"window": 4}, "positional": "rope",
                       "max_len": 64}}
    model = build_model(cfg)
    logits = model(torch.randn(3, 20, 40), torch.zeros(3, 20, dtype=torch.bool)).output
    assert logits.shape == (3, 10)
    with pytest.raises(ValueError, match=r"expected frames \(B, T, 40\)"):
        model(torch.randn(3, 20, 41))
