"""A running worker rides out the database going away: restarts, crashes, cut connections.

Each test runs ``outbox work`` (not burst: a long-running worker) against a private server,
PostgreSQL and MariaDB, takes the database away under it, and checks that the same worker
process is still running, then drains everything, and that the checker finds nothing lost,
phantom or left behind.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine

from tests._support import wait_for
from tests.faults._checker import check
from tests.faults._cluster import PrivateCluster
from tests.faults._mariadb_server import PrivateMariaDB
from tests.faults._processes import OutboxProcess, drained
from tests.faults._workload import Ledger, produce
from tests.faults.fault_app import BATCH_SIZE_ENV, HANDLER_SECONDS_ENV

pytestmark = pytest.mark.timeout(120)

LEASE_SECONDS = 2.0
WORKER = [
    "work",
    "--concurrency", "2",
    "--lease", str(LEASE_SECONDS),
    "--poll-interval", "0.2",
    "--distribute-every", "0.5",
    "--shutdown-grace-period", "10",
]  # fmt: skip
BATCH_SIZE = 10
DRAIN_SECONDS = 30.0


@pytest.fixture
def engine(private_database: str) -> Iterator[Engine]:
    """An engine on the test's database, for producing and checking."""
    engine = create_engine(private_database, pool_pre_ping=True)
    yield engine
    engine.dispose()


def _worker(
    url: str, handled_dir: Path, log_dir: Path, handler_seconds: float = 0.1
) -> OutboxProcess:
    return OutboxProcess(
        "worker",
        url,
        WORKER,
        handled_dir=handled_dir,
        log_dir=log_dir,
        env={BATCH_SIZE_ENV: str(BATCH_SIZE), HANDLER_SECONDS_ENV: str(handler_seconds)},
    )


def _delivered(handled_dir: Path) -> bool:
    return any(path.stat().st_size for path in handled_dir.glob("handled-*.log"))


EXPECTED = {"drained": True, "same worker running": True, "exit code": 0, "violations": {}}


def _outcome(
    worker: OutboxProcess, engine: Engine, handled_dir: Path, ledger: Ledger
) -> dict[str, object]:
    """Did it drain in time, is the worker the same process, its exit code on SIGTERM, and
    the checker's violations."""
    try:
        wait_for(lambda: drained(engine), "the outbox to drain", DRAIN_SECONDS)
        done = True
    except AssertionError:
        done = False
    alive = worker.alive()
    code = worker.stop()
    return {
        "drained": done,
        "same worker running": alive,
        "exit code": code,
        "violations": check(engine, handled_dir, ledger.rolled_back).violations,
    }


def _errors(worker: OutboxProcess) -> str:
    """The worker's error lines, for the failure message."""
    lines = [line for line in worker.stderr().splitlines() if '"level": "error"' in line]
    return "\n".join(line[:400] for line in lines[-5:])


def test_worker_rides_out_an_immediate_restart(
    private_server: PrivateCluster | PrivateMariaDB,
    private_database: str,
    engine: Engine,
    handled_dir: Path,
    log_dir: Path,
) -> None:
    """A crash restart between two waves of events: the same worker drains both."""
    ledger = Ledger()
    worker = _worker(private_database, handled_dir, log_dir)
    try:
        produce(engine, ledger, 40, rng=random.Random(1))
        wait_for(lambda: drained(engine), "the first wave to drain", DRAIN_SECONDS)
        private_server.restart_immediate()
        produce(engine, ledger, 80, rng=random.Random(2))

        outcome = _outcome(worker, engine, handled_dir, ledger)
    finally:
        worker.kill()

    assert EXPECTED == outcome, _errors(worker)


def test_worker_rides_out_a_database_down_longer_than_its_lease_mid_batch(
    private_server: PrivateCluster | PrivateMariaDB,
    private_database: str,
    engine: Engine,
    handled_dir: Path,
    log_dir: Path,
) -> None:
    """The database crashes mid-batch and stays down for three leases: nothing stays stuck."""
    ledger = Ledger()
    produce(engine, ledger, 40, rng=random.Random(3))
    worker = _worker(private_database, handled_dir, log_dir, handler_seconds=2.0)
    try:
        wait_for(lambda: _delivered(handled_dir), "a batch to deliver", 30)
        private_server.crash()
        try:
            time.sleep(3 * LEASE_SECONDS)  # the outage under test, not a wait for a condition
        finally:
            private_server.start()

        outcome = _outcome(worker, engine, handled_dir, ledger)
    finally:
        worker.kill()

    assert EXPECTED == outcome, _errors(worker)


def test_worker_rides_out_its_connections_being_terminated_mid_batch(
    private_server: PrivateCluster | PrivateMariaDB,
    private_database: str,
    engine: Engine,
    handled_dir: Path,
    log_dir: Path,
) -> None:
    """Every client's connection killed, twice, while batches run: the worker carries on."""
    ledger = Ledger()
    produce(engine, ledger, 60, rng=random.Random(4))
    worker = _worker(private_database, handled_dir, log_dir, handler_seconds=1.0)
    try:
        wait_for(lambda: _delivered(handled_dir), "a batch to deliver", 30)
        private_server.terminate()
        time.sleep(0.7)  # the second cut lands inside the next batches
        private_server.terminate()

        outcome = _outcome(worker, engine, handled_dir, ledger)
    finally:
        worker.kill()

    assert EXPECTED == outcome, _errors(worker)
