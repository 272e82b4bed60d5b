"""The value codec (``outbox._core.values``): one encoding per type, written and read alike;
bytes in base64 only; the archive's own form of binary read by replay alone."""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import uuid
from typing import Any

import pytest
from sqlalchemy import (
    JSON,
    Column,
    Enum,
    Integer,
    Interval,
    LargeBinary,
    MetaData,
    Numeric,
    PickleType,
    String,
    Table,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite

from outbox import jsonable
from outbox._core.values import (
    archived_payload,
    archived_values,
    bytes_from_json,
    from_archived,
    from_json,
    from_text,
    interval_from_json,
    to_json,
)


class Colour(enum.Enum):
    RED = "red"
    DARK_BLUE = "dark blue"


class Level(enum.IntEnum):
    LOW = 1


_TABLE = Table(
    "values_events",
    MetaData(),
    Column("id", Integer, primary_key=True),
    Column("blob", LargeBinary, nullable=True),
    Column("colour", Enum(Colour), nullable=True),
    Column("amount", Numeric(6, 2), nullable=True),
    Column("wait", Interval, nullable=True),
    Column("data", JSON, nullable=True),
    Column("label", String(5), nullable=False),
    Column("pickled", PickleType, nullable=True),
)


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (dt.datetime(2024, 2, 29, 23, 59, 58, 123456), "2024-02-29T23:59:58.123456"),
        (dt.datetime(2024, 1, 1, tzinfo=dt.UTC), "2024-01-01T00:00:00+00:00"),
        (dt.date(2024, 2, 29), "2024-02-29"),
        (dt.time(13, 14, 15), "13:14:15"),
        (dt.timedelta(days=3, seconds=5, microseconds=7), "3 days, 0:00:05.000007"),
        (uuid.UUID(int=1), "00000000-0000-0000-0000-000000000001"),
        (decimal.Decimal("12.50"), "12.50"),
        (b"\x00\xff raw", "AP8gcmF3"),
        (bytearray(b"\xde\xad\xbe\xef"), "3q2+7w=="),
        (Colour.DARK_BLUE, "dark blue"),
        (Level.LOW, 1),
        ({"a": [1, 2.5, None, True]}, {"a": [1, 2.5, None, True]}),
        ([uuid.UUID(int=2)], ["00000000-0000-0000-0000-000000000002"]),
    ],
)
def test_each_type_is_written_in_its_one_encoding(value: Any, written: Any) -> None:
    """Times in ISO 8601, intervals as Python's text, UUIDs and decimals as text, bytes in
    base64, enums by value, JSON's own values as they are."""
    assert (written, written) == (to_json(value), jsonable(value))


def test_an_application_object_is_refused_by_to_json_and_shown_as_text_by_jsonable() -> None:
    """The sinks' bodies refuse what has no encoding; ``--json`` and the API show its text."""
    with pytest.raises(TypeError, match="a complex value cannot be written as JSON"):
        to_json(1j)
    assert "1j" == jsonable(1j)


def test_jsonable_writes_dataclasses_as_objects_with_their_properties() -> None:
    """A result's fields and public properties, each in its encoding."""

    @dataclasses.dataclass
    class Result:
        blob: bytes

        @property
        def size(self) -> int:
            return len(self.blob)

    assert {"blob": "AAE=", "size": 2} == jsonable(Result(b"\x00\x01"))


@pytest.mark.parametrize(
    ("value", "read"),
    [
        (b"", b""),
        (b"\x00\xff raw \x80", b"\x00\xff raw \x80"),
        (b"\xfb\xff", b"\xfb\xff"),  # the "+/" alphabet
    ],
)
def test_bytes_read_back_what_they_were_written_as(value: bytes, read: bytes) -> None:
    """Base64 read back is the bytes written."""
    assert read == bytes_from_json(to_json(value))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("00ff80", "'00ff80' is not base64: bytes are standard base64 (RFC 4648, padded), not hex"),
        ("\\x00ff", "bytes are standard base64 (RFC 4648, padded), not hex"),
        ("0xdeadbeef", "not hex"),
        (
            "AP8gcmF3IIA",
            "'AP8gcmF3IIA' is not base64: bytes are standard base64 (RFC 4648, padded); this"
            " text lacks its padding (=)",
        ),
        ("-_8=", "is not base64"),  # the URL-safe alphabet
        ("AP8g\ncmF3", "is not base64"),
    ],
    ids=["hex", "postgresql-hex", "0x-hex", "unpadded", "url-safe", "line-break"],
)
def test_bytes_in_anything_but_padded_base64_are_refused_saying_so(text: str, message: str) -> None:
    """Hex (also PostgreSQL's ``\\x``), missing padding, the URL-safe alphabet and line
    breaks are refused, the message saying bytes are base64."""
    with pytest.raises(ValueError, match="is not base64") as raised:
        bytes_from_json(text)
    assert message in str(raised.value)


def test_ingest_reads_bytes_as_the_api_answers_them() -> None:
    """What ``jsonable`` answers for a bytes column, ``from_json`` reads as the same bytes."""
    value = b"\x00\x01binary\xff"
    assert value == from_json(_TABLE.c.blob, jsonable(value))


def test_an_enum_column_is_read_by_its_members_values() -> None:
    """A member's value (what is answered) is read as the member; its name is not."""
    with pytest.raises(ValueError, match="'RED' is not a value of Colour"):
        from_json(_TABLE.c.colour, "RED")
    assert Colour.DARK_BLUE == from_json(_TABLE.c.colour, "dark blue")


@pytest.mark.parametrize(
    "value",
    [
        dt.timedelta(0),
        dt.timedelta(seconds=-1),
        dt.timedelta(days=1, microseconds=1),
        dt.timedelta(days=-10_000, hours=23),
    ],
)
def test_an_interval_is_read_back_from_its_text(value: dt.timedelta) -> None:
    """Python's text of an interval, negative ones and microseconds too, reads back."""
    assert value == interval_from_json(to_json(value))


@pytest.mark.parametrize(
    ("dialect", "stored"),
    [
        (sqlite.dialect(), dt.datetime(1970, 1, 1, 0, 0, 5, 500000)),
        (mysql.dialect(), dt.datetime(1970, 1, 1, 0, 0, 5, 500000)),
        (postgresql.dialect(), dt.timedelta(seconds=5, microseconds=500000)),
    ],
    ids=["sqlite", "mariadb", "postgresql"],
)
def test_an_operator_s_text_for_an_interval_is_stored_as_its_database_stores_one(
    dialect: Any, stored: Any
) -> None:
    """An edit of an ``Interval`` column takes its text (a fraction of fewer than six digits
    too) and gives what the database stores: a time since 1970 where it has no interval type."""
    assert stored == from_text(Column("wait", Interval), "0:00:05.5", dialect)


@pytest.mark.parametrize(
    "text", ["999999999 days, 0:00:00", "-999999999 days, 0:00:00", "\u0663:00:00"]
)
def test_an_interval_no_database_stores_is_refused_as_a_value(text: str) -> None:
    """An interval past what 1970 plus it can be (years 1 to 9999), or written in other
    digits than ASCII's, is a ValueError naming it: an edit's or a producer's 400."""
    with pytest.raises(ValueError, match="interval"):
        interval_from_json(text.encode().decode("unicode_escape"))


def test_a_column_converted_only_by_its_processors_takes_no_text() -> None:
    """A ``PickleType`` cannot be written from an operator's text: a TypeError saying so."""
    with pytest.raises(TypeError, match="a PickleType column takes no value as text"):
        from_text(Column("blob", PickleType), "x", sqlite.dialect())


def test_an_operator_s_text_for_bytes_is_base64() -> None:
    """An edit's text for a bytes column is base64, and hex is refused."""
    dialect = sqlite.dialect()
    with pytest.raises(ValueError, match="not hex"):
        from_text(_TABLE.c.blob, "00ff80", dialect)
    assert b"\x00\xff\x80" == from_text(_TABLE.c.blob, "AP+A", dialect)


def test_replay_reads_the_databases_own_form_of_binary() -> None:
    """An archived payload's ``"\\\\x<hex>"`` (PostgreSQL's text of a bytea, which the other
    databases' payloads copy) is read as bytes, as is base64; for a PickleType too."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    assert (b"\x00\xff", b"\x00\xff", b"\x80\x04") == (
        from_archived(_TABLE.c.blob, "\\x00FF", dialect),
        from_archived(_TABLE.c.blob, "AP8=", dialect),
        from_archived(_TABLE.c.pickled, "\\x8004", dialect),
    )


def test_an_archived_event_is_shown_as_its_columns_store_it() -> None:
    """The archive's hex of binary becomes bytes (answered in base64) and its times times; a
    value of a column no longer in the table, or one its column does not read, stays as
    archived."""
    dialect = sqlite.dialect()
    payload = archived_payload(
        '{"blob": "\\\\x00FF", "amount": 12.50, "gone": "\\\\x01", "wait": "nope"}'
    )
    shown = archived_values(_TABLE.columns, payload, dialect)
    assert {"blob": "AP8=", "amount": "12.50", "gone": "\\x01", "wait": "nope"} == jsonable(shown)
