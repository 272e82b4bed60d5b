"""What the sinks share, without a server: the default payload's JSON, the default messages
read from a group's rows being those of its events, and the words of their errors."""

from __future__ import annotations

import datetime as dt
import decimal
import enum
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import select

from outbox import Batch, ConfigurationError, DownstreamError, Outbox, lifecycle
from outbox.sinks.encoding import (
    json_default,
    json_payload,
    message_id,
    ordering_key,
    payload_bytes,
    row_messages,
)
from outbox.sinks.errors import downstream_failed, not_a_message
from outbox.sinks.options import check_per_event
from outbox.sinks.secrets import PART_MIN_CHARS, Secrets
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


def test_a_url_part_is_masked_as_written_and_decoded() -> None:
    """A password given percent-encoded in a URL is masked in both spellings."""
    secrets = Secrets()
    secrets.add_quoted("p%40ss-w0rd")

    assert "*** or ***" == secrets.redact("p%40ss-w0rd or p@ss-w0rd")


def test_a_per_event_option_neither_text_nor_a_function_is_refused_naming_it() -> None:
    """A per-event text option given as something else is refused, naming the option."""
    with pytest.raises(ConfigurationError) as raised:
        check_per_event("subject", 42)

    assert "subject: expected a string or a function of the event, got int" == str(raised.value)


def test_a_failure_and_an_event_not_a_message_say_so_in_one_line_with_no_secret() -> None:
    """The errors a sink raises name the downstream, or the event, and mask its secrets."""
    secrets = Secrets(["s3cret"])
    error = ConnectionError("refused by\nhost with s3cret")

    failed = downstream_failed("Broker at host", error, secrets)
    refused = not_a_message(42, error, secrets)

    assert "Broker at host: ConnectionError: refused by host with ***" == str(failed)
    assert "event 42 cannot be made a message: ConnectionError: refused by host with ***" == str(
        refused
    )


def test_a_header_is_masked_whole_and_by_its_parts() -> None:
    """``Bearer <token>`` masks the token alone too; the scheme word stays readable."""
    secrets = Secrets()
    secrets.add_header("Bearer tok-0123456789")

    assert "***; token ***" == secrets.redact("Bearer tok-0123456789; token tok-0123456789")


def test_basic_auth_is_masked_as_base64_user_and_password_and_password() -> None:
    """``Basic <base64>`` masks the base64, ``user:password`` and the password alone."""
    secrets = Secrets()
    secrets.add_header("Basic YXBwOmh1bnRlcjI=")  # app:hunter2

    assert "*** *** *** app" == secrets.redact("YXBwOmh1bnRlcjI= app:hunter2 hunter2 app")


def test_a_part_shorter_than_the_minimum_is_not_masked_alone() -> None:
    """Parts under PART_MIN_CHARS (a short cookie value, the scheme) are masked only as
    part of the whole value."""
    secrets = Secrets()
    secrets.add_header("session=abc1234; theme=dark-mode-on")

    assert (8, "*** | abc1234 | *** | Bearer") == (
        PART_MIN_CHARS,
        secrets.redact("session=abc1234; theme=dark-mode-on | abc1234 | dark-mode-on | Bearer"),
    )


def test_a_url_masks_its_password_and_query_values_as_written_and_decoded() -> None:
    """A URL's password and each query value are masked, percent-encoded or not."""
    secrets = Secrets()
    secrets.add_url("https://app:p%40ss-w0rd@api.example/x?api_key=k%2Fy-123&page=2")

    assert "*** *** *** *** app 2" == secrets.redact(
        "p%40ss-w0rd p@ss-w0rd k%2Fy-123 k/y-123 app 2"
    )


def test_an_error_quoting_a_secret_is_raised_again_masked_without_its_cause() -> None:
    """What a block raises is re-raised with its secrets masked, the cause that quoted them
    left out; an error without a secret is raised as it is."""
    secrets = Secrets(["s3cret-token"])
    clean = ValueError("nothing to hide")

    def failing() -> None:
        try:
            raise ConnectionError("refused s3cret-token")
        except ConnectionError as error:
            raise DownstreamError(f"down: {error}") from error

    def raising_clean() -> None:
        raise clean

    with pytest.raises(DownstreamError) as raised, secrets.masking():
        failing()
    with pytest.raises(ValueError, match="nothing to hide") as kept, secrets.masking():
        raising_clean()

    assert ("down: refused ***", None, True) == (
        str(raised.value),
        raised.value.__cause__,
        kept.value is clean,
    )


class _Checked:
    """A handler object whose start check raises ``refusal`` (None: passes)."""

    def __init__(self, refusal: Exception | None) -> None:
        self.refusal = refusal
        self.stops = 0

    def __call__(self, batch: Batch[Any]) -> None:
        pass

    def outbox_start(self, app: Outbox, handler: Any) -> None:
        if self.refusal is not None:
            raise self.refusal

    def outbox_stop(self) -> None:
        self.stops += 1


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        (None, None),
        (ConfigurationError("window too short"), "handler 'h': window too short"),
        (ConfigurationError("handler 'h': named\nalready"), "handler 'h': named already"),
        (RuntimeError("boom"), "handler 'h': RuntimeError: boom"),
    ],
)
def test_the_start_check_says_in_one_line_why_a_worker_would_refuse_and_closes(
    sqlite_url: str,
    make_app: Callable[..., Outbox],
    raised: Exception | None,
    said: str | None,
) -> None:
    """``lifecycle.refusals`` runs each object's start check: None when it passes, else one
    line naming the handler; the object is stopped after, either way."""
    reset_schema(sqlite_url)
    app = make_app(sqlite_url)
    checked = _Checked(raised)
    app.handler(SinkEvent, name="h")(checked)

    found = lifecycle.refusals(app, app.select_handlers(()))

    assert ({"h": said}, 1) == (found, checked.stops)
