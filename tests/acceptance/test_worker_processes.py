"""``outbox work --processes N``: one start-up, N forked worker processes, one supervisor.

The workers' pids come from what the test application's handlers wrote (``started.log``) and
from the ``worker <host>:<pid>:<token> stopped`` lines each worker prints when it ends.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from outbox import schema
from outbox._core import log as _log
from tests._support import wait_for
from tests.acceptance import _tables
from tests.acceptance._cli import (
    APP,
    LEASE,
    Cli,
    handled,
    handled_ids,
    start_work,
    started,
)
from tests.acceptance.cli_app import SLEEP_ENV

pytestmark = pytest.mark.timeout(90)


def _handler_pids(output_dir: Path) -> set[int]:
    return {line.pid for line in started(output_dir)}


def _stopped_pids(stdout: str) -> list[int]:
    """The pid of each worker that printed its summary line."""
    return [
        int(line.split()[1].split(":")[1]) for line in stdout.splitlines() if " stopped: " in line
    ]


def _claims_in_flight(stderr: str) -> list[int]:
    """``claims_in_flight`` of each worker's start-up log line (JSON lines: not a terminal)."""
    lines = (json.loads(line) for line in stderr.splitlines() if line.startswith("{"))
    return [line["claims_in_flight"] for line in lines if line["event"] == _log.WORKER_STARTED]


def _alive(pid: int) -> bool:
    """Running, not merely a zombie that an orphan's new parent has not reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _registered_workers(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return [int(pid) for pid in conn.execute(select(schema.workers.c.pid)).scalars()]


def _two_workers(engine: Engine) -> list[int]:
    """The registered workers' pids once there are (at least) two; else nothing."""
    pids = _registered_workers(engine)
    return pids if len(pids) >= 2 else []


def test_burst_with_two_processes_handles_every_event_once_in_both(
    cli: Cli,
    server_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """Both forked workers take groups; each event is handled once; both print a summary; the
    command's two claims in flight per handler are shared, one per process."""
    engine = connect(server_database)
    ids = commit_events(engine, 40)

    result = cli.run(
        "--app", APP, "--database-url", server_database, "work", *LEASE,
        "--burst", "--processes", "2", "--concurrency", "1",
        env={SLEEP_ENV: "0.5"},
    )  # fmt: skip

    stopped = _stopped_pids(result.stdout)
    assert (0, sorted(ids), 2, set(stopped), [], [1, 1]) == (
        result.code,
        handled_ids(output_dir),
        len(set(stopped)),
        _handler_pids(output_dir),
        _tables.buffer_rows(engine),
        _claims_in_flight(result.stderr),
    )


def test_sigterm_to_the_parent_lets_every_worker_finish_its_batch_and_exits_zero(
    cli: Cli,
    server_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """SIGTERM to the supervisor: both batches in flight finish, and no worker is left."""
    engine = connect(server_database)
    commit_events(engine, 40)
    cli.run("--app", APP, "--database-url", server_database, "distribute")
    parent = start_work(
        cli, server_database, "--processes", "2", "--concurrency", "1",
        "--shutdown-grace-period", "20", env={SLEEP_ENV: "1.5"},
    )  # fmt: skip
    wait_for(lambda: len(_handler_pids(output_dir)) == 2, "both workers inside a batch")
    in_flight = {line.group_id for line in started(output_dir)}

    parent.send(signal.SIGTERM)
    code = parent.wait(timeout=30)

    finished = {line.group_id for line in handled(output_dir)}
    workers = _handler_pids(output_dir)
    assert (0, set(), [], []) == (
        code,
        in_flight - finished,
        [pid for pid in workers if _alive(pid)],
        _registered_workers(engine),
    )


def test_a_killed_worker_process_is_replaced_and_nothing_is_lost(
    cli: Cli,
    server_database: str,
    connect: Callable[[str], Engine],
    commit_events: Any,
    output_dir: Path,
) -> None:
    """SIGKILL one worker mid-batch: the supervisor starts another; every event gets handled."""
    engine = connect(server_database)
    ids = commit_events(engine, 30)
    cli.run("--app", APP, "--database-url", server_database, "distribute")
    parent = start_work(
        cli, server_database, "--processes", "2", "--concurrency", "1", env={SLEEP_ENV: "1"}
    )
    killed = wait_for(lambda: started(output_dir), "a batch to start")[0].pid
    first = set(wait_for(lambda: _two_workers(engine), "both workers registered"))

    os.kill(killed, signal.SIGKILL)
    wait_for(lambda: set(handled_ids(output_dir)) == set(ids), "every event handled", timeout=40)
    wait_for(lambda: set(_registered_workers(engine)) - first, "a replacement worker registered")
    parent.send(signal.SIGTERM)
    result = parent.result(timeout=30)

    stopped = _stopped_pids(result.stdout)
    assert (0, 2, False, True) == (
        result.code,
        len(stopped),
        killed in stopped,
        "outbox.worker.process_restarting" in result.stderr,
    )


def test_workers_whose_supervisor_was_killed_stop_by_themselves(
    cli: Cli, server_database: str, connect: Callable[[str], Engine]
) -> None:
    """SIGKILL to the supervisor: its orphaned workers notice, stop gracefully, deregister."""
    engine = connect(server_database)
    parent = start_work(cli, server_database, "--processes", "2")
    workers = wait_for(lambda: _two_workers(engine), "both workers registered")

    parent.send(signal.SIGKILL)
    parent.wait(timeout=10)
    wait_for(lambda: not any(_alive(pid) for pid in workers), "the orphans to exit", timeout=20)

    assert [] == _registered_workers(engine)


def test_processes_below_one_is_a_usage_error(cli: Cli, server_database: str) -> None:
    """``--processes 0`` exits 2 naming the option."""
    result = cli.run(
        "--app", APP, "--database-url", server_database, "work", "--burst", "--processes", "0"
    )

    assert (2, True) == (result.code, "--processes" in result.stderr)


def test_a_worker_whose_metrics_port_is_taken_stops_the_command_with_a_usage_error(
    cli: Cli, server_database: str
) -> None:
    """``--processes 2 --metrics-port P`` with P + 1 taken: exit 2 naming the port, no
    restart loop, no worker left."""
    with socket.socket() as taken:
        taken.bind(("", 0))  # every interface, as the metrics endpoint binds
        taken.listen()
        port = int(taken.getsockname()[1]) - 1
        result = cli.run(
            "--app", APP, "--database-url", server_database,
            "work", "--processes", "2", "--metrics-port", str(port), timeout=30,
        )  # fmt: skip

    assert (2, True, False) == (
        result.code,
        str(port + 1) in result.stderr,
        "process_restarting" in result.stderr,
    )


def test_metrics_ports_past_the_last_port_are_a_usage_error(cli: Cli, server_database: str) -> None:
    """``--processes 2 --metrics-port 65535``: the second worker would have no port."""
    result = cli.run(
        "--app", APP, "--database-url", server_database,
        "work", "--processes", "2", "--metrics-port", "65535",
    )  # fmt: skip

    assert (2, True) == (result.code, "--metrics-port" in result.stderr)
