"""The API's typical request bodies declared with msgspec (for ``benchmarks.api_schema``): the
same as ``_api_schema_pydantic``'s."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

Text = Annotated[str, msgspec.Meta(min_length=1, pattern=r"\S")]
Key = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]


class Selection(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    handler: Annotated[list[str], msgspec.Meta(min_length=1)] | None = None
    status: Annotated[list[str], msgspec.Meta(min_length=1)] | None = None
    older_than: Annotated[float, msgspec.Meta(ge=0, le=100 * 366 * 86_400.0)] | None = None
    error: Text | None = None
    key: Text | None = None
    payload: Text | None = None
    group: Annotated[list[str], msgspec.Meta(min_length=1)] | None = None
    dry_run: bool = False
    reason: Text | None = None


class Event(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    key: Key
    values: dict[str, Any]


class Batch(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    events: Annotated[list[Event], msgspec.Meta(min_length=1, max_length=5_000)]
