"""Values the database accepts that the archive, replay and batch jobs must survive.

Hypothesis writes events holding awkward values into buffers of a database that accepts them:
NUL characters (in SQLite text, in binary columns, in JSON strings), lone surrogates (they get
past the drivers only inside JSON, as ``\\ud800`` escapes), NaN and infinities, numbers of many
digits, binary data, multi-megabyte values, and JSON nested deeper than Python's parser goes.

What the database stored (read back through SQLAlchemy before the drain) is the oracle: after a
group succeeded with ``archive=True`` or was dead-lettered, ``replay`` must put exactly that
value back. A value that the driver cannot even load must fail its own group with a clear
error, be dead-lettered after its attempts, and leave every other group flowing. A value the
database refuses (NUL in PostgreSQL text, NaN in PostgreSQL JSON; on MariaDB NaN and the
infinities, lone surrogates in JSON, JSON nested deeper than 32 levels, numbers of more than 65
digits) makes the application's own insert fail, which is fine: those are left out of the
strategies for that database (``assume`` drops them from the pinned examples there).

Values that broke the archive when these tests were written are pinned with ``@example``: they
fail at once and by name, and Hypothesis explores the rest.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
import random
import sys
import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    Integer,
    Interval,
    LargeBinary,
    Numeric,
    PickleType,
    Text,
    TypeDecorator,
    cast,
    create_engine,
    delete,
    func,
    insert,
    literal,
    select,
    type_coerce,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, BufferMixin, Outbox, ReplayError, RetryPolicy, add_events, schema
from outbox.ops.replay import replay
from outbox.testing import drain
from outbox.worker import Worker
from tests.conftest import reset_schema

pytestmark = pytest.mark.filterwarnings(
    # SQLite has no decimal type: SQLAlchemy stores Numeric as a float there and says so.
    "ignore:Dialect sqlite\\+pysqlite does \\*not\\* support Decimal objects natively"
)

POSTGRESQL = "postgresql"
SQLITE = "sqlite"
MARIADB = "mysql"  # SQLAlchemy's name for MariaDB's dialect, and outbox's

ONE_SHOT = RetryPolicy(max_attempts=1)
# Two attempts, the second due at once, so that one drain or burst runs both.
TWO_QUICK_ATTEMPTS = RetryPolicy(max_attempts=2, scale=0.0, base_delay=0.0, jitter=0.0)

# Each example is a real drain and replay on a real database: few examples, no deadline, no
# example database, and no shrinking, which can take minutes of round trips; a failing example
# is reported as generated, and the known ones are pinned with @example.
EXAMPLES = settings(
    max_examples=25,
    deadline=None,
    database=None,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
WORKER_EXAMPLES = settings(EXAMPLES, max_examples=8)
FEW_EXAMPLES = settings(EXAMPLES, max_examples=2)

MEGABYTE = 1 << 20

# Values MariaDB refuses when the application writes them (a DECIMAL has 65 digits at most, and
# JSON nests 32 levels at most): their tests run on the databases that store them.
NOT_ON_MARIADB = pytest.mark.parametrize("database_url", ["sqlite", "postgresql"], indirect=True)


class BadValuesBase(DeclarativeBase):
    pass


class Prefixed(TypeDecorator[str]):
    """Text stored with a prefix that only the type adds and takes away: a value that went
    through the type twice comes back with the prefix left on."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Any) -> str | None:
        return None if value is None else f"stored:{value}"

    def process_result_value(self, value: str | None, dialect: Any) -> str | None:
        return None if value is None else value.removeprefix("stored:")


# On MariaDB, the types that hold what the other databases hold: TEXT and BLOB stop at 64 KB,
# FLOAT is single precision, and a DECIMAL with no precision given keeps no fraction.
_LONG_TEXT = Text().with_variant(mysql.LONGTEXT(), MARIADB)
_LONG_BINARY = LargeBinary().with_variant(mysql.LONGBLOB(), MARIADB)
_DOUBLE = Float().with_variant(mysql.DOUBLE(asdecimal=False), MARIADB)
_WIDE_NUMERIC = Numeric().with_variant(mysql.DECIMAL(65, 30), MARIADB)


class ValueColumns:
    """One column per kind of awkward value; a test fills one of them and leaves the rest NULL."""

    seq: Mapped[int] = mapped_column(Integer)
    text_value: Mapped[str | None] = mapped_column(_LONG_TEXT, nullable=True)
    binary_value: Mapped[bytes | None] = mapped_column(_LONG_BINARY, nullable=True)
    float_value: Mapped[float | None] = mapped_column(_DOUBLE, nullable=True)
    numeric_value: Mapped[Decimal | None] = mapped_column(_WIDE_NUMERIC, nullable=True)
    integer_value: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    json_value: Mapped[Any] = mapped_column(JSON, nullable=True)
    # Types whose stored values differ from what the application sees (TypeDecorators).
    pickled_value: Mapped[Any] = mapped_column(PickleType, nullable=True)
    interval_value: Mapped[dt.timedelta | None] = mapped_column(Interval, nullable=True)
    prefixed_value: Mapped[str | None] = mapped_column(Prefixed, nullable=True)


class ArchivedValueEvent(ValueColumns, BufferMixin, BadValuesBase):
    """Handled by a handler that succeeds and archives its groups."""

    __tablename__ = "bad_values_archived"


class DeadValueEvent(ValueColumns, BufferMixin, BadValuesBase):
    """Handled by a handler that always fails and dead-letters its groups."""

    __tablename__ = "bad_values_dead"


class BystanderEvent(BufferMixin, BadValuesBase):
    """Ordinary events of another handler, which must keep flowing next to a poisoned group."""

    __tablename__ = "bad_values_bystanders"
    n: Mapped[int] = mapped_column(Integer)


VALUE_MODELS = (ArchivedValueEvent, DeadValueEvent)


def _accept(batch: Batch[Any]) -> None:
    """A handler whose downstream takes every group."""


def _refuse(batch: Batch[Any]) -> None:
    """A handler whose downstream refuses every group."""
    raise RuntimeError("the downstream API refused the batch")


class Recorder:
    """A handler that records an attribute of every event it was given."""

    def __init__(self, field: str) -> None:
        self.field = field
        self.seen: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, batch: Batch[Any]) -> None:
        with self._lock:
            self.seen.extend(getattr(event, self.field) for event in batch.events)


class Poisoned:
    """An app whose value buffer has one event per group, next to two other handlers.

    ``values`` succeeds and archives, with two quick attempts; ``bystanders`` succeeds;
    ``dead_letter_values`` always fails once and dead-letters.
    """

    def __init__(self, app: Outbox) -> None:
        self.app = app
        self.handled = Recorder("seq")
        self.bystanders = Recorder("n")
        app.handler(
            ArchivedValueEvent, batch_size=1, archive=True, retry=TWO_QUICK_ATTEMPTS, name="values"
        )(self.handled)
        app.handler(BystanderEvent, batch_size=2, name="bystanders")(self.bystanders)
        app.handler(DeadValueEvent, retry=ONE_SHOT, name="dead_letter_values")(_refuse)
        app.with_settings(poll_interval=0.05)

    def reset(self) -> None:
        """Empty the tables and the recorders for the next example."""
        _empty(self.app)
        self.handled.seen.clear()
        self.bystanders.seen.clear()

    def run_burst(self) -> None:
        """Run a real worker until nothing is due: handler and completion errors stay in it."""
        Worker(self.app, concurrency=2, burst=True, shutdown_grace_period=10.0).run()

    def outcome(self) -> dict[str, Any]:
        """What became of every event of ``values`` and ``bystanders``, as one value."""
        archive = schema.archive
        with self.app.engine.connect() as conn:
            archived = conn.execute(
                select(archive.c.status, archive.c.attempts).where(archive.c.handler == "values")
            ).all()
            jobs = conn.execute(select(func.count()).select_from(schema.jobs)).scalar_one()
            left = conn.execute(select(func.count()).select_from(ArchivedValueEvent)).scalar_one()
        return {
            "handled": sorted(self.handled.seen),
            "bystanders": sorted(self.bystanders.seen),
            "archived": sorted(tuple(row) for row in archived),
            "jobs left": jobs,
            "rows left": left,
        }


def _create_tables(url: str) -> Iterator[str]:
    engine = create_engine(url)
    with engine.begin() as conn:
        BadValuesBase.metadata.drop_all(conn)
        BadValuesBase.metadata.create_all(conn)
    try:
        yield url
    finally:
        with engine.begin() as conn:
            BadValuesBase.metadata.drop_all(conn)
        engine.dispose()


def _values_app(app: Outbox) -> Outbox:
    app.handler(ArchivedValueEvent, archive=True, name="archive_values")(_accept)
    app.handler(DeadValueEvent, retry=ONE_SHOT, name="dead_letter_values")(_refuse)
    return app


@pytest.fixture
def bad_values_tables(database_url: str) -> Iterator[str]:
    """This module's buffer tables on each database, created for one test and dropped after."""
    yield from _create_tables(database_url)


@pytest.fixture
def values_app(bad_values_tables: str, make_app: Callable[[str], Outbox]) -> Outbox:
    """An app that archives the groups of one buffer and dead-letters those of the other."""
    return _values_app(make_app(bad_values_tables))


@pytest.fixture
def sqlite_values_app(sqlite_url: str, make_app: Callable[[str], Outbox]) -> Iterator[Outbox]:
    """``values_app`` on SQLite only, for values that only SQLite accepts."""
    reset_schema(sqlite_url)
    for url in _create_tables(sqlite_url):
        yield _values_app(make_app(url))


@pytest.fixture
def poisoned(bad_values_tables: str, make_app: Callable[[str], Outbox]) -> Poisoned:
    """A ``Poisoned`` app on each database."""
    return Poisoned(make_app(bad_values_tables))


# --- helpers -------------------------------------------------------------------------------


def _empty(app: Outbox) -> None:
    """Delete every row a previous example left behind."""
    with app.engine.begin() as conn:
        for table in (*BadValuesBase.metadata.sorted_tables, schema.jobs, schema.archive):
            conn.execute(delete(table))


def _comparable(value: Any) -> Any:
    """A value as it should compare after a round trip: NaN equals NaN."""
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, Decimal) and value.is_nan():
        return "NaN"
    return value


def _json_comparable(value: Any) -> Any:
    """A JSON document as JSON compares it: NaN equals NaN; 1e+300 and 1000...0 are one number."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, float):
        return repr(value) if not math.isfinite(value) else Decimal(repr(value))
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, list):
        return [_json_comparable(item) for item in value]
    return {key: _json_comparable(item) for key, item in value.items()}


def _buffered(app: Outbox, columns: list[str]) -> dict[tuple[str, int], tuple[Any, ...]]:
    """The values of ``columns`` in both value buffers, by (buffer, seq)."""
    values: dict[tuple[str, int], tuple[Any, ...]] = {}
    with app.engine.connect() as conn:
        for model in VALUE_MODELS:
            table = model.__table__
            query = select(table.c.seq, *(table.c[column] for column in columns))
            for seq, *row in conn.execute(query):
                values[(table.name, seq)] = tuple(row)
    return values


def _round_trip(
    app: Outbox, rows: list[dict[str, Any]], compare: Callable[[Any], Any] = _comparable
) -> tuple[dict[tuple[str, int], tuple[Any, ...]], dict[tuple[str, int], tuple[Any, ...]]]:
    """Commit ``rows`` into both buffers, drain (archive, dead-letter) and replay.

    Returns the values as the buffers held them before the drain and after the replay.
    """
    _empty(app)
    columns = sorted({column for row in rows for column in row})
    rows = [{"seq": seq, **row} for seq, row in enumerate(rows)]
    with app.engine.begin() as conn:
        for model in VALUE_MODELS:
            add_events(conn, model, rows)
    stored = _buffered(app, columns)
    drain(app)
    replay(app, all_statuses=True)
    replayed = _buffered(app, columns)
    return (
        {key: tuple(map(compare, row)) for key, row in stored.items()},
        {key: tuple(map(compare, row)) for key, row in replayed.items()},
    )


def _storable(dialect: str, value: Any) -> Any:
    """``value`` with what the database refuses to store replaced by what it stores: on MariaDB,
    NaN and the infinities become None, and lone surrogates ``?``; elsewhere, ``value``."""
    if dialect != MARIADB:
        return value
    if isinstance(value, float | Decimal) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        return "".join("?" if "\ud800" <= char <= "\udfff" else char for char in value)
    if isinstance(value, list):
        return [_storable(dialect, item) for item in value]
    if isinstance(value, dict):
        return {_storable(dialect, key): _storable(dialect, item) for key, item in value.items()}
    return value


def _one_column(column: str, values: list[Any]) -> list[dict[str, Any]]:
    return [{column: value} for value in values]


def _nested_json(depth: int) -> str:
    """A JSON object nested ``depth`` levels deep, as text."""
    return '{"a":' * depth + "1" + "}" * depth


def _unloadable_depth(extra: int) -> int:
    """A nesting depth Python's json cannot load here: beyond the current recursion limit.

    Python's C JSON scanner stops at the recursion limit (1000 by default; Hypothesis raises it
    while a test runs). PostgreSQL's json parser goes to about 12,000 levels with the default
    max_stack_depth; SQLite stores any text in a JSON column.
    """
    return sys.getrecursionlimit() + extra


def _raw_json(app: Outbox, document: str, json_type: Any) -> Any:
    """A JSON document given as text, as another program or SQL writes it: no json.dumps.

    PostgreSQL parses it into ``json_type``; SQLite stores the text as it is (a CAST to JSON
    would give it numeric affinity there).
    """
    if app.dialect == POSTGRESQL:
        return cast(literal(document, Text), json_type)
    return type_coerce(document, Text)


def _insert_raw_json(app: Outbox, model: type[Any], seq: int, document: str) -> None:
    """Write an event whose JSON column is given as text."""
    with app.engine.begin() as conn:
        conn.execute(
            insert(model.__table__).values(seq=seq, json_value=_raw_json(app, document, JSON()))
        )


# --- strategies ----------------------------------------------------------------------------

# Characters the drivers can send: no surrogates (psycopg and sqlite3 both refuse to encode them).
_ENCODABLE = st.characters(exclude_categories=("Cs",))
_LONE_SURROGATES = st.characters(categories=("Cs",))
_TRICKY_TEXT = [
    "",
    " ",
    "\\x",
    "\\x00ff",
    "\\xzz",
    "NaN",
    "null",
    "{}",
    '{"a": 1}',
    "'; DROP TABLE outbox_archive; --",
    "é€😀",
    "\u2028\u2029",
]


def _texts(dialect: str) -> st.SearchStrategy[str]:
    """Text a database's TEXT column accepts; PostgreSQL refuses NUL, SQLite stores it."""
    if dialect == POSTGRESQL:
        alphabet = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
        return st.text(alphabet, max_size=40) | st.sampled_from(_TRICKY_TEXT)
    nul_texts = st.sampled_from(["\x00", "a\x00b", "\x00\x00\x00", "\\x00\x00"])
    return st.text(_ENCODABLE, max_size=40) | st.sampled_from(_TRICKY_TEXT) | nul_texts


_FLOATS = (
    st.none()
    | st.floats()
    | st.sampled_from(
        [0.1 + 0.2, 1 / 3, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -0.0]
    )
)

# Up to 25 integer and 20 fractional digits, and NaN and the infinities.
_DECIMALS = (
    st.none()
    | st.builds(
        lambda sign, whole, fraction: Decimal(f"{sign}{whole}.{fraction}"),
        st.sampled_from(["", "-"]),
        st.text("0123456789", min_size=1, max_size=25),
        st.text("0123456789", min_size=1, max_size=20),
    )
    | st.sampled_from([Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity")])
)


def _json_documents(*, allow_nan: bool) -> st.SearchStrategy[Any]:
    """JSON documents with NUL and lone-surrogate strings and numbers of up to 30 digits."""
    strings = st.text(_ENCODABLE | _LONE_SURROGATES, max_size=12)
    leaves = (
        st.none()
        | st.booleans()
        | st.integers(min_value=-(10**30), max_value=10**30)
        | st.floats(allow_nan=allow_nan, allow_infinity=allow_nan)
        | strings
    )
    return st.recursive(
        leaves,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(strings, children, max_size=4)
        ),
        max_leaves=12,
    )


def _values_of(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    return st.lists(strategy, min_size=1, max_size=4)


# --- round trips ---------------------------------------------------------------------------


@EXAMPLES
@given(data=st.data())
def test_text_round_trips_through_archive_and_replay(
    values_app: Outbox, data: st.DataObject
) -> None:
    """Text (NUL characters on SQLite, every encodable character) comes back unchanged."""
    values = data.draw(_values_of(_texts(values_app.dialect)))
    stored, replayed = _round_trip(values_app, _one_column("text_value", values))
    assert stored == replayed


@EXAMPLES
@given(values=_values_of(st.none() | st.binary(max_size=64)))
@example(values=[None])
def test_binary_round_trips_through_archive_and_replay(
    values_app: Outbox, values: list[bytes | None]
) -> None:
    """Binary values, NUL bytes, empty and NULL ones included, come back unchanged."""
    stored, replayed = _round_trip(values_app, _one_column("binary_value", values))
    assert stored == replayed


@EXAMPLES
@given(
    values=_values_of(
        st.none()
        | st.binary(max_size=16)
        | st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3)
    )
)
@example(values=[{"a": 1}])
def test_pickled_values_round_trip_through_archive_and_replay(
    values_app: Outbox, values: list[Any]
) -> None:
    """A PickleType column stores pickled bytes under a TypeDecorator: the archive keeps the
    bytes, and replay writes them back without pickling them a second time."""
    stored, replayed = _round_trip(values_app, _one_column("pickled_value", values))
    assert stored == replayed


@EXAMPLES
@given(
    values=_values_of(
        st.none()
        | st.timedeltas(min_value=dt.timedelta(days=-9999), max_value=dt.timedelta(days=9999))
    )
)
@example(values=[dt.timedelta(seconds=5)])
@example(values=[dt.timedelta(days=-1, microseconds=1)])
def test_intervals_round_trip_through_archive_and_replay(
    values_app: Outbox, values: list[dt.timedelta | None]
) -> None:
    """Intervals (a DATETIME under a TypeDecorator on SQLite, native on PostgreSQL) come back
    unchanged."""
    stored, replayed = _round_trip(values_app, _one_column("interval_value", values))
    assert stored == replayed


@EXAMPLES
@given(values=_values_of(st.none() | st.text(max_size=20).filter(lambda t: "\x00" not in t)))
@example(values=["plain"])
def test_decorated_text_is_replayed_as_stored_not_converted_twice(
    values_app: Outbox, values: list[str | None]
) -> None:
    """A TypeDecorator that changes values on their way in: replay writes back the stored
    value, so the application reads what it wrote, not the value converted twice."""
    stored, replayed = _round_trip(values_app, _one_column("prefixed_value", values))
    assert stored == replayed


@EXAMPLES
@given(values=_values_of(_FLOATS))
@example(values=[0.1 + 0.2])
@example(values=[float("inf")])
def test_float_round_trips_through_archive_and_replay(
    values_app: Outbox, values: list[float | None]
) -> None:
    """Doubles, NaN, the infinities, subnormals and the largest double come back unchanged."""
    values = _storable(values_app.dialect, values)
    stored, replayed = _round_trip(values_app, _one_column("float_value", values))
    assert stored == replayed


@EXAMPLES
@given(values=_values_of(_DECIMALS))
@example(values=[Decimal("12345678901234567890.123456789")])
@example(values=[Decimal("Infinity")])
def test_numeric_round_trips_through_archive_and_replay(
    values_app: Outbox, values: list[Decimal | None]
) -> None:
    """Numeric values of up to 45 digits, NaN and the infinities come back unchanged."""
    values = _storable(values_app.dialect, values)
    stored, replayed = _round_trip(values_app, _one_column("numeric_value", values))
    assert stored == replayed


@NOT_ON_MARIADB
@FEW_EXAMPLES
@given(digits=st.integers(min_value=4_301, max_value=6_000), seed=st.integers(0, 2**32))
@example(digits=4_301, seed=0)
def test_numeric_of_thousands_of_digits_round_trips(
    values_app: Outbox, digits: int, seed: int
) -> None:
    """A numeric with more digits than Python turns into an int by default comes back unchanged."""
    rng = random.Random(seed)
    number = "1" + "".join(rng.choices("0123456789", k=digits - 1))
    stored, replayed = _round_trip(values_app, _one_column("numeric_value", [Decimal(number)]))
    assert stored == replayed


@EXAMPLES
@given(values=_values_of(st.none() | st.integers(min_value=-(2**63), max_value=2**63 - 1)))
def test_big_integer_round_trips_through_archive_and_replay(
    values_app: Outbox, values: list[int | None]
) -> None:
    """64-bit integers, both extremes included, come back unchanged."""
    stored, replayed = _round_trip(values_app, _one_column("integer_value", values))
    assert stored == replayed


@EXAMPLES
@given(values=_values_of(_json_documents(allow_nan=False)))
@example(values=[{"text": "nul \x00 inside"}])
@example(values=[["lone \ud800 surrogate"]])
@example(values=[0.1 + 0.2])
def test_json_round_trips_through_archive_and_replay(values_app: Outbox, values: list[Any]) -> None:
    """JSON with NUL and lone-surrogate strings and numbers of 30 digits comes back unchanged."""
    values = _storable(values_app.dialect, values)
    stored, replayed = _round_trip(values_app, _one_column("json_value", values), _json_comparable)
    assert stored == replayed


@EXAMPLES
@given(values=_values_of(_json_documents(allow_nan=True)))
@example(values=[{"ratio": float("nan")}])
@example(values=[[float("inf")]])
def test_json_with_nan_and_infinity_round_trips_on_sqlite(
    sqlite_values_app: Outbox, values: list[Any]
) -> None:
    """On SQLite, which stores what Python writes, JSON holding NaN and Infinity comes back."""
    stored, replayed = _round_trip(
        sqlite_values_app, _one_column("json_value", values), _json_comparable
    )
    assert stored == replayed


@FEW_EXAMPLES
@given(megabytes=st.integers(min_value=2, max_value=3), seed=st.integers(0, 2**32))
def test_multi_megabyte_values_round_trip(values_app: Outbox, megabytes: int, seed: int) -> None:
    """Text, binary and a JSON string of megabytes each come back unchanged."""
    rng = random.Random(seed)
    size = megabytes * MEGABYTE
    text = "".join(rng.choices("aé€😀\n\"'\\{}", k=size // 4)) * 2
    row = {"text_value": text, "binary_value": rng.randbytes(size), "json_value": [text]}
    stored, replayed = _round_trip(values_app, [row])
    assert stored == replayed


# --- values the driver cannot load, and values the archive cannot convert -------------------


@NOT_ON_MARIADB
@WORKER_EXAMPLES
@given(extra=st.integers(min_value=100, max_value=3_000))
@example(extra=100)
def test_json_too_deep_to_load_dead_letters_only_its_own_group(
    poisoned: Poisoned, extra: int
) -> None:
    """A JSON value too deep to load fails its group twice and is dead-lettered; all else flows."""
    poisoned.reset()
    app = poisoned.app
    with app.engine.begin() as conn:
        add_events(conn, ArchivedValueEvent, [{"seq": 0, "json_value": {"a": 0}}])
    _insert_raw_json(app, ArchivedValueEvent, 1, _nested_json(_unloadable_depth(extra)))
    with app.engine.begin() as conn:
        add_events(conn, ArchivedValueEvent, [{"seq": 2, "json_value": {"a": 2}}])
        add_events(conn, BystanderEvent, [{"n": n} for n in range(5)])
    poisoned.run_burst()
    assert {
        "handled": [0, 2],
        "bystanders": [0, 1, 2, 3, 4],
        "archived": [("dead", 2), ("succeeded", 1), ("succeeded", 1)],
        "jobs left": 0,
        "rows left": 0,
    } == poisoned.outcome()


@NOT_ON_MARIADB
@WORKER_EXAMPLES
@given(extra=st.integers(min_value=100, max_value=3_000))
@example(extra=100)
def test_json_too_deep_to_load_is_dead_lettered_with_a_clear_error(
    poisoned: Poisoned, extra: int
) -> None:
    """The dead letter of a JSON value too deep to load says why: a RecursionError."""
    poisoned.reset()
    _insert_raw_json(poisoned.app, ArchivedValueEvent, 0, _nested_json(_unloadable_depth(extra)))
    poisoned.run_burst()
    with poisoned.app.engine.connect() as conn:
        errors = list(conn.execute(select(schema.archive.c.error)).scalars())
    expected = "RecursionError: maximum recursion depth exceeded"
    assert [expected] == [error.splitlines()[0][: len(expected)] for error in errors]


@NOT_ON_MARIADB
@WORKER_EXAMPLES
@given(extra=st.integers(min_value=100, max_value=3_000))
@example(extra=100)
def test_dead_letter_too_deep_to_load_does_not_stop_replay_of_others(
    poisoned: Poisoned, extra: int
) -> None:
    """Replay puts other dead letters back even when one archived payload is too deep to load."""
    poisoned.reset()
    app = poisoned.app
    with app.engine.begin() as conn:
        add_events(conn, DeadValueEvent, [{"seq": n, "text_value": f"event {n}"} for n in range(3)])
    poisoned.run_burst()
    # The dead letter a too-deep event leaves (written here, so that this test does not depend
    # on the worker getting that far).
    payload = f'{{"seq": 9, "json_value": {_nested_json(_unloadable_depth(extra))}}}'
    with app.engine.begin() as conn:
        conn.execute(
            insert(schema.archive).values(
                handler="values",
                buffer=ArchivedValueEvent.__tablename__,
                event_id=9,
                status="dead",
                attempts=2,
                error="RecursionError: maximum recursion depth exceeded",
                payload=_raw_json(app, payload, schema.archive.c.payload.type),
            )
        )
    with contextlib.suppress(ReplayError):  # refusing the unloadable one, clearly, is fine
        replay(app, all_statuses=True)
    with app.engine.connect() as conn:
        replayed = sorted(conn.execute(select(DeadValueEvent.seq)).scalars())
        deep_kept = (
            conn.execute(select(func.count()).select_from(ArchivedValueEvent)).scalar_one()
            + conn.execute(
                select(func.count()).where(schema.archive.c.handler == "values")
            ).scalar_one()
        )
    assert ([0, 1, 2], 1) == (replayed, deep_kept)


@WORKER_EXAMPLES
@given(
    poison=st.builds(
        lambda head, bad, tail: head + bad + tail,
        st.text(_ENCODABLE, max_size=5),
        st.just("\x00") | _LONE_SURROGATES,
        st.text(_ENCODABLE, max_size=5),
    )
)
@example(poison="\x00")
def test_json_the_archive_cannot_convert_still_finishes_its_group(
    poisoned: Poisoned, poison: str
) -> None:
    """A group with a NUL or lone surrogate in a JSON string finishes; no group stays stuck."""
    poison = _storable(poisoned.app.dialect, poison)
    poisoned.reset()
    with poisoned.app.engine.begin() as conn:
        add_events(
            conn,
            ArchivedValueEvent,
            [{"seq": n, "json_value": {"text": poison if n == 1 else "plain"}} for n in range(3)],
        )
        add_events(conn, BystanderEvent, [{"n": n} for n in range(5)])
    poisoned.run_burst()
    assert {
        "handled": [0, 1, 2],
        "bystanders": [0, 1, 2, 3, 4],
        "archived": [("succeeded", 1)] * 3,
        "jobs left": 0,
        "rows left": 0,
    } == poisoned.outcome()
