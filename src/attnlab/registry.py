"""A name -> class registry: how every family (attention variants, positional encodings, scores,
normalisers, backbones, tasks, sequence layers) is found by name, with the same verbs everywhere:
``register``, ``create``, ``get``, ``names``."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Generic, TypeVar

from .validate import ArgumentTypeError

__all__ = ["Registry", "RegistryView", "keyword_options", "option_docs"]

T = TypeVar("T")
V = TypeVar("V")


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
        """Call what is registered as ``name`` with ``args`` and ``options`` (build an instance);
        an option it does not take raises a ``ValueError`` that lists the ones it does."""
        self.check_options(name, options)
        return self.get(name)(*args, **options)

    def options(self, name: str) -> list[str] | None:
        """The keyword options ``create(name, ...)`` takes (:func:`keyword_options`), or None
        when it passes further options on to something that cannot be inspected."""
        return keyword_options(self.get(name))

    def check_options(self, name: str, options: Collection[str], *, hidden: Collection[str] = (),
                      what: str = "option") -> None:
        """Raise a ``ValueError`` naming each of ``options`` that ``name`` does not take and listing
        the ones it does (less ``hidden``: those set another way, e.g. by their own flag);
        ``what`` names the options in the message (``"--attention-option"``)."""
        valid = self.options(name)
        if valid is None:
            return
        bad = [o for o in options if o not in valid]
        if bad:
            shown = [o for o in valid if o not in hidden]
            takes = f"it takes {', '.join(shown)}" if shown else "it takes none"
            raise ValueError(f"unknown {what} {', '.join(map(repr, bad))} for the {self.kind} {name!r}; {takes}")

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def get(self, name: str) -> T:
        """The class registered as ``name``."""
        if not isinstance(name, str):
            raise ArgumentTypeError(f"a {self.kind} name must be a str, got {type(name).__name__}")
        try:
            return self._items[name]
        except KeyError:
            raise ValueError(f"unknown {self.kind} {name!r}; choose one of {', '.join(self.names())}") from None


class RegistryView(Mapping[str, V]):
    """A read-only mapping over a registry, read at every access: each registered name, in the
    order of registration, to ``value(name)``; names whose value is None are left out. A name
    registered later (a plugin, a test) is in it at once, which a dict built at import is not.

    Args:
        registry: the :class:`Registry` read. value: ``name -> value`` (None: not in the view).
    """

    def __init__(self, registry: Registry, value: Callable[[str], V | None]):
        self._registry = registry
        self._value = value

    def __getitem__(self, name: str) -> V:
        found = self._value(name) if isinstance(name, str) and name in self._registry else None
        if found is None:
            raise KeyError(name)
        return found

    def __iter__(self) -> Iterator[str]:
        return (n for n in self._registry.in_order() if self._value(n) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self)!r})"


_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def keyword_options(obj) -> list[str] | None:
    """The keyword options a class (its ``__init__``) or a function takes, sorted.

    A class whose ``__init__`` takes ``**options`` passes them to its base class, whose options
    are followed in turn, or, when it declares ``options_target`` (a class or function), to that
    target. None when options go somewhere that cannot be followed (any option may be valid).
    """
    seen: list[str] = []
    targets = [c for c in obj.__mro__ if "__init__" in vars(c)] if isinstance(obj, type) else [obj]
    for fn in targets:
        if fn is object:  # **options passed up to object (a builtin such as dict): cannot be followed
            return None
        try:
            params = inspect.signature(fn.__init__ if isinstance(fn, type) else fn).parameters.values()
        except (TypeError, ValueError):
            return None
        seen += [p.name for p in params if p.kind in _NAMED and p.name != "self"]
        if not any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params):
            return sorted(set(seen))
        target = vars(fn).get("options_target") if isinstance(fn, type) else None
        if target is not None:
            more = keyword_options(target)
            return None if more is None else sorted(set(seen) | set(more))
    return None


def option_docs(obj) -> dict[str, str]:
    """What each keyword option of a registered class or function is, read from the ``Args:``
    section of its docstring (a class's, then its bases'; the first that says wins): an entry
    ``name: text`` or ``a, b: text`` (options that share a line), continued on more indented
    lines, and several ``name: text.`` entries on one line. An entry that only points elsewhere
    (``see :class:`Base```, ``as for every step``) says nothing: a base's entry says it. ``{}``
    without such a section."""
    found: dict[str, str] = {}
    sources = [c for c in obj.__mro__ if c is not object] if isinstance(obj, type) else [obj]
    for src in sources:
        for name, text in _args_entries(inspect.getdoc(src) or "").items():
            if not _POINTER.match(text):
                found.setdefault(name, text)
    return found


_POINTER = re.compile(r"^(?:see|as for) (?::\w+:`[^`]+`|every step)(?: \(self-attention only\))?\.?$")
"""An ``Args:`` entry that only points at another's (its base's) entry."""


_ENTRY = re.compile(r"(?:^|(?<=\. ))((?:\w+)(?:, \w+)*): ")


def _args_entries(doc: str) -> dict[str, str]:
    lines = doc.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == "Args:"), None)
    if start is None:
        return {}
    block, indent = [], None
    for line in lines[start + 1 :]:
        if not line.strip():
            if block:
                break
            continue
        width = len(line) - len(line.lstrip())
        indent = width if indent is None else indent
        if width < indent:
            break
        if width == indent:
            block.append(line.strip())
        elif block:
            block[-1] += " " + line.strip()
    out: dict[str, str] = {}
    for entry in block:
        marks = list(_ENTRY.finditer(entry))
        for i, mark in enumerate(marks):
            text = entry[mark.end() : marks[i + 1].start() if i + 1 < len(marks) else len(entry)].strip()
            for name in mark.group(1).split(", "):
                out[name] = text
    return out
