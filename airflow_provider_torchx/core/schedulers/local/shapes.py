"""JSON shapes, declared as data: what a reader relies on in a JSON document (keys, their
types, nested arrays and objects), checked in one pass. A document that fits costs no string;
one that does not gets one message naming where (``'roles'[1]['name']``) and what is wrong.
The local job store declares its files' shapes with these (``record.SHAPES``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from airflow_provider_torchx.core.errors import shown

#: Why a value does not fit a shape: where in the value (keys and indexes from its top) and
#: what is wrong there. Built only on the way out of a value that does not fit, so a value
#: that fits costs no string.
Misfit = tuple[tuple[str | int, ...], str]


class Shape(Protocol):
    """A JSON shape: ``what`` names it in a message, ``misfit`` says why a value does not fit
    (None: it fits)."""

    @property
    def what(self) -> str: ...

    def misfit(self, value: Any) -> Misfit | None: ...


_JSON_NAMES: dict[type, str] = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}


def _wrong(value: Any, what: str) -> Misfit:
    """``value`` is not ``what``: what it is instead (by its JSON type)."""
    kind = "null" if value is None else _JSON_NAMES.get(type(value), "a number")
    return (), f"is {kind}, not {what}"


def _inside(key: str | int, misfit: Misfit | None) -> Misfit | None:
    """``misfit`` of the item ``key`` of a value, as the value's own."""
    return None if misfit is None else ((key, *misfit[0]), misfit[1])


def why_not(shape: Shape, value: Any) -> str | None:
    """Why ``value`` (a whole file's JSON) does not fit ``shape``, as a message naming where
    (``'roles'[1]['name']``; ``the file`` for the whole); None when it fits."""
    misfit = shape.misfit(value)
    if misfit is None:
        return None
    where, wrong = misfit
    at = "".join(f"[{k!r}]" if isinstance(k, str) else f"[{k}]" for k in where[1:])
    return f"{repr(where[0]) + at if where else 'the file'} {wrong}"


@dataclass(frozen=True)
class Is:
    """A value of one of ``types`` (Python's types of the parsed JSON), named ``what``."""

    types: type | tuple[type, ...]
    what: str

    def misfit(self, value: Any) -> Misfit | None:
        return None if isinstance(value, self.types) else _wrong(value, self.what)


@dataclass(frozen=True)
class Among:
    """A string among ``names`` (or null, when ``null``), named ``what``."""

    names: Collection[str]
    what: str
    null: bool = False

    def misfit(self, value: Any) -> Misfit | None:
        if (value is None and self.null) or (isinstance(value, str) and value in self.names):
            return None
        return ((), f"is {shown(value)}, not {self.what}")


@dataclass(frozen=True)
class Obj:
    """An object with the keys of ``required`` and, when present, those of ``optional``, each
    of its shape; other keys are not looked at."""

    required: Mapping[str, Shape] = field(default_factory=dict)
    optional: Mapping[str, Shape] = field(default_factory=dict)
    what: str = "an object"

    def misfit(self, value: Any) -> Misfit | None:
        if not isinstance(value, dict):
            return _wrong(value, self.what)
        for key, shape in self.required.items():
            if key not in value:
                return (key,), f"is missing ({shape.what})"
            misfit = shape.misfit(value[key])
            if misfit is not None:
                return _inside(key, misfit)
        for key, shape in self.optional.items():
            misfit = shape.misfit(value[key]) if key in value else None
            if misfit is not None:
                return _inside(key, misfit)
        return None


@dataclass(frozen=True)
class Each:
    """An array whose every item is ``item``; ``keyed``: an object (any keys) whose every
    value is."""

    item: Shape
    keyed: bool = False

    @property
    def what(self) -> str:
        return "an object" if self.keyed else "an array"

    def misfit(self, value: Any) -> Misfit | None:
        if not isinstance(value, dict if self.keyed else list):
            return _wrong(value, self.what)
        for key, item in value.items() if isinstance(value, dict) else enumerate(value):
            misfit = self.item.misfit(item)
            if misfit is not None:
                return _inside(key, misfit)
        return None


@dataclass(frozen=True)
class Row:
    """An array of exactly ``items``, each of its shape (a tuple in JSON)."""

    items: tuple[Shape, ...]
    what: str

    def misfit(self, value: Any) -> Misfit | None:
        if not isinstance(value, list):
            return _wrong(value, self.what)
        if len(value) != len(self.items):
            return (), f"has {len(value)} items, not {self.what}"
        for i, (shape, item) in enumerate(zip(self.items, value, strict=True)):
            misfit = shape.misfit(item)
            if misfit is not None:
                return _inside(i, misfit)
        return None


#: The shapes of JSON's scalars (``ANY``: any value; ``OBJECT``: any object).
STRING = Is(str, "a string")
STRING_OR_NULL = Is((str, type(None)), "a string or null")
INTEGER = Is(int, "an integer")
NUMBER = Is((int, float), "a number")
ANY = Is(object, "a value")
OBJECT = Obj()
