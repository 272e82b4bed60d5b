"""Buffers whose ``created_at`` follows a session's local clock (MariaDB and MySQL): the check
at worker start and in ``outbox check``, and ``outbox migrate-buffers``, which makes them UTC.

Older releases of outbox wrote MariaDB's clock as ``CURRENT_TIMESTAMP``: the session's local
time, stored in a DATETIME with no zone. Buffer tables made then (from ``outbox.db_now()`` in
the application's own migrations) keep that default, while outbox reads every time as UTC: a
session at -05:00 dates its events 5 hours in the past, one at +02:00 2 hours in the future.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from sqlalchemy import Connection, Table
from sqlalchemy.exc import DBAPIError

from outbox import _db
from outbox._core import log as _log
from outbox._db import queries
from outbox._db.dialects import is_transient
from outbox._db.types import CreatedAtClock, SessionClock
from outbox.app import Outbox
from outbox.exceptions import LocalClockError, OutboxError
from outbox.ops.progress import Phase, Progress

log = _log.get_logger(__name__)

DEFAULT_BATCH_SIZE = 1000
"""Rows converted per transaction: small, as producers and workers use the buffer meanwhile."""
LOCK_WAIT_SECONDS = 10
"""How long switching a buffer's default waits for the transactions writing to it, per try
(writers that come later wait behind it meanwhile)."""
LOCK_ATTEMPTS = 3
# The named lock that lets one `outbox migrate-buffers` run at a time on a database.
_LOCK_NAME = "outbox.migrate_buffers"
_UTC_DEFAULT = "UTC_TIMESTAMP(6)"


@dataclass(frozen=True, slots=True)
class ClockFinding:
    """A buffer whose ``created_at`` defaults to the session's local clock."""

    buffer: str
    refuse: bool
    """True when this session is outside UTC: outbox would misread this buffer's times now;
    False when only sessions in other zones (an application's) would."""
    text: str
    """One line saying what and what to do."""


def offset_text(seconds: int) -> str:
    """An offset from UTC as ``+02:00`` or ``-05:00``."""
    sign = "-" if seconds < 0 else "+"
    minutes = abs(seconds) // 60
    return f"{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def check(app: Outbox, tables: Iterable[Table]) -> list[ClockFinding]:
    """The buffers among ``tables`` whose ``created_at`` defaults to the session's local
    clock, judged by the time zone of a session of ``app``'s engine; none on a database whose
    clock has no zone to differ in."""
    if app.supports.zone_free_clock is not None:
        return []
    with app.engine.connect() as conn:
        session = queries.session_clock(conn)
        clocks = queries.created_at_clocks(conn, tables)
    return [
        _finding(buffer, clock, session) for buffer, clock in sorted(clocks.items()) if clock.local
    ]


def _finding(buffer: str, clock: CreatedAtClock, session: SessionClock) -> ClockFinding:
    if session.utc:
        return ClockFinding(
            buffer,
            refuse=False,
            text=f"buffer {buffer}: created_at defaults to the session's local clock "
            f"({clock.default}): this session is in UTC, but sessions in another time zone (an "
            "application's) would date events hours off; `outbox migrate-buffers` makes it UTC",
        )
    return ClockFinding(
        buffer,
        refuse=True,
        text=f"buffer {buffer}: created_at defaults to the session's local clock "
        f"({clock.default}) and this session's time zone is {session.time_zone} "
        f"(UTC{offset_text(session.offset_seconds)}): outbox would date its events "
        f"{abs(session.offset_seconds) / 3600:g} h off; run `outbox migrate-buffers` first",
    )


def enforce(app: Outbox, tables: Iterable[Table], *, warn: bool = True) -> None:
    """Raise LocalClockError, naming every buffer, when outbox would misread buffers' times in
    this session; log a warning for a buffer that only sessions in other zones would date
    wrongly (``warn``)."""
    findings = check(app, tables)
    refused = [f.text for f in findings if f.refuse]
    if refused:
        raise LocalClockError("; ".join(refused))
    if warn:
        for finding in findings:
            log.warning(_log.BUFFER_CLOCK_LOCAL, buffer=finding.buffer, detail=finding.text)


# --- outbox migrate-buffers ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BufferMigration:
    """What ``outbox migrate-buffers`` did to one buffer, or would do (``dry_run``)."""

    buffer: str
    default: str | None
    """The ``created_at`` default found; None when the table has no ``created_at``."""
    switch: bool
    """The default is (was) the session's local clock, to be made UTC."""
    rows: int
    """Rows (to be) converted from ``time_zone`` to UTC."""
    time_zone: str | None
    """The zone the rows are (were) converted from; None: none are."""
    whole_seconds: bool
    """``created_at`` is a DATETIME of whole seconds."""
    dry_run: bool

    def text(self) -> str:
        """One line for the operator."""
        would = "would " if self.dry_run else ""
        if not self.switch and self.time_zone is None:
            return f"{self.buffer}: nothing to do (created_at defaults to {self.default})"
        done = []
        if self.switch:
            done.append(
                f"{would}set created_at's default to {_UTC_DEFAULT}"
                if self.dry_run
                else f"created_at's default set to {_UTC_DEFAULT}"
            )
        if self.time_zone is not None:
            done.append(
                f"{would}convert {self.rows} rows from {self.time_zone} to UTC"
                if self.dry_run
                else f"{self.rows} rows converted from {self.time_zone} to UTC"
            )
        elif self.switch:
            keep = "would keep" if self.dry_run else "kept"
            done.append(f"{keep} its {self.rows} rows as they are (this session is in UTC)")
        line = f"{self.buffer}: {'; '.join(done)}"
        if self.switch and self.whole_seconds:
            line += (
                " (created_at keeps whole seconds: DATETIME(6) would rewrite the table, "
                "for your own migration to do when writes can wait)"
            )
        return line


def migrate_buffers(
    app: Outbox,
    tables: Iterable[Table],
    *,
    dry_run: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: Progress | None = None,
) -> list[BufferMigration]:
    """Make each buffer's ``created_at`` default UTC, and convert the rows written with the
    local default from this session's time zone to UTC, ``batch_size`` rows per transaction,
    beside producers and workers. ``dry_run``: say what would be done; change nothing.

    Call only where ``app.supports.zone_free_clock`` is None. The session's time zone is that
    of ``app``'s engine: the application's, as its producers wrote in it. A run stopped
    midway is finished by the next, which converts each row once: outbox keeps the
    conversion's bounds and progress in a table of its own while it runs.

    ``progress`` (:class:`~outbox.ops.progress.Progress`) is told each buffer's rows as they are
    converted, a batch at a time (not counted first: the count would read the table once more);
    when it asks to stop, :class:`~outbox.ops.progress.StoppedError` is raised between two batches,
    and the next run goes on from there.
    """
    unique = {table.fullname: table for table in tables}
    with app.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if not queries.try_lock_conversions(conn, _LOCK_NAME):
            raise OutboxError("another `outbox migrate-buffers` is running on this database")
        try:
            session = queries.session_clock(conn)
            zone = None if session.utc else session.time_zone
            return [
                _migrate(app, conn, unique[name], clock, zone, dry_run, batch_size, progress)
                for name, clock in sorted(queries.created_at_clocks(conn, unique.values()).items())
            ]
        finally:
            if not dry_run:
                queries.drop_conversions_if_done(conn)
            queries.unlock_conversions(conn, _LOCK_NAME)


def _migrate(
    app: Outbox,
    conn: Connection,
    table: Table,
    clock: CreatedAtClock,
    zone: str | None,
    dry_run: bool,
    batch_size: int,
    progress: Progress | None,
) -> BufferMigration:
    """One buffer: its default switched, then its local rows converted."""
    earlier = queries.conversions_under_way(conn).get(table.fullname)
    result = BufferMigration(
        buffer=table.fullname,
        default=clock.default,
        switch=clock.local,
        rows=0,
        time_zone=earlier.time_zone if earlier is not None else zone if clock.local else None,
        whole_seconds=clock.whole_seconds,
        dry_run=dry_run,
    )
    if not result.switch and result.time_zone is None:
        return result
    if dry_run:
        after = earlier.converted_through if earlier is not None else 0
        through = None if clock.local else earlier.last_local_id if earlier else 0
        return replace(result, rows=queries.count_rows_through(conn, table, after, through))
    if clock.local:
        if result.time_zone is not None:
            queries.create_conversions(conn)
        _switch(conn, table, result.time_zone)
    if result.time_zone is None:
        return replace(result, rows=queries.count_rows_through(conn, table, 0, None))
    phase = Phase(progress, "converted", f"rows of {table.fullname} to UTC", None)
    while True:
        phase.check()
        changed = _db.run_in_transaction(
            app.engine, lambda tx: queries.convert_next_rows(tx, table, batch_size)
        )
        if changed is None:
            phase.end()
            return replace(result, rows=phase.done)
        phase.advance(changed)


def _switch(conn: Connection, table: Table, zone: str | None) -> None:
    """Switch ``table``'s default under a write lock, waiting a bounded time for writers."""
    for _ in range(LOCK_ATTEMPTS):
        try:
            queries.switch_default_to_utc(conn, table, zone, LOCK_WAIT_SECONDS)
            return
        except DBAPIError as error:
            if not is_transient(error):
                raise
            waited = error
    raise OutboxError(
        f"{table.fullname}: transactions kept the table busy for {LOCK_ATTEMPTS} x "
        f"{LOCK_WAIT_SECONDS} s; nothing changed in it, run `outbox migrate-buffers` again"
    ) from waited
