"""A fleet across hosts keeps its promises when the network between them and the database
fails: a host black-holed for longer than its lease, a host on a slow and lossy link, a host
killed outright while the database restarts, and a host whose clock is minutes wrong.

Two hosts (``_netns``: a namespace each, behind a router namespace of its own) run an
``outbox work`` each against a private server, PostgreSQL and MariaDB, while a producer writes
events throughout. Counted from outside, by the fault suite's checker (tests/faults): what the
handlers recorded (``calls``: each event handed over, by which process, when the call began)
and what the tables hold. Nothing lost or phantom, no group finished twice, nothing left
claimed; a duplicate only where the documentation allows it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine

from outbox import Settings
from outbox._core import log as _log
from outbox._services.heartbeat import HEARD_WITHIN_INTERVALS, heartbeat_interval
from tests._support import wait_for
from tests.faults._checker import check
from tests.faults._cluster import PrivateCluster
from tests.faults._mariadb_server import PrivateMariaDB
from tests.faults._processes import drained
from tests.faults._workload import Ledger, Producer
from tests.faults.fault_app import SETTINGS
from tests.faults.fault_app import app as fault_app
from tests.network._fleet import (
    HANDLER_SECONDS,
    LEASE_SECONDS,
    SLOW_LINK,
    Call,
    HostWorker,
    build_skewed_clock,
    calls,
    database_now,
    fleet,
    heard_since,
    heartbeat_gaps,
    heartbeat_offsets,
    held_by,
    latenesses,
    seconds_until,
)
from tests.network._netns import require_namespaces

pytestmark = pytest.mark.timeout(240)

RATE = 60.0  # events a second, below what two hosts handle (about 100)
RESCUE_TICK = SETTINGS.rescue_interval
# The longest after a cut that a cut-off worker may still begin a handler call: while the
# fleet still hears it (two and a half heartbeat intervals after its last heartbeat began),
# for a claim younger than half the lease; a call is picked up some time after its claim.
LAST_CALL_AFTER_CUT = (
    HEARD_WITHIN_INTERVALS
    * heartbeat_interval(Settings(lease_seconds=LEASE_SECONDS, worker_stale_after=5.0))
    + HANDLER_SECONDS
)
DRAIN_SECONDS = 60.0
PROMISE = fault_app.get_handler("deliver").urgency.promise
SKEW_SECONDS = 300.0


@pytest.fixture(autouse=True)
def _namespaces() -> None:
    require_namespaces()


@pytest.fixture
def engine(private_database: str) -> Iterator[Engine]:
    """An engine on the test's database, from the root namespace: producing and checking."""
    engine = create_engine(private_database, pool_pre_ping=True)
    yield engine
    engine.dispose()


@pytest.fixture
def producer(private_database: str) -> Iterator[Producer]:
    """A producer writing events throughout, from the root namespace."""
    ledger = Ledger()
    producer = Producer(private_database, ledger, name="producer", rate=RATE, target=10**9, seed=11)
    producer.start()
    yield producer
    producer.stopping.set()
    producer.join()


def _finish(
    engine: Engine, producer: Producer, hosts: dict[str, HostWorker], handled_dir: Path
) -> dict[str, Any]:
    """Stop producing, let the fleet drain, stop it: the workers' exit codes, the checker's
    violations, and its whole report (for a failure's message)."""
    producer.stopping.set()
    producer.join()
    wait_for(lambda: drained(engine), "the fleet to drain", DRAIN_SECONDS)
    codes = [host.worker.stop() for host in hosts.values()]
    report = check(engine, handled_dir, producer.ledger.rolled_back)
    return {"exit codes": codes, "violations": report.violations, "report": report.summary()}


def _wait_until_holding(engine: Engine, pid: int) -> set[int]:
    held: set[int] = wait_for(lambda: held_by(engine, pid), "host a to hold a group", 30)
    return held


def _first_calls(handed: list[Call]) -> dict[int, Call]:
    first: dict[int, Call] = {}
    for call in sorted(handed, key=lambda c: c.called_at):
        first.setdefault(call.key, call)
    return first


def _twice(handed: list[Call]) -> list[int]:
    return sorted(key for key, n in Counter(c.key for c in handed).items() if n > 1)


def test_a_black_holed_host_is_rescued_within_its_lease_and_finishes_nothing_it_lost(
    private_database: str,
    engine: Engine,
    producer: Producer,
    handled_dir: Path,
    log_dir: Path,
) -> None:
    """Host a's packets are dropped, both ways and with no reset, mid-batch, for three leases.

    Its groups are rescued within the lease and a rescue tick; after the cut it begins no
    handler call until the link is back (the lease check and its bounded waits); the groups
    it handled across the cut are the only ones handed over twice; once healed it works again.
    """
    with fleet(private_database, ["a", "b"], handled_dir, log_dir) as hosts:
        a = hosts["a"]
        held = _wait_until_holding(engine, a.pid)
        cut_at = time.time()
        a.host.black_hole()
        rescued_in = seconds_until(
            lambda: not held & held_by(engine, a.pid), "a's groups to be rescued", 30
        )
        time.sleep(max(0.0, cut_at + 3 * LEASE_SECONDS - time.time()))
        healed = database_now(engine)
        a.host.heal()
        healed_at = time.time()
        back_in = seconds_until(
            lambda: any(c.pid == a.pid and c.called_at > healed_at for c in calls(handled_dir)),
            "a to handle a group again",
            40,
        )
        assert heard_since(engine, a.pid, healed)
        outcome = _finish(engine, producer, hosts, handled_dir)
    handed = calls(handled_dir)
    last_call = cut_at + LAST_CALL_AFTER_CUT
    first = _first_calls(handed)
    across_the_cut = {k for k, c in first.items() if c.pid == a.pid and c.called_at < last_call}
    assert {
        "violations": {},
        "exit codes": [0, 0],
        "calls by a during the cut": [],
        "duplicates of groups a did not handle across the cut": [],
    } == {
        "violations": outcome["violations"],
        "exit codes": outcome["exit codes"],
        "calls by a during the cut": [
            c for c in handed if c.pid == a.pid and last_call < c.called_at < healed_at
        ],
        "duplicates of groups a did not handle across the cut": [
            key for key in _twice(handed) if key not in across_the_cut
        ],
    }, outcome["report"]
    assert rescued_in < LEASE_SECONDS + RESCUE_TICK + 2.0, rescued_in
    assert back_in < 30, back_in
    print(
        f"black hole: rescued in {rescued_in:.1f} s, back {back_in:.1f} s after the heal,"
        f" {len(_twice(handed))} events handed over twice; {outcome['report']}"
    )


def test_a_slow_lossy_link_keeps_its_host_in_the_fleet_and_nothing_is_handled_twice(
    private_database: str,
    engine: Engine,
    producer: Producer,
    handled_dir: Path,
    log_dir: Path,
) -> None:
    """Host a's link is slow, with a small queue that drops what overflows it, for three
    leases: its heartbeats come later than their interval, but it is not taken for gone while
    it holds its leases, and no group is handed over twice."""
    with fleet(private_database, ["a", "b"], handled_dir, log_dir) as hosts:
        a = hosts["a"]
        _wait_until_holding(engine, a.pid)
        slowed_at = time.time()
        a.host.slow(SLOW_LINK)
        gaps = heartbeat_gaps(engine, a.pid, 3 * LEASE_SECONDS)
        dropped = a.host.dropped()
        a.host.heal()
        seconds_until(
            lambda: any(c.pid == a.pid and c.called_at > slowed_at for c in calls(handled_dir)),
            "a to handle a group on the slow link or after",
            40,
        )
        outcome = _finish(engine, producer, hosts, handled_dir)
        rescues = [h.worker.stderr().count(_log.JOBS_RESCUED) for h in hosts.values()]
    handed = calls(handled_dir)
    # The link was slow: heartbeats came later than their interval. (How many packets its
    # queue dropped depends on the database's protocol: a dozen with PostgreSQL's, often none
    # with MariaDB's smaller packets.)
    interval = heartbeat_interval(Settings(lease_seconds=LEASE_SECONDS, worker_stale_after=5.0))
    assert max(gaps) > interval, gaps
    assert {"violations": {}, "exit codes": [0, 0], "rescues": [0, 0], "twice": []} == {
        "violations": outcome["violations"],
        "exit codes": outcome["exit codes"],
        "rescues": rescues,
        "twice": _twice(handed),
    }, outcome["report"]
    print(f"slow link: heartbeat gaps up to {max(gaps):.1f} s, {dropped} packets dropped")


def test_a_host_killed_outright_while_the_database_restarts_loses_nothing(
    private_server: PrivateCluster | PrivateMariaDB,
    private_database: str,
    engine: Engine,
    producer: Producer,
    handled_dir: Path,
    log_dir: Path,
) -> None:
    """Every process of host a is killed with no goodbye, mid-batch, and then the database
    restarts at once while host b works: a's groups are rescued once it is taken for gone, b
    rides out the restart, and nothing is lost."""
    with fleet(private_database, ["a", "b"], handled_dir, log_dir) as hosts:
        a = hosts["a"]
        held = _wait_until_holding(engine, a.pid)
        killed_at = time.monotonic()
        a.worker.kill()
        rescued_in = seconds_until(
            lambda: not held & held_by(engine, a.pid), "a's groups to be rescued", 30
        )
        private_server.restart_immediate()
        time.sleep(LEASE_SECONDS)
        outcome = _finish(engine, producer, {"b": hosts["b"]}, handled_dir)
    assert {"violations": {}, "exit codes": [0]} == {
        "violations": outcome["violations"],
        "exit codes": outcome["exit codes"],
    }, outcome["report"]
    stale = SETTINGS.worker_stale_after
    assert rescued_in < min(stale, LEASE_SECONDS) + RESCUE_TICK + 2.0, (rescued_in, killed_at)
    print(f"host killed: rescued in {rescued_in:.1f} s; {outcome['report']}")


def test_clocks_minutes_wrong_on_the_hosts_change_nothing(
    private_database: str,
    engine: Engine,
    producer: Producer,
    handled_dir: Path,
    log_dir: Path,
    tmp_path: Path,
) -> None:
    """Host a's clock runs five minutes slow and host b's five minutes fast: the fleet takes
    neither for gone, rescues nothing, stamps their heartbeats with the database's time, and
    counts the ages of their batches (their lateness against the band's promise) alike.
    outbox reads every point in time from the database's clock, or through its reading of it
    (``outbox._db.database_clock``)."""
    offsets = {"a": -SKEW_SECONDS, "b": SKEW_SECONDS}
    began = time.time()
    skewed_clock = build_skewed_clock(tmp_path)
    with fleet(
        private_database,
        ["a", "b"],
        handled_dir,
        log_dir,
        clock_offsets=offsets,
        skewed_clock=skewed_clock,
    ) as hosts:
        for host in hosts.values():
            _wait_until_holding(engine, host.pid)
        started = database_now(engine)
        time.sleep(3 * LEASE_SECONDS)
        heard = [heard_since(engine, host.pid, started) for host in hosts.values()]
        stamped = heartbeat_offsets(engine, [host.pid for host in hosts.values()])
        outcome = _finish(engine, producer, hosts, handled_dir)
        rescues = [h.worker.stderr().count(_log.JOBS_RESCUED) for h in hosts.values()]
        ages = [
            sorted({round(late + PROMISE) for late in latenesses(h.worker.stderr())})
            for h in hosts.values()
        ]
        pids = {name: host.pid for name, host in hosts.items()}
    ended = time.time()
    handed = calls(handled_dir)
    assert {
        "violations": {},
        "exit codes": [0, 0],
        "rescues": [0, 0],
        "heard": [True, True],
        "twice": [],
    } == {
        "violations": outcome["violations"],
        "exit codes": outcome["exit codes"],
        "rescues": rescues,
        "heard": heard,
        "twice": _twice(handed),
    }, outcome["report"]
    # Each host's clock was off (its handler's calls say when they began by it) ...
    for name, offset in offsets.items():
        own = [c.called_at for c in handed if c.pid == pids[name]]
        assert own, name
        assert all(began + offset - 1 < moment < ended + offset + 1 for moment in own), name
    # ... yet its heartbeats were stamped with the database's time, and the oldest event of
    # each of its batches was seconds old by its account as by the other's.
    assert all(abs(offset) < LEASE_SECONDS for offset in stamped), stamped
    assert all(0 <= age < 60 for host in ages for age in host), ages
    assert all(ages), ages
