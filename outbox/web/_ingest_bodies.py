"""What each handler's ingest takes, declared when the console is made: a struct of its buffer's
columns (each column's JSON type and bounds, those without a default required, no other), for
the OpenAPI document to tell a producer outside Python what to send.

The endpoints read a batch's frame with :class:`outbox.web.bodies.IngestBatch`; the values
themselves are checked and converted column by column by :func:`outbox.ops.ingest.ingest`, which
names every problem of a batch at once.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import uuid
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from sqlalchemy import JSON, Column, Enum, Table

from outbox._core.values import BASE64_PATTERN, INTERVAL_PATTERN, decimal_digits, integer_range
from outbox.app import Outbox
from outbox.buffer import BufferMixin
from outbox.ops.ingest import MAX_EVENTS
from outbox.web.bodies import JSON_VALUE, Body, Key


@dataclass(frozen=True, slots=True)
class IngestBodies:
    """One handler's ingest bodies: an event's values (``PUT``) and a batch (``POST``)."""

    values: type[msgspec.Struct]
    batch: type[msgspec.Struct]


def declare(app: Outbox) -> dict[str, IngestBodies]:
    """Each handler's ingest bodies, by handler name."""
    declared = {}
    named: set[str] = set()
    for handler in sorted(app.handlers):
        # A struct's name is a component's name in the document: letters, digits, ._- only,
        # and one a handler each.
        name = re.sub(r"[^A-Za-z0-9._-]", "_", handler)
        name = name if name not in named else f"{name}.{len(named)}"
        named.add(name)
        declared[handler] = _bodies(name, app.handlers[handler].table)
    return declared


def _bodies(name: str, table: Table) -> IngestBodies:
    fields: list[tuple[str, Any, Any]] = []
    own = BufferMixin.OWN_COLUMNS
    for position, column in enumerate(c for c in table.columns if c.name not in own):
        schema = column_schema(column)
        if column.nullable:
            schema = {"anyOf": [schema, {"type": "null"}]}
        required = not column.nullable and column.default is None and column.server_default is None
        # Declared by position, named by the column: a column may be named as no attribute can.
        # Left out, a column takes its own default (or NULL): the struct states none.
        default: Any = msgspec.NODEFAULT if required else msgspec.UNSET
        fields.append(
            (
                f"column_{position}",
                Annotated[Any, msgspec.Meta(extra_json_schema=schema)],
                msgspec.field(default=default, name=column.name),
            )
        )
    values = msgspec.defstruct(
        f"{name}.values",
        fields,
        bases=(Body,),
        module=__name__,
        kw_only=True,
    )
    event = msgspec.defstruct(
        f"{name}.event", [("key", Key), ("values", values)], bases=(Body,), module=__name__
    )
    batch = msgspec.defstruct(
        f"{name}.batch",
        [("events", Annotated[list[event], msgspec.Meta(min_length=1, max_length=MAX_EVENTS)])],  # type: ignore[valid-type]
        bases=(Body,),
        module=__name__,
    )
    return IngestBodies(values, batch)


def column_schema(column: Column[Any]) -> dict[str, Any]:
    """The JSON Schema of the values ``column`` takes (as :func:`outbox.ops.ingest.ingest` reads
    them: text for times and UUIDs, bytes in base64, an enum by its members' values, a decimal
    as a number or its text)."""
    kind = column.type
    members = getattr(kind, "enum_class", None) if isinstance(kind, Enum) else None
    if members is not None:
        return {"enum": [member.value for member in members]}  # enums by value, as answered
    if isinstance(kind, Enum) and kind.enums:
        return {"type": "string", "enum": list(kind.enums)}
    if isinstance(kind, JSON):
        return dict(JSON_VALUE)
    try:
        python_type = kind.python_type
    except NotImplementedError:
        return {}
    if python_type is bool:
        return {"type": "boolean"}
    if python_type is int:
        low, high = integer_range(column)
        return {"type": "integer", "minimum": low, "maximum": high}
    if python_type is float:
        return {"type": "number"}
    if python_type is decimal.Decimal:
        return _decimal_schema(column)
    if python_type is str:
        length = getattr(kind, "length", None)
        return {"type": "string", **({"maxLength": length} if length else {})}
    formats = {dt.datetime: "date-time", dt.date: "date", dt.time: "time", uuid.UUID: "uuid"}
    if python_type in formats:
        return {"type": "string", "format": formats[python_type]}
    if python_type is dt.timedelta:
        return {"type": "string", "pattern": INTERVAL_PATTERN}
    if python_type is bytes:
        return {"type": "string", "contentEncoding": "base64", "pattern": BASE64_PATTERN}
    return {}


def _decimal_schema(column: Column[Any]) -> dict[str, Any]:
    whole = decimal_digits(column)
    if whole is None:
        return {"type": ["string", "number"], "pattern": r"^-?[0-9]+(\.[0-9]+)?$"}
    # A number is rounded to the column's scale as it is stored: one that rounds onto the
    # bound is refused, so the bound is half a unit of the last place below it; text keeps
    # to the column's places, and so never rounds.
    scale = getattr(column.type, "scale", None) or 0
    bound = float(decimal.Decimal(10**whole) - decimal.Decimal(5).scaleb(-scale - 1))
    places = rf"(\.[0-9]{{1,{scale}}})?" if scale else ""
    return {
        "type": ["string", "number"],
        "pattern": rf"^-?[0-9]{{1,{whole}}}{places}$",
        "exclusiveMinimum": -bound,
        "exclusiveMaximum": bound,
    }
