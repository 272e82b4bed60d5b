"""What every tier of the tests shares."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from outbox import Settings

T = TypeVar("T")

# Deferrals come back at once (the floor of a second is tested on its own): for tests of what a
# deferral does, run with outbox.testing.drain, which handles only what is due now.
NO_RETRY_AFTER_FLOOR = Settings(min_retry_after=0.0)

WAIT_SECONDS = 20.0
"""How long a wait lasts before it fails: only a broken run waits that long."""
POLL_SECONDS = 0.02


def wait_for(condition: Callable[[], T], what: str, timeout: float = WAIT_SECONDS) -> T:
    """Poll ``condition`` until it returns something truthy, and return that; fail naming
    ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(POLL_SECONDS)


JULIANDAY_ERROR = 0.001
"""Seconds SQLite's ``julianday()`` arithmetic can be off by (some 50 µs, as a double holds a
day number of about 2.46 million): a duration read in the millisecond it was written can come
back a little longer than it was set."""

REFUSAL = "deleting events is refused"
"""The error of the trigger :func:`refuse_deletes` installs."""

_REFUSE_DELETES = {
    "sqlite": [
        "CREATE TRIGGER refuse_delete_{table} BEFORE DELETE ON {table} "
        f"BEGIN SELECT RAISE(ABORT, '{REFUSAL}'); END"
    ],
    "postgresql": [
        "CREATE OR REPLACE FUNCTION refuse_delete() RETURNS trigger LANGUAGE plpgsql AS "
        f"$$ BEGIN RAISE EXCEPTION '{REFUSAL}'; END $$",
        "CREATE TRIGGER refuse_delete_{table} BEFORE DELETE ON {table} "
        "FOR EACH ROW EXECUTE FUNCTION refuse_delete()",
    ],
    "mysql": [
        "CREATE TRIGGER refuse_delete_{table} BEFORE DELETE ON {table} FOR EACH ROW "
        f"SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '{REFUSAL}'"
    ],
}
_ALLOW_DELETES = {
    "sqlite": "DROP TRIGGER refuse_delete_{table}",
    "postgresql": "DROP TRIGGER refuse_delete_{table} ON {table}",
    "mysql": "DROP TRIGGER refuse_delete_{table}",
}


def refuse_deletes(engine: Engine, table: str) -> None:
    """Install a trigger, as an application might, that refuses every DELETE on ``table``:
    a finishing write the database refuses for good, on every database."""
    with engine.begin() as conn:
        for statement in _REFUSE_DELETES[engine.dialect.name]:
            conn.execute(text(statement.format(table=table)))


def allow_deletes(engine: Engine, table: str) -> None:
    """Drop the trigger of :func:`refuse_deletes`, if it is there."""
    with contextlib.suppress(DBAPIError), engine.begin() as conn:
        conn.execute(text(_ALLOW_DELETES[engine.dialect.name].format(table=table)))


def count_rows(url: str, table: Any) -> int:
    """The rows of ``table`` in the database at ``url`` now, read on an engine of its own (for
    a test whose application runs in other processes)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(table)).scalar_one())
    finally:
        engine.dispose()


@contextlib.contextmanager
def scratch_databases() -> Iterator[Callable[[str, str], str]]:
    """Create databases on shared servers for one test, and drop them after it: yields
    ``create(admin_url, name)``, which returns the new database's URL."""
    created: list[tuple[str, str]] = []

    def create(admin_url: str, name: str) -> str:
        admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
        admin.dispose()
        created.append((admin_url, name))
        return make_url(admin_url).set(database=name).render_as_string(False)

    try:
        yield create
    finally:
        for admin_url, name in created:
            admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                force = " WITH (FORCE)" if admin_url.startswith("postgresql") else ""
                conn.execute(text(f"DROP DATABASE IF EXISTS {name}{force}"))
            admin.dispose()


@contextlib.contextmanager
def silent_server() -> Iterator[int]:
    """A TCP port that accepts connections and never says a word (a server hung before its
    greeting, or a link that dropped everything after the handshake)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()
        for sock in accepted:
            sock.close()
