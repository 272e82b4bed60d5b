"""Concurrency: several real connections, threads and processes working one buffer at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select

from outbox import Batch, Outbox, Settings, schema
from outbox._engine import claimer
from outbox._engine.claimer import Claim
from outbox.worker import CLAIMS_IN_FLIGHT_PER_HANDLER, Worker
from tests.models import ActivityEvent

ROOT = Path(__file__).resolve().parents[2]
CLAIMERS = 8
EVENTS = 5000
BATCH_SIZE = 100


def run_threads(targets: list[Callable[[], None]], timeout: float = 60.0) -> list[BaseException]:
    """Run each target in its own thread; return what they raised. Fails on a thread that hangs."""
    errors: list[BaseException] = []

    def guard(target: Callable[[], None]) -> None:
        try:
            target()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=guard, args=(t,), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(deadline - time.monotonic(), 0.0))
    assert [] == [t.name for t in threads if t.is_alive()], "threads still running"
    return errors


def noop(batch: Batch[Any]) -> None:
    """Accept every event."""


def test_concurrent_claimers_partition_the_buffer(
    make_app: Callable[[str], Outbox],
    postgres_database: str,
    commit_events: Callable[..., list[int]],
) -> None:
    """Claimers on 8 connections at once stamp every row exactly once, in groups <= batch_size."""
    apps = [make_app(postgres_database) for _ in range(CLAIMERS)]
    for app in apps:
        app.handler(ActivityEvent, name="sync", batch_size=BATCH_SIZE)(noop)
    commit_events(apps[0].engine, EVENTS)
    barrier = threading.Barrier(CLAIMERS, timeout=30)
    claims: list[Claim] = []

    def claim_until_empty(app: Outbox) -> Callable[[], None]:
        def run() -> None:
            handler = app.get_handler("sync")
            barrier.wait()
            while (claim := claimer.run_once(app, handler)) is not None:
                claims.append(claim)

        return run

    errors = run_threads([claim_until_empty(app) for app in apps])
    with apps[0].engine.connect() as conn:
        stamped = dict(
            conn.execute(
                select(ActivityEvent.group_id, func.count()).group_by(ActivityEvent.group_id)
            ).all()
        )
    reported = {c.group_id: c.size for c in claims}
    assert ([], len(claims), reported, EVENTS, True) == (
        errors,
        len(reported),
        stamped,
        sum(reported.values()),
        all(size <= BATCH_SIZE for size in reported.values()),
    )


def test_concurrent_claims_each_enqueue_one_batch_job(
    make_app: Callable[[str], Outbox],
    postgres_database: str,
    commit_events: Callable[..., list[int]],
) -> None:
    """Every group claimed concurrently has exactly one batch job, and no job lacks a group."""
    apps = [make_app(postgres_database) for _ in range(CLAIMERS)]
    for app in apps:
        app.handler(ActivityEvent, name="sync", batch_size=BATCH_SIZE)(noop)
    commit_events(apps[0].engine, EVENTS // 5)
    barrier = threading.Barrier(CLAIMERS, timeout=30)
    claimed: list[Any] = []

    def claim_until_empty(app: Outbox) -> Callable[[], None]:
        def run() -> None:
            handler = app.get_handler("sync")
            barrier.wait()
            while (claim := claimer.run_once(app, handler)) is not None:
                claimed.append(claim.group_id)

        return run

    errors = run_threads([claim_until_empty(app) for app in apps])
    with apps[0].engine.connect() as conn:
        job_groups = list(conn.execute(select(schema.jobs.c.group_id)).scalars())
    assert ([], sorted(map(str, claimed))) == (errors, sorted(map(str, job_groups)))


class SharedRecorder:
    """Records every event id handed to any handler, across threads."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self._lock = threading.Lock()

    def __call__(self, batch: Batch[Any]) -> None:
        with self._lock:
            self.ids.extend(e.id for e in batch.events)


def test_worker_fleet_handles_every_event_exactly_once(
    make_app: Callable[[str], Outbox],
    postgres_database: str,
    commit_events: Callable[..., list[int]],
) -> None:
    """Four burst workers on separate pools drain one buffer: each event handled once."""
    recorder = SharedRecorder()
    apps = [make_app(postgres_database) for _ in range(4)]
    for app in apps:
        app.settings = Settings(poll_interval=0.05)
        app.handler(ActivityEvent, name="sync", batch_size=50)(recorder)
    ids = commit_events(apps[0].engine, 2000)
    workers = [Worker(app, concurrency=2, burst=True) for app in apps]
    barrier = threading.Barrier(len(workers), timeout=30)

    def work(worker: Worker) -> Callable[[], None]:
        def run() -> None:
            barrier.wait()
            worker.run()

        return run

    errors = run_threads([work(w) for w in workers])
    duplicates = [i for i, n in Counter(recorder.ids).items() if n > 1]
    with apps[0].engine.connect() as conn:
        left = conn.execute(select(func.count()).select_from(ActivityEvent)).scalar_one()
    assert ([], [], ids, 0, 0) == (
        errors,
        duplicates,
        sorted(set(recorder.ids)),
        left,
        sum(w.stats.leases_lost for w in workers),
    )


@pytest.mark.parametrize("claims_in_flight", [CLAIMS_IN_FLIGHT_PER_HANDLER, 1])
def test_a_worker_runs_at_most_its_claims_in_flight_of_a_handler_at_once(
    claims_in_flight: int,
    make_app: Callable[[str], Outbox],
    postgres_database: str,
    commit_events: Callable[..., list[int]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Eight threads and a fast handler: at most ``claims_in_flight`` of the worker's claims
    (by default CLAIMS_IN_FLIGHT_PER_HANDLER) run at once, those that ride with a finish among
    them, and every event is handled once."""
    app = make_app(postgres_database)
    app.settings = Settings(poll_interval=0.05)
    recorder = SharedRecorder()
    app.handler(ActivityEvent, name="sync", batch_size=10)(recorder)
    ids = commit_events(app.engine, 400)
    claim_step = claimer._claim_step
    lock = threading.Lock()
    in_flight = [0, 0]  # now, most

    def slow_claim(*args: Any, **kwargs: Any) -> Claim | None:
        with lock:
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
        try:
            time.sleep(0.02)  # long enough for the other threads to pile up behind
            return claim_step(*args, **kwargs)
        finally:
            with lock:
                in_flight[0] -= 1

    monkeypatch.setattr(claimer, "_claim_step", slow_claim)
    options = {} if claims_in_flight == CLAIMS_IN_FLIGHT_PER_HANDLER else {"claims_in_flight": 1}
    clean = Worker(app, concurrency=8, burst=True, **options).run()

    assert (True, claims_in_flight, ids) == (
        clean,
        in_flight[1],
        sorted(recorder.ids),
    )


WORKER_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path

    from outbox import Outbox, Settings
    from outbox.worker import Worker
    from tests.models import ActivityEvent

    url, directory, index = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    app = Outbox(url)
    app.settings = Settings(poll_interval=0.05)
    handled = []

    @app.handler(ActivityEvent, name="sync", batch_size=25)
    def sync(batch):
        handled.extend(e.id for e in batch.events)

    (directory / f"ready-{index}").touch()
    deadline = time.monotonic() + 30
    while not (directory / "go").exists():
        if time.monotonic() > deadline:
            sys.exit("never told to go")
        time.sleep(0.01)
    clean = Worker(app, concurrency=2, burst=True).run()
    result = json.dumps({"clean": clean, "handled": handled})
    (directory / f"result-{index}.json").write_text(result)
    """
)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_sqlite_worker_processes_share_one_file_without_lock_errors(
    database_url: str, tmp_path: Path, commit_events: Callable[..., list[int]]
) -> None:
    """Three worker processes on one SQLite file handle every event once, never locked out."""
    engine = create_engine(database_url)
    ids = commit_events(engine, 1500)
    engine.dispose()
    script = tmp_path / "worker.py"
    script.write_text(WORKER_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    processes = [
        subprocess.Popen(
            [sys.executable, str(script), database_url, str(tmp_path), str(n)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for n in range(3)
    ]
    try:
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("ready-*"))) < 3:
            assert time.monotonic() < deadline, "worker processes did not start"
            time.sleep(0.02)
        (tmp_path / "go").touch()
        outputs = [p.communicate(timeout=60)[0] for p in processes]
    finally:
        for process in processes:
            process.kill()
    missing = [n for n in range(3) if not (tmp_path / f"result-{n}.json").exists()]
    assert not missing, [outputs[n] for n in missing]
    results = [json.loads((tmp_path / f"result-{n}.json").read_text()) for n in range(3)]
    handled = [i for r in results for i in r["handled"]]
    assert ([0, 0, 0], [], [True, True, True], ids, len(ids)) == (
        [p.returncode for p in processes],
        [line for out in outputs for line in out.splitlines() if "locked" in line.lower()],
        [r["clean"] for r in results],
        sorted(set(handled)),
        len(handled),
    )
