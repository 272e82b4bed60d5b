"""The archive partitioned by day (migrations 0009 and 0010) and its retention.

Up and down with rows archived and jobs in flight, every row kept and ids going on from the
same sequence; rows archived afterwards land in their day's partition (PostgreSQL: its dead
letters' leaf or the rest; a day with no partition: the default one); a retention pass takes
out the days past its age, dropping a day with no dead letter and emptying one with some of
all but them, and deletes rows where the archive is one table; two passes at once: one works.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, insert, select, text

from outbox import Outbox, Settings, schema
from outbox._db import queries
from outbox._db.dialects.interface import DayRetired
from outbox._db.mysql import partitions as mysql
from outbox._db.postgresql import partitions as postgresql
from outbox._services.retention import Retention
from outbox.ops import archive
from outbox.ops.migrate import migrate
from tests.acceptance._cli import Cli

SUCCEEDED = schema.ArchiveStatus.SUCCEEDED
DEAD = schema.ArchiveStatus.DEAD
REPLAYED = schema.ArchiveStatus.REPLAYED


def _archive(engine: Engine, status: str, at: dt.datetime | None = None, event_id: int = 1) -> int:
    values: dict[str, Any] = {
        "handler": "h",
        "buffer": "events",
        "event_id": event_id,
        "group_id": uuid.uuid4(),
        "status": status,
        "attempts": 1,
        "payload": {"id": event_id},
    }
    if at is not None:
        values["archived_at"] = at
    with engine.begin() as conn:
        conn.execute(insert(schema.archive).values(values))
        return int(
            conn.execute(
                select(schema.archive.c.id).order_by(schema.archive.c.id.desc()).limit(1)
            ).scalar_one()
        )


def _rows(engine: Engine) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        found = conn.execute(
            select(schema.archive.c.id, schema.archive.c.status).order_by(schema.archive.c.id)
        )
        return [(int(i), str(s)) for i, s in found]


def _partitioned(engine: Engine) -> bool:
    with engine.connect() as conn:
        return queries.archive_partitioned(conn)


def _noon(day: dt.date) -> dt.datetime:
    return dt.datetime.combine(day, dt.time(12), dt.UTC)


def _first_day(engine: Engine) -> dt.date:
    with engine.connect() as conn:
        first = queries.archive_first_day(conn)
    assert first is not None
    return first


def _migrated(url: str, engine_on: Callable[[str], Engine]) -> Engine:
    engine = engine_on(url)
    migrate(engine)
    return engine


def test_up_and_down_with_rows_in_flight_keep_every_row(
    empty_server_url: str, engine_on: Callable[[str], Engine]
) -> None:
    """At 0008 with archived rows and a job in flight, up to 0010: partitioned, every row
    there, a new row's id after theirs; down to 0008: one table with every row, those archived
    since too; and up again."""
    engine = engine_on(empty_server_url)
    migrate(engine, "0008")
    before = [_archive(engine, status, event_id=n) for n, status in enumerate((SUCCEEDED, DEAD))]
    with engine.begin() as conn:
        conn.execute(
            insert(schema.jobs).values(kind="batch", handler="h", priority=0, group_id=uuid.uuid4())
        )
    migrate(engine)
    up = (_partitioned(engine), _rows(engine))
    after = _archive(engine, REPLAYED, _noon(_first_day(engine)))
    migrate(engine, "0008")
    down = (_partitioned(engine), _rows(engine))
    migrate(engine)
    with engine.connect() as conn:
        jobs = conn.execute(select(schema.jobs.c.handler)).scalars().all()
    expected_up = (True, [(before[0], SUCCEEDED), (before[1], DEAD)])
    expected_down = (False, [*expected_up[1], (after, REPLAYED)])
    assert (expected_up, after > before[1], expected_down, True, ["h"]) == (
        up,
        after > before[1],
        down,
        _partitioned(engine),
        jobs,
    )


def test_at_0009_no_row_is_refused_and_0010_attaches_the_rows_before_the_cut(
    make_empty_database: Callable[[str], str], engine_on: Callable[[str], Engine]
) -> None:
    """PostgreSQL: a database left at 0009 takes every row, whatever its ``archived_at`` (a
    day before the cut, a month after); the rows archived before it are kept apart. 0010 moves
    the rows stamped before the cut from the default partition to ``outbox_archive_before``
    and attaches it: every row is read back, each where its time puts it."""
    engine = engine_on(make_empty_database("postgresql"))
    migrate(engine, "0008")
    old = _archive(engine, SUCCEEDED, event_id=1)
    migrate(engine, "0009")
    now = dt.datetime.now(dt.UTC)
    straggler = _archive(engine, DEAD, now - dt.timedelta(days=1), event_id=2)
    later = _archive(engine, SUCCEEDED, now + dt.timedelta(days=30), event_id=3)
    at_0009 = [row_id for row_id, _ in _rows(engine)]
    migrate(engine)
    first = _first_day(engine)
    found = [_where(engine, row, first) for row in (old, straggler, later)]
    assert (
        [straggler, later],
        ["outbox_archive_before", "outbox_archive_before", "outbox_archive_default"],
        [old, straggler, later],
    ) == (at_0009, found, [row_id for row_id, _ in _rows(engine)])


def _where(engine: Engine, row_id: int, first: dt.date) -> str:
    """The partition a row is in (PostgreSQL: its leaf)."""
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            found = conn.execute(
                text("SELECT tableoid::regclass::text FROM outbox_archive WHERE id = :id"),
                {"id": row_id},
            )
            return str(found.scalar_one())
        for part in queries.archive_partitions(conn):
            hit = conn.execute(
                text(f"SELECT 1 FROM outbox_archive PARTITION ({part.name}) WHERE id = :id"),
                {"id": row_id},
            ).first()
            if hit is not None:
                return part.name
    raise AssertionError(f"row {row_id} is in no partition")


def test_rows_archived_after_the_migration_land_in_their_day(
    empty_server_url: str, engine_on: Callable[[str], Engine]
) -> None:
    """A row archived on a day with a partition is in it (PostgreSQL: a dead letter in its
    ``_dead`` leaf, the rest in ``_rest``); a row of a day with none in the default."""
    engine = _migrated(empty_server_url, engine_on)
    first = _first_day(engine)
    day = first + dt.timedelta(days=1)
    dead = _archive(engine, DEAD, _noon(day))
    done = _archive(engine, SUCCEEDED, _noon(day))
    later = _archive(engine, SUCCEEDED, _noon(first + dt.timedelta(days=40)))
    found = [_where(engine, row, first) for row in (dead, done, later)]
    name = f"d{day:%Y%m%d}"
    if engine.dialect.name == "postgresql":
        expected = [
            f"outbox_archive_{name}_dead",
            f"outbox_archive_{name}_rest",
            "outbox_archive_default",
        ]
    else:
        expected = [name, name, "p_future"]
    assert expected == found


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def migrated_app(
    request: pytest.FixtureRequest,
    make_empty_database: Callable[[str], str],
    engine_on: Callable[[str], Engine],
) -> Iterator[Outbox]:
    """An application on a database of each kind migrated to the head revision."""
    url = make_empty_database(request.param)
    migrate(engine_on(url))
    app = Outbox(url, settings=Settings(archive_retention_days=2))
    yield app
    app.engine.dispose()


def test_retention_takes_old_days_out_and_keeps_dead_letters(migrated_app: Outbox) -> None:
    """Past the age: a day with dead letters keeps only them, a day with none goes; rows
    within the age stay; where the archive is one table (SQLite) the old rows are deleted,
    dead letters kept, as well."""
    engine = migrated_app.engine
    partitioned = _partitioned(engine)
    # The migration's first day holds its rows from the cut on: the day after is whole.
    first = _first_day(engine) if partitioned else dt.datetime.now(dt.UTC).date()
    old, older, kept = (first + dt.timedelta(days=n) for n in (1, 2, 3))
    rows = {
        "dead": _archive(engine, DEAD, _noon(old)),
        "old": _archive(engine, SUCCEEDED, _noon(old)),
        "replayed": _archive(engine, REPLAYED, _noon(old)),
        "older": _archive(engine, SUCCEEDED, _noon(older)),
        "kept": _archive(engine, SUCCEEDED, _noon(kept)),
    }
    done = Retention(migrated_app).run_once(days=1, today=kept + dt.timedelta(days=1))
    left = {row_id for row_id, _ in _rows(engine)}
    retired = {first: DayRetired.DROPPED, old: DayRetired.EMPTIED, older: DayRetired.DROPPED}
    assert (
        {rows["dead"], rows["kept"]},
        retired if partitioned else {},
        (),
        0 if partitioned else 3,
    ) == (
        left,
        done.retired,
        done.waited,
        done.deleted,
    )
    if partitioned:
        with engine.connect() as conn:
            days = {p.day for p in queries.archive_partitions(conn) if p.day}
        assert (old in days, older in days, kept in days) == (True, False, True)


def test_retention_makes_days_ahead(migrated_app: Outbox) -> None:
    """A pass makes the days from today to three days ahead that the archive lacks."""
    engine = migrated_app.engine
    if not _partitioned(engine):
        pytest.skip("the archive is one table here")
    today = _first_day(engine) + dt.timedelta(days=10)
    done = Retention(migrated_app).run_once(today=today)
    expected = tuple(today + dt.timedelta(days=n) for n in range(4))
    with engine.connect() as conn:
        days = {p.day for p in queries.archive_partitions(conn)}
    assert (expected, True) == (done.made, set(expected) <= days)


def test_days_are_made_ahead_with_retention_off(
    make_empty_database: Callable[[str], str], engine_on: Callable[[str], Engine]
) -> None:
    """Retention off: a pass makes the days ahead all the same (turning retention on later
    finds them made, not a default partition holding days of rows), and takes nothing out."""
    url = make_empty_database("postgresql")
    migrate(engine_on(url))
    app = Outbox(url)
    try:
        first = _first_day(app.engine)
        old = _archive(app.engine, SUCCEEDED, _noon(first + dt.timedelta(days=1)))
        today = first + dt.timedelta(days=10)
        done = Retention(app).run_once(today=today)
        with app.engine.connect() as conn:
            days = {p.day for p in queries.archive_partitions(conn)}
        left = [row_id for row_id, _ in _rows(app.engine)]
    finally:
        app.engine.dispose()
    expected = tuple(today + dt.timedelta(days=n) for n in range(4))
    assert (expected, True, {}, [old]) == (done.made, set(expected) <= days, done.retired, left)


def test_two_passes_at_once_one_works(migrated_app: Outbox) -> None:
    """While another transaction holds the cleaners' lock, a pass does nothing, and a prune
    deletes row by row; once it ends, a pass runs."""
    engine = migrated_app.engine
    if engine.dialect.name == "sqlite":
        pytest.skip("SQLite's one writer serializes the passes' deletes")
    holder = create_engine(engine.url)
    try:
        with holder.connect() as conn, conn.begin(), queries.retention_lock(conn) as held:
            results = []
            thread = threading.Thread(
                target=lambda: results.append(Retention(migrated_app).run_once())
            )
            thread.start()
            thread.join()
        again = Retention(migrated_app).run_once()
    finally:
        holder.dispose()
    assert (True, False, True) == (held, results[0].ran, again.ran)


def test_archive_counts_browse_and_prune_on_days(migrated_app: Outbox) -> None:
    """Counts, browse (newest first, across partitions) and prune read and delete the
    partitioned archive as they do one table; prune keeps dead letters."""
    engine = migrated_app.engine
    first = _first_day(engine) if _partitioned(engine) else dt.datetime.now(dt.UTC).date()
    before = _archive(engine, SUCCEEDED, dt.datetime.now(dt.UTC) - dt.timedelta(days=3))
    dead = _archive(engine, DEAD, dt.datetime.now(dt.UTC) - dt.timedelta(days=3))
    later = _archive(engine, SUCCEEDED, _noon(first + dt.timedelta(days=1)))
    counts = archive.counts(migrated_app)
    page = archive.browse(migrated_app, limit=2)
    pruned = archive.prune(migrated_app, older_than=86400)
    assert (
        {("h", "succeeded"): 2, ("h", "dead"): 1},
        [later, dead],
        page.next,
        1,
        [(dead, DEAD), (later, SUCCEEDED)],
    ) == (counts, [e.id for e in page.events], dead, pruned, _rows(engine)), before


def test_prune_takes_whole_days_out_and_keeps_dead_letters(
    empty_server_url: str, engine_on: Callable[[str], Engine]
) -> None:
    """`prune` of the statuses that are history: a day archived wholly before the age loses
    them in one statement (its dead letters stay), counted in what it pruned; the day the age
    falls in is pruned row by row; a day within the age stays."""
    engine = engine_on(empty_server_url)
    today = dt.datetime.now(dt.UTC).date()
    first = today - dt.timedelta(days=3)
    with engine.begin() as conn:
        schema.metadata.create_all(conn)
        if engine.dialect.name == "postgresql":
            postgresql.partition_archive(conn, 5, cut=dt.datetime.combine(first, dt.time(), dt.UTC))
        else:
            mysql.partition_archive(conn, first, 5)
    app = Outbox(empty_server_url)
    try:
        dead = _archive(app.engine, DEAD, _noon(first))
        _archive(app.engine, SUCCEEDED, _noon(first))
        _archive(app.engine, REPLAYED, _noon(first))
        _archive(app.engine, SUCCEEDED, _noon(first + dt.timedelta(days=1)))
        kept = _archive(app.engine, SUCCEEDED, dt.datetime.now(dt.UTC))
        # Two days back: the age falls within the day after `first`, pruned row by row;
        # `first` is wholly before it.
        pruned = archive.prune(app, older_than=2 * 86400)
        with app.engine.connect() as conn:
            days = {p.day for p in queries.archive_partitions(conn)}
        left = {row_id for row_id, _ in _rows(app.engine)}
    finally:
        app.engine.dispose()
    assert (3, {dead, kept}, True, True) == (
        pruned,
        left,
        first in days,
        first + dt.timedelta(days=1) in days,
    )


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_archive_days_shows_the_partitions_and_the_retention(
    kind: str,
    cli: Cli,
    make_empty_database: Callable[[str], str],
    engine_on: Callable[[str], Engine],
) -> None:
    """``outbox archive days --json``: the partitions, oldest first, each day named; where
    the archive is one table, a line that says so."""
    url = make_empty_database(kind)
    migrate(engine_on(url))
    result = cli.run("--database-url", url, "archive", "days", "--json")
    if kind == "sqlite":
        text_result = cli.run("--database-url", url, "archive", "days")
        assert (0, [], True) == (
            result.code,
            json.loads(result.stdout)["partitions"],
            text_result.stdout.startswith("the archive is one table here"),
        )
        return
    found = json.loads(result.stdout)
    names = [p["name"] for p in found["partitions"]]
    first = _first_day(engine_on(url))
    days = [f"outbox_archive_d{first + dt.timedelta(days=n):%Y%m%d}" for n in range(4)]
    assert (0, None, ["outbox_archive_before", *days, "outbox_archive_default"]) == (
        result.code,
        found["retention_days"],
        names,
    )
