"""The API's typical request bodies declared with pydantic v2 (for ``benchmarks.api_schema``):
a selection with its action's fields, and a batch of ingest."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

Text = Annotated[str, Field(min_length=1, pattern=r"\S")]
Key = Annotated[str, Field(min_length=1, max_length=200)]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Selection(Body):
    handler: Annotated[list[str], Field(min_length=1)] | None = None
    status: Annotated[list[str], Field(min_length=1)] | None = None
    older_than: Annotated[float, Field(ge=0, le=100 * 366 * 86_400.0)] | None = None
    error: Text | None = None
    key: Text | None = None
    payload: Text | None = None
    group: Annotated[list[str], Field(min_length=1)] | None = None
    dry_run: bool = False
    reason: Text | None = None


class Event(Body):
    key: Key
    values: dict[str, Any]


class Batch(Body):
    events: Annotated[list[Event], Field(min_length=1, max_length=5_000)]
