"""The database's clock as a session sees it, and buffer tables whose ``created_at`` follows a
session's local clock (MariaDB and MySQL, where ``CURRENT_TIMESTAMP`` is local time stored in
a DATETIME with no zone): what the clock checks and ``outbox migrate-buffers`` ask.

Every statement here is MariaDB's and MySQL's; the callers ask ``supports.zone_free_clock``
first, and come here only where it is None.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    MetaData,
    String,
    Table,
    bindparam,
    select,
    text,
)

from outbox._db.types import Conversion, CreatedAtClock, SessionClock

# Two dates half a year apart: a zone that leaves both unchanged has no daylight saving time,
# and, with no offset now, is UTC. A fixed offset is not enough to tell: Europe/London is
# +00:00 all winter.
_WINTER, _SUMMER = "2001-01-15 12:00:00", "2001-07-15 12:00:00"


def session_clock(conn: Connection) -> SessionClock:
    """The time zone of ``conn``'s session: set by the server's default, or by the application
    on each connection (``init_command``, a connect event)."""
    row = conn.execute(
        text(
            "SELECT @@session.time_zone,"
            " TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), NOW()),"
            " CONVERT_TZ(:winter, @@session.time_zone, '+00:00') = :winter"
            " AND CONVERT_TZ(:summer, @@session.time_zone, '+00:00') = :summer"
        ),
        {"winter": _WINTER, "summer": _SUMMER},
    ).one()
    offset = int(row[1])
    return SessionClock(
        time_zone=str(row[0]), offset_seconds=offset, utc=offset == 0 and row[2] == 1
    )


def created_at_clocks(conn: Connection, tables: Iterable[Table]) -> dict[str, CreatedAtClock]:
    """The ``created_at`` column of each of ``tables``, by the table's full name; a table that
    does not exist (or has no such column) is left out. One query per schema."""
    by_schema: dict[str | None, list[Table]] = {}
    for table in tables:
        by_schema.setdefault(table.schema, []).append(table)
    found: dict[str, CreatedAtClock] = {}
    for schema_name, members in by_schema.items():
        statement = text(
            "SELECT TABLE_NAME, COLUMN_DEFAULT, COLUMN_TYPE FROM information_schema.COLUMNS"
            " WHERE TABLE_SCHEMA = COALESCE(:schema, DATABASE()) AND TABLE_NAME IN :names"
            " AND COLUMN_NAME = 'created_at'"
        ).bindparams(bindparam("names", expanding=True))
        rows = conn.execute(
            statement, {"schema": schema_name, "names": [t.name for t in members]}
        ).all()
        by_name = {t.name: t for t in members}
        for name, default, column_type in rows:
            found[by_name[name].fullname] = CreatedAtClock(
                default=None if default is None else str(default), column_type=str(column_type)
            )
    return found


# --- converting a buffer's local times to UTC -------------------------------------------------

# A conversion under way: which rows of a buffer hold local time, and how far the conversion
# has come. Its own table, created while a conversion runs and dropped when none is left, so
# that an interrupted run resumes where it stopped and changes no row twice. Not one of
# outbox's tables (schema.py): no migration creates it.
conversions = Table(
    "outbox_clock_conversions",
    MetaData(),
    Column("buffer", String(400), primary_key=True),
    Column("time_zone", String(64), nullable=False),
    Column("last_local_id", BigInteger, nullable=False),
    Column("converted_through", BigInteger, nullable=False),
)


def create_conversions(conn: Connection) -> None:
    """Create the table of conversions under way, if it is not there."""
    conversions.create(conn, checkfirst=True)


def drop_conversions_if_done(conn: Connection) -> None:
    """Drop the table of conversions once none is under way."""
    if _conversions_exist(conn) and conn.execute(select(conversions).limit(1)).first() is None:
        conversions.drop(conn)


def conversions_under_way(conn: Connection) -> dict[str, Conversion]:
    """The conversions under way, by buffer; none when the table is not there."""
    if not _conversions_exist(conn):
        return {}
    return {
        row.buffer: Conversion(
            row.buffer, row.time_zone, int(row.last_local_id), int(row.converted_through)
        )
        for row in conn.execute(select(conversions))
    }


def _conversions_exist(conn: Connection) -> bool:
    exists = conn.execute(
        text(
            "SELECT 1 FROM information_schema.TABLES"
            " WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :name"
        ),
        {"name": conversions.name},
    ).first()
    return exists is not None


def try_lock_conversions(conn: Connection, name: str) -> bool:
    """Take the named lock that lets one ``outbox migrate-buffers`` run at a time; False when
    another session holds it. The session's: it lasts until released or disconnected."""
    return bool(conn.execute(text("SELECT GET_LOCK(:name, 0)"), {"name": name}).scalar())


def unlock_conversions(conn: Connection, name: str) -> None:
    """Release the lock of :func:`try_lock_conversions`."""
    conn.execute(text("SELECT RELEASE_LOCK(:name)"), {"name": name})


def count_rows_through(conn: Connection, table: Table, after: int, through: int | None) -> int:
    """Rows of ``table`` with ids in (``after``, ``through``]; past ``after`` when ``through``
    is None."""
    statement = text(f"SELECT COUNT(*) FROM {_name(conn, table)} WHERE id > :after")
    if through is not None:
        statement = text(f"{statement.text} AND id <= :through")
    return int(conn.execute(statement, {"after": after, "through": through}).scalar_one())


def switch_default_to_utc(
    conn: Connection, table: Table, time_zone: str | None, lock_wait_seconds: int
) -> int | None:
    """Make ``table``'s ``created_at`` default UTC, and record which rows hold local time of
    ``time_zone`` (None: the writers' session is UTC, no row needs converting); returns the
    highest id of those (0: none), or None when the default was UTC already.

    ``conn`` is in autocommit mode. The table is locked for writing meanwhile: writers that
    have it open finish first, new ones wait until the lock is released, which is at most one
    ``SELECT MAX(id)``, one insert and one instant change of the default later. So every row
    there is was written with the local default, and every later one gets the UTC default and
    a higher id (ids only grow): the bound is exact, where a highest id read after the change
    could already include a row written in UTC. ``lock_wait_seconds``: how long to wait for
    the writers (a lock wait timeout after it).
    """
    name = _name(conn, table)
    # The session's own wait is put back after: the connection returns to the application's pool.
    before = conn.execute(text("SELECT @@session.lock_wait_timeout")).scalar_one()
    conn.execute(text(f"SET SESSION lock_wait_timeout = {int(lock_wait_seconds)}"))
    locked = f"{name} WRITE" + (f", {conversions.name} WRITE" if time_zone is not None else "")
    try:
        conn.execute(text(f"LOCK TABLES {locked}"))
    finally:
        conn.execute(text(f"SET SESSION lock_wait_timeout = {int(before)}"))
    try:
        clock = created_at_clocks(conn, [table]).get(table.fullname)
        if clock is None or not clock.local:
            return None
        last = int(conn.execute(text(f"SELECT COALESCE(MAX(id), 0) FROM {name}")).scalar_one())
        # Recorded before the default changes: a run stopped in between finds the default
        # still local and takes a newer bound, keeping the zone and the progress recorded.
        if time_zone is not None:
            conn.execute(
                text(
                    f"INSERT INTO {conversions.name}"
                    " (buffer, time_zone, last_local_id, converted_through)"
                    " VALUES (:buffer, :zone, :last, 0)"
                    " ON DUPLICATE KEY UPDATE last_local_id = VALUES(last_local_id)"
                ),
                {"buffer": table.fullname, "zone": time_zone, "last": last},
            )
        conn.execute(
            text(f"ALTER TABLE {name} ALTER COLUMN created_at SET DEFAULT (UTC_TIMESTAMP(6))")
        )
        return last
    finally:
        conn.execute(text("UNLOCK TABLES"))


def convert_next_rows(conn: Connection, table: Table, batch_size: int) -> int | None:
    """Convert the next ``batch_size`` local-time rows of ``table`` to UTC, in the caller's
    transaction, and record how far it came; returns how many rows changed, None when the
    conversion was complete already.

    The conversion's row is read ``FOR UPDATE``: a second run waits rather than converting the
    same rows again. ``CONVERT_TZ`` with the zone's name converts each row at the offset of
    its own date (daylight saving time included).
    """
    progress = conn.execute(
        select(conversions).where(conversions.c.buffer == table.fullname).with_for_update()
    ).first()
    if progress is None or progress.converted_through >= progress.last_local_id:
        return None
    name = _name(conn, table)
    after, last = int(progress.converted_through), int(progress.last_local_id)
    # The batch's upper id: ids have gaps (claimed rows are deleted), so it is read, not added.
    upper = conn.execute(
        text(
            f"SELECT MAX(id) FROM (SELECT id FROM {name} WHERE id > :after AND id <= :last"
            " ORDER BY id LIMIT :size) AS batch"
        ),
        {"after": after, "last": last, "size": batch_size},
    ).scalar()
    through = last if upper is None else int(upper)
    changed = conn.execute(
        text(
            f"UPDATE {name} SET created_at = CONVERT_TZ(created_at, :zone, '+00:00')"
            " WHERE id > :after AND id <= :through"
        ),
        {"zone": progress.time_zone, "after": after, "through": through},
    ).rowcount
    conn.execute(
        conversions.update()
        .where(conversions.c.buffer == table.fullname)
        .values(converted_through=through)
    )
    if through >= last:
        conn.execute(conversions.delete().where(conversions.c.buffer == table.fullname))
    return int(changed)


def _name(conn: Connection, table: Table) -> str:
    """``table``'s name quoted for a statement, with its schema."""
    return str(conn.dialect.identifier_preparer.format_table(table))
