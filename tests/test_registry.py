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
