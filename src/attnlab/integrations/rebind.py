"""Serving one model's layers with other functions than their modeling module's, without changing
the module (:func:`attnlab.integrations.hybrid.use_kernels`): copies of the layer class's methods
whose global names resolve in a module of their own, ``attnlab.served.<modeling module>``, set on the
layer as its own attributes (:func:`give_methods`) and dropped again (:func:`take_methods`)."""

from __future__ import annotations

import sys
import types
import weakref
from collections.abc import Callable

from torch import nn

__all__ = ["give_methods", "is_served", "served_methods", "served_module", "take_methods"]


def _references(fn: types.FunctionType, names: frozenset, namespace: dict) -> bool:
    """Whether ``fn`` looks up one of ``names`` in ``namespace`` (its own code or a nested one's)."""
    if fn.__globals__ is not namespace:
        return False
    codes = [fn.__code__]
    while codes:
        code = codes.pop()
        if names & set(code.co_names):
            return True
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return False


def _rebound(fn, names: frozenset, namespace: dict, served_namespace: dict, _seen: dict | None = None):
    """A copy of ``fn`` whose lookups of ``names`` in its module's ``namespace`` find
    ``served_namespace`` instead, through the closures of the decorators that wrap it (each
    wrapper copied with a new cell for the function it wraps); ``fn`` itself when nothing in it
    looks them up. Nothing is changed in place: the module, the class and ``fn`` stay as they are."""
    if not isinstance(fn, types.FunctionType):
        return fn
    seen = {} if _seen is None else _seen
    if id(fn) in seen:  # a closure that reaches itself
        return seen[id(fn)]
    seen[id(fn)] = fn
    cells = fn.__closure__ or ()
    inner = [_rebound(c.cell_contents, names, namespace, served_namespace, seen) if _filled(c) else None for c in cells]
    own = _references(fn, names, namespace)
    if not own and all(new is None or new is c.cell_contents for new, c in zip(inner, cells)):
        return fn
    closure = tuple(c if new is None or new is c.cell_contents else types.CellType(new) for new, c in zip(inner, cells))
    copy = types.FunctionType(fn.__code__, served_namespace if own else fn.__globals__, fn.__name__, fn.__defaults__,
                              closure or None)
    copy.__kwdefaults__, copy.__qualname__, copy.__module__ = fn.__kwdefaults__, fn.__qualname__, fn.__module__
    copy.__dict__.update(fn.__dict__)
    copy.__doc__ = fn.__doc__
    if "__wrapped__" in fn.__dict__:
        copy.__wrapped__ = _rebound(fn.__wrapped__, names, namespace, served_namespace, seen)
    seen[id(fn)] = copy
    return copy


def _filled(cell) -> bool:
    try:
        return cell.cell_contents is not cell  # always True: reading an empty cell raises
    except ValueError:
        return False


def served_module(modeling, served: dict[str, Callable]) -> types.ModuleType:
    """A module of the modeling module's names with the served functions in place of
    transformers' (made once per modeling module), registered in ``sys.modules`` as
    ``attnlab.served.<the modeling module's name>``: torch.compile guards a function's globals
    through its module's entry there."""
    name = f"attnlab.served.{modeling.__name__}"
    if name not in sys.modules:
        module = types.ModuleType(name, modeling.__doc__)
        module.__dict__.update({k: v for k, v in vars(modeling).items()
                                if k not in ("__name__", "__spec__", "__loader__")})
        module.__dict__.update(served)
        sys.modules[name] = module
    return sys.modules[name]


def served_methods(module: nn.Module, modeling, served: dict[str, Callable]) -> dict[str, Callable]:
    """The methods of a layer's class that call a served function, each as a copy that finds
    attnlab's functions (a namespace of its own: the modeling module's names, the served ones
    replaced), bound to this layer alone."""
    names, namespace = frozenset(served), vars(modeling)
    methods = {}
    served_namespace = served_module(modeling, served).__dict__
    for cls in reversed(type(module).__mro__):
        if cls.__module__ != modeling.__name__:  # only the modeling module's own classes call its functions
            continue
        for attr, fn in vars(cls).items():
            if isinstance(fn, types.FunctionType) and attr != "__init__":
                copy = _rebound(fn, names, namespace, served_namespace)
                if copy is not fn:
                    methods[attr] = types.MethodType(copy, module)
                else:
                    methods.pop(attr, None)  # a subclass's own version that calls nothing served
    return methods


_SERVING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # the layers that hold copies now


def is_served(layer: nn.Module) -> bool:
    """Whether ``layer`` holds copies of its class's methods now (given by :func:`give_methods`)."""
    return layer in _SERVING


def give_methods(layer: nn.Module, methods: dict[str, Callable]) -> None:
    """Make ``methods`` (:func:`served_methods`) ``layer``'s own attributes, found before its class's methods."""
    layer.__dict__.update(methods)
    _SERVING[layer] = True


def take_methods(layer: nn.Module, names) -> None:
    """Drop the copies ``names`` from ``layer``: its class's methods again."""
    for method in names:
        layer.__dict__.pop(method, None)
    _SERVING.pop(layer, None)
