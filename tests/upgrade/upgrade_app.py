"""The application the upgrade tier runs through the ``outbox`` command of two releases.

The older release's ``outbox work`` imports it from a directory holding this file alone (no
other code of this checkout on its path), and so does the current one: it uses only what every
release has (``Outbox``, ``Settings``, ``RetryPolicy``, ``BufferMixin``, ``Batch`` and the
``handler`` decorator) and imports nothing from the tests.

Its handler, ``deliver``, appends one fsynced line per event to a file of its own process
(``handled-<pid>.log`` under ``FAULT_HANDLED_DIR``, the fault tier's file and variable, so that
its checker reads them): ``<event_key> <group_id> <attempt> <pid> <release> <started>``, where
``release`` names the release that ran it (``UPGRADE_RELEASE``) and ``started`` is the Unix time
the batch started. Each process that imports it writes ``process-<pid>.txt`` there: its release
and the file its ``outbox`` came from, so a test can see which code each worker ran.

Each release runs with its own default settings. ``UPGRADE_SESSION_TIME_ZONE`` (``-05:00``):
every MariaDB connection of the process sets its session time zone to it, as an application
whose connections are in local time does.
``python upgrade_app.py create-tables URL`` creates the buffer and proof tables with the
release that runs it, as the application created them before the upgrade.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, String, create_engine, event
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.pool import Pool

import outbox
from outbox import Batch, BufferMixin, Outbox, RetryPolicy

HANDLED_DIR_ENV = "FAULT_HANDLED_DIR"
RELEASE_ENV = "UPGRADE_RELEASE"
SESSION_TIME_ZONE_ENV = "UPGRADE_SESSION_TIME_ZONE"
HANDLER_SECONDS_ENV = "UPGRADE_HANDLER_SECONDS"
BATCH_SIZE = 50
HANDLER_SECONDS = float(os.environ.get(HANDLER_SECONDS_ENV, "0.02"))
# Failed groups come back half a second later, and never die: the tier proves delivery.
RETRY = RetryPolicy(max_attempts=100, scale=0.0, base_delay=0.5, jitter=0.0)
# Events older than an hour are archived as expired, not delivered: an event dated in local time
# west of UTC looks hours old to a UTC clock: the tests count delivered against committed.
EXPIRES_AFTER_SECONDS = 3600.0


class Base(DeclarativeBase):
    pass


class UpgradeEvent(BufferMixin, Base):
    """An event; ``event_key`` is unique across the run, committed or rolled back."""

    __tablename__ = "upgrade_events"
    event_key: Mapped[int] = mapped_column(BigInteger, unique=True)
    producer: Mapped[str] = mapped_column(String(40))


class UpgradeProof(Base):
    """Written in the same transaction as its event: the proof that the event committed."""

    __tablename__ = "upgrade_proof"
    event_key: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)


app = Outbox()


def set_session_time_zone(dbapi_connection: Any, zone: str) -> None:
    """Set a MariaDB connection's session time zone; other databases' connections are left."""
    if not type(dbapi_connection).__module__.startswith("pymysql"):
        return
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SET time_zone = %s", (zone,))
    finally:
        cursor.close()


def _on_connect(dbapi_connection: Any, connection_record: Any) -> None:
    set_session_time_zone(dbapi_connection, os.environ[SESSION_TIME_ZONE_ENV])


if os.environ.get(SESSION_TIME_ZONE_ENV):
    # Every pool of the process, outbox's own engines included.
    event.listen(Pool, "connect", _on_connect)


def _directory() -> Path | None:
    directory = os.environ.get(HANDLED_DIR_ENV)
    return Path(directory) if directory else None


def _append(path: Path, lines: list[str]) -> None:
    data = "".join(f"{line}\n" for line in lines).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _record_process() -> None:
    directory = _directory()
    if directory is not None:
        release = os.environ.get(RELEASE_ENV, "unknown")
        _append(directory / f"process-{os.getpid()}.txt", [f"{release} {outbox.__file__}"])


_record_process()


@app.handler(
    UpgradeEvent,
    batch_size=BATCH_SIZE,
    retry=RETRY,
    archive=True,
    expires_after=EXPIRES_AFTER_SECONDS,
)
def deliver(batch: Batch[UpgradeEvent]) -> None:
    """Deliver the batch downstream (one durable line per event) halfway through its time."""
    started = time.time()
    time.sleep(HANDLER_SECONDS / 2)
    directory = _directory()
    if directory is not None:
        pid = os.getpid()
        release = os.environ.get(RELEASE_ENV, "unknown")
        head = f"{batch.group_id} {batch.attempt} {pid} {release} {started:.6f}"
        _append(directory / f"handled-{pid}.log", [f"{e.event_key} {head}" for e in batch.events])
    time.sleep(HANDLER_SECONDS / 2)


def create_tables(url: str) -> None:
    """Create the application's tables with the release that runs this."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            Base.metadata.create_all(conn)
    finally:
        engine.dispose()


if __name__ == "__main__":
    if sys.argv[1:2] != ["create-tables"] or len(sys.argv) != 3:
        sys.exit("usage: python upgrade_app.py create-tables URL")
    create_tables(sys.argv[2])
