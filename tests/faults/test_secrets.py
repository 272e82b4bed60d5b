"""Secrets stay secret, names cannot inject SQL, and row data is never executed.

- A database password never reaches the CLI's stdout or stderr, whatever is wrong with the URL.
- Event values (a canary string in the columns) never reach the logs, the error stored with a
  retrying job (``outbox_jobs.last_error``) or with a dead letter (``outbox_archive.error``),
  as long as the handler's own exception does not quote them; not even when the database or
  the driver fails on one of those values.
- Names that reach SQL are validated or quoted: handler names with quotes, semicolons or spaces
  are refused at registration; a buffer table or column with such a name works end to end
  because SQLAlchemy quotes it.
- Archive and replay move row data as JSON only: a value that would run if it were unpickled
  or evaluated goes through both and nothing runs.
"""

from __future__ import annotations

import io
import json
import pickle
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
import structlog
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sqlalchemy import (
    JSON,
    LargeBinary,
    String,
    Text,
    cast,
    func,
    insert,
    inspect,
    literal,
    select,
)
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, BufferMixin, ConfigurationError, Outbox, RetryPolicy, schema
from outbox.cli import configure_logging
from outbox.ops import notify
from outbox.ops.replay import replay
from outbox.testing import drain
from outbox.worker import Worker
from tests.acceptance._cli import APP, Cli
from tests.conftest import reset_schema
from tests.models import ActivityEvent, EmailEvent

PASSWORD_CANARY = "pw-canary-7f3a1c"
PAYLOAD_CANARY = "payload-canary-3e9d41"
HANDLER_ERROR = "the downstream API refused the batch"

ONE_SHOT = RetryPolicy(max_attempts=1)
# A failed attempt is retried an hour later: after a drain the job waits with its last_error.
RETRY_LATER = RetryPolicy(max_attempts=3, scale=0.0, base_delay=3600.0, jitter=0.0)

ODD_TABLE = 'weird "name"; drop'
ODD_COLUMN = 'odd "column"; -- \''


class SecretsBase(DeclarativeBase):
    pass


class OddlyNamedEvent(BufferMixin, SecretsBase):
    """A buffer whose table and column names need quoting in every statement."""

    __tablename__ = ODD_TABLE
    value: Mapped[str] = mapped_column(ODD_COLUMN, String(100))


class AliasNamedEvent(BufferMixin, SecretsBase):
    """A buffer with a column named like the alias the archive gives the buffer's rows."""

    __tablename__ = "secrets_alias_events"
    outbox_row: Mapped[str] = mapped_column(String(100))
    note: Mapped[str] = mapped_column(String(100))


class TrapEvent(BufferMixin, SecretsBase):
    """Values that would run code if anything unpickled or evaluated them."""

    __tablename__ = "secrets_trap_events"
    blob: Mapped[bytes] = mapped_column(LargeBinary)
    source: Mapped[str] = mapped_column(Text)
    data: Mapped[Any] = mapped_column(JSON)


class Recorder:
    """A handler that records one attribute of every event it was given."""

    def __init__(self, field: str) -> None:
        self.field = field
        self.seen: list[Any] = []
        self._lock = threading.Lock()

    def __call__(self, batch: Batch[Any]) -> None:
        with self._lock:
            self.seen.extend(getattr(event, self.field) for event in batch.events)


def _refuse(batch: Batch[Any]) -> None:
    """A handler whose downstream refuses every group, without quoting any event."""
    raise RuntimeError(HANDLER_ERROR)


def _accept(batch: Batch[Any]) -> None:
    """A handler whose downstream takes every group."""


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture
def cli(tmp_path: Path) -> Iterator[Cli]:
    """Runs ``outbox`` commands in subprocesses; any still running at the end are killed."""
    output_dir = tmp_path / "handlers"
    output_dir.mkdir()
    runner = Cli(tmp_path, output_dir)
    try:
        yield runner
    finally:
        runner.close()


@pytest.fixture
def logs() -> Iterator[Callable[[], str]]:
    """Logging configured as the CLI does it (JSON lines, debug level); returns what was logged."""
    stream = io.StringIO()
    saved = structlog.get_config()
    configure_logging("debug", "json")
    structlog.configure(logger_factory=structlog.WriteLoggerFactory(file=stream))
    try:
        yield stream.getvalue
    finally:
        structlog.configure(**saved)


@pytest.fixture
def secrets_tables(database_url: str, make_app: Callable[[str], Outbox]) -> Iterator[str]:
    """This module's buffer tables, created for one test on each database and dropped after."""
    engine = make_app(database_url).engine
    with engine.begin() as conn:
        SecretsBase.metadata.drop_all(conn)
        SecretsBase.metadata.create_all(conn)
    yield database_url
    with engine.begin() as conn:
        SecretsBase.metadata.drop_all(conn)


# --- helpers -------------------------------------------------------------------------------


def _commit_canary_events(app: Outbox, count: int = 3) -> None:
    """Commit email events whose address and JSON data carry the payload canary."""
    rows = [
        {"address": f"{PAYLOAD_CANARY}-{n}@example.com", "data": {"token": PAYLOAD_CANARY}}
        for n in range(count)
    ]
    with app.engine.begin() as conn:
        conn.execute(insert(EmailEvent.__table__), rows)


def _stored_errors(app: Outbox) -> list[str]:
    """Every error outbox stored: jobs' last_error and the archive's error."""
    with app.engine.connect() as conn:
        jobs = conn.execute(select(schema.jobs.c.last_error)).scalars()
        archived = conn.execute(select(schema.archive.c.error)).scalars()
        return [error for error in (*jobs, *archived) if error is not None]


def _run_burst(app: Outbox) -> None:
    """Run a real worker until nothing is due; errors stay inside it, as in production."""
    app.with_settings(poll_interval=0.05)
    Worker(app, concurrency=2, burst=True, shutdown_grace_period=10.0).run()


# --- (a) the database password -------------------------------------------------------------

_ESCAPED_PASSWORD = quote(f"{PASSWORD_CANARY}@/:%?#", safe="")
UNREACHABLE_URLS = {
    "refused": f"postgresql+psycopg://app:{PASSWORD_CANARY}@127.0.0.1:1/app",
    "unknown host": f"postgresql+psycopg://app:{PASSWORD_CANARY}@no-such-host.invalid:5432/app",
    "bad port": f"postgresql+psycopg://app:{PASSWORD_CANARY}@127.0.0.1:notaport/app",
    "port out of range": f"postgresql+psycopg://app:{PASSWORD_CANARY}@127.0.0.1:99999/app",
    "bad option": f"postgresql+psycopg://app:{PASSWORD_CANARY}@127.0.0.1:1/app?sslmode=bogus",
    "escaped password": f"postgresql+psycopg://app:{_ESCAPED_PASSWORD}@127.0.0.1:1/app",
}
COMMANDS = {
    "migrate": ("migrate",),
    "work": ("--log-level", "debug", "--app", APP, "work", "--burst"),
    "prune": ("prune", "--older-than", "1d"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("url", sorted(UNREACHABLE_URLS))
def test_cli_never_prints_the_password_of_a_database_it_cannot_use(
    cli: Cli, url: str, command: str
) -> None:
    """A command that cannot use the database fails without printing its password anywhere."""
    result = cli.run("--database-url", UNREACHABLE_URLS[url], *COMMANDS[command])

    assert (True, False) == (result.code != 0, PASSWORD_CANARY in result.output)


def test_cli_never_prints_the_password_from_the_environment(cli: Cli) -> None:
    """A password given in OUTBOX_DATABASE_URL is not printed either."""
    result = cli.run(
        "--app", APP, "work", "--burst",
        env={"OUTBOX_DATABASE_URL": UNREACHABLE_URLS["refused"]},
    )  # fmt: skip

    assert (3, False) == (result.code, PASSWORD_CANARY in result.output)


# --- (b) event values ----------------------------------------------------------------------


def test_error_kept_with_a_retrying_job_has_no_event_values(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """The last_error of a job waiting for its retry names the failure, not the events."""
    app = make_app(database_url)
    app.handler(EmailEvent, retry=RETRY_LATER, name="refuse")(_refuse)
    _commit_canary_events(app)
    drain(app)
    (error,) = _stored_errors(app)

    assert (True, False) == (HANDLER_ERROR in error, PAYLOAD_CANARY in error)


def test_error_kept_with_a_dead_letter_has_no_event_values(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """A dead letter's error names the failure, not the events (which are in its payload)."""
    app = make_app(database_url)
    app.handler(EmailEvent, retry=ONE_SHOT, name="refuse")(_refuse)
    _commit_canary_events(app)
    drain(app)
    with app.engine.connect() as conn:
        rows = conn.execute(select(schema.archive.c.error, schema.archive.c.payload)).all()

    assert [(True, False, True)] * 3 == [
        (HANDLER_ERROR in error, PAYLOAD_CANARY in error, PAYLOAD_CANARY in json.dumps(payload))
        for error, payload in rows
    ]


def test_logs_have_no_event_values(
    database_url: str, make_app: Callable[[str], Outbox], logs: Callable[[], str]
) -> None:
    """At debug level, a worker's logs about failed and succeeded batches carry no event values."""
    app = make_app(database_url)
    app.handler(EmailEvent, retry=ONE_SHOT, name="refuse")(_refuse)
    app.handler(ActivityEvent, archive=True, name="accept")(_accept)
    _commit_canary_events(app)
    with app.engine.begin() as conn:
        conn.execute(insert(ActivityEvent.__table__), [{"activity_id": 1, "kind": PAYLOAD_CANARY}])
    _run_burst(app)
    output = logs()

    assert (2, False) == (output.count('"outbox.batch.handled"'), PAYLOAD_CANARY in output)


def test_database_error_about_an_event_value_does_not_log_the_event(
    database_url: str, make_app: Callable[[str], Outbox], logs: Callable[[], str]
) -> None:
    """When the database fails on an event's value (NUL in JSON), the logs still carry no values."""
    app = make_app(database_url)
    app.handler(EmailEvent, archive=True, name="accept")(_accept)
    with app.engine.begin() as conn:
        conn.execute(
            insert(EmailEvent.__table__),
            [{"address": "a@example.com", "data": {"token": PAYLOAD_CANARY, "bad": "\x00"}}],
        )
    _run_burst(app)
    output = logs()

    assert (True, False) == ("outbox." in output, PAYLOAD_CANARY in output)


def test_text_the_driver_cannot_decode_is_not_quoted_in_errors_or_logs(
    sqlite_url: str, make_app: Callable[[str], Outbox], logs: Callable[[], str]
) -> None:
    """SQLite text that is not UTF-8 fails its group without its text reaching errors or logs."""
    reset_schema(sqlite_url)
    app = make_app(sqlite_url)
    app.handler(EmailEvent, retry=ONE_SHOT, name="accept")(_accept)
    undecodable = PAYLOAD_CANARY.encode() + b"\xff\xfe"
    with app.engine.begin() as conn:
        conn.execute(
            insert(EmailEvent.__table__).values(
                address=cast(literal(undecodable, LargeBinary), Text)
            )
        )
    _run_burst(app)
    output = logs() + "\n".join(_stored_errors(app))

    assert (True, False) == ("outbox." in output, PAYLOAD_CANARY in output)


# --- (c) names that reach SQL --------------------------------------------------------------

_SQL_CHARACTERS = st.sampled_from(list("'\";` \t\n\\/()*%=<>,\x00"))
_NAME_PARTS = st.text(st.characters(categories=("L", "Nd")), max_size=8)


@settings(max_examples=25, deadline=None, database=None)
@given(
    name=st.builds(
        lambda head, bad, tail: head + bad + tail, _NAME_PARTS, _SQL_CHARACTERS, _NAME_PARTS
    )
)
@example(name="x'; DROP TABLE outbox_jobs; --")
@example(name='say "hi"')
@example(name="two words")
@example(name="sync\n")
def test_handler_name_with_sql_characters_is_refused_at_registration(name: str) -> None:
    """A handler name with quotes, semicolons, spaces or other SQL characters is refused."""
    app = Outbox("sqlite://")

    with pytest.raises(ConfigurationError) as refused:
        app.handler(ActivityEvent, name=name)(_accept)

    assert (True, {}) == (
        str(refused.value).startswith(f"handler name {name!r} is not valid"),
        dict(app.handlers),
    )


@pytest.mark.postgres
def test_cli_refuses_a_handler_filter_with_sql_characters(
    cli: Cli, postgres_database: str, make_app: Callable[[str], Outbox]
) -> None:
    """``replay --handler "x'; DROP TABLE ..."`` is a usage error and drops nothing."""
    injection = "x'; DROP TABLE outbox_archive; --"
    result = cli.run(
        "--app", APP, "--database-url", postgres_database, "replay", "--handler", injection
    )  # fmt: skip
    with make_app(postgres_database).engine.connect() as conn:
        archive_exists = inspect(conn).has_table("outbox_archive")

    assert (2, True) == (result.code, archive_exists)


def test_oddly_named_buffer_runs_a_full_cycle(
    secrets_tables: str, make_app: Callable[[str], Outbox]
) -> None:
    """Table and column names with quotes and semicolons survive drain, archive, replay (the
    replayed rows kept, marked) and a second drain."""
    app = make_app(secrets_tables)
    handled = Recorder("value")
    app.handler(OddlyNamedEvent, batch_size=2, archive=True, name="odd")(handled)
    values = [f"event {n}" for n in range(5)]
    with app.engine.begin() as conn:
        conn.execute(insert(OddlyNamedEvent.__table__), [{ODD_COLUMN: v} for v in values])
    drain(app)
    replayed = replay(app, all_statuses=True).events
    drain(app)
    with app.engine.connect() as conn:
        archived = [
            (buffer, payload[ODD_COLUMN], status)
            for buffer, payload, status in conn.execute(
                select(schema.archive.c.buffer, schema.archive.c.payload, schema.archive.c.status)
            )
        ]
        buffered = conn.execute(select(func.count()).select_from(OddlyNamedEvent)).scalar_one()
    # Each event archived twice: delivered and replayed (the row kept, marked), then delivered.
    twice = [(ODD_TABLE, v, s) for v in values for s in ("replayed", "succeeded")]
    assert (sorted(values * 2), 5, sorted(twice), 0) == (
        sorted(handled.seen),
        replayed,
        sorted(archived),
        buffered,
    )


@pytest.mark.postgres
@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_notify_trigger_installs_on_an_oddly_named_buffer(
    secrets_tables: str, make_app: Callable[[str], Outbox]
) -> None:
    """The notify trigger of a buffer named ``weird "name"; drop`` installs and announces it."""
    app = make_app(secrets_tables)
    app.handler(OddlyNamedEvent, name="odd")(_accept)
    notify.install(app)
    dsn = make_url(secrets_tables).set(drivername="postgresql")
    with psycopg.connect(dsn.render_as_string(hide_password=False), autocommit=True) as listener:
        listener.execute("LISTEN outbox")
        with app.engine.begin() as conn:
            conn.execute(insert(OddlyNamedEvent.__table__), [{ODD_COLUMN: "hello"}])
        payloads = [n.payload for n in listener.notifies(timeout=5.0, stop_after=1)]

    assert [ODD_TABLE] == payloads


def test_buffer_column_named_like_the_archive_row_alias_round_trips(
    secrets_tables: str, make_app: Callable[[str], Outbox]
) -> None:
    """A column named ``outbox_row`` does not shadow the row in the archive: all columns survive."""
    app = make_app(secrets_tables)
    app.handler(AliasNamedEvent, retry=ONE_SHOT, name="alias")(_refuse)
    with app.engine.begin() as conn:
        conn.execute(insert(AliasNamedEvent.__table__), [{"outbox_row": "shadow", "note": "kept"}])
    drain(app)
    replay(app, all_statuses=True)
    with app.engine.connect() as conn:
        rows = conn.execute(select(AliasNamedEvent.outbox_row, AliasNamedEvent.note)).all()

    assert [("shadow", "kept")] == [tuple(row) for row in rows]


# --- (d) row data is never unpickled or evaluated ------------------------------------------


class _Trap:
    """Pickles to a call that creates the marker file when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_archive_and_replay_never_unpickle_or_evaluate_row_data(
    secrets_tables: str, make_app: Callable[[str], Outbox], tmp_path: Path
) -> None:
    """Values that would run code if unpickled or evaluated go through archive and replay inert."""
    marker = tmp_path / "marker"
    trap = {
        "blob": pickle.dumps(_Trap(marker)),
        "source": f"__import__('pathlib').Path({str(marker)!r}).touch()",
        "data": {
            "__reduce__": ["pathlib.Path.touch", [str(marker)]],
            "py/object": "pathlib.Path",
            "yaml": f"!!python/object/apply:pathlib.Path.touch [{str(marker)!r}]",
            "__class__": "__import__('os').system",
        },
    }
    app = make_app(secrets_tables)
    handled = Recorder("id")
    app.handler(TrapEvent, archive=True, name="trap")(handled)
    with app.engine.begin() as conn:
        conn.execute(insert(TrapEvent.__table__), [trap])
    drain(app)
    replay(app, all_statuses=True)
    drain(app)
    replay(app, all_statuses=True)
    with app.engine.connect() as conn:
        row = conn.execute(select(TrapEvent.blob, TrapEvent.source, TrapEvent.data)).one()

    assert (False, 2, trap) == (
        marker.exists(),
        len(handled.seen),
        {"blob": row.blob, "source": row.source, "data": row.data},
    )


def test_trap_would_fire_if_unpickled(tmp_path: Path) -> None:
    """The pickled trap is armed: unpickling it creates the marker, so the test above means it."""
    marker = tmp_path / "marker"
    pickle.loads(pickle.dumps(_Trap(marker)))  # noqa: S301 - the point of the test

    assert [marker] == list(tmp_path.iterdir())
