"""A name -> class registry: how every family (attention variants, positional encodings, scores,
normalisers, backbones, tasks, sequence layers) is found by name, with the same verbs everywhere:
``register``, ``create``, ``get``, ``names``."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Classes registered under a name; unknown names raise a ``ValueError`` that lists the known ones.

    Args:
        kind: what is registered, for messages ("positional encoding", "attention").
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Class decorator: register the class as ``name`` and set its ``name`` attribute."""

        def deco(cls: T) -> T:
            self.add(name, cls)
            cls.name = name
            return cls

        return deco

    def add(self, name: str, obj: T) -> None:
        """Register ``obj`` as ``name`` (a name is registered once)."""
        if name in self._items:
            raise ValueError(f"a {self.kind} named {name!r} is already registered")
        self._items[name] = obj

    def remove(self, name: str) -> None:
        """Forget ``name`` (a plugin unloaded, a test cleaning up); unknown names raise ``ValueError``."""
        self.get(name)
        del self._items[name]

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._items)

    def in_order(self) -> list[str]:
        """The registered names in the order they were registered."""
        return list(self._items)

    def create(self, name: str, *args, **options):
        """Call what is registered as ``name`` with ``args`` and ``options`` (build an instance)."""
        return self.get(name)(*args, **options)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def get(self, name: str) -> T:
        """The class registered as ``name``."""
        if not isinstance(name, str):
            raise TypeError(f"a {self.kind} name must be a str, got {type(name).__name__}")
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of {', '.join(self.names())}") from None
