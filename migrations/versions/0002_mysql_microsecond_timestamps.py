"""Timestamps to the microsecond on MariaDB and MySQL

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26 11:20:00.000000

MariaDB's and MySQL's plain DATETIME keeps whole seconds, which cut leases short by up to a
second; there every timestamp becomes DATETIME(6). Nothing changes on other databases.

The releases before this migration wrote MariaDB's clock as CURRENT_TIMESTAMP, the session's
local time; every later one writes UTC. So, when the migrating session is not in UTC, the
times stored so far are converted from its time zone to UTC (the zone the application's
sessions write in: run ``outbox migrate --app yourapp:app``, whose engine sets it). Workers of
the older release would go on writing local time beside them: while any is alive, this
migration refuses. A downgrade leaves the times in UTC (docs/operations.md).
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import text
from sqlalchemy.dialects import mysql

from outbox._db.dialects import name_of, supports
from outbox._db.queries import session_clock
from outbox.exceptions import LocalClockError
from outbox.schema import db_now

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# (table, column, nullable, set by the database clock)
TIMESTAMPS = (
    ("outbox_jobs", "run_at", False, True),
    ("outbox_jobs", "lease_expires_at", True, False),
    ("outbox_jobs", "created_at", False, True),
    ("outbox_archive", "created_at", True, False),
    ("outbox_archive", "archived_at", False, True),
    ("outbox_workers", "started_at", False, True),
    ("outbox_workers", "heartbeat_at", False, True),
)


def _alter(precision: int) -> None:
    bind = op.get_bind()
    if bind.dialect.name not in ("mysql", "mariadb"):
        return
    # One ALTER per table, all its columns in it: each ALTER that changes a column's type copies
    # the whole table, so one per column would copy outbox_archive twice. MODIFY restates the
    # whole column: its nullability and default are given again.
    type_ = mysql.DATETIME(fsp=precision).compile(dialect=bind.dialect)
    now = db_now().compile(dialect=bind.dialect)
    columns: dict[str, list[str]] = {}
    for table, column, nullable, clocked in TIMESTAMPS:
        spec = f"MODIFY {column} {type_} {'NULL' if nullable else 'NOT NULL'}"
        columns.setdefault(table, []).append(spec + (f" DEFAULT {now}" if clocked else ""))
    for table, specs in columns.items():
        op.execute(f"ALTER TABLE {table} {', '.join(specs)}")


# The times the releases before this migration wrote in the session's local time.
LOCAL_TIMES = {
    "outbox_jobs": ("run_at", "lease_expires_at", "created_at"),
    "outbox_archive": ("created_at", "archived_at"),
    "outbox_workers": ("started_at", "heartbeat_at"),
}
# A worker whose heartbeat is this close to now is alive: the older release's default
# worker_stale_after.
LIVE_WITHIN_SECONDS = 60


def _local_zone() -> str | None:
    """The migrating session's time zone where stored times follow it and it is not UTC."""
    bind = op.get_bind()
    if supports(name_of(bind.dialect)).zone_free_clock is not None:
        return None
    clock = session_clock(bind)
    return None if clock.utc else clock.time_zone


def _refuse_while_older_workers_run() -> None:
    """Refuse, naming them, while workers of the older release are alive: they would write
    local time beside the converted times."""
    zone = _local_zone()
    if zone is None:
        return
    # Alive by the local clock they write in, or by UTC should they write in another zone.
    live = (
        op.get_bind()
        .execute(
            text(
                "SELECT hostname, pid FROM outbox_workers WHERE heartbeat_at BETWEEN"
                " NOW() - INTERVAL :s SECOND AND NOW() + INTERVAL :s SECOND OR heartbeat_at BETWEEN"
                " UTC_TIMESTAMP() - INTERVAL :s SECOND AND UTC_TIMESTAMP() + INTERVAL :s SECOND"
                " ORDER BY hostname, pid"
            ),
            {"s": LIVE_WITHIN_SECONDS},
        )
        .all()
    )
    if live:
        workers = ", ".join(f"{row.hostname}:{row.pid}" for row in live)
        raise LocalClockError(
            f"workers of the older release are running ({workers}); they write local time "
            f"(this session's zone is {zone}), and this migration converts outbox's times to "
            "UTC: stop them, then run `outbox migrate` again (events wait safely in the "
            "buffers meanwhile)"
        )


def _times_to_utc() -> None:
    """Convert the times the older release wrote from the session's zone to UTC, each at the
    offset of its own date. The last statements of upgrade(): on MariaDB every ALTER commits,
    so these commit with the revision's stamp or not at all, and never run twice."""
    if _local_zone() is None:
        return
    for table, columns in LOCAL_TIMES.items():
        converted = ", ".join(
            f"{column} = CONVERT_TZ({column}, @@session.time_zone, '+00:00')" for column in columns
        )
        op.get_bind().execute(text(f"UPDATE {table} SET {converted}"))


def upgrade() -> None:
    _refuse_while_older_workers_run()
    _alter(6)
    _times_to_utc()


def downgrade() -> None:
    _alter(0)
