"""``kill -9`` of Celery worker children mid-batch: nothing lost, no phantom, and every killed
group re-claimed within one lease.

Celery loses the executing and reserved tasks of a killed or OOM-killed child (celery #7924,
#1628). Under outbox a killed child loses only a lease: the job table says which group it
held, and the group is handed over again when the lease ends (or sooner). Two workers
(prefork, two children each) at a prefetch multiplier of 1, 4 and 100 drain rounds of events;
each round, a child that has just begun a group not killed before (its handler has recorded
the start) is SIGKILLed a random moment later, before the call ends, and the proof waits for
that group to be begun again by another child. Then, once drained: every committed event
delivered (0 lost), nothing delivered that was not committed (0 phantom), repeats only of the killed
groups, no dead letter, and each killed group begun again within one lease of its kill (plus
the rescue's period, in which the expiry is noticed, and a child's call, which its message
may wait behind). Each child heartbeats as a worker: a killed child is judged gone after a
silent 3 s, before its 5 s lease ends.

``OUTBOX_FULL_RUN=1``: 20 kills at each prefetch multiplier on each database; the default
run: 2 kills at a multiplier of 4, on PostgreSQL and RabbitMQ (the poison proof's default run
is MariaDB's and Redis's).
"""

from __future__ import annotations

import os
import random
import statistics
import time
from contextlib import suppress
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from tests.celery_proofs import proof_app
from tests.celery_proofs._harness import (
    FULL,
    Call,
    archived,
    celeries,
    commit,
    drained,
    killed,
    read_records,
    tally,
)

PREFETCHES = (1, 4, 100) if FULL else (4,)
KILLS = 20 if FULL else 2
WORKERS = 2
CONCURRENCY = 2
EVENTS_PER_ROUND = 60
BATCH_SIZE = 20
HANDLER_SECONDS = 1.0
LEASE_SECONDS = 5.0
STALE_SECONDS = 3.0
DISTRIBUTE_EVERY = 0.5
RESCUE_EVERY = 0.5  # the proof app's Settings.rescue_interval, the executor's default period
# What "within one lease" allows beyond the lease: the rescue that frees the job runs every
# half second, its message then waits for a child to finish the call it is in (the other
# children are busy with groups of their own), and a second for the machine's hiccups.
NOTICED_WITHIN_SECONDS = RESCUE_EVERY + HANDLER_SECONDS + 1.0
SETTINGS = {
    proof_app.BATCH_SIZE_ENV: str(BATCH_SIZE),
    proof_app.HANDLER_SECONDS_ENV: str(HANDLER_SECONDS),
    proof_app.LEASE_SECONDS_ENV: str(LEASE_SECONDS),
    proof_app.STALE_SECONDS_ENV: str(STALE_SECONDS),
    proof_app.DISTRIBUTE_EVERY_ENV: str(DISTRIBUTE_EVERY),
}
# Each database with one broker, at every multiplier.
CASES = [
    (prefetch, broker, database)
    for prefetch in PREFETCHES
    for broker, database in (
        (("rabbitmq", "postgresql"), ("redis", "mariadb"))
        if FULL
        else (("rabbitmq", "postgresql"),)
    )
]
STARTUP_SECONDS = 60.0
ROUND_SECONDS = 15.0
ROUND_TRIES = 4
DRAIN_SECONDS = 120.0

pytestmark = pytest.mark.timeout(KILLS * 60 + 300)


def _victim(calls: list[Call], killed: set[str]) -> list[Call]:
    """The calls of groups not killed yet begun less than 0.6 of a call ago (a kill can still
    land before they end), newest first: each kill is of another group."""
    now = time.time()
    fresh = [c for c in calls if now - c.at < 0.6 * HANDLER_SECONDS and c.group not in killed]
    return sorted(fresh, key=lambda c: -c.at)


@pytest.mark.parametrize(
    ("prefetch", "broker", "proof_database"), CASES, indirect=["broker", "proof_database"]
)
def test_children_killed_mid_batch_lose_nothing(
    prefetch: int, broker: str, proof_database: str, tmp_path: Path
) -> None:
    """SIGKILLed pool children mid-batch: 0 lost, 0 phantom, repeats only of the killed
    groups, and each killed group begun again within one lease."""
    engine = create_engine(proof_database)
    rng = random.Random(os.environ.get("OUTBOX_CELERY_KILLS_SEED"))
    committed: list[int] = []
    kills: list[tuple[Call, float]] = []
    recoveries: list[float] = []
    with celeries(tmp_path, broker, proof_database, SETTINGS) as run:
        for n in range(WORKERS):
            run.worker(f"worker-{n}", concurrency=CONCURRENCY, prefetch=prefetch)
        run.beat("beat")
        run.wait_for(
            lambda: len(run.pools()) == WORKERS * CONCURRENCY, "the pools", STARTUP_SECONDS
        )
        for round_ in range(KILLS):
            call = None
            for again_ in range(ROUND_TRIES):
                # A round whose calls all began and ended between two looks (a loaded
                # machine) is followed by another.
                committed += commit(engine, EVENTS_PER_ROUND, f"round-{round_}-{again_}")
                with suppress(AssertionError):
                    call = run.wait_for(
                        lambda: _victim(
                            read_records(run.records).in_flight(run.pools()),
                            {c.group for c, _ in kills},
                        ),
                        "a group begun in a pool child",
                        ROUND_SECONDS,
                    )[0]
                    break
                run.check()  # a process that exited fails the proof here, with the logs
            assert call is not None, f"no call seen in flight in {ROUND_TRIES} rounds"
            aim = call.at + rng.uniform(0.05, 0.8) * HANDLER_SECONDS
            time.sleep(max(aim - time.time(), 0))
            at = killed(call.pid)
            kills.append((call, at))
            again = run.wait_for(
                lambda: read_records(run.records).started_after(call.group, at),  # noqa: B023
                f"group {call.group} begun again",
                LEASE_SECONDS + NOTICED_WITHIN_SECONDS + 30,
            )[0]
            recoveries.append(again.at - at)
        run.wait_for(lambda: drained(engine), "the drain", DRAIN_SECONDS)
        records = read_records(run.records)
    dead = archived(engine, "dead")
    engine.dispose()

    counts = tally(committed, records)
    ended = {call.key for call in records.ends}
    mid_batch = [call for call, _ in kills if call.key not in ended]
    killed_groups = {call.group for call, _ in kills}
    repeated_groups = {group for event, group, *_ in records.deliveries if event in counts.repeated}
    # What the run did, for the record (`pytest -s`; nox -s full prints it).
    print(
        f"\nprefetch {prefetch}, {engine.dialect.name} via {broker.split(':')[0]}: "
        f"{counts.committed} events, {len(kills)} kills ({len(mid_batch)} mid-batch), "
        f"{counts.delivered} delivered, {len(counts.lost)} lost, {len(counts.phantom)} phantom, "
        f"{len(counts.repeated)} delivered again (of {len(repeated_groups)} groups); "
        f"{len(killed_groups)} groups killed, begun again after {min(recoveries):.2f}-"
        f"{max(recoveries):.2f} s (median {statistics.median(recoveries):.2f} s; lease "
        f"{LEASE_SECONDS} s, silent worker {STALE_SECONDS} s)"
    )
    assert ([], [], KILLS, []) == (counts.lost, counts.phantom, len(mid_batch), dead)
    assert (KILLS, set()) == (len(killed_groups), repeated_groups - killed_groups)
    assert [] == [s for s in recoveries if s > LEASE_SECONDS + NOTICED_WITHIN_SECONDS]
