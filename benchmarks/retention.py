"""Retention of the archive on PostgreSQL: a day taken out of a partitioned archive against
today's DELETE-based prune of the same day, and the job table's dead tuples.

Two scratch databases (``retention_bench_plain``, ``retention_bench_days``) get the same
archive: ``--rows`` rows archived evenly over ``--days`` UTC days, generated in the database
(``INSERT ... SELECT generate_series``, ``--chunk`` rows a transaction), one in a hundred of
the even days' rows dead letters (the odd days have none). ``plain`` is the archive as
``metadata.create_all`` makes it (one table); ``days`` is the archive as migration 0010 makes
it (a partition per day, each split by status), its days made ahead by the retention's own
statement. Both are analyzed and vacuumed before anything is measured.

Then, on each, the first two days go, as each database's archive lets them:

- ``plain``: today's ``outbox prune`` (``delete_old_archived``, 1,000 rows a transaction, the
  statuses that are history), a day at a time; then the ``VACUUM`` its dead tuples need.
- ``days``: the retention's statement for a day past its age (``retire_archive_day``): the
  first day has dead letters, so its history leaf is truncated and the day stays with them;
  the second has none and is dropped whole.

For each step: its wall time, the longest lock of each mode seen held on the archive's
relations (a second connection polls ``pg_locks`` every ``--poll-ms``: a lock shorter than a
poll may go unseen; a DDL's lock is held for the whole of its transaction, which is timed
too), table and index sizes and live and dead tuples (``pg_stat_user_tables``) before and
after, and the dead letters of the day before and after (they must stay).

The job table (``--jobs``): batch jobs inserted and deleted a thousand at a time, as groups
come and go, with autovacuum off as on the test server: its dead tuples and size, then a
``VACUUM``'s time and the size after, then the same churn again (the space is reused).

On MariaDB (``--mariadb-rows``, 0: skipped), in a scratch database ``retention_bench_maria``:
the archive at migration 0009 with that many rows archived over the week before, migration
0010 timed (the one copy MariaDB's repartitioning makes); then as many rows archived over the
next ``--days`` days, one day with dead letters, one without: retention's statement for each
(an exchange and the dead letters written back; a drop) against `prune`'s deletes of a third
day, with the partitions' sizes (``information_schema.PARTITIONS``, InnoDB's estimates) before
and after. A DDL holds the table's metadata lock for the whole of its statement, which is
timed.

    python -m benchmarks.retention --rows 5000000 --days 7 --jobs 500000 --mariadb-rows 1000000

``--migration-rows`` measures PostgreSQL's migrations 0009 and 0010 alone, on an archive of as
many rows over the week before, a writer and a reader going on throughout (the longest each
waited, and the locks seen):

    python -m benchmarks.retention --migration-rows 5000000 --days 7

``--skip-plain`` measures the partitioned archive alone, for a week at the full size:

    python -m benchmarks.retention --rows 50000000 --days 7 --jobs 0 --mariadb-rows 0 --skip-plain
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, text

from benchmarks._common import command_line, drop_database, machine, scratch_database, write
from outbox import schema
from outbox._db import queries
from outbox.ops.archive import PRUNE_STATUSES
from outbox.ops.migrate import migrate, upgrade

_STRONG = ("AccessExclusiveLock", "ExclusiveLock", "ShareRowExclusiveLock", "ShareLock")


class LockWatch:
    """Polls ``pg_locks`` from a connection of its own; keeps, per mode, the longest time a
    lock on an ``outbox_archive*`` relation was seen held by one session."""

    def __init__(self, engine: Engine, every: float) -> None:
        self.engine = engine
        self.every = every
        self.longest: dict[str, tuple[float, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LockWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        seen: dict[tuple[int, str, str], float] = {}
        with self.engine.connect() as conn:
            conn.execute(text("SET application_name = 'retention_lock_watch'"))
            while not self._stop.is_set():
                now = time.perf_counter()
                rows = conn.execute(
                    text(
                        "SELECT l.pid, c.relname, l.mode FROM pg_locks l "
                        "JOIN pg_class c ON c.oid = l.relation "
                        "WHERE l.granted AND l.pid <> pg_backend_pid() "
                        "AND c.relname LIKE 'outbox_archive%'"
                    )
                ).all()
                conn.commit()
                current = {(r.pid, r.relname, r.mode) for r in rows}
                for key in current:
                    seen.setdefault(key, now)
                for key in list(seen):
                    held = now - seen[key]
                    if held > self.longest.get(key[2], (0.0, ""))[0]:
                        self.longest[key[2]] = (held, key[1])
                    if key not in current:
                        del seen[key]
                time.sleep(self.every)

    def report(self) -> dict[str, Any]:
        """The longest lock seen per mode: seconds and the relation."""
        return {
            mode: {"seconds": round(held, 4), "relation": relation}
            for mode, (held, relation) in sorted(self.longest.items())
        }


def _sizes(conn: Connection, partitioned: bool) -> dict[str, Any]:
    """Heap and index bytes, live and dead tuples of the archive (every leaf)."""
    time.sleep(0.5)  # the ended sessions' statistics reach pg_stat_*
    leaves = (
        "SELECT relid FROM pg_partition_tree('outbox_archive') WHERE isleaf"
        if partitioned
        else "SELECT 'outbox_archive'::regclass"
    )
    row = conn.execute(
        text(
            "SELECT sum(pg_table_size(s.relid))::bigint AS heap, "
            "sum(pg_indexes_size(s.relid))::bigint AS indexes, "
            "sum(s.n_live_tup)::bigint AS live, sum(s.n_dead_tup)::bigint AS dead, "
            "count(*) AS leaves "
            f"FROM pg_stat_user_tables s WHERE s.relid IN ({leaves})"
        )
    ).one()
    conn.commit()
    return {
        "heap_mib": round(row.heap / 2**20, 1),
        "indexes_mib": round(row.indexes / 2**20, 1),
        "live_tuples": int(row.live),
        "dead_tuples": int(row.dead),
        "leaves": int(row.leaves),
    }


def _dead_letters(conn: Connection, day: dt.date) -> int:
    start = dt.datetime.combine(day, dt.time(), dt.UTC)
    found = conn.execute(
        text(
            "SELECT count(*) FROM outbox_archive WHERE status = 'dead' "
            "AND archived_at >= :start AND archived_at < :end"
        ),
        {"start": start, "end": start + dt.timedelta(days=1)},
    ).scalar_one()
    conn.commit()
    return int(found)


def _fill(url: Any, first: dt.date, args: argparse.Namespace) -> float:
    # An engine of its own, disposed before the VACUUM ANALYZE: its sessions' counts reach the
    # statistics as they end, and would otherwise be added after the analyze counted the rows.
    engine = create_engine(url)
    start = dt.datetime.combine(first, dt.time(), dt.UTC)
    began = time.perf_counter()
    for low in range(1, args.rows + 1, args.chunk):
        high = min(low + args.chunk - 1, args.rows)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO outbox_archive (handler, buffer, event_id, status, attempts, "
                    " payload, created_at, archived_at) "
                    "SELECT 'bench', 'bench_events', g, "
                    " CASE WHEN g % 100 = 0 AND (extract(day FROM t.at)::int % 2) = "
                    "  (extract(day FROM :start)::int % 2) THEN 'dead' ELSE 'succeeded' END, "
                    " 1, jsonb_build_object('id', g, 'body', 'event number ' || g, "
                    "  'amount', g % 1000), t.at - interval '1 second', t.at "
                    "FROM generate_series(CAST(:low AS bigint), CAST(:high AS bigint)) g, "
                    "LATERAL (SELECT CAST(:start AS timestamptz) "
                    "  + (g - 1) * (CAST(:days AS integer) * interval '1 day') "
                    "  / CAST(:rows AS bigint) AS at) t"
                ),
                {"low": low, "high": high, "start": start, "days": args.days, "rows": args.rows},
            )
    engine.dispose()
    vacuum = create_engine(url, isolation_level="AUTOCOMMIT")
    with vacuum.connect() as conn:
        conn.execute(text("VACUUM ANALYZE outbox_archive"))
    vacuum.dispose()
    return time.perf_counter() - began


def _prune_day(engine: Engine, day: dt.date) -> int:
    """Today's prune of everything archived before the end of ``day`` (the statuses that are
    history), 1,000 rows a transaction, as ``outbox prune`` runs it."""
    end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.UTC)
    total = 0
    start: dt.datetime | None = None
    while True:
        with engine.begin() as conn:
            now = queries.database_now(conn)
            older_than = (now - end).total_seconds()
            chunk = queries.delete_old_archived(conn, older_than, 1000, PRUNE_STATUSES, start)
        total += chunk.deleted
        start = chunk.last_archived_at
        if chunk.deleted < 1000:
            return total


def _measure(engine: Engine, watch_every: float, work: Any) -> dict[str, Any]:
    """Run ``work(worker)`` on an engine of its own, watched; the engine is disposed after,
    so that its sessions' statistics reach pg_stat_* (a session reports them when it ends,
    or idle, every ten seconds)."""
    worker = create_engine(engine.url)
    with LockWatch(engine, watch_every) as watch:
        began = time.perf_counter()
        outcome = work(worker)
        seconds = time.perf_counter() - began
    worker.dispose()
    return {"seconds": round(seconds, 3), "outcome": outcome, "longest_locks": watch.report()}


def _first_two_days(
    engine: Engine,
    first: dt.date,
    args: argparse.Namespace,
    partitioned: bool,
    what: str,
    work: Any,
) -> list[dict[str, Any]]:
    """``work(engine, day)`` on ``first`` and the day after, each measured, with the sizes and
    the day's dead letters before and after."""
    steps = []
    with engine.connect() as conn:
        for day in (first, first + dt.timedelta(days=1)):
            before = _sizes(conn, partitioned)
            dead_before = _dead_letters(conn, day)
            step = _measure(engine, args.poll_ms / 1000, lambda w, d=day: work(w, d))
            step.update(
                day=str(day),
                what=what,
                before=before,
                after=_sizes(conn, partitioned),
                dead_letters=[dead_before, _dead_letters(conn, day)],
            )
            steps.append(step)
    return steps


def _plain(args: argparse.Namespace, first: dt.date) -> dict[str, Any]:
    url = scratch_database("retention_bench_plain")
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            schema.metadata.create_all(conn)
        filled = _fill(engine.url, first, args)
        steps = _first_two_days(
            engine, first, args, False, "prune (DELETE, 1,000 rows a transaction)", _prune_day
        )
        with engine.connect() as conn:
            step = _measure(engine, args.poll_ms / 1000, _vacuum_archive)
            step.update(what="VACUUM after the prunes", after=_sizes(conn, False))
            steps.append(step)
        return {"fill_seconds": round(filled, 1), "steps": steps}
    finally:
        engine.dispose()
        drop_database("retention_bench_plain")


def _vacuum_archive(engine: Engine) -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM outbox_archive"))


def _retire(engine: Engine, day: dt.date) -> dict[str, Any]:
    with engine.connect() as conn:
        began = time.perf_counter()
        with conn.begin():
            done = queries.retire_archive_day(conn, day, 1.0)
        assert done is not None, f"no partition of {day}"
        return {"retired": done.value, "transaction_seconds": round(time.perf_counter() - began, 4)}


def _days(args: argparse.Namespace) -> tuple[dt.date, dict[str, Any]]:
    url = scratch_database("retention_bench_days")
    engine = create_engine(url)
    try:
        upgrade(engine)
        with engine.begin() as conn:
            cut_day = queries.archive_first_day(conn)
            assert cut_day is not None
        # The migration's day holds its rows from the cut on: the next day is whole.
        first = cut_day + dt.timedelta(days=1)
        for offset in range(args.days):
            with engine.begin() as conn:
                queries.make_archive_day(conn, first + dt.timedelta(days=offset), 1.0)
        filled = _fill(engine.url, first, args)
        steps = _first_two_days(
            engine, first, args, True, "retention: the day's history taken out", _retire
        )
        jobs = _job_churn(engine, args.jobs) if args.jobs else None
        return first, {"fill_seconds": round(filled, 1), "steps": steps, "jobs": jobs}
    finally:
        engine.dispose()
        drop_database("retention_bench_days")


class Traffic:
    """A writer archiving a row, and a reader reading the newest, every ``every`` seconds on
    connections of their own while a migration runs: the longest each waited."""

    def __init__(self, engine: Engine, every: float) -> None:
        self.engine = engine
        self.every = every
        self.longest = {"insert": 0.0, "read": 0.0}
        self.count = {"insert": 0, "read": 0}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(kind,), daemon=True)
            for kind in ("insert", "read")
        ]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _run(self, kind: str) -> None:
        statement = text(
            "INSERT INTO outbox_archive (handler, buffer, event_id, status, attempts, payload) "
            "VALUES ('bench', 'bench_events', 0, 'succeeded', 1, '{}')"
            if kind == "insert"
            else "SELECT id FROM outbox_archive ORDER BY id DESC LIMIT 1"
        )
        with self.engine.connect() as conn:
            while not self._stop.is_set():
                began = time.perf_counter()
                try:
                    conn.execute(statement)
                    conn.commit()
                except Exception as error:  # a refused row is the figure, not a crash
                    conn.rollback()
                    self.errors.append(f"{kind}: {str(error).splitlines()[0]}")
                waited = time.perf_counter() - began
                self.longest[kind] = max(self.longest[kind], waited)
                self.count[kind] += 1
                time.sleep(self.every)

    def report(self) -> dict[str, Any]:
        return {
            "longest_insert_seconds": round(self.longest["insert"], 4),
            "longest_read_seconds": round(self.longest["read"], 4),
            "inserts": self.count["insert"],
            "reads": self.count["read"],
            "errors": self.errors[:5],
        }


def _pg_migration(args: argparse.Namespace) -> dict[str, Any]:
    """Revisions 0009 and 0010 on an archive of ``--migration-rows`` rows over the week
    before, a writer and a reader going on throughout; the locks seen and the longest waits."""
    url = scratch_database("retention_bench_migration")
    engine = create_engine(url)
    try:
        migrate(engine, "0008")
        today = dt.datetime.now(dt.UTC).date()
        fill = argparse.Namespace(rows=args.migration_rows, days=args.days, chunk=args.chunk)
        filled = _fill(engine.url, today - dt.timedelta(days=args.days), fill)
        steps = []
        for revision in ("0009", "0010"):
            with Traffic(engine, 0.005) as traffic:
                step = _measure(engine, args.poll_ms / 1000, lambda w, r=revision: migrate(w, r))
            step.update(revision=revision, traffic=traffic.report())
            step.pop("outcome")
            steps.append(step)
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT count(*) FROM outbox_archive")).scalar_one()
        return {
            "rows": args.migration_rows,
            "fill_seconds": round(filled, 1),
            "steps": steps,
            "rows_after": int(rows),
        }
    finally:
        engine.dispose()
        drop_database("retention_bench_migration")


def _job_state(conn: Connection) -> dict[str, Any]:
    time.sleep(0.5)
    row = conn.execute(
        text(
            "SELECT pg_table_size('outbox_jobs') AS heap, pg_indexes_size('outbox_jobs') AS idx, "
            "n_live_tup, n_dead_tup FROM pg_stat_user_tables WHERE relname = 'outbox_jobs'"
        )
    ).one()
    conn.commit()
    return {
        "heap_kib": row.heap // 1024,
        "indexes_kib": row.idx // 1024,
        "live_tuples": int(row.n_live_tup),
        "dead_tuples": int(row.n_dead_tup),
    }


def _churn(url: Any, jobs: int) -> float:
    engine = create_engine(url)
    began = time.perf_counter()
    for _ in range(max(jobs // 1000, 1)):
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO outbox_jobs (kind, handler, group_id, priority) "
                    "SELECT 'batch', 'bench', gen_random_uuid(), 0 FROM generate_series(1, 1000)"
                )
            )
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM outbox_jobs WHERE kind = 'batch'"))
    seconds = time.perf_counter() - began
    engine.dispose()  # its statistics reach pg_stat_* as its sessions end
    return seconds


def _job_churn(engine: Engine, jobs: int) -> dict[str, Any]:
    with engine.connect() as conn:
        first = _churn(engine.url, jobs)
        after = _job_state(conn)
        vacuum = create_engine(engine.url, isolation_level="AUTOCOMMIT")
        with vacuum.connect() as session:
            began = time.perf_counter()
            session.execute(text("VACUUM outbox_jobs"))
            vacuum_seconds = time.perf_counter() - began
        vacuum.dispose()
        vacuumed = _job_state(conn)
        second = _churn(engine.url, jobs)
        again = _job_state(conn)
    return {
        "jobs": jobs,
        "churn_seconds": round(first, 1),
        "after_churn": after,
        "vacuum_seconds": round(vacuum_seconds, 3),
        "after_vacuum": vacuumed,
        "second_churn_seconds": round(second, 1),
        "after_second_churn": again,
    }


MARIADB_ADMIN_URL = "mysql+pymysql://root@127.0.0.1:3306/test"


def _maria_sizes(conn: Connection) -> dict[str, Any]:
    conn.execute(text("ANALYZE TABLE outbox_archive")).all()
    row = conn.execute(
        text(
            "SELECT SUM(DATA_LENGTH) AS data, SUM(INDEX_LENGTH) AS idx, SUM(TABLE_ROWS) AS n, "
            "COUNT(*) AS parts FROM information_schema.PARTITIONS "
            "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_archive'"
        )
    ).one()
    conn.commit()
    return {
        "data_mib": round(int(row.data) / 2**20, 1),
        "indexes_mib": round(int(row.idx) / 2**20, 1),
        "rows_estimated": int(row.n),
        "partitions": int(row.parts),
    }


def _maria_fill(engine: Engine, start: dt.datetime, rows: int, days: int) -> float:
    began = time.perf_counter()
    for low in range(1, rows + 1, 250_000):
        high = min(low + 249_999, rows)
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO outbox_archive (handler, buffer, event_id, status, attempts, "
                    " payload, created_at, archived_at) "
                    "SELECT 'bench', 'bench_events', seq, "
                    " IF(seq % 100 = 0 AND FLOOR((seq - 1) * :days / :rows) % 2 = 0, "
                    "  'dead', 'succeeded'), 1, "
                    " JSON_OBJECT('id', seq, 'body', CONCAT('event number ', seq), "
                    "  'amount', seq % 1000), at - INTERVAL 1 SECOND, at "
                    "FROM (SELECT seq, :start + INTERVAL FLOOR((seq - 1) * 86400 * :days "
                    "  / :rows) SECOND AS at FROM seq_1_to_" + str(rows) + " "
                    "  WHERE seq BETWEEN :low AND :high) s"
                ),
                {
                    "start": start.replace(tzinfo=None),
                    "days": days,
                    "rows": rows,
                    "low": low,
                    "high": high,
                },
            )
    return time.perf_counter() - began


def _mariadb(args: argparse.Namespace) -> dict[str, Any]:
    admin = create_engine(MARIADB_ADMIN_URL)
    with admin.begin() as conn:
        conn.execute(text("DROP DATABASE IF EXISTS retention_bench_maria"))
        conn.execute(text("CREATE DATABASE retention_bench_maria CHARACTER SET utf8mb4"))
    engine = create_engine(admin.url.set(database="retention_bench_maria"))
    try:
        migrate(engine, "0009")
        today = dt.datetime.now(dt.UTC).date()
        week_before = dt.datetime.combine(today - dt.timedelta(days=args.days), dt.time(), dt.UTC)
        filled = _maria_fill(engine, week_before, args.mariadb_rows, args.days)
        began = time.perf_counter()
        migrate(engine, "0010")
        migration = time.perf_counter() - began
        with engine.begin() as conn:
            for offset in range(args.days):
                day = today + dt.timedelta(days=offset)
                if day not in {p.day for p in queries.archive_partitions(conn)}:
                    queries.make_archive_day(conn, day, 1.0)
        start = dt.datetime.combine(today, dt.time(), dt.UTC)
        _maria_fill(engine, start, args.mariadb_rows, args.days)
        steps = []
        with engine.connect() as conn:
            for day in (today, today + dt.timedelta(days=1)):
                before = _maria_sizes(conn)
                dead_before = _dead_letters(conn, day)
                began = time.perf_counter()
                with conn.begin():
                    done = queries.retire_archive_day(conn, day, 1.0)
                assert done is not None, f"no partition of {day}"
                seconds = time.perf_counter() - began
                steps.append(
                    {
                        "day": str(day),
                        "what": f"retention ({done.value})",
                        "seconds": round(seconds, 3),
                        "before": before,
                        "after": _maria_sizes(conn),
                        "dead_letters": [dead_before, _dead_letters(conn, day)],
                    }
                )
            third = today + dt.timedelta(days=2)
            before = _maria_sizes(conn)
            began = time.perf_counter()
            deleted = _prune_day_only(engine, third)
            steps.append(
                {
                    "day": str(third),
                    "what": f"prune's deletes of the day ({deleted:,} rows)",
                    "seconds": round(time.perf_counter() - began, 3),
                    "before": before,
                    "after": _maria_sizes(conn),
                }
            )
        return {
            "rows": args.mariadb_rows,
            "fill_seconds": round(filled, 1),
            "migration_0010_seconds": round(migration, 2),
            "steps": steps,
        }
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text("DROP DATABASE IF EXISTS retention_bench_maria"))
        admin.dispose()


def _prune_day_only(engine: Engine, day: dt.date) -> int:
    """Prune's statement (``delete_old_archived``, 1,000 rows a transaction) on one day's rows
    alone, from the day's start: the days before it are not prune's to take here."""
    end = dt.datetime.combine(day + dt.timedelta(days=1), dt.time(), dt.UTC)
    total = 0
    start: dt.datetime | None = dt.datetime.combine(day, dt.time(), dt.UTC)
    while True:
        with engine.begin() as conn:
            now = queries.database_now(conn)
            now = now.replace(tzinfo=dt.UTC) if now.tzinfo is None else now
            chunk = queries.delete_old_archived(
                conn, (now - end).total_seconds(), 1000, PRUNE_STATUSES, start
            )
        total += chunk.deleted
        start = chunk.last_archived_at or start
        if chunk.deleted < 1000:
            return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--chunk", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=500_000)
    parser.add_argument("--poll-ms", type=float, default=2.0)
    parser.add_argument("--mariadb-rows", type=int, default=1_000_000)
    parser.add_argument(
        "--migration-rows",
        type=int,
        default=0,
        help="PostgreSQL's migrations 0009 and 0010 on an archive of as many rows, under "
        "traffic: stored as retention_migration_<rows>.json",
    )
    parser.add_argument("--skip-postgresql", action="store_true")
    parser.add_argument(
        "--skip-plain",
        action="store_true",
        help="only the partitioned archive (a large --rows): stored as retention_<rows>.json",
    )
    args = parser.parse_args()
    load = Path("/proc/loadavg").read_text()
    if args.skip_postgresql:
        # Only MariaDB: the PostgreSQL figures of the last run are kept.
        from benchmarks._common import RESULTS

        stored = json.loads((RESULTS / "retention.json").read_text())
        stored["mariadb"] = _mariadb(args) if args.mariadb_rows else None
        stored["mariadb_command"] = command_line("benchmarks.retention", args)
        path = write("retention", stored)
        print(path.read_text())
        return
    if args.migration_rows:
        path = write(
            f"retention_migration_{args.migration_rows}",
            {
                "benchmark": "retention_migration",
                "command": command_line("benchmarks.retention", args),
                "machine": machine(),
                "load_at_start": load.split()[:3],
                "migration": _pg_migration(args),
            },
        )
        print(path.read_text())
        return
    first, days = _days(args)
    plain = None if args.skip_plain else _plain(args, first)
    maria = _mariadb(args) if args.mariadb_rows else None
    path = write(
        f"retention_{args.rows}" if args.skip_plain else "retention",
        {
            "benchmark": "retention",
            "command": command_line("benchmarks.retention", args),
            "machine": machine(),
            "load_at_start": load.split()[:3],
            "rows": args.rows,
            "days": args.days,
            "plain": plain,
            "partitioned": days,
            "mariadb": maria,
        },
    )
    print(path.read_text())


if __name__ == "__main__":
    main()
