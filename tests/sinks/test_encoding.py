"""How an event becomes a message, without a server: the default payload's JSON, the default
messages read from a group's rows being those of its events, and the per-event options."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from outbox import Batch, ConfigurationError, Outbox
from outbox.sinks.encoding import (
    json_default,
    json_payload,
    message_id,
    ordering_key,
    payload_bytes,
    row_messages,
)
from outbox.sinks.options import check_per_event
from tests.conftest import reset_schema
from tests.models import SinkEvent
from tests.sinks._contract import commit_events, event_rows


class Colour(enum.Enum):
    RED = "red"


class Stamp(dt.datetime):
    """A datetime of a class of its own (a library's, say)."""


class Amount(decimal.Decimal):
    """A decimal of a class of its own."""


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC), "2024-05-01T12:30:00+00:00"),
        (dt.datetime(2024, 5, 1, 12, 30, 0, 5), "2024-05-01T12:30:00.000005"),
        (dt.date(2024, 5, 1), "2024-05-01"),
        (dt.time(12, 30), "12:30:00"),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
        (decimal.Decimal("12.50"), "12.50"),
        (b"\x00\xff", "AP8="),
        (Colour.RED, "red"),
        (Stamp(2024, 5, 1, 12, 30), "2024-05-01T12:30:00"),
        (Amount("0.10"), "0.10"),
    ],
)
def test_the_default_payload_writes_each_type_json_has_not(value: Any, written: Any) -> None:
    """Times in ISO 8601, UUIDs and decimals as text (digits kept), bytes in base64, enums by
    value; subclasses as their base class."""
    assert written == json_default(value)


def test_a_value_json_cannot_write_is_refused_naming_its_type() -> None:
    """A value of no known type raises TypeError naming the type."""
    with pytest.raises(TypeError, match="a complex value cannot be written as JSON"):
        json_default(1j)


@pytest.mark.parametrize("key_column", ["account", None])
def test_the_messages_read_from_rows_are_those_of_the_events(
    key_column: str | None, sqlite_url: str, make_app: Callable[..., Outbox]
) -> None:
    """For every row of a group, the id, key and payload read from the row are, byte for byte,
    what message_id, the ordering key and json_payload make of its event."""
    reset_schema(sqlite_url)
    app = make_app(sqlite_url)
    app.handler(SinkEvent, name="h", ordering_key=key_column)(lambda batch: None)
    handler = app.get_handler("h")
    commit_events(app.engine, event_rows(30))
    with app.engine.connect() as conn:
        rows = list(conn.execute(select(SinkEvent.__table__).order_by(SinkEvent.id)))
    batch = Batch(rows=rows, model=SinkEvent, group_id=uuid.uuid4(), attempt=1, handler="h")
    key = ordering_key(handler)
    path = row_messages(handler, payload=json_payload, message_id=message_id, key=None)
    assert path is not None

    from_rows = path.messages(batch)

    assert [
        (message_id(e), None if key is None else key(e), payload_bytes(json_payload(e)))
        for e in batch.events
    ] == from_rows


def test_a_batch_of_events_is_not_read_as_rows(
    sqlite_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A batch made of events (no rows to read) gives None: its messages come from them."""
    reset_schema(sqlite_url)
    app = make_app(sqlite_url)
    app.handler(SinkEvent, name="h")(lambda batch: None)
    path = row_messages(app.get_handler("h"), payload=json_payload, message_id=message_id, key=None)
    assert path is not None
    events = [SinkEvent(id=1, account="acme", amount=decimal.Decimal(1), ref=uuid.uuid4())]

    assert path.messages(Batch(events, group_id=uuid.uuid4(), attempt=1, handler="h")) is None


@pytest.mark.parametrize(
    "options",
    [
        {"payload": lambda e: b"x"},
        {"message_id": lambda e: "x"},
        {"key": lambda e: "x"},
    ],
    ids=["payload", "message_id", "key"],
)
def test_an_option_of_the_users_means_no_row_path(
    options: dict[str, Any], sqlite_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A payload, message id or key function of the user's is given the event: no row path."""
    reset_schema(sqlite_url)
    app = make_app(sqlite_url)
    app.handler(SinkEvent, name="h")(lambda batch: None)
    given: dict[str, Any] = {"payload": json_payload, "message_id": message_id, "key": None}

    assert row_messages(app.get_handler("h"), **(given | options)) is None


def test_a_per_event_option_neither_text_nor_a_function_is_refused_naming_it() -> None:
    """A per-event text option given as something else is refused, naming the option."""
    with pytest.raises(ConfigurationError) as raised:
        check_per_event("subject", 42)

    assert "subject: expected a string or a function of the event, got int" == str(raised.value)
