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
