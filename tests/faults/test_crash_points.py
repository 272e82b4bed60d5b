"""A worker SIGKILLed at each named crash point loses nothing, and the next worker finishes.

For every point of ``outbox._core.faults.POINTS``: commit events (and roll some back), run
``outbox work --burst`` with ``OUTBOX_CRASH_POINT`` set so that it kills itself the second
time it reaches the point, wait for its lease to run out, run a healthy ``outbox work
--burst``, and check what became of every event. Only a kill after the handler returned and
before the completion committed may deliver one group twice.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from outbox._core.faults import (
    AFTER_HANDLER,
    CRASH_AFTER_ENV,
    CRASH_POINT_ENV,
    IN_COMPLETION,
    POINTS,
)
from tests._support import wait_for
from tests.faults._checker import check
from tests.faults._processes import OutboxProcess, live_leases, run_outbox
from tests.faults._workload import Ledger, produce
from tests.faults.fault_app import BATCH_SIZE_ENV, HANDLER_SECONDS_ENV

pytestmark = pytest.mark.timeout(90)

BATCH_SIZE = 10
EVENTS = 3 * BATCH_SIZE
WORKER = ["work", "--burst", "--concurrency", "1", "--lease", "2", "--poll-interval", "0.2"]
APP_ENV = {BATCH_SIZE_ENV: str(BATCH_SIZE), HANDLER_SECONDS_ENV: "0"}
# Points between the handler's return and the commit of its completion: the group's events
# were delivered but not recorded, so the next worker delivers them again.
DELIVERED_TWICE = {AFTER_HANDLER, IN_COMPLETION}


@pytest.mark.parametrize("point", POINTS)
def test_worker_killed_at_crash_point_loses_nothing(
    point: str, private_database: str, handled_dir: Path, log_dir: Path
) -> None:
    """SIGKILL at the point, then a healthy burst: nothing lost, phantom or left behind."""
    engine = create_engine(private_database)
    ledger = Ledger()
    seed = POINTS.index(point)
    produce(engine, ledger, EVENTS, rng=random.Random(seed))
    doomed = OutboxProcess(
        "doomed",
        private_database,
        WORKER,
        handled_dir=handled_dir,
        log_dir=log_dir,
        env={**APP_ENV, CRASH_POINT_ENV: point, CRASH_AFTER_ENV: "2"},
    )
    try:
        killed = doomed.wait(timeout=30)
    finally:
        doomed.kill()
    wait_for(lambda: live_leases(engine) == 0, "the killed worker's lease to run out", 10)
    code = run_outbox(
        private_database, WORKER, handled_dir=handled_dir, log_dir=log_dir, name="next", timeout=60
    )
    report = check(engine, handled_dir, ledger.rolled_back)
    engine.dispose()

    expected = {
        "killed": -9,
        "next worker": 0,
        "committed": EVENTS,
        "delivered": EVENTS,
        "lost": 0,
        "phantom": 0,
        "duplicated": BATCH_SIZE if point in DELIVERED_TWICE else 0,
        "left_claimed": 0,
        "left_unclaimed": 0,
        "jobs_left": 0,
        "concurrent_commits": 0,
        "unterminated": 0,
    }
    observed = {"killed": killed, "next worker": code}
    observed.update({k: getattr(report, k) for k in expected if hasattr(report, k)})
    assert expected == observed, f"seed {seed}: {report.summary()}"
