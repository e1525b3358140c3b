"""ModelConfig: the typed model description, its JSON round trip and the version-1 dict."""

import json

import pytest

from attnlab.models import AttentionSpec, ModelConfig, PositionalSpec


def test_round_trip_and_backbone_options_equal_the_version_1_options():
    v1 = {"kind": "tagging", "model": "transformer", "vocab_size": 9, "num_labels": 3, "dim": 8, "pooling": "mean",
          "options": {"num_layers": 1, "num_heads": 2, "attention": "local", "attention_options": {"window": 2},
                      "positional": "rope", "max_len": 17, "causal": True, "dropout": 0.1}}
    cfg = ModelConfig.from_dict(v1)
    assert cfg.embed_dim == 8  # the width's earlier key, dim, read as embed_dim
    assert cfg.attention == AttentionSpec("local", {"window": 2}) and cfg.positional == PositionalSpec("rope")
    assert cfg.causal and cfg.options == {"dropout": 0.1}
    assert cfg.backbone_options() == v1["options"]  # the backbone gets exactly what version 1 gave it
    assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg


def test_bad_dicts_are_refused():
    with pytest.raises(TypeError, match="unknown model config field"):
        ModelConfig.from_dict({"kind": "tagging", "model": "mlp", "num_labels": 2, "embed_dim": 4, "colour": "red"})
    with pytest.raises(TypeError, match="a model config is a dict, got list"):
        ModelConfig.from_dict([])
