"""The application ``benchmarks.many_databases`` runs through the real ``outbox work``: one
buffer, on several databases.

Its registry is a function reading ``BENCH_MANY_DATABASES`` (JSON: name -> URL) each time it is
asked, as a tenant registry would. Every event names the database it was written to (``db``).
The handler keeps the defaults a user has (batch size 1,000, ``Urgency.HOUR``, no archive) and
records what it handled, cheaply: one line per batch, appended to
``<BENCH_MANY_HANDLED>/handled-<pid>.log`` (a file per worker process, written with one
``write`` and no fsync: the benchmark stops no worker uncleanly), holding the database's name,
the handler's start (wall clock, seconds) and ``id:age`` for every event, its age being the
handler's start less the event's ``created_at`` (the database's clock at insert; the database
runs on this machine, so the two clocks are one).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import Batch, BufferMixin, Outbox

DATABASES_ENV = "BENCH_MANY_DATABASES"
HANDLED_ENV = "BENCH_MANY_HANDLED"


class Base(DeclarativeBase):
    pass


class ManyEvent(BufferMixin, Base):
    """An event, naming the database it was written to."""

    __tablename__ = "bench_many_events"
    db: Mapped[str] = mapped_column(String(16))


def registry() -> dict[str, str]:
    """``BENCH_MANY_DATABASES``, read again at each call."""
    listed: dict[str, str] = json.loads(os.environ.get(DATABASES_ENV, "{}"))
    return listed


app = Outbox(databases=registry)

# The open record file and the process it belongs to: a forked worker opens its own.
_record: tuple[int, int] | None = None


def _record_fd() -> int:
    global _record
    if _record is None or _record[0] != os.getpid():
        path = Path(os.environ[HANDLED_ENV]) / f"handled-{os.getpid()}.log"
        _record = (os.getpid(), os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    return _record[1]


@app.handler(ManyEvent)
def record(batch: Batch[ManyEvent]) -> None:
    """Append one line: the database, the handler's start, each event's id and age."""
    started = time.time()
    rows = batch.rows  # tuples: no model instance per event, the handler stays cheap
    ages = " ".join(f"{row.id}:{started - row.created_at.timestamp():.4f}" for row in rows)
    os.write(_record_fd(), f"{rows[0].db} {started:.6f} {ages}\n".encode())
