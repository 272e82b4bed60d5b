"""The JSON Schema of the answers the operations layer makes (``groups.Listing``,
``archive.ArchivePage``...): what :func:`outbox._core.values.jsonable` writes of each dataclass,
derived from the dataclass itself, its fields' annotations and its public properties' return
annotations, so that the API's document follows a field added to a dataclass by itself.

An object schema lists every field and property as required, and no other
(``additionalProperties: false``): ``jsonable`` writes each of them, always. Enums are
components as msgspec writes them (:mod:`outbox.web.bodies`), so that the document names each
once; a union of enums is one ``enum`` of all their values.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import inspect
import types
import typing
import uuid
from collections import abc
from typing import Any

_SEQUENCES = (list, set, frozenset, abc.Sequence, abc.Set, abc.Collection, abc.Iterable)
_MAPPINGS = (dict, abc.Mapping)
_SCALARS: dict[Any, dict[str, Any]] = {
    type(None): {"type": "null"},
    bool: {"type": "boolean"},
    int: {"type": "integer"},
    float: {"type": "number"},
    str: {"type": "string"},
    bytes: {"type": "string", "contentEncoding": "base64"},
    uuid.UUID: {"type": "string", "format": "uuid"},
    decimal.Decimal: {"type": "string"},
    # A time as the database hands it back: with its offset, or (SQLite) without one, which
    # the ``date-time`` format refuses.
    dt.datetime: {"type": "string", "description": "ISO 8601 date and time"},
    dt.date: {"type": "string", "format": "date"},
    dt.time: {"type": "string", "description": "ISO 8601 time"},
}


class AnswerSchemas:
    """The JSON Schemas of answers, each dataclass and enum within them once, by name
    (:attr:`schemas`), referred to through ``template``."""

    def __init__(self, template: str = "#/components/schemas/{name}") -> None:
        self.schemas: dict[str, dict[str, Any]] = {}
        """Each dataclass's and enum's schema by its name: the document's components."""
        self._template = template
        self._named: dict[str, type[Any]] = {}

    def of(self, kind: Any) -> dict[str, Any]:
        """The JSON Schema of a ``kind`` as ``jsonable`` writes it (a reference for a dataclass
        or an enum, its schema then in :attr:`schemas`); a TypeError for a type it cannot
        describe."""
        if kind is Any:
            return {}
        if kind in _SCALARS:
            return dict(_SCALARS[kind])
        if isinstance(kind, type) and issubclass(kind, enum.Enum):
            return self._component(kind, _enum)
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            return self._component(kind, self._object)
        if isinstance(kind, typing.NewType):
            return self.of(kind.__supertype__)
        origin, arguments = typing.get_origin(kind), typing.get_args(kind)
        if origin is typing.Literal:
            return {"enum": list(arguments)}
        if origin in (typing.Union, types.UnionType):
            return self._union(arguments)
        if origin is tuple:
            return self._tuple(arguments)
        if origin in _SEQUENCES:
            return {"type": "array", "items": self.of(arguments[0] if arguments else Any)}
        if origin in _MAPPINGS:
            return self._mapping(*(arguments or (str, Any)))
        raise TypeError(f"no JSON Schema for {kind!r}: jsonable would write it as text")

    def _component(self, kind: type[Any], describe: Any) -> dict[str, Any]:
        """A reference to ``kind``'s schema, made by ``describe`` the first time."""
        name = kind.__name__
        named = self._named.setdefault(name, kind)
        if named is not kind:
            raise TypeError(f"two answers' types are named {name}: {named!r} and {kind!r}")
        if name not in self.schemas:
            self.schemas[name] = {}  # a dataclass that holds itself refers to it
            self.schemas[name] = describe(kind)
        return {"$ref": self._template.format(name=name)}

    def _object(self, kind: type[Any]) -> dict[str, Any]:
        """A dataclass: its fields, then its public properties, as ``jsonable`` writes them."""
        hints = typing.get_type_hints(kind)
        properties = {f.name: self.of(hints[f.name]) for f in dataclasses.fields(kind)}
        for name in dir(kind):
            found = getattr(kind, name, None)
            if isinstance(found, property) and not name.startswith("_"):
                returns = typing.get_type_hints(found.fget).get("return")
                if returns is None:
                    raise TypeError(f"{kind.__name__}.{name} has no return annotation")
                properties[name] = {**self.of(returns), **_description(found.fget)}
        return {
            "title": kind.__name__,
            **_description(kind),
            "type": "object",
            "properties": properties,
            "required": list(properties),
            "additionalProperties": False,
        }

    def _union(self, members: tuple[Any, ...]) -> dict[str, Any]:
        """Any of ``members``; several enums among them (msgspec describes no union of two)
        as one ``enum`` of all their values."""
        enums = [m for m in members if isinstance(m, type) and issubclass(m, enum.Enum)]
        choices = [self.of(m) for m in members if m not in enums or len(enums) == 1]
        if len(enums) > 1:
            values = {m.value for kind in enums for m in kind}
            choices.insert(0, {"enum": sorted(values)})
        return choices[0] if len(choices) == 1 else {"anyOf": choices}

    def _tuple(self, items: tuple[Any, ...]) -> dict[str, Any]:
        """``tuple[X, ...]``: an array of X; ``tuple[X, Y]``: an array of exactly those."""
        if len(items) == 2 and items[1] is Ellipsis:
            return {"type": "array", "items": self.of(items[0])}
        return {
            "type": "array",
            "prefixItems": [self.of(item) for item in items],
            "items": False,
            "minItems": len(items),
            "maxItems": len(items),
        }

    def _mapping(self, keys: Any, values: Any) -> dict[str, Any]:
        """An object of ``values``; its keys as text (an enum's: its values)."""
        schema: dict[str, Any] = {"type": "object", "additionalProperties": self.of(values)}
        if keys is not str and keys is not Any:
            named = self.of(keys)
            if "$ref" in named or "enum" in named:
                schema["propertyNames"] = named
        return schema


def _enum(kind: type[enum.Enum]) -> dict[str, Any]:
    """An enum as msgspec writes it: its values, sorted."""
    return {"title": kind.__name__, **_description(kind), "enum": sorted(m.value for m in kind)}


def _description(declared: Any) -> dict[str, str]:
    """``declared``'s docstring, unless it has none (a dataclass's made-up one is none)."""
    doc = declared.__doc__
    if not doc or (isinstance(declared, type) and doc.startswith(f"{declared.__name__}(")):
        return {}
    return {"description": inspect.cleandoc(doc)}
