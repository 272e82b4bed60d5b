"""A worker killed, or stopped by signals, mid-batch: nothing is lost, the group comes back.

Each test runs ``outbox work`` with a 2 s lease against PostgreSQL and MariaDB, waits until the test
application's handler is inside a slow batch (it writes ``started.log`` first), then signals it.
"""

from __future__ import annotations

import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from tests._support import wait_for
from tests.acceptance import _tables
from tests.acceptance._cli import (
    APP,
    LEASE,
    Cli,
    Line,
    handled,
    handled_ids,
    start_work,
    started,
)
from tests.acceptance.cli_app import SLEEP_ENV

pytestmark = pytest.mark.timeout(60)

SLOW = {SLEEP_ENV: "30"}
"""A batch that takes far longer than the test: it only ends by a signal."""


def _first_batch(output_dir: Path) -> Line:
    """Wait until a handler is inside its first batch; the line it wrote when it started."""
    lines: list[Line] = wait_for(lambda: started(output_dir), "a batch to start", timeout=20)
    return lines[0]


def _drained(engine: Engine) -> bool:
    return not _tables.buffer_rows(engine) and not _tables.jobs(engine)


def _handled_or_waiting(engine: Engine, output_dir: Path, ids: list[int]) -> dict[int, str]:
    """Where each event is: handled, unclaimed, claimed by a group with a job, or lost."""
    groups_with_job = {job["group_id"] for job in _tables.jobs(engine) if job["kind"] == "batch"}
    in_buffer = dict(_tables.buffer_rows(engine))
    done = set(handled_ids(output_dir))
    where = {}
    for event_id in ids:
        if event_id in done:
            where[event_id] = "handled"
        elif event_id in in_buffer and in_buffer[event_id] is None:
            where[event_id] = "unclaimed"
        elif event_id in in_buffer and in_buffer[event_id] in groups_with_job:
            where[event_id] = "claimed"
        else:
            where[event_id] = "lost"
    return where


def test_sigkill_mid_batch_group_is_handled_again_after_the_lease_expires(
    cli: Cli,
    server_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """SIGKILL mid-batch: another worker handles the group at attempt 2, once its lease ran out."""
    engine = connect(server_database)
    ids = commit_events(engine, 30)
    cli.run("--app", APP, "--database-url", server_database, "distribute")
    doomed = start_work(cli, server_database, "--concurrency", "1", env=SLOW)
    killed = _first_batch(output_dir)

    doomed.send(signal.SIGKILL)
    doomed.wait(timeout=10)
    (job,) = [j for j in _tables.jobs(engine) if j["group_id"] == uuid.UUID(killed.group_id)]
    rescuer = start_work(cli, server_database, "--concurrency", "2")
    wait_for(lambda: _drained(engine), "the second worker to drain everything", timeout=30)
    rescuer.send(signal.SIGTERM)
    rescuer.wait(timeout=15)

    retried = [line for line in started(output_dir) if line.group_id == killed.group_id]
    attempts = {line.attempt for line in handled(output_dir) if line.group_id == killed.group_id}
    assert (1, [1, 2], {2}, True, set(ids)) == (
        job["attempts"],
        [line.attempt for line in retried],
        attempts,
        float(retried[1].value) >= job["lease_expires_at"].timestamp(),
        set(handled_ids(output_dir)),
    )


def test_sigkill_mid_batch_loses_nothing(
    cli: Cli,
    server_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """After SIGKILL and a second worker, every event was handled and no row or job is left."""
    engine = connect(server_database)
    ids = commit_events(engine, 30)
    cli.run("--app", APP, "--database-url", server_database, "distribute")
    doomed = start_work(cli, server_database, "--concurrency", "1", env=SLOW)
    _first_batch(output_dir)

    doomed.send(signal.SIGKILL)
    doomed.wait(timeout=10)
    rescuer = start_work(cli, server_database, "--concurrency", "2")
    wait_for(lambda: set(handled_ids(output_dir)) == set(ids), "every event handled", timeout=30)
    rescuer.send(signal.SIGTERM)
    code = rescuer.wait(timeout=15)

    assert (0, [], []) == (code, _tables.buffer_rows(engine), _tables.jobs(engine))


def test_sigterm_finishes_the_batch_in_flight_and_exits_zero(
    cli: Cli,
    server_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """SIGTERM mid-batch: the batch finishes, no new one starts, and the worker exits 0."""
    engine = connect(server_database)
    commit_events(engine, 30)
    cli.run("--app", APP, "--database-url", server_database, "distribute")
    worker = start_work(
        cli,
        server_database,
        "--concurrency", "1",
        "--shutdown-grace-period", "20",
        env={SLEEP_ENV: "1.5"},
    )  # fmt: skip
    in_flight = _first_batch(output_dir)

    worker.send(signal.SIGTERM)
    code = worker.wait(timeout=20)

    assert (0, {in_flight.group_id}, Counter({in_flight.group_id: 10})) == (
        code,
        {line.group_id for line in started(output_dir)},
        Counter(line.group_id for line in handled(output_dir)),
    )


def test_sigterm_leaves_every_event_handled_or_waiting_for_the_next_worker(
    cli: Cli,
    server_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """After SIGTERM each event is handled or still in the buffer; a burst run finishes them."""
    engine = connect(server_database)
    ids = commit_events(engine, 30)
    cli.run("--app", APP, "--database-url", server_database, "distribute")
    worker = start_work(
        cli,
        server_database,
        "--concurrency", "1",
        "--shutdown-grace-period", "20",
        env={SLEEP_ENV: "1.5"},
    )  # fmt: skip
    _first_batch(output_dir)

    worker.send(signal.SIGTERM)
    worker.wait(timeout=20)
    after_stop = Counter(_handled_or_waiting(engine, output_dir, ids).values())
    leased = [job for job in _tables.jobs(engine) if job["lease_token"] is not None]
    burst = cli.run("--app", APP, "--database-url", server_database, "work", "--burst", *LEASE)

    assert (0, [], Counter(ids), 0, [], []) == (
        after_stop["lost"],
        leased,
        Counter(handled_ids(output_dir)),
        burst.code,
        _tables.buffer_rows(engine),
        _tables.jobs(engine),
    )


def test_second_sigterm_abandons_the_batch_and_exits_one_at_once(
    cli: Cli,
    server_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """A second SIGTERM exits 1 at once, long before the 30 s grace period; the batch undone."""
    engine = connect(server_database)
    commit_events(engine, 10)
    cli.run("--app", APP, "--database-url", server_database, "distribute")
    worker = start_work(
        cli, server_database, "--concurrency", "1", "--shutdown-grace-period", "30", env=SLOW
    )
    _first_batch(output_dir)

    worker.send(signal.SIGTERM)
    wait_for(lambda: "outbox.worker.stopping" in worker.stderr(), "the first SIGTERM to land")
    worker.send(signal.SIGTERM)
    second_signal = time.monotonic()
    code = worker.wait(timeout=10)
    took = time.monotonic() - second_signal

    assert (1, True, []) == (code, took < 5, handled(output_dir))


def test_group_abandoned_by_a_second_sigterm_is_handled_after_its_lease_expires(
    cli: Cli,
    server_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """The group abandoned on a second SIGTERM is handled by the next worker, at attempt 2."""
    engine = connect(server_database)
    ids = commit_events(engine, 10)
    cli.run("--app", APP, "--database-url", server_database, "distribute")
    worker = start_work(
        cli, server_database, "--concurrency", "1", "--shutdown-grace-period", "30", env=SLOW
    )
    abandoned = _first_batch(output_dir)
    worker.send(signal.SIGTERM)
    wait_for(lambda: "outbox.worker.stopping" in worker.stderr(), "the first SIGTERM to land")
    worker.send(signal.SIGTERM)
    worker.wait(timeout=10)

    group_id = uuid.UUID(abandoned.group_id)
    wait_for(lambda: _tables.lease_expired(engine, group_id), "the abandoned lease to expire")
    burst = cli.run("--app", APP, "--database-url", server_database, "work", "--burst", *LEASE)

    assert (0, Counter({(abandoned.group_id, 2): 10}), ids, [], []) == (
        burst.code,
        Counter((line.group_id, line.attempt) for line in handled(output_dir)),
        handled_ids(output_dir),
        _tables.buffer_rows(engine),
        _tables.jobs(engine),
    )
