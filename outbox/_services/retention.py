"""The archive's retention: the fleet's leader (and, after they distribute, ``outbox
distribute``, ``outbox run --once`` and Celery's distribute task: :func:`pass_if_due`) takes
out the history older than ``Settings.archive_retention_days``, one pass at a time however many
processes run.

Where the archive is partitioned by day (docs/design.md, "Retention by day"), a pass makes the
days ahead (today and the next :data:`DAYS_AHEAD`), then takes out each day past the age: a
day with no dead letter is dropped, a day with some keeps them and loses the rest. Each of
those statements waits at most :data:`LOCK_WAIT` for its lock and is tried again at the next
pass rather than queue the workers behind it. The rows older than the age outside day
partitions (archived before migration 0009's cut, or on a day no partition held), and every
such row where the archive is one table (SQLite, or tables made by hand), are deleted in
chunks, as ``outbox prune`` deletes them; a day whose statement gave up waiting keeps its rows
for a later pass. Dead letters stay: they go when replayed, or pruned by name.

A pass that ran then deletes the ingest's idempotency keys older than
``Settings.ingest_key_horizon`` and every inbox id past its horizon, in chunks outside the
cleaners' lock (two processes deleting them at once only share the work).

One cleaner of the archive at a time: each transaction of a pass holds a lock of the
database's for its length (PostgreSQL: a transaction's advisory lock, which a transaction
pooler cannot hand to another client; MariaDB: ``GET_LOCK``, released at its end), and a pass
that finds it held does nothing more. The days ahead are made whether or not retention is on.
The leader starts a pass every :data:`RETENTION_EVERY`, in a thread of its own, so that the
heartbeat never waits for it.
"""

from __future__ import annotations

import datetime as dt
import functools
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError

from outbox import inbox, schema
from outbox._core import log as _log
from outbox._db import queries, run_in_transaction
from outbox._db.dialects import error_summary, is_lock_timeout, is_missing_table
from outbox._db.dialects.interface import DayRetired
from outbox.app import Outbox

log = _log.get_logger(__name__)
_T = TypeVar("_T")

RETENTION_EVERY = 600.0
"""Seconds between two passes by the fleet's leader."""
DAYS_AHEAD = 3
"""Days made ahead of today: rows never wait for a partition unless no pass runs that long."""
LOCK_WAIT = 0.5
"""Seconds a pass's statement waits for a lock before giving up until the next pass."""
DELETE_CHUNK = 1000
DELETE_CHUNKS = 500
"""Chunks a pass deletes at most (where rows are deleted): the rest waits for the next."""
FOREGROUND_DELETE_CHUNKS = 10
"""Chunks a pass run by a distribution (:func:`pass_if_due`) deletes at most: it runs in the
foreground of a cron line or a Celery task, whose own work must not wait long behind it."""
HISTORY = frozenset(s.value for s in schema.ArchiveStatus if s != schema.ArchiveStatus.DEAD)
"""What retention takes: every status but ``dead``."""


@dataclass(frozen=True)
class RetentionPass:
    """What one pass did. ``ran``: False when another pass held the lock (it did nothing)."""

    ran: bool
    made: tuple[dt.date, ...] = ()
    retired: dict[dt.date, DayRetired] = field(default_factory=dict)
    deleted: int = 0
    waited: tuple[str, ...] = ()
    """What it gave up, and why (a lock held too long, the default partition holding rows of a
    day to make): tried again at the next pass."""
    inbox_ids: int = 0
    """Inbox ids past their horizon it deleted (:mod:`outbox.inbox`)."""
    ingest_keys: int = 0
    """The ingest's idempotency keys older than ``Settings.ingest_key_horizon`` it deleted."""


class Retention:
    """Retention of ``app``'s archive, at ``Settings.archive_retention_days``."""

    def __init__(self, app: Outbox) -> None:
        self.app = app
        self._thread: threading.Thread | None = None

    @property
    def days(self) -> int | None:
        """Whole days of history kept (None: retention is off)."""
        return self.app.settings.archive_retention_days

    def start(self) -> bool:
        """Start a pass in a thread of its own, unless one runs. A pass makes the days ahead
        whether or not retention is on: turning it on later must find them made, not a
        default partition holding days of rows."""
        if self._thread is not None and self._thread.is_alive():
            return False
        self._thread = threading.Thread(target=self._run, name="outbox-retention", daemon=True)
        self._thread.start()
        return True

    def _run(self) -> None:
        try:
            self.run_once()
        except Exception as error:
            log.exception(_log.ARCHIVE_RETENTION_FAILED, error=str(error))

    def run_once(
        self,
        days: int | None = None,
        today: dt.date | None = None,
        delete_chunks: int = DELETE_CHUNKS,
    ) -> RetentionPass:
        """One pass: the days ahead of ``today`` (the database's UTC date unless given) made;
        then, keeping ``days`` whole days (the setting's unless given; None: retention off),
        the history before them taken out, rows deleted ``delete_chunks`` chunks at most."""
        keep = self.days if days is None else days
        with self.app.engine.connect() as conn:
            done = self._pass(conn, keep, today, delete_chunks)
        if done.ran:
            # Whatever the archive's retention: a key past its horizon is of no use.
            done = replace(
                done,
                ingest_keys=_unless_missing(lambda: self._forget_ingest_keys(delete_chunks)),
                inbox_ids=_unless_missing(lambda: inbox.prune(self.app.engine, delete_chunks)),
            )
        if any((done.made, done.retired, done.deleted, done.waited)) or any(
            (done.inbox_ids, done.ingest_keys)
        ):
            log.info(
                _log.ARCHIVE_RETENTION,
                days=keep,
                made=[str(d) for d in done.made],
                retired={str(d): r.value for d, r in done.retired.items()},
                deleted=done.deleted,
                waited=list(done.waited),
                inbox_ids=done.inbox_ids,
                ingest_keys=done.ingest_keys,
            )
        return done

    def _forget_ingest_keys(self, chunks: int) -> int:
        horizon = self.app.settings.ingest_key_horizon
        total = 0
        if horizon is None:
            return 0
        for _ in range(chunks):
            deleted = run_in_transaction(
                self.app.engine,
                functools.partial(
                    queries.delete_old_ingest_keys, older_than_seconds=horizon, limit=DELETE_CHUNK
                ),
            )
            total += deleted
            if deleted < DELETE_CHUNK:
                break
        return total

    def _pass(
        self, conn: Connection, keep: int | None, today: dt.date | None, delete_chunks: int
    ) -> RetentionPass:
        made: list[dt.date] = []
        retired: dict[dt.date, DayRetired] = {}
        waited: list[str] = []
        deleted: list[int] = []
        try:
            with (
                conn.begin(),
                queries.retention_lock(conn) as held,
                queries.bounded_archive_lock_waits(conn, LOCK_WAIT),
            ):
                if not held:
                    return RetentionPass(ran=False)
                now = _utc(queries.database_now(conn))
                listed = queries.archive_days(conn)
                partitioned = listed is not None
                days = listed or []
                first: dt.date | None = None
                if partitioned:
                    queries.recover_retired_days(conn)
                    first = queries.archive_first_day(conn)
        except DBAPIError as error:
            if not is_lock_timeout(error):
                raise
            return RetentionPass(True, waited=("list the archive's days: a lock held too long",))
        today = today or now.date()
        # Days past the age whose partition a lock held too long kept with its history: not
        # deleted row by row either, but left whole for the next pass.
        kept: set[dt.date] = set()
        try:
            last = days[-1] if days else None
            for offset in range(DAYS_AHEAD + 1) if partitioned else ():
                day = today + dt.timedelta(days=offset)
                if (first is not None and day < first) or (last is not None and day <= last):
                    continue
                if self._step(conn, waited, f"make {day}", queries.make_archive_day, day) is True:
                    made.append(day)
            if keep is None:
                return RetentionPass(True, tuple(made), waited=tuple(waited))
            cutoff = today - dt.timedelta(days=keep)
            for day in (d for d in days if d < cutoff):
                done = self._step(conn, waited, f"retire {day}", queries.retire_archive_day, day)
                if done is _WAITED:
                    kept.add(day)
                elif isinstance(done, DayRetired):
                    retired[day] = done
            start = dt.datetime.combine(cutoff, dt.time(), dt.UTC)
            self._delete((now - start).total_seconds(), frozenset(kept), delete_chunks, deleted)
        except _AnotherCleanerError as busy:
            waited.append(f"{busy}: another cleaner runs; the pass stopped there")
        return RetentionPass(True, tuple(made), retired, sum(deleted), tuple(waited))

    @staticmethod
    def _step(
        conn: Connection,
        waited: list[str],
        what: str,
        statement: Callable[[Connection, dt.date, float], _T],
        day: dt.date,
    ) -> _T | object:
        """``statement`` on ``day`` in a transaction of its own holding the cleaners' lock;
        :data:`_WAITED` when it gave up waiting for a table's lock (``waited`` says what).
        Raises :class:`_AnotherCleanerError` when another cleaner holds the lock."""
        try:
            with conn.begin(), queries.retention_lock(conn) as held:
                if not held:
                    raise _AnotherCleanerError(what)
                return statement(conn, day, LOCK_WAIT)
        except DBAPIError as error:
            if is_lock_timeout(error):
                waited.append(f"{what}: a lock held too long")
            elif isinstance(error, IntegrityError):
                # PostgreSQL: the default partition holds rows of the day (no pass made it
                # in time). They stay there, deleted row by row when past the age.
                waited.append(f"{what}: {error_summary(error)}")
            else:
                raise
            return _WAITED

    def _delete(
        self, older_than: float, kept: frozenset[dt.date], chunks: int, deleted: list[int]
    ) -> None:
        """Delete up to ``chunks`` chunks, each one's count appended to ``deleted`` as it
        commits (a pass stopped half-way still says what it deleted)."""
        start: dt.datetime | None = None
        for _ in range(chunks):
            pruned = run_in_transaction(
                self.app.engine, functools.partial(_delete_chunk, older_than, start, kept)
            )
            if pruned is None:
                raise _AnotherCleanerError("delete")
            deleted.append(pruned.deleted)
            start = pruned.last_archived_at
            if pruned.deleted < DELETE_CHUNK:
                break


_WAITED = object()
"""A step that gave up waiting for a table's lock."""


class _AnotherCleanerError(Exception):
    """Another cleaner (a pass, a prune) holds the lock: the pass stops at this step."""


def _delete_chunk(
    older_than: float, start: dt.datetime | None, kept: frozenset[dt.date], conn: Connection
) -> queries.PrunedChunk | None:
    with queries.retention_lock(conn) as held:
        if not held:
            return None
        return queries.delete_old_archived(
            conn,
            older_than_seconds=older_than,
            limit=DELETE_CHUNK,
            statuses=HISTORY,
            from_archived_at=start,
            skip_days=kept,
        )


def _unless_missing(prune: Callable[[], int]) -> int:
    """``prune()``, or 0 when its table is not there: a database not migrated to the
    generation that brought it (a downgrade) keeps its archive's retention."""
    try:
        return prune()
    except DBAPIError as error:
        if is_missing_table(error):
            return 0
        raise


def _utc(moment: dt.datetime) -> dt.datetime:
    # SQLite's clock comes back without a zone, in UTC.
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)


_last_pass: weakref.WeakKeyDictionary[Outbox, float] = weakref.WeakKeyDictionary()
_last_pass_lock = threading.Lock()


def pass_if_due(app: Outbox) -> RetentionPass | None:
    """A pass, run here and now, unless one ran in this process less than
    :data:`RETENTION_EVERY` ago (None then): what distributes outside ``outbox work``
    (``outbox distribute`` and ``outbox run --once``, which cron starts as a new process each
    time, so each runs one; Celery's distribute task) calls, whether or not a worker leads
    elsewhere, so that every way of running outbox makes the days ahead and keeps the
    retention. Its row deletes stop after :data:`FOREGROUND_DELETE_CHUNKS` chunks. A failure
    is logged at error level with its traceback, not raised: distribution goes on."""
    now = time.monotonic()
    with _last_pass_lock:
        last = _last_pass.get(app)
        if last is not None and now - last < RETENTION_EVERY:
            return None
        _last_pass[app] = now
    try:
        return Retention(app).run_once(delete_chunks=FOREGROUND_DELETE_CHUNKS)
    except Exception as error:
        log.exception(_log.ARCHIVE_RETENTION_FAILED, error=str(error))
        return None
