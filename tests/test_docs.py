"""Every public name has a docstring."""

import importlib
import inspect
import pkgutil

import attnlab


def public_modules():
    yield attnlab
    for info in pkgutil.walk_packages(attnlab.__path__, "attnlab."):
        yield importlib.import_module(info.name)


def test_every_public_function_and_class_is_documented():
    missing = []
    for mod in public_modules():
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and not (obj.__doc__ or "").strip():
                missing.append(f"{mod.__name__}.{name}")
    assert not missing, f"undocumented public names: {missing}"
