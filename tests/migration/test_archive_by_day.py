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
from tests.acceptance._cli import APP, Cli
from tests.models import Base

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
    after = _archive(engine, REPLAYED)
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


def test_0010_waits_for_a_writer_begun_before_the_cut(
    make_empty_database: Callable[[str], str], engine_on: Callable[[str], Engine]
) -> None:
    """PostgreSQL: a transaction that began before 0009's cut is archiving a row stamped
    before it (in the default partition, uncommitted) when 0010 runs: 0010 waits for it to
    end, then moves the row to ``outbox_archive_before``; nothing is refused."""
    url = make_empty_database("postgresql")
    engine = engine_on(url)
    migrate(engine, "0008")
    writer = engine_on(url)
    errors: list[BaseException] = []

    def attach() -> None:
        try:
            migrate(engine_on(url))
        except BaseException as error:  # the test's finding, not a crash
            errors.append(error)

    with writer.connect() as conn:
        conn.execute(text("SELECT 1"))  # its transaction begins here, before the cut
        migrate(engine, "0009")
        conn.execute(
            insert(schema.archive).values(
                handler="h", buffer="events", event_id=9, group_id=uuid.uuid4(),
                status=SUCCEEDED, attempts=1, payload={},
                archived_at=dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1),
            )
        )  # fmt: skip
        thread = threading.Thread(target=attach)
        thread.start()
        thread.join(0.5)
        waiting = thread.is_alive()
        conn.commit()
    thread.join(60)
    found = [_where(engine, row_id, _first_day(engine)) for row_id, _ in _rows(engine)]
    assert (True, [], ["outbox_archive_before"]) == (waiting, errors, found)


def test_down_from_0009_keeps_a_row_committed_while_it_copies(
    make_empty_database: Callable[[str], str], engine_on: Callable[[str], Engine]
) -> None:
    """PostgreSQL: undoing 0009 while a worker's transaction archives a row: the downgrade
    waits for it, and the row is in the one table after."""
    url = make_empty_database("postgresql")
    engine = engine_on(url)
    migrate(engine, "0009")
    first = _archive(engine, SUCCEEDED, event_id=1)
    writer = engine_on(url)
    with writer.connect() as conn:
        conn.execute(
            insert(schema.archive).values(
                handler="h", buffer="events", event_id=2, group_id=uuid.uuid4(),
                status=SUCCEEDED, attempts=1, payload={},
            )
        )  # fmt: skip
        thread = threading.Thread(target=lambda: migrate(engine_on(url), "0008"))
        thread.start()
        thread.join(1.0)
        conn.commit()
    thread.join(60)
    rows = [row_id for row_id, _ in _rows(engine)]
    assert (False, 2, first) == (_partitioned(engine), len(rows), rows[0])


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


def test_a_day_retention_could_not_lock_is_left_whole(migrated_app: Outbox) -> None:
    """A day past the age whose partition another transaction holds: the pass gives up on
    it (``waited``) and leaves its rows for a later pass rather than delete them row by row;
    the day after goes."""
    engine = migrated_app.engine
    if engine.dialect.name != "postgresql":
        pytest.skip("MariaDB's metadata lock is the whole table's: every day waits there")
    first = _first_day(engine) + dt.timedelta(days=1)
    held, gone = first, first + dt.timedelta(days=1)
    rows = [_archive(engine, SUCCEEDED, _noon(day)) for day in (held, gone)]
    name = f"outbox_archive_d{held:%Y%m%d}"
    reader = create_engine(engine.url)
    try:
        with reader.connect() as conn, conn.begin():
            conn.execute(text(f"LOCK TABLE {name}_rest IN ACCESS SHARE MODE"))
            done = Retention(migrated_app).run_once(days=1, today=gone + dt.timedelta(days=2))
    finally:
        reader.dispose()
    left = [row_id for row_id, _ in _rows(engine)]
    assert (
        [rows[0]],
        [f"retire {held}: a lock held too long"],
        0,
        DayRetired.DROPPED,
    ) == (left, [w for w in done.waited if str(held) in w], done.deleted, done.retired.get(gone))


def test_steps_on_a_day_another_cleaner_did_are_nothing(migrated_app: Outbox) -> None:
    """Making a day that exists, or retiring one that is gone (another cleaner was first):
    nothing done, no error."""
    engine = migrated_app.engine
    if not _partitioned(engine):
        pytest.skip("the archive is one table here")
    day = _first_day(engine) + dt.timedelta(days=1)
    with engine.connect() as conn, conn.begin():
        again = queries.make_archive_day(conn, day, 1.0)
    with engine.connect() as conn, conn.begin():
        first = queries.retire_archive_day(conn, day, 1.0)
    with engine.connect() as conn, conn.begin():
        second = queries.retire_archive_day(conn, day, 1.0)
        history = queries.count_archive_day_history(conn, day)
    assert (False, DayRetired.DROPPED, None, 0) == (again, first, second, history)


@pytest.mark.parametrize("kind", ["postgresql", "mariadb"])
def test_outbox_distribute_from_cron_makes_the_days_ahead(
    kind: str,
    cli: Cli,
    make_empty_database: Callable[[str], str],
    engine_on: Callable[[str], Engine],
) -> None:
    """Where no `outbox work` leads (cron's `outbox distribute`), the days ahead are made:
    a day missing is made by the next distribute."""
    url = make_empty_database(kind)
    engine = engine_on(url)
    migrate(engine)
    Base.metadata.create_all(engine)  # the buffers of the application the command loads
    with engine.connect() as conn:
        today = queries.database_now(conn).date()
    ahead = today + dt.timedelta(days=3)
    with engine.begin() as conn:
        if kind == "postgresql":
            conn.execute(text(f"DROP TABLE outbox_archive_d{ahead:%Y%m%d}"))
        else:
            conn.execute(text(f"ALTER TABLE outbox_archive DROP PARTITION d{ahead:%Y%m%d}"))
    result = cli.run("--app", APP, "--database-url", url, "distribute")
    with engine.connect() as conn:
        days = {p.day for p in queries.archive_partitions(conn)}
    assert (0, True) == (result.code, ahead in days), result.output


def test_a_pass_waits_for_no_lock_held_long(
    make_empty_database: Callable[[str], str], engine_on: Callable[[str], Engine]
) -> None:
    """PostgreSQL: while a transaction holds the default partition, exclusively or reading it,
    a pass (which may run in the foreground of `outbox distribute`) lists the days from the
    catalogue's names without waiting for it, and a day to make waits at most its lock wait
    and is not counted as made."""
    url = make_empty_database("postgresql")
    migrate(engine_on(url))
    app = Outbox(url)
    holder = engine_on(url)
    passes = []
    try:
        today = _first_day(app.engine) + dt.timedelta(days=10)
        for mode in ("ACCESS EXCLUSIVE", "ACCESS SHARE"):
            with holder.connect() as conn, conn.begin():
                conn.execute(text(f"LOCK TABLE outbox_archive_default IN {mode} MODE"))
                passes.append(Retention(app).run_once(today=today))
    finally:
        app.engine.dispose()
    expected = ((), [f"make {today}: a lock held too long"])
    assert [expected, expected] == [
        (done.made, [w for w in done.waited if str(today) in w or w.startswith("list")])
        for done in passes
    ]


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
        # The first moment of the day after `first`: before the age whatever the time of day
        # now (noon would be after it in the morning).
        start = dt.datetime.combine(first + dt.timedelta(days=1), dt.time(0, 0, 0, 1), dt.UTC)
        _archive(app.engine, SUCCEEDED, start)
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
