"""The archive's partitions on PostgreSQL: one per UTC day, each split by status so that a
day's history goes in one statement and its dead letters stay (docs/design.md, "Retention by
day").

``outbox_archive`` is partitioned by range of ``archived_at``:

- ``outbox_archive_before``: the archive as it was before revision 0009, every row before the
  cut its check constraint records (``FROM (MINVALUE)``, attached by revision 0010); pruned
  row by row, as before.
- ``outbox_archive_dYYYYMMDD``: one UTC day, itself partitioned by list of ``status``: its
  ``_dead`` leaf holds the dead letters, its ``_rest`` leaf (the default) everything else.
- ``outbox_archive_default``: rows of a day with no partition (the days are made ahead; this
  holds rows only when nothing made them); pruned row by row.

Every statement that takes a lock on a partition the workers write or read runs with a short
``lock_timeout``: it gives up rather than queue the workers behind it.
"""

from __future__ import annotations

import datetime as dt
import re
import time

from sqlalchemy import Connection, text

from outbox._db.dialects.interface import ArchivePartition, DayRetired

ROOT = "outbox_archive"
BEFORE = "outbox_archive_before"
DEFAULT = "outbox_archive_default"
_DAY = re.compile(r"^outbox_archive_d(\d{8})$")
_DEAD = "dead"


def day_name(day: dt.date) -> str:
    """The name of ``day``'s partition."""
    return f"{ROOT}_d{day:%Y%m%d}"


def has_day(conn: Connection, day: dt.date) -> bool:
    """Whether ``day``'s partition exists."""
    return _exists(conn, day_name(day))


def is_partitioned(conn: Connection) -> bool:
    """Whether ``outbox_archive`` is a partitioned table here (revision 0009 made it one)."""
    kind = conn.execute(
        text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:name)"), {"name": ROOT}
    ).scalar_one_or_none()
    return kind == "p"


def partitions(conn: Connection) -> list[ArchivePartition]:
    """The archive's partitions, oldest first, with their size and estimated rows."""
    rows = conn.execute(
        text(
            "SELECT c.relname AS name, "
            " (SELECT coalesce(sum(greatest(l.reltuples, 0)), 0)::bigint "
            "    FROM pg_partition_tree(c.oid) t JOIN pg_class l ON l.oid = t.relid "
            "   WHERE t.isleaf) AS rows, "
            " (SELECT coalesce(sum(greatest(l.reltuples, 0)), 0)::bigint "
            "    FROM pg_partition_tree(c.oid) t JOIN pg_class l ON l.oid = t.relid "
            "   WHERE t.isleaf AND l.relname = c.relname || '_dead') AS dead_rows, "
            " (SELECT coalesce(sum(pg_total_relation_size(t.relid)), 0)::bigint "
            "    FROM pg_partition_tree(c.oid) t WHERE t.isleaf) AS bytes "
            "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(:root) ORDER BY c.relname"
        ),
        {"root": ROOT},
    ).all()
    found = []
    for row in rows:
        match = _DAY.match(row.name)
        day = _day_of(match.group(1)) if match else None
        found.append(
            ArchivePartition(
                row.name, day, int(row.rows), int(row.dead_rows) if day else -1, int(row.bytes)
            )
        )
    order = {BEFORE: 0, DEFAULT: 2}
    return sorted(found, key=lambda p: (order.get(p.name, 1), p.day or dt.date.min))


def days(conn: Connection) -> list[dt.date]:
    """The days the archive has a partition of, from the catalogue's names alone (no size is
    read: nothing waits for a partition's lock)."""
    names = conn.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass(:root)"
        ),
        {"root": ROOT},
    ).scalars()
    return [_day_of(m.group(1)) for name in names if (m := _DAY.match(name))]


def _day_of(digits: str) -> dt.date:
    return dt.datetime.strptime(digits, "%Y%m%d").date()


def first_day(conn: Connection) -> dt.date | None:
    """The first day a day partition may hold: the day of the cut ``outbox_archive_before``
    ends at; None without it."""
    if not _exists(conn, BEFORE):
        return None
    return _cut(conn).date()


def bound_lock_waits(conn: Connection, seconds: float) -> None:
    """Wait at most ``seconds`` for each lock for the rest of the transaction."""
    conn.execute(text(f"SET LOCAL lock_timeout = '{int(seconds * 1000)}ms'"))


def unbound_lock_waits(conn: Connection) -> None:
    """Nothing: :func:`bound_lock_waits` ends with its transaction."""


def make_day(conn: Connection, day: dt.date, start: dt.datetime | None = None) -> None:
    """Make ``day``'s partition (from ``start`` on: the cut's day, in :func:`split_archive`):
    built apart, with its two leaves and their indexes, then
    attached. Attaching takes ``SHARE UPDATE EXCLUSIVE`` on the archive (its readers and
    writers go on) and reads only the default partition, to check it holds none of the day's
    rows."""
    name = day_name(day)
    end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.UTC)
    start = start or dt.datetime.combine(day, dt.time(), dt.UTC)
    conn.execute(
        text(f"CREATE TABLE {name} (LIKE {ROOT} INCLUDING DEFAULTS) PARTITION BY LIST (status)")
    )
    conn.execute(text(f"CREATE TABLE {name}_dead PARTITION OF {name} FOR VALUES IN ('{_DEAD}')"))
    conn.execute(text(f"CREATE TABLE {name}_rest PARTITION OF {name} DEFAULT"))
    for leaf in (f"{name}_dead", f"{name}_rest"):
        # Per leaf, not on the archive: a unique index over partitions would have to hold
        # the partition key. Ids come from one sequence; the index serves lookups and order.
        conn.execute(text(f"CREATE UNIQUE INDEX {leaf}_id ON {leaf} (id)"))
    conn.execute(
        text(
            f"ALTER TABLE {ROOT} ATTACH PARTITION {name} "
            f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"
        )
    )


def retire_day(conn: Connection, day: dt.date) -> DayRetired:
    """Take ``day``'s history out of the archive and keep its dead letters. A day with no dead
    letter is dropped whole (``ACCESS EXCLUSIVE`` on the archive, for the milliseconds a drop
    takes); a day with some has its ``_rest`` leaf truncated (``ACCESS EXCLUSIVE`` on that leaf
    alone) and stays, holding only them. Neither leaves a dead row behind to vacuum."""
    name = day_name(day)
    if not conn.execute(text(f"SELECT EXISTS (SELECT 1 FROM {name}_dead)")).scalar_one():
        conn.execute(text(f"DROP TABLE {name}"))
        return DayRetired.DROPPED
    if not conn.execute(text(f"SELECT EXISTS (SELECT 1 FROM {name}_rest)")).scalar_one():
        return DayRetired.KEPT
    conn.execute(text(f"TRUNCATE {name}_rest"))
    return DayRetired.EMPTIED


def try_lock(conn: Connection, key: str) -> bool:
    """Take the transaction's advisory lock ``key`` if no other session holds it: it ends with
    the transaction (a transaction pooler may hand the session to another client after)."""
    got = conn.execute(text("SELECT pg_try_advisory_xact_lock(hashtext(:key))"), {"key": key})
    return bool(got.scalar_one())


def unlock(conn: Connection, key: str) -> None:
    """Nothing: :func:`try_lock`'s lock ends with its transaction."""


_INDEXES = ("handler_status", "archived_at", "group_id")
BOUND_CONSTRAINT = "ck_outbox_archive_before"


def split_archive(conn: Connection, days_ahead: int, cut: dt.datetime | None = None) -> None:
    """Revision 0009: put a partitioned ``outbox_archive`` in the place of the archive, whose
    rows so far stay in it, renamed ``outbox_archive_before``, until :func:`attach_before`.

    Under the lock the rename takes (``ACCESS EXCLUSIVE``, held for catalogue changes only),
    the cut is the database's clock (or just after the newest row's ``archived_at``, if
    later; ``cut`` in tests): ``outbox_archive_before`` gets ``archived_at < cut`` as a check
    constraint ``NOT VALID`` (nothing writes to it any more: it can never refuse a row), and
    the partitioned table takes its name, columns, defaults, comments, id sequence and
    indexes, with the default partition, the cut's day from the cut on and ``days_ahead``
    days after it. Writers go on at once, into the new table; a row stamped before the cut by
    a transaction that started before it lands in the default partition, where
    :func:`attach_before` finds it. An archive partitioned already, or missing, is left as
    it is (tables stamped at a revision rather than migrated to it)."""
    if is_partitioned(conn) or not _exists(conn, ROOT):
        return
    conn.execute(text(f"LOCK TABLE {ROOT} IN ACCESS EXCLUSIVE MODE"))
    if cut is None:
        cut = conn.execute(
            text(
                "SELECT greatest(clock_timestamp(), "
                f"(SELECT max(archived_at) + interval '1 microsecond' FROM {ROOT}))"
            )
        ).scalar_one()
    assert cut is not None
    cut = cut.astimezone(dt.UTC)
    _rename(conn, ROOT, BEFORE)
    conn.execute(
        text(
            f"ALTER TABLE {BEFORE} ADD CONSTRAINT {BOUND_CONSTRAINT} "
            f"CHECK (archived_at < '{cut.isoformat()}') NOT VALID"
        )
    )
    conn.execute(
        text(
            f"CREATE TABLE {ROOT} (LIKE {BEFORE} INCLUDING DEFAULTS INCLUDING COMMENTS) "
            "PARTITION BY RANGE (archived_at)"
        )
    )
    conn.execute(text(f"ALTER SEQUENCE {ROOT}_id_seq OWNED BY {ROOT}.id"))
    conn.execute(text(f"CREATE INDEX ix_{ROOT}_handler_status ON {ROOT} (handler, status)"))
    conn.execute(text(f"CREATE INDEX ix_{ROOT}_archived_at ON {ROOT} (archived_at)"))
    conn.execute(text(f"CREATE INDEX ix_{ROOT}_group_id ON {ROOT} (group_id)"))
    conn.execute(text(f"CREATE TABLE {DEFAULT} PARTITION OF {ROOT} DEFAULT"))
    conn.execute(text(f"CREATE UNIQUE INDEX {DEFAULT}_id ON {DEFAULT} (id)"))
    first = cut.date()
    make_day(conn, first, start=cut)
    for offset in range(1, days_ahead + 1):
        make_day(conn, first + dt.timedelta(days=offset))


def attach_before(conn: Connection) -> None:
    """Revision 0010: attach ``outbox_archive_before`` as the partition of every row before
    the cut :func:`split_archive` made, with no long read under a lock anyone waits for.

    Its check constraint is validated (a read of a table nothing else uses any more); then,
    under ``ACCESS EXCLUSIVE`` on the default partition (readers of the archive wait for the
    milliseconds left), the rows stamped before the cut that landed there move to it, and it
    is attached ``FROM (MINVALUE) TO (cut)``: the validated constraint proves its rows belong,
    so attaching reads only the default partition. Attached already, or missing: nothing."""
    if not is_partitioned(conn) or not _exists(conn, BEFORE) or _is_partition(conn, BEFORE):
        return
    cut = _cut(conn)
    conn.execute(text(f"ALTER TABLE {BEFORE} VALIDATE CONSTRAINT {BOUND_CONSTRAINT}"))
    # Every lock the attach takes but the default partition's first, that one last: readers
    # of the archive queue behind it only for the move and the attach, not for a wait.
    conn.execute(text(f"LOCK TABLE {BEFORE} IN ACCESS EXCLUSIVE MODE"))
    conn.execute(text(f"LOCK TABLE ONLY {ROOT} IN SHARE UPDATE EXCLUSIVE MODE"))
    _wait_for_writers_before(conn, cut, OLD_TRANSACTIONS_WAIT)
    conn.execute(text(f"LOCK TABLE {DEFAULT} IN ACCESS EXCLUSIVE MODE"))
    conn.execute(
        text(
            f"WITH moved AS (DELETE FROM {DEFAULT} WHERE archived_at < :cut RETURNING *) "
            f"INSERT INTO {BEFORE} SELECT * FROM moved"
        ),
        {"cut": cut},
    )
    conn.execute(
        text(
            f"ALTER TABLE {ROOT} ATTACH PARTITION {BEFORE} "
            f"FOR VALUES FROM (MINVALUE) TO ('{cut.isoformat()}')"
        )
    )


OLD_TRANSACTIONS_WAIT = 30.0
"""Seconds :func:`attach_before` waits for the archive's writers that began before the cut."""


def _wait_for_writers_before(conn: Connection, cut: dt.datetime, seconds: float) -> None:
    """Wait (at most ``seconds``) until no other transaction that began before the cut holds
    a lock on the archive: a statement that began before it (held up by 0009's rename)
    stamps its row before it, and, routed to the default partition but still writing there
    once ``outbox_archive_before`` is attached, would be refused. Past the wait the attach
    goes on: a transaction open that long is not a worker's finish. A transaction this one
    holds up (0009 and 0010 in one transaction, as alembic's own command runs them) is not
    waited for: it writes nothing until this one ends."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        older = conn.execute(
            text(
                "SELECT count(*) FROM pg_locks l "
                "JOIN pg_stat_activity a ON a.pid = l.pid "
                "JOIN pg_class c ON c.oid = l.relation "
                "WHERE a.datname = current_database() AND a.pid <> pg_backend_pid() "
                "AND l.granted AND NOT pg_backend_pid() = ANY(pg_blocking_pids(a.pid)) "
                "AND a.xact_start < :cut AND c.relname LIKE 'outbox\\_archive%'"
            ),
            {"cut": cut},
        ).scalar_one()
        if not older:
            return
        time.sleep(0.1)


def detach_before(conn: Connection) -> None:
    """Undo :func:`attach_before`: ``outbox_archive_before`` is a table apart again, its
    constraint kept."""
    if _exists(conn, BEFORE) and _is_partition(conn, BEFORE):
        conn.execute(text(f"ALTER TABLE {ROOT} DETACH PARTITION {BEFORE}"))


def unsplit_archive(conn: Connection) -> None:
    """Undo :func:`split_archive`: the rows of the partitioned table are copied into
    ``outbox_archive_before``, which becomes ``outbox_archive`` again, without its
    constraint; readers and writers of the archive wait for the copy. An archive that is one
    table already is left as it is."""
    if not is_partitioned(conn):
        return
    # Readers and writers wait from here: a row committed after the copy's snapshot would go
    # with the partitioned table. The strongest lock at once, not EXCLUSIVE then the drop's:
    # a lock taken in two steps deadlocks with a transaction that read before it writes.
    conn.execute(text(f"LOCK TABLE {ROOT} IN ACCESS EXCLUSIVE MODE"))
    detach_before(conn)
    # The constraint first: it holds every row archived from the cut on out of the table.
    conn.execute(text(f"ALTER TABLE {BEFORE} DROP CONSTRAINT {BOUND_CONSTRAINT}"))
    conn.execute(text(f"INSERT INTO {BEFORE} SELECT * FROM {ROOT}"))
    conn.execute(text(f"ALTER SEQUENCE {ROOT}_id_seq OWNED BY {BEFORE}.id"))
    conn.execute(text(f"DROP TABLE {ROOT}"))
    _rename(conn, BEFORE, ROOT)


def _rename(conn: Connection, old: str, new: str) -> None:
    """Rename the archive's table ``old`` to ``new``, with its primary key and indexes."""
    conn.execute(text(f"ALTER TABLE {old} RENAME TO {new}"))
    conn.execute(text(f"ALTER INDEX pk_{old} RENAME TO pk_{new}"))
    for index in _INDEXES:
        conn.execute(text(f"ALTER INDEX ix_{old}_{index} RENAME TO ix_{new}_{index}"))


def _exists(conn: Connection, name: str) -> bool:
    found = conn.execute(text("SELECT to_regclass(:name)"), {"name": name}).scalar_one()
    return found is not None


def _is_partition(conn: Connection, name: str) -> bool:
    found = conn.execute(
        text("SELECT relispartition FROM pg_class WHERE oid = to_regclass(:name)"),
        {"name": name},
    ).scalar_one_or_none()
    return bool(found)


def _cut(conn: Connection) -> dt.datetime:
    """The cut :func:`split_archive` recorded in ``outbox_archive_before``'s constraint."""
    cut: dt.datetime = conn.execute(
        text(
            "SELECT (regexp_match(pg_get_constraintdef(oid), '''([^'']+)'''))[1]::timestamptz "
            "FROM pg_constraint WHERE conname = :name AND conrelid = to_regclass(:table)"
        ),
        {"name": BOUND_CONSTRAINT, "table": BEFORE},
    ).scalar_one()
    return cut.astimezone(dt.UTC)


def count_history(conn: Connection, day: dt.date) -> int:
    """The rows of ``day`` that are not dead letters (its ``_rest`` leaf)."""
    return int(conn.execute(text(f"SELECT count(*) FROM {day_name(day)}_rest")).scalar_one())


def partition_archive(conn: Connection, days_ahead: int, cut: dt.datetime | None = None) -> None:
    """Revisions 0009 and 0010 in one transaction, for an archive no worker writes to yet
    (tables made by ``metadata.create_all``, in tests and benchmarks)."""
    split_archive(conn, days_ahead, cut)
    attach_before(conn)
