"""The name registry shared by positional encodings and attention variants."""

import pytest

from attnlab.registry import Registry


def test_register_get_names_and_errors():
    reg = Registry("widget")

    @reg.register("b")
    class B:
        pass

    reg.add("a", int)
    assert reg.names() == ["a", "b"] and reg.get("b") is B and B.name == "b" and reg.get("a") is int
    with pytest.raises(ValueError, match="unknown widget 'c'; choose one of a, b"):
        reg.get("c")
    with pytest.raises(TypeError, match="widget name must be a str, got int"):
        reg.get(3)
    with pytest.raises(ValueError, match="a widget named 'a' is already registered"):
        reg.add("a", float)


def test_create_order_membership_and_remove():
    reg = Registry("widget")
    reg.add("z", lambda *a, **k: (a, k))
    reg.add("a", dict)
    assert reg.in_order() == ["z", "a"] and reg.names() == ["a", "z"]
    assert reg.create("z", 1, x=2) == ((1,), {"x": 2}) and reg.create("a", y=3) == {"y": 3}
    assert "z" in reg and "q" not in reg
    reg.remove("z")
    assert "z" not in reg and reg.in_order() == ["a"]
    with pytest.raises(ValueError, match="unknown widget 'z'"):
        reg.remove("z")


def test_keyword_options_follow_options_through_bases_and_targets():
    from attnlab import efficient
    from attnlab.models.base import BACKBONES
    from attnlab.registry import keyword_options

    # LocalAttention(**options) -> EfficientAttention: its own window and block, and the base's options
    assert efficient.VARIANTS.options("local") == sorted(
        ["embed_dim", "num_heads", "window", "block", "causal", "kdim", "vdim", "bias", "head_mode", "positional", "positional_options",
         "max_len", "num_kv_heads"])
    # WindowMLPBackbone(**options) -> MLPBackbone; TransformerBackbone(**encoder_options) -> Encoder -> EncoderConfig
    assert BACKBONES.options("window_mlp") == ["dropout", "embed_dim", "ff_dim", "num_layers", "vocab_size", "window"]
    assert {"score", "normalize", "dropout", "attention", "num_heads", "num_layers"} <= set(BACKBONES.options("transformer"))
    assert keyword_options(dict) is None  # **kwargs into code that cannot be followed: any option may be valid
    assert keyword_options(lambda a, *, b=1: None) == ["a", "b"]


def test_check_options_names_the_bad_ones_and_lists_the_valid_ones():
    from attnlab import efficient

    with pytest.raises(ValueError, match=r"unknown --attention-option 'windw' for the attention 'local'; it takes block, window$"):
        efficient.VARIANTS.check_options("local", ["window", "windw"], what="--attention-option",
                                         hidden=set(efficient.VARIANTS.options("local")) - {"block", "window"})
    with pytest.raises(ValueError, match="unknown option 'windw' for the attention 'local'"):
        efficient.create("local", embed_dim=8, num_heads=2, windw=4)
    efficient.VARIANTS.check_options("local", ["window"])  # a valid one passes
    reg = Registry("widget")
    reg.add("f", lambda *, a=1: a)
    with pytest.raises(ValueError, match="for the widget 'f'; it takes a"):
        reg.create("f", b=2)
