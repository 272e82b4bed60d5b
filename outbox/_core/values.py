"""Typed results as JSON's values: what ``--json`` prints and the HTTP API answers, the same
for both faces."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import enum
import uuid
from typing import Any

__all__ = ["jsonable"]


def jsonable(value: Any) -> Any:
    """``value`` as JSON's values: dataclasses as objects (with their public properties),
    enums as their words, UUIDs, times and decimals as text, bytes as base64."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        found = {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        for name in dir(type(value)):
            if isinstance(getattr(type(value), name, None), property) and not name.startswith("_"):
                found[name] = jsonable(getattr(value, name))
        return found
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(jsonable(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
