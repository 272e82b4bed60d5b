"""MariaDB with sessions outside UTC, upgraded from the release that wrote its clock as the
session's local time (CURRENT_TIMESTAMP): migration 0002 converts outbox's times to UTC,
``migrate_buffers`` the buffers', and a worker refuses a buffer still on the local clock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, text

from outbox import LocalClockError, Outbox, schema
from outbox._db import queries
from outbox.ops import metrics
from outbox.ops.buffer_clock import check, migrate_buffers
from outbox.ops.migrate import VERSION_TABLE, current_revision, upgrade
from outbox.ops.progress import Progress, StoppedError
from outbox.worker import Worker
from tests._support import wait_for
from tests.conftest import reset_schema
from tests.models import ActivityEvent

ZONES = ["-05:00", "+02:00"]
# The times the older release's tables took from the clock by default.
CLOCKED = {
    "outbox_jobs": ("run_at", "created_at"),
    "outbox_archive": ("archived_at",),
    "outbox_workers": ("started_at", "heartbeat_at"),
}
BUFFER = ActivityEvent.__table__.name


def _in_zone(url: str, zone: str) -> Engine:
    """An engine whose every connection's session is in ``zone``, as an application sets it."""
    engine = create_engine(url)

    @event.listens_for(engine, "connect")
    def set_zone(dbapi_connection: Any, record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"SET time_zone = '{zone}'")
        cursor.close()

    return engine


@pytest.fixture(params=ZONES)
def zoned(request: pytest.FixtureRequest, mariadb_url: str) -> Iterator[Engine]:
    """An engine on the session's MariaDB database whose sessions are at -05:00, then +02:00."""
    engine = _in_zone(mariadb_url, request.param)
    yield engine
    engine.dispose()


def _at_older_release(engine: Engine) -> None:
    """outbox's tables at revision 0001 as the older release made them: defaults of the
    session's local clock."""
    with engine.begin() as conn:
        schema.metadata.drop_all(conn)
        conn.execute(text(f"DROP TABLE IF EXISTS {VERSION_TABLE}"))
    upgrade(engine, "0001")
    with engine.begin() as conn:
        for table, columns in CLOCKED.items():
            for column in columns:
                conn.execute(
                    text(f"ALTER TABLE {table} ALTER {column} SET DEFAULT CURRENT_TIMESTAMP(6)")
                )


def _write_as_older_release(engine: Engine, heartbeat_minutes_ago: int) -> None:
    """A leased job, an archived event and a worker, written as the older release wrote them."""
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO outbox_jobs (kind, handler, priority, lease_owner, lease_expires_at)"
                " VALUES ('claim', 'h', 1, 'old', NOW() + INTERVAL 3 MINUTE)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO outbox_archive (handler, buffer, event_id, status, attempts, payload,"
                " created_at) VALUES ('h', 'b', 1, 'succeeded', 1, '{}', NOW() - INTERVAL 7 MINUTE)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO outbox_workers (id, hostname, pid, concurrency, heartbeat_at)"
                " VALUES ('old', 'oldhost', 4242, 1, NOW() - INTERVAL :m MINUTE)"
            ),
            {"m": heartbeat_minutes_ago},
        )


def _minutes_ago(engine: Engine) -> dict[str, int]:
    """Every time written above, in whole minutes before now by UTC (negative: ahead)."""
    columns = {
        "outbox_jobs": ("run_at", "lease_expires_at", "created_at"),
        "outbox_archive": ("created_at", "archived_at"),
        "outbox_workers": ("started_at", "heartbeat_at"),
    }
    ages = {}
    with engine.connect() as conn:
        for table, names in columns.items():
            for name in names:
                seconds = conn.execute(
                    text(f"SELECT TIMESTAMPDIFF(SECOND, {name}, UTC_TIMESTAMP()) FROM {table}")
                ).scalar_one()
                ages[f"{table}.{name}"] = round(seconds / 60)
    return ages


def test_migration_converts_the_older_release_times_to_utc(zoned: Engine) -> None:
    """Times the older release wrote in the session's zone read as UTC after the upgrade."""
    _at_older_release(zoned)
    _write_as_older_release(zoned, heartbeat_minutes_ago=10)
    upgrade(zoned)
    expected = {
        "outbox_jobs.run_at": 0,
        "outbox_jobs.lease_expires_at": -3,
        "outbox_jobs.created_at": 0,
        "outbox_archive.created_at": 7,
        "outbox_archive.archived_at": 0,
        "outbox_workers.started_at": 0,
        "outbox_workers.heartbeat_at": 10,
    }
    assert expected == _minutes_ago(zoned)


def test_migration_refuses_while_workers_of_the_older_release_run(zoned: Engine) -> None:
    """A worker that heartbeat a moment ago by the local clock stops the upgrade, named."""
    _at_older_release(zoned)
    _write_as_older_release(zoned, heartbeat_minutes_ago=0)
    with pytest.raises(LocalClockError) as refused:
        upgrade(zoned)
    message = str(refused.value)
    assert ("0001", True, True) == (
        current_revision(zoned),
        "(oldhost:4242)" in message,
        "run `outbox migrate` again" in message,
    )


def test_migration_in_a_utc_session_keeps_the_times(mariadb_url: str) -> None:
    """In a UTC session the older release's times were UTC already: none moves, and a live
    worker does not stop the upgrade."""
    engine = _in_zone(mariadb_url, "+00:00")
    try:
        _at_older_release(engine)
        _write_as_older_release(engine, heartbeat_minutes_ago=0)
        upgrade(engine)
        ages = _minutes_ago(engine)
    finally:
        engine.dispose()
    assert (-3, 7, 0) == (
        ages["outbox_jobs.lease_expires_at"],
        ages["outbox_archive.created_at"],
        ages["outbox_workers.heartbeat_at"],
    )


# --- buffers --------------------------------------------------------------------------------


def _buffer_as_older_release(engine: Engine) -> Outbox:
    """outbox's tables at head, the test buffer with the older release's created_at (a
    DATETIME of whole seconds, defaulting to the session's local clock), and an app on it."""
    reset_schema(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        conn.execute(
            text(
                f"ALTER TABLE {BUFFER} MODIFY created_at DATETIME NOT NULL"
                " DEFAULT CURRENT_TIMESTAMP(6)"
            )
        )
    app = Outbox(engine=engine)

    @app.handler(ActivityEvent, expires_after=3600)
    def record_activity(batch: Any) -> None:
        pass

    return app


def _write_events(engine: Engine, count: int) -> list[tuple[int, Any]]:
    """Write ``count`` events, one transaction each; each one's id and the UTC time it was
    written at."""
    written = []
    for n in range(count):
        with engine.begin() as conn:
            conn.execute(
                text(f"INSERT INTO {BUFFER} (activity_id, kind) VALUES (:n, 'viewed')"), {"n": n}
            )
            written.append(
                tuple(conn.execute(text("SELECT LAST_INSERT_ID(), UTC_TIMESTAMP(6)")).one())
            )
    return written


def _off_by_more_than_a_second(engine: Engine, written: list[tuple[int, Any]]) -> list[int]:
    """The ids whose created_at is not UTC within a second of when they were written."""
    with engine.connect() as conn:
        stored = dict(conn.execute(text(f"SELECT id, created_at FROM {BUFFER}")).all())
    return [id_ for id_, at in written if not 0 <= (at - stored[id_]).total_seconds() < 1.5]


def test_migrate_buffers_converts_local_rows_beside_producers(zoned: Engine) -> None:
    """Rows written before and during the command all read as UTC after it, none twice."""
    app = _buffer_as_older_release(zoned)
    written = _write_events(zoned, 40)
    stop = threading.Event()
    during: list[tuple[int, Any]] = []

    def produce() -> None:
        while not stop.is_set():
            during.extend(_write_events(zoned, 1))

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_for(lambda: len(during) >= 3, "the producer's first events")
        migrations = migrate_buffers(app, [ActivityEvent.__table__], batch_size=7)
    finally:
        stop.set()
        producer.join()
    written += during + _write_events(zoned, 3)
    assert ([], True) == (
        _off_by_more_than_a_second(zoned, written),
        migrations[0].rows >= 40,
    )


def test_a_fresh_event_is_fresh_after_migrate_buffers(zoned: Engine) -> None:
    """An event written in the session's zone before the command is seconds old after it,
    not hours: no expiry, no staleness."""
    app = _buffer_as_older_release(zoned)
    _write_events(zoned, 1)
    migrate_buffers(app, [ActivityEvent.__table__])
    (status,) = metrics.collect(app)
    assert 0 == round((status.oldest_age or 0.0) / 60)


def test_a_second_run_changes_nothing(zoned: Engine) -> None:
    """Run again, the command finds the default UTC and converts no row twice."""
    app = _buffer_as_older_release(zoned)
    written = _write_events(zoned, 5)
    migrate_buffers(app, [ActivityEvent.__table__])
    (again,) = migrate_buffers(app, [ActivityEvent.__table__])
    assert ("utc_timestamp(6)", False, []) == (
        again.default,
        again.switch,
        _off_by_more_than_a_second(zoned, written),
    )


def test_a_run_stopped_midway_is_finished_by_the_next(
    zoned: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped after two batches, the next run converts the rest, and no row twice."""
    app = _buffer_as_older_release(zoned)
    written = _write_events(zoned, 20)
    convert = queries.convert_next_rows
    batches = iter(range(3))

    def stopping(conn: Any, table: Any, size: int) -> int | None:
        if next(batches) == 2:
            raise KeyboardInterrupt
        return convert(conn, table, size)

    monkeypatch.setattr(queries, "convert_next_rows", stopping)
    with pytest.raises(KeyboardInterrupt):
        migrate_buffers(app, [ActivityEvent.__table__], batch_size=4)
    monkeypatch.setattr(queries, "convert_next_rows", convert)
    written += _write_events(zoned, 2)
    (finished,) = migrate_buffers(app, [ActivityEvent.__table__], batch_size=4)
    assert (12, []) == (finished.rows, _off_by_more_than_a_second(zoned, written))


def test_a_run_told_to_stop_stops_between_batches_and_the_next_finishes(zoned: Engine) -> None:
    """A progress that asks to stop after two batches: StoppedError saying the rows converted,
    and the next run converts the rest, no row twice."""
    app = _buffer_as_older_release(zoned)
    written = _write_events(zoned, 20)

    class StopAfterTwo(Progress):
        batches = 0

        def advance(self, done: int) -> None:
            self.batches += 1

        def should_stop(self) -> bool:
            return self.batches >= 2

    with pytest.raises(StoppedError) as stopped:
        migrate_buffers(app, [ActivityEvent.__table__], batch_size=4, progress=StopAfterTwo())
    (finished,) = migrate_buffers(app, [ActivityEvent.__table__], batch_size=4)
    assert (f"converted 8 rows of {BUFFER} to UTC", 12, []) == (
        stopped.value.summary,
        finished.rows,
        _off_by_more_than_a_second(zoned, written),
    )


def test_a_dry_run_counts_and_changes_nothing(zoned: Engine) -> None:
    """--dry-run: the default and the rows it would convert, and every row left as it was."""
    app = _buffer_as_older_release(zoned)
    _write_events(zoned, 4)
    before = _created_at(zoned)
    (plan,) = migrate_buffers(app, [ActivityEvent.__table__], dry_run=True)
    (finding,) = check(app, [ActivityEvent.__table__])
    assert (True, 4, True, before) == (plan.switch, plan.rows, finding.refuse, _created_at(zoned))


def _created_at(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text(f"SELECT created_at FROM {BUFFER} ORDER BY id")).scalars())


def test_a_worker_refuses_a_buffer_on_the_local_clock(zoned: Engine) -> None:
    """A worker in a session outside UTC does not start on a buffer that defaults to local
    time: one line naming the buffer, the zone and the command that mends it."""
    app = _buffer_as_older_release(zoned)
    with pytest.raises(LocalClockError) as refused:
        Worker(app, burst=True).run()
    message = str(refused.value)
    zone = _session_zone(zoned)
    assert (True, True, True) == (
        f"buffer {BUFFER}:" in message,
        f"time zone is {zone}" in message,
        "outbox migrate-buffers" in message,
    )


def _session_zone(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT @@session.time_zone")).scalar_one())


def test_a_utc_session_only_warns(mariadb_url: str) -> None:
    """In a UTC session the local default is a warning, not a refusal."""
    engine = _in_zone(mariadb_url, "+00:00")
    try:
        app = _buffer_as_older_release(engine)
        findings = check(app, [ActivityEvent.__table__])
    finally:
        engine.dispose()
    assert [(BUFFER, False)] == [(f.buffer, f.refuse) for f in findings]
