r"""Many databases under one ``outbox work``: fairness across them, and one of them going away.

    python -m benchmarks.many_databases --events 1000000 --seconds 60 --runs 2

A smoke run: ``--events 20000 --seconds 15 --runs 1 --results many_databases_smoke`` (the
results go to a file of that name instead; ``--scenarios fairness`` or ``outage``: one of them).

Both scenarios run the real command, ``python -m outbox --app benchmarks.many_app:app work``
(one worker process per database, under one supervisor), with the defaults a user has: the
handler's batch size 1,000 and ``Urgency.HOUR``, ``Settings()`` (polling every second,
``network_timeout`` 30 s), four threads per worker. The application's registry reads the
databases from ``BENCH_MANY_DATABASES``; its handler appends, per batch, each event's id and
age (handler start less ``created_at``, the database's clock at insert) to a file per worker
process (``benchmarks.many_app``).

**fairness** (``--scenarios fairness``): two databases on the machine's PostgreSQL,
``bench_many_big`` and ``bench_many_small``. A run with a backlog COPYs ``--events``
(1,000,000) events into ``big`` before the command starts; the baseline run leaves ``big``
empty. Once the workers have registered (and, with the backlog, ``big``'s drain is under way)
and two more seconds have passed, ``small`` gets its ``--small-events`` (100) in one
transaction: a tenant that has 100 events to deliver while another has a million. Measured:
each of the 100 events' latency (``created_at``, the transaction's start, to the handler's
start), the time from the commit until the last of them was handled, ``big``'s backlog then,
and ``big``'s drain rate (events over the time from its first handler start to its last).
The notify triggers are installed on both buffers (``--polling``: not), so that what the small
database's events wait for is its worker, not where in its one-second poll they happened to
land. Baseline and backlog runs take turns, ``--runs`` of each.

**outage** (``--scenarios outage``): three databases, ``bench_many_a`` and ``bench_many_b`` on
the machine's PostgreSQL and ``bench_many_c`` on a private cluster the benchmark starts
(``tests.faults._cluster.PrivateCluster``: initdb into a temporary directory, on a free port,
removed at the end). No notify trigger (a user's default). A producer process per database
commits one event per transaction, ``--rate`` (200) a second, for ``--seconds`` (60), through
plain psycopg; a sampler thread per database reads the oldest event's age every 0.5 s (on
average, at random instants: see ``Sampler``) with the query ``outbox status`` uses
(``outbox._db.queries.oldest_event_age``: the age of the lowest id still in the buffer,
claimed or not; 0 when empty). In the outage variant the private cluster is stopped (``pg_ctl
stop -m immediate``) a third of the way in and started again two thirds of the way in. Its
producer then fails a write, and retries connecting every 0.2 s; the events it could not write
while the server was down are the application's failures, not caught up afterwards (after
reconnecting it goes on at the rate from there). A commit whose acknowledgement was lost with
the connection counts as in doubt. Figures per run: the p95 of each database's sampled oldest
age over the producers' window; for ``c``, the events committed before the stop that were still
waiting when it came, and the time from the restart until the last of them was handled, and
until its sampled oldest age was back under the highest it had been before the stop; per
database, events committed and handled (distinct ids): none lost means every acknowledged id
handled, and nothing handled beyond them but in-doubt commits.
Baseline and outage take turns (A B A B for ``--runs 2``); each pair's ratio, the outage's p95
over the baseline's for ``a`` and ``b``, is reported apart (this machine's speed drifts).

The command's log (JSON lines) is read after each run: its lines counted by level and event,
and those other than routine work (warnings, errors, a database recovering) kept in order
with their time from the run's start, so that what the workers and the supervisor said about
the outage is in the results.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import multiprocessing
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.queues import Queue
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

import psycopg
from sqlalchemy import create_engine
from sqlalchemy.exc import SQLAlchemyError

from benchmarks._common import (
    REPOSITORY,
    command_line,
    drop_database,
    fresh_tables,
    libpq_url,
    machine,
    percentile,
    scratch_database,
    summary,
    write,
)
from benchmarks.many_app import DATABASES_ENV, HANDLED_ENV, Base, ManyEvent, app
from benchmarks.report.targets import OUTAGE_P95_RATIO
from outbox._db import queries
from outbox.ops import notify
from tests.faults._cluster import PrivateCluster

APP = "benchmarks.many_app:app"
BUFFER = ManyEvent.__tablename__
PREFIX = "bench_many_"
SETTLE_SECONDS = 2.0  # after the workers registered (and big's drain began): the small write
SAMPLE_SECONDS = 0.5  # the oldest-age sampler's period
RECONNECT_SECONDS = 0.2  # a producer's pause between attempts to reach a downed database
DRAIN_TIMEOUT_SECONDS = 900.0
INFINITY = float("inf")  # the handling time of an event never handled
NOTABLE_LINES = 40  # of a run's log, kept in the results


# --- the command under test ---------------------------------------------------------------------


class Work:
    """One ``outbox work`` on the databases named, its handled records and log in a directory."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="outbox-many-"))
        self.log = self.directory / "work.log"
        env = {**os.environ, DATABASES_ENV: json.dumps(urls), HANDLED_ENV: str(self.directory)}
        command = [sys.executable, "-m", "outbox", "--app", APP, "--log-format", "json", "work"]
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                command, cwd=REPOSITORY, env=env, stdout=log, stderr=subprocess.STDOUT
            )
        self.started = time.time()

    def stop(self) -> None:
        """SIGTERM (graceful), as a service manager stops it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def handled_any(self) -> bool:
        """Whether some handler has recorded a batch."""
        return any(path.stat().st_size for path in self.directory.glob("handled-*.log"))

    def events_logged(self, t0: float) -> dict[str, Any]:
        """The command's log lines counted by level and event (JSON lines; others as text),
        and those that say something other than routine work (anything but ``info``, and the
        database recovering) in order, timed from ``t0`` (wall clock)."""
        counted: Counter[str] = Counter()
        notable: list[dict[str, Any]] = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                counted[f"text: {line[:100]}"] += 1
                continue
            if not isinstance(entry, dict):
                continue
            level, event = entry.get("level", "?"), entry.get("event", "?")
            counted[f"{level}: {event}"] += 1
            if (level != "info" or "recovered" in event) and len(notable) < NOTABLE_LINES:
                at = dt.datetime.fromisoformat(entry["timestamp"]).timestamp() - t0
                said = {"at_s": round(at, 2), "level": level, "event": event}
                for key in ("worker", "error", "delay", "pid"):
                    if key in entry:
                        said[key] = str(entry[key])[:160]
                notable.append(said)
        return {"counted": dict(sorted(counted.items())), "notable": notable}

    def remove(self) -> None:
        """Delete the handled records and the log."""
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def work(urls: dict[str, str]) -> Iterator[Work]:
    """A running ``outbox work``, stopped and its files removed at the end."""
    command = Work(urls)
    try:
        yield command
    finally:
        command.stop()
        command.remove()


@dataclass
class Handled:
    """What the handlers recorded for one database."""

    events: int = 0
    """Events handled, a repeat counted again."""
    first: float | None = None
    """The first batch's handler start (wall clock)."""
    last: float | None = None
    """The last batch's handler start."""
    by_id: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Event id -> (handler start, age) of its first handling (only where asked)."""
    repeats: int = 0
    """Events handled again after their first handling."""


def read_handled(directory: Path, detail: set[str]) -> dict[str, Handled]:
    """Every batch the handlers recorded, per database; ids and ages for ``detail``'s."""
    found: dict[str, Handled] = {}
    for path in directory.glob("handled-*.log"):
        with path.open() as lines:
            for line in lines:
                db, started, *pairs = line.split()
                at = float(started)
                record = found.setdefault(db, Handled())
                record.events += len(pairs)
                record.first = at if record.first is None else min(record.first, at)
                record.last = at if record.last is None else max(record.last, at)
                if db not in detail:
                    continue
                for pair in pairs:
                    event, age = pair.split(":")
                    key = int(event)
                    if key in record.by_id:
                        record.repeats += 1
                        if at < record.by_id[key][0]:
                            record.by_id[key] = (at, float(age))
                    else:
                        record.by_id[key] = (at, float(age))
    return found


def wait_registered(urls: dict[str, str], timeout: float = 120.0) -> None:
    """Until a worker has registered in each database (its row in ``outbox_workers``)."""
    deadline = time.monotonic() + timeout
    for name, url in urls.items():
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            while not conn.execute("SELECT count(*) FROM outbox_workers").fetchone()[0]:  # type: ignore[index]
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no worker registered in {name} within {timeout:g} s")
                time.sleep(0.1)


def remaining(url: str) -> int:
    """Events still in a database's buffer (claimed or not)."""
    with psycopg.connect(libpq_url(url)) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {BUFFER}").fetchone()[0])  # type: ignore[index]


def wait_empty(urls: dict[str, str], timeout: float, every: float = 0.2) -> float:
    """Until every buffer named is empty; the wall-clock time it was seen so."""
    deadline = time.monotonic() + timeout
    with contextlib.ExitStack() as stack:
        conns = [
            stack.enter_context(psycopg.connect(libpq_url(url), autocommit=True))
            for url in urls.values()
        ]
        while True:
            query = f"SELECT EXISTS (SELECT 1 FROM {BUFFER})"
            if not any(conn.execute(query).fetchone()[0] for conn in conns):  # type: ignore[index]
                return time.time()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{', '.join(urls)} not drained within {timeout:g} s")
            time.sleep(every)


def prepare(urls: dict[str, str], triggers: bool) -> None:
    """Fresh outbox tables and buffer in each database; the notify triggers if asked."""
    os.environ[DATABASES_ENV] = json.dumps(urls)  # app.on(name) reads the registry
    for name, url in urls.items():
        fresh_tables(url, Base.metadata)
        if triggers:
            view = app.on(name)
            notify.install(view)
            view.engine.dispose()


# --- fairness ------------------------------------------------------------------------------------


def load_backlog(url: str, events: int) -> None:
    """COPY ``events`` events into ``big``'s buffer, then VACUUM ANALYZE it, as a backlog
    written before the command started."""
    chunk = "big\n" * 100_000
    with psycopg.connect(libpq_url(url)) as conn:
        with conn.cursor() as cursor, cursor.copy(f"COPY {BUFFER} (db) FROM STDIN") as copy:
            for start in range(0, events, 100_000):
                copy.write(chunk if events - start >= 100_000 else "big\n" * (events - start))
        conn.commit()
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(f"VACUUM ANALYZE {BUFFER}")


def write_small(url: str, events: int) -> tuple[float, float]:
    """``events`` events in one transaction; (the transaction's start by the database's clock,
    the commit's return by this machine's), both wall-clock seconds."""
    with psycopg.connect(libpq_url(url)) as conn:
        (began,) = conn.execute("SELECT extract(epoch FROM now())::float8").fetchone()  # type: ignore[misc]
        conn.execute(
            f"INSERT INTO {BUFFER} (db) SELECT 'small' FROM generate_series(1, %s)", (events,)
        )
        conn.commit()
        return float(began), time.time()


def fairness_run(
    urls: dict[str, str], backlog: int, small_events: int, triggers: bool
) -> dict[str, Any]:
    """One run: ``backlog`` events waiting in big (0: the baseline), small's events written
    while they drain; the small events' latencies and big's drain rate."""
    prepare(urls, triggers)
    if backlog:
        load_backlog(urls["big"], backlog)
    with work(urls) as command:
        wait_registered(urls)
        deadline = time.monotonic() + 120
        while backlog and not command.handled_any():
            if time.monotonic() > deadline:
                raise RuntimeError("big's drain did not start within 120 s")
            time.sleep(0.05)
        time.sleep(SETTLE_SECONDS)
        big_before = remaining(urls["big"]) if backlog else 0
        began, committed = write_small(urls["small"], small_events)
        small_empty = wait_empty({"small": urls["small"]}, 120, every=0.01)
        big_after = remaining(urls["big"]) if backlog else 0
        wait_empty({"big": urls["big"]}, DRAIN_TIMEOUT_SECONDS, every=0.5)
        command.stop()
        handled = read_handled(command.directory, {"small"})
        logged = command.events_logged(command.started)
    small = handled["small"]
    if len(small.by_id) != small_events:
        raise RuntimeError(f"small: {len(small.by_id)} of {small_events} events handled")
    ages = [age for _, age in small.by_id.values()]
    last = max(at for at, _ in small.by_id.values())
    run: dict[str, Any] = {
        "variant": "backlog" if backlog else "baseline",
        "backlog": backlog,
        "small": {
            **summary(ages),
            "all_handled_after_commit_ms": round(1000 * (last - committed), 1),
            "first_handled_after_commit_ms": round(
                1000 * (min(at for at, _ in small.by_id.values()) - committed), 1
            ),
            "commit_ms": round(1000 * (committed - began), 1),
            "seen_empty_after_commit_ms": round(1000 * (small_empty - committed), 1),
            "repeats": small.repeats,
        },
        "log": logged,
    }
    if backlog:
        big = handled["big"]
        assert big.first is not None
        assert big.last is not None
        run["big"] = {
            "handled": big.events,
            "waiting_when_small_written": big_before,
            "waiting_when_small_handled": big_after,
            "drain_seconds": round(big.last - big.first, 2),
            "events_per_second": round(big.events / (big.last - big.first)),
            "first_handled_after_start_s": round(big.first - command.started, 2),
        }
    return run


def fairness(args: argparse.Namespace) -> dict[str, Any]:
    """Baseline and backlog runs, taking turns; their figures and the ratios."""
    urls = {"big": scratch_database(f"{PREFIX}big"), "small": scratch_database(f"{PREFIX}small")}
    runs: list[dict[str, Any]] = []
    try:
        for n in range(args.runs):
            for backlog in (0, args.events):
                run = fairness_run(urls, backlog, args.small_events, not args.polling)
                runs.append(run)
                print(f"fairness {run['variant']} {n + 1}: {_brief(run)}", flush=True)
    finally:
        for name in urls:
            drop_database(f"{PREFIX}{name}")
    by = {v: [r for r in runs if r["variant"] == v] for v in ("baseline", "backlog")}

    def median(variant: str, key: str) -> float:
        return float(statistics.median(r["small"][key] for r in by[variant]))

    ratios = {
        key: round(median("backlog", key) / median("baseline", key), 2)
        for key in ("all_handled_after_commit_ms", "p50_ms", "max_ms")
    }
    return {
        "events": args.events,
        "small_events": args.small_events,
        "notify_triggers": not args.polling,
        "runs": runs,
        "medians": {
            variant: {
                "all_handled_after_commit_ms": median(variant, "all_handled_after_commit_ms"),
                "p50_ms": median(variant, "p50_ms"),
                "max_ms": median(variant, "max_ms"),
            }
            for variant in by
        },
        "backlog_over_baseline": ratios,
        "big_events_per_second": [r["big"]["events_per_second"] for r in by["backlog"]],
    }


def _brief(run: dict[str, Any]) -> str:
    small = run["small"]
    text = f"small all handled {small['all_handled_after_commit_ms']} ms after commit"
    if "big" in run:
        big = run["big"]
        text += (
            f"; big {big['events_per_second']:,} events/s, "
            f"{big['waiting_when_small_written']:,} waiting when small was written"
        )
    return text


# --- outage --------------------------------------------------------------------------------------


def produce(
    name: str,
    dsn: str,
    rate: float,
    seconds: float,
    ready: Barrier,
    go: Event,
    start: Synchronized[float],
    report: Queue[dict[str, Any]],
) -> None:
    """Commit one event per transaction, ``rate`` a second, from ``start`` for ``seconds``.

    A failed write (the database went away) closes the connection; the producer then tries to
    connect every ``RECONNECT_SECONDS`` and, once through, goes on at the rate from there: the
    writes it missed are not made up. Reports the ids it saw committed with their commit
    times, and the commits whose outcome it could not know (in doubt).
    """
    conn: psycopg.Connection[Any] | None = psycopg.connect(dsn)
    ready.wait(timeout=60)
    go.wait(timeout=60)
    end = start.value + seconds
    interval = 1.0 / rate
    due = start.value
    committed: list[tuple[int, float]] = []
    failures: list[str] = []
    in_doubt = 0
    down_since: float | None = None
    down_seconds = 0.0
    while due < end:
        pause = due - time.time()
        if pause > 0:
            time.sleep(pause)
        if conn is None:
            try:
                conn = psycopg.connect(dsn, connect_timeout=2)
            except psycopg.Error:
                time.sleep(RECONNECT_SECONDS)
                continue
            assert down_since is not None
            down_seconds += time.time() - down_since
            down_since = None
            due = max(due, time.time())  # what could not be written is not made up
        stage = "insert"
        try:
            row = conn.execute(f"INSERT INTO {BUFFER} (db) VALUES (%s) RETURNING id", (name,))
            (event,) = row.fetchone()  # type: ignore[misc]
            stage = "commit"
            conn.commit()
        except psycopg.Error as error:
            failures.append(f"{stage}: {type(error).__name__}: {str(error).strip()[:120]}")
            in_doubt += stage == "commit"
            with contextlib.suppress(psycopg.Error):
                conn.close()
            conn = None
            down_since = time.time()
            continue
        committed.append((int(event), time.time()))
        due += interval
    if conn is not None:
        conn.close()
    report.put(
        {
            "name": name,
            "committed": committed,
            "in_doubt": in_doubt,
            "failures": failures,
            "down_seconds": down_seconds + (time.time() - down_since if down_since else 0.0),
        }
    )


class Sampler:
    """A thread reading one database's oldest event age every ``SAMPLE_SECONDS`` on average."""

    def __init__(self, url: str, t0: float) -> None:
        self.samples: list[tuple[float, float | None]] = []  # (seconds from t0, age or None)
        self._engine = create_engine(url, pool_pre_ping=True, connect_args={"connect_timeout": 2})
        self._t0 = t0
        self._random = random.Random()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        table = ManyEvent.__table__
        due = time.monotonic()
        while not self._stop.is_set():
            at = time.time() - self._t0
            try:
                with self._engine.connect() as conn:
                    age = queries.oldest_event_age(conn, table)  # type: ignore[arg-type]
                self.samples.append((at, 0.0 if age is None else age))
            except SQLAlchemyError:
                self.samples.append((at, None))  # unreachable
            # At random within 0.5 to 1.5 periods: a fixed period of half the workers'
            # one-second poll would read each database at one phase of its sawtooth for the
            # whole run, and its p95 would say where that phase fell, not how old events got.
            due += SAMPLE_SECONDS * (0.5 + self._random.random())
            self._stop.wait(max(0.0, due - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self._engine.dispose()


def outage_run(
    urls: dict[str, str], cluster: PrivateCluster, seconds: float, rate: float, outage: bool
) -> dict[str, Any]:
    """One run of the three databases under load; ``outage``: c's server stopped a third of
    the way in and started again two thirds of the way in."""
    prepare(urls, triggers=False)
    ready = multiprocessing.Barrier(len(urls) + 1)
    go = multiprocessing.Event()
    start: Synchronized[float] = multiprocessing.Value("d", 0.0)
    report: Queue[dict[str, Any]] = multiprocessing.Queue()
    producers = [
        multiprocessing.Process(
            target=produce,
            args=(name, libpq_url(url), rate, seconds, ready, go, start, report),
        )
        for name, url in urls.items()
    ]
    stopped_at = restarted_at = None
    with work(urls) as command:
        wait_registered(urls)
        for producer in producers:
            producer.start()
        ready.wait(timeout=60)
        t0 = time.time() + 0.2
        start.value = t0
        samplers = {name: Sampler(url, t0) for name, url in urls.items()}
        go.set()
        if outage:
            time.sleep(max(0.0, t0 + seconds / 3 - time.time()))
            cluster.crash()
            stopped_at = time.time() - t0
            time.sleep(max(0.0, t0 + 2 * seconds / 3 - time.time()))
            cluster.start()
            restarted_at = time.time() - t0
        produced = {r["name"]: r for r in (report.get(timeout=seconds + 120) for _ in producers)}
        for producer in producers:
            producer.join(30)
        drained = wait_empty(urls, 300) - t0
        for sampler in samplers.values():
            sampler.stop()
        command.stop()
        handled = read_handled(command.directory, set(urls))
        logged = command.events_logged(t0)
    databases = {}
    for name in urls:
        databases[name] = _database_figures(
            produced[name],
            handled.get(name, Handled()),
            samplers[name].samples,
            seconds,
            t0,
            (stopped_at, restarted_at) if outage and name == "c" else None,
        )
    said = {
        "worker_error_after_stop_s": _said_after(logged, "database_error", stopped_at),
        "worker_recovered_after_restart_s": _said_after(logged, "database_recovered", restarted_at),
    }
    return {
        "variant": "outage" if outage else "baseline",
        "stopped_at_s": None if stopped_at is None else round(stopped_at, 2),
        "restarted_at_s": None if restarted_at is None else round(restarted_at, 2),
        **(said if outage else {}),
        "all_drained_at_s": round(drained, 2),
        "databases": databases,
        "log": logged,
    }


def _said_after(logged: dict[str, Any], event: str, since: float | None) -> float | None:
    """Seconds from ``since`` (from the run's start) to the first log line of ``event`` at or
    after it; None when there is none."""
    if since is None:
        return None
    return next(
        (
            round(line["at_s"] - since, 2)
            for line in logged["notable"]
            if line["event"].endswith(event) and line["at_s"] >= since
        ),
        None,
    )


def _database_figures(
    produced: dict[str, Any],
    handled: Handled,
    samples: list[tuple[float, float | None]],
    seconds: float,
    t0: float,
    outage: tuple[float | None, float | None] | None,
) -> dict[str, Any]:
    """One database's figures in one outage run: oldest-age p95, losses, and for the one
    that went away, its recovery."""
    window = [age for at, age in samples if 0 <= at <= seconds and age is not None]
    committed = dict(produced["committed"])
    handled_ids = set(handled.by_id)
    lost = sorted(set(committed) - handled_ids)
    beyond = len(handled_ids - set(committed))
    figures: dict[str, Any] = {
        "committed": len(committed),
        "committed_per_second": round(len(committed) / seconds, 1),
        "in_doubt": produced["in_doubt"],
        "handled": len(handled_ids),
        "handled_again": handled.repeats,
        "lost": len(lost),
        "handled_beyond_committed": beyond,
        "none_lost": not lost and beyond <= produced["in_doubt"],
        "oldest_age_p95_s": round(percentile(window, 0.95), 3),
        "oldest_age_p50_s": round(percentile(window, 0.50), 3),
        "oldest_age_max_s": round(max(window), 3),
        "samples": len(window),
        "unreachable_samples": sum(age is None for _, age in samples),
        "producer_down_s": round(produced["down_seconds"], 2),
        "producer_failures": Counter(f.split(":")[0] for f in produced["failures"]),
        "producer_first_failure": produced["failures"][0] if produced["failures"] else None,
    }
    if outage is not None:
        stopped, restarted = outage
        assert stopped is not None
        assert restarted is not None
        # The events committed before the stop that no handler had started on when it came.
        waiting = [
            event
            for event, at in committed.items()
            if at - t0 < stopped
            and handled.by_id.get(event, (float("inf"), 0.0))[0] - t0 >= stopped
        ]
        last = max((handled.by_id[e][0] - t0 for e in waiting if e in handled.by_id), default=None)
        before = [age for at, age in samples if 0 <= at < stopped and age is not None]
        back = next(
            (
                at
                for at, age in samples
                if at > restarted and age is not None and age <= max(before, default=0.0)
            ),
            None,
        )
        figures["outage"] = {
            "waiting_at_stop": len(waiting),
            "last_of_them_handled_after_restart_s": None
            if last is None
            else round(last - restarted, 2),
            "oldest_age_highest_before_stop_s": round(max(before, default=0.0), 3),
            "oldest_age_back_under_it_after_restart_s": None
            if back is None
            else round(back - restarted, 2),
            "first_sample_after_restart": next(
                (
                    {"after_restart_s": round(at - restarted, 2), "oldest_age_s": age}
                    for at, age in samples
                    if at > restarted and age is not None
                ),
                None,
            ),
        }
    return figures


def outage(args: argparse.Namespace) -> dict[str, Any]:
    """Baseline and outage runs, taking turns (A B A B ...); each pair's ratios."""
    cluster = PrivateCluster()
    runs: list[dict[str, Any]] = []
    try:
        cluster.start()
        urls = {
            "a": scratch_database(f"{PREFIX}a"),
            "b": scratch_database(f"{PREFIX}b"),
            "c": cluster.create_database(f"{PREFIX}c"),
        }
        for n in range(args.runs):
            for down in (False, True):
                run = outage_run(urls, cluster, args.seconds, args.rate, down)
                runs.append(run)
                print(f"outage {run['variant']} {n + 1}: {_brief_outage(run)}", flush=True)
    finally:
        cluster.stop()
        for name in ("a", "b"):
            drop_database(f"{PREFIX}{name}")
    pairs = []
    for baseline, went_away in zip(runs[::2], runs[1::2], strict=True):
        pairs.append(
            {
                name: round(
                    went_away["databases"][name]["oldest_age_p95_s"]
                    / baseline["databases"][name]["oldest_age_p95_s"],
                    3,
                )
                for name in ("a", "b")
            }
        )
    return {
        "seconds": args.seconds,
        "rate_per_second": args.rate,
        "target_ratio": OUTAGE_P95_RATIO,
        "runs": runs,
        "ratios": pairs,
        "target_met": all(r <= OUTAGE_P95_RATIO for pair in pairs for r in pair.values()),
        "none_lost": all(d["none_lost"] for run in runs for d in run["databases"].values()),
    }


def _brief_outage(run: dict[str, Any]) -> str:
    parts = []
    for name, figures in run["databases"].items():
        part = (
            f"{name}: p95 {figures['oldest_age_p95_s']} s, "
            f"{figures['committed']} committed, {figures['lost']} lost"
        )
        if "outage" in figures:
            part += f", drained {figures['outage']['last_of_them_handled_after_restart_s']} s"
            part += " after restart"
        parts.append(part)
    return "; ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="fairness,outage")
    parser.add_argument("--events", type=int, default=1_000_000, help="big's backlog")
    parser.add_argument("--small-events", type=int, default=100)
    parser.add_argument(
        "--polling", action="store_true", help="fairness without the notify triggers"
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="the outage runs' length")
    parser.add_argument("--rate", type=float, default=200.0, help="events/s per database")
    parser.add_argument("--runs", type=int, default=2, help="runs of each variant, interleaved")
    parser.add_argument("--results", default="many_databases", help="results file's name")
    args = parser.parse_args()
    scenarios = args.scenarios.split(",")
    if not set(scenarios) <= {"fairness", "outage"}:
        parser.error("--scenarios: fairness, outage or both")
    results: dict[str, Any] = {
        "benchmark": "many_databases",
        "command": command_line("benchmarks.many_databases", args),
        "machine": machine(),
    }
    if "fairness" in scenarios:
        results["fairness"] = fairness(args)
    if "outage" in scenarios:
        results["outage"] = outage(args)
    path = write(args.results, results)
    print(f"results in {path}")


if __name__ == "__main__":
    main()
