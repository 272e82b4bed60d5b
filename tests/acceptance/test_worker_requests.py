"""An operator asks a running ``outbox work`` process to drain or to stop, from another process
(``outbox workers drain`` / ``stop``): the request travels through the database, and the worker
acts on it at its next heartbeat, saying who asked.

Each test runs ``outbox work`` with a 2 s lease (a heartbeat every 2/3 s) against PostgreSQL
and MariaDB, waits until the test application's handler is inside a batch, which it holds until
the worker has logged the request, then lets it end.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, insert, select

from outbox import schema
from tests._support import wait_for
from tests.acceptance import _tables
from tests.acceptance._cli import (
    APP,
    Cli,
    Line,
    Result,
    Running,
    handled,
    handled_ids,
    start_work,
    started,
)
from tests.acceptance.cli_app import HOLD_ENV

pytestmark = pytest.mark.timeout(90)


def _first_batch(output_dir: Path) -> Line:
    lines: list[Line] = wait_for(lambda: started(output_dir), "a batch to start", timeout=20)
    return lines[0]


def _ask(cli: Cli, url: str, request: str, worker_id: str, worker: Running, hold: Path) -> Result:
    """``outbox workers <request> <worker_id>``, once the worker holds a batch; the batch
    ends once the worker has logged the request."""
    asked = cli.run("--app", APP, "--database-url", url, "workers", request, worker_id)
    wait_for(lambda: _asked_lines(worker.stderr()), "the worker to read the request")
    hold.unlink()
    return asked


def _worker_id(engine: Engine) -> str:
    def found() -> str | None:
        with engine.connect() as conn:
            ids = conn.execute(select(schema.workers.c.id)).scalars().all()
        return ids[0] if len(ids) == 1 else None

    worker_id: str = wait_for(found, "the worker's row")
    return worker_id


def _asked_lines(stderr: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [line for line in lines if line["event"] == "outbox.worker.asked"]


def _operations(engine: Engine) -> list[tuple[str, str, str | None]]:
    ops = schema.operations
    with engine.connect() as conn:
        rows = conn.execute(select(ops.c.action, ops.c.actor, ops.c.selection).order_by(ops.c.id))
        return [(r.action, r.actor, r.selection) for r in rows]


def _workers_left(engine: Engine) -> int:
    return _tables.count(engine, schema.workers)


def test_a_drained_worker_finishes_what_it_holds_past_its_grace_period_and_exits_zero(
    cli: Cli,
    server_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """Asked to drain mid-batch: the batch finishes although the grace period is 0 (a stop
    would abandon it and exit 1), no other group starts, the worker exits 0 and leaves; every
    event is handled or waits, none leased; the worker logged who asked, and the request is
    recorded."""
    engine = connect(server_database)
    ids = commit_events(engine, 30)
    cli.run("--app", APP, "--database-url", server_database, "distribute")
    hold = output_dir / "hold"
    hold.touch()
    worker = start_work(
        cli,
        server_database,
        "--concurrency", "1",
        "--shutdown-grace-period", "0",
        env={HOLD_ENV: str(hold)},
    )  # fmt: skip
    in_flight = _first_batch(output_dir)
    worker_id = _worker_id(engine)

    asked = _ask(cli, server_database, "drain", worker_id, worker, hold)
    code = worker.wait(timeout=30)

    done = set(handled_ids(output_dir))
    in_buffer = {event_id for event_id, _ in _tables.buffer_rows(engine)}
    leased = [job for job in _tables.jobs(engine) if job["lease_token"] is not None]
    [said] = _asked_lines(worker.stderr())
    [(action, actor, selection)] = _operations(engine)
    assert (
        0,
        True,
        0,
        {in_flight.group_id},
        Counter({in_flight.group_id: 10}),
        set(ids),
        [],
        0,
        ("drain", actor, True),
        ("drain", worker_id, json.dumps({"worker": worker_id})),
    ) == (
        asked.code,
        asked.stdout.startswith(f"asked worker {worker_id} ("),
        code,
        {line.group_id for line in started(output_dir)},
        Counter(line.group_id for line in handled(output_dir)),
        done | in_buffer,
        leased,
        _workers_left(engine),
        (said["request"], said["requested_by"], said["known"]),
        (action, said["worker"], selection),
    )


def test_a_stopped_worker_stops_as_on_sigterm(
    cli: Cli,
    server_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """Asked to stop mid-batch: as SIGTERM, the batch finishes within the grace period, no new
    one starts, and the worker exits 0 and leaves."""
    engine = connect(server_database)
    commit_events(engine, 30)
    cli.run("--app", APP, "--database-url", server_database, "distribute")
    hold = output_dir / "hold"
    hold.touch()
    worker = start_work(
        cli,
        server_database,
        "--concurrency", "1",
        "--shutdown-grace-period", "20",
        env={HOLD_ENV: str(hold)},
    )  # fmt: skip
    in_flight = _first_batch(output_dir)
    worker_id = _worker_id(engine)

    asked = _ask(cli, server_database, "stop", worker_id, worker, hold)
    code = worker.wait(timeout=30)

    assert (0, 0, {in_flight.group_id}, Counter({in_flight.group_id: 10}), 0, ["stop"]) == (
        asked.code,
        code,
        {line.group_id for line in started(output_dir)},
        Counter(line.group_id for line in handled(output_dir)),
        _workers_left(engine),
        [line["request"] for line in _asked_lines(worker.stderr())],
    )


def test_asking_a_worker_too_old_to_read_it_is_refused_and_writes_nothing(
    cli: Cli, server_database: str, connect: Callable[[str], Engine]
) -> None:
    """A worker of schema generation 6: exit 1 naming why and what to do; its row and the
    operations' record as they were."""
    engine = connect(server_database)
    with engine.begin() as conn:
        conn.execute(
            insert(schema.workers).values(
                id="old:1", hostname="old-host", pid=1, concurrency=1, version="0.2.0", generation=6
            )
        )
    asked = cli.run("--app", APP, "--database-url", server_database, "workers", "drain", "old:1")
    with engine.connect() as conn:
        request = conn.execute(select(schema.workers.c.request)).scalar_one()
    assert (
        1,
        "Error: worker 'old:1' runs outbox 0.2.0, older than schema 0007: it never reads "
        "requests to drain or stop; send its process SIGTERM on old-host\n",
        None,
        [],
    ) == (asked.code, asked.stderr, request, _operations(engine))
