"""outbox on Celery as a worker's circumstances change, in real ``celery worker`` processes on a
real broker and database: a handler's pause ends, the database's schema is taken back under
the worker, and the solo and threads pools."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from sqlalchemy import create_engine, text

from outbox import schema
from outbox._core import log as _log
from outbox.ops import flow
from outbox.ops.migrate import VERSION_TABLE
from tests._support import wait_for
from tests.conftest import Base
from tests.executors import _processes, celery_app
from tests.hosts._hosts import Host, start

EVENTS = 10
BACKLOG = 300
# Far below the sweep's 30 s: a job found within this long was not found by the sweep (and
# no beat runs in these tests, so no sweep runs at all).
RESUMED_WITHIN_SECONDS = 10.0
CLI_TIMEOUT_SECONDS = 60.0
SHUTDOWN_SECONDS = 30.0
OLDER_REVISION = "0007"


def _skipped(processes: _processes.Celery, job_id: int) -> bool:
    return f"outbox.executor.skipped job_id={job_id} " in processes.output()


def _pause(url: str, until: float | None = None) -> None:
    app = _processes.app(url)
    try:
        flow.pause(app, "deliver", until=until, actor="test")
    finally:
        app.engine.dispose()


def _resume(url: str) -> None:
    app = _processes.app(url)
    try:
        flow.resume(app, "deliver", actor="test")
    finally:
        app.engine.dispose()


def test_a_resumed_handlers_job_runs_without_waiting_for_the_sweep(
    processes: _processes.Celery,
) -> None:
    """A message dropped while its handler was paused: once an operator resumes the handler,
    the process that dropped it publishes the job again, and its events are delivered."""
    url = processes.database_url
    _processes.prepare(url, EVENTS)
    job_id = _processes.claim_job(url)
    _pause(url)
    processes.worker(concurrency=1)
    _processes.send(processes, job_id)
    wait_for(lambda: _skipped(processes, job_id), "the message to be skipped")
    _resume(url)
    wait_for(lambda: _processes.waiting(url) == 0, "the events", RESUMED_WITHIN_SECONDS)
    assert [EVENTS] == processes.call_sizes()


def test_a_job_dropped_in_a_pause_with_an_end_runs_once_it_ends(
    processes: _processes.Celery,
) -> None:
    """A message dropped while its handler was paused for 3 s: once the pause ends by itself,
    the job runs, with no resume and no sweep."""
    url = processes.database_url
    _processes.prepare(url, EVENTS)
    job_id = _processes.claim_job(url)
    _pause(url, until=3.0)
    processes.worker(concurrency=1)
    _processes.send(processes, job_id)
    wait_for(lambda: _skipped(processes, job_id), "the message to be skipped")
    wait_for(lambda: _processes.waiting(url) == 0, "the events", RESUMED_WITHIN_SECONDS)
    assert [EVENTS] == processes.call_sizes()


# --- a schema taken back under the worker ----------------------------------------------------


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "outbox", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_SECONDS,
        check=False,
    )


def _migrated(url: str) -> None:
    """Empty the database and migrate it with ``outbox migrate``, as a deployment does."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            Base.metadata.drop_all(conn)
            celery_app.Base.metadata.drop_all(conn)
            schema.metadata.drop_all(conn)
            conn.execute(text(f"DROP TABLE IF EXISTS {VERSION_TABLE}"))
    finally:
        engine.dispose()
    done = _cli({}, "--database-url", url, "migrate")
    assert 0 == done.returncode, done.stderr


def _incompatible_lines(worker: Host) -> list[str]:
    return [
        line for line in worker.output().splitlines() if _log.WORKER_SCHEMA_INCOMPATIBLE in line
    ]


def test_a_schema_taken_back_stops_the_celery_worker(processes: _processes.Celery) -> None:
    """`outbox migrate --to 0007 --yes` under a Celery worker: its process says why once, at
    ERROR, in the line ``outbox work`` logs, and the worker shuts down warm.

    The migration takes back one revision per transaction, so the worker stops at whichever
    older generation its heartbeat reads first: any of 7 to the one before its own."""
    url = processes.database_url
    _migrated(url)
    _processes.prepare(url, 0)
    # A stale age of 3 s: a heartbeat, which reads the schema, every second.
    worker = processes.worker(concurrency=1, **{celery_app.STALE_ENV: "3"})
    wait_for(lambda: "outbox.worker.started" in worker.output(), "the worker process to start")
    downgrade = _cli({}, "--database-url", url, "migrate", "--to", OLDER_REVISION, "--yes")
    assert 0 == downgrade.returncode, downgrade.stderr
    wait_for(lambda: worker.popen.poll() is not None, "the worker to exit", SHUTDOWN_SECONDS)
    said = [
        found.groups()
        for line in _incompatible_lines(worker)
        if (found := re.search(r"(\w+)/ForkPoolWorker.* schema_generation=(\d+) .*"
                               r"worker_generation=(\d+)", line))
    ]  # fmt: skip
    assert [("ERROR", str(schema.GENERATION))] == [(level, worker) for level, _, worker in said]
    assert int(said[0][1]) in range(int(OLDER_REVISION), schema.GENERATION)


# --- solo and threads pools --------------------------------------------------------------------


def _pool_worker(processes: _processes.Celery, pool: str) -> Host:
    """A worker of the ``pool`` pool (two threads for ``threads``) consuming the test's queue."""
    args = [sys.executable, "-m", "celery", "-A", "tests.executors.celery_app", "worker",
            "--loglevel", "DEBUG", "--pool", pool, "--queues", processes.queue,
            "--hostname", f"{pool}-{processes.queue}@%h",
            "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip
    if pool == "threads":
        args += ["--concurrency", "2"]
    host = start(args, processes.tmp_path / f"worker-{pool}.log", processes.env())
    processes.hosts.append(host)
    return host


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_a_solo_or_threads_worker_delivers_a_backlog_and_is_listed(
    processes: _processes.Celery, pool: str
) -> None:
    """A ``--pool solo`` or ``--pool threads`` worker and a beat: every event of a backlog
    delivered, and the worker's own process one live worker of ``outbox workers list``."""
    url = processes.database_url
    _processes.prepare(url, BACKLOG)
    _pool_worker(processes, pool)
    processes.beat()
    wait_for(lambda: _processes.waiting(url) == 0, "the backlog to drain", 60.0)
    listed = _cli(
        processes.env(), "--app", "tests.executors.celery_app:outbox", "workers", "list", "--json"
    )
    assert 0 == listed.returncode, listed.stderr
    workers = [w for w in json.loads(listed.stdout) if w["alive"]]
    assert [True] == [str(w["id"]).startswith(f"{pool}-{processes.queue}@") for w in workers]
    assert list(range(1, BACKLOG + 1)) == _processes.archived(url)
