"""A handler that kills its own process, every time: a dead letter after its attempts.

With ``task_reject_on_worker_lost`` Celery loops on such a task for ever; without it, the task
is lost. Under outbox each kill ends an attempt (its lease is freed by the rescue, the attempt
counted), and once the attempts are spent the group is dead-lettered with the cause recorded:
its events in the archive as dead, each attempt in ``outbox_attempts``. Then nothing more: the
handler was called once per attempt, while the worker went on distributing and rescuing.

``OUTBOX_FULL_RUN=1``: on PostgreSQL and MariaDB; the default run: on MariaDB.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine

from outbox import schema
from outbox._db.queries import RESCUED_ERROR
from tests.celery_proofs import proof_app
from tests.celery_proofs._harness import (
    FULL,
    archived,
    attempts_of,
    celeries,
    commit,
    drained,
    read_records,
)

MAX_ATTEMPTS = 3
EVENTS = 4
LEASE_SECONDS = 3.0
DISTRIBUTE_EVERY = 0.5
CASES = [("rabbitmq", "postgresql"), ("redis", "mariadb")] if FULL else [("redis", "mariadb")]
SETTINGS = {
    proof_app.SUICIDE_ENV: "1",
    proof_app.MAX_ATTEMPTS_ENV: str(MAX_ATTEMPTS),
    proof_app.LEASE_SECONDS_ENV: str(LEASE_SECONDS),
    proof_app.DISTRIBUTE_EVERY_ENV: str(DISTRIBUTE_EVERY),
}
# Each attempt ends at the latest when its lease does, and is noticed within seconds.
DEAD_WITHIN_SECONDS = (MAX_ATTEMPTS + 1) * (LEASE_SECONDS + 5) + 60
RESCUE_TASK = "outbox.rescue"
RESCUE_EVERY = 0.5  # the proof app's Settings.rescue_interval, the executor's default period
# After the dead letter, the worker goes on this many rescues: long enough for a loop to show.
RESCUES_AFTER = 6

pytestmark = pytest.mark.timeout(DEAD_WITHIN_SECONDS + 120)


@pytest.mark.parametrize(("broker", "proof_database"), CASES, indirect=True)
def test_a_handler_that_kills_its_process_ends_as_a_dead_letter(
    broker: str, proof_database: str, tmp_path: Path
) -> None:
    """A poison group: one call per attempt, then dead-lettered with the cause recorded,
    and never called again."""
    engine = create_engine(proof_database)
    with celeries(tmp_path, broker, proof_database, SETTINGS) as run:
        run.worker("worker", concurrency=2, prefetch=1)
        run.beat("beat")
        committed = commit(engine, EVENTS, "poison")
        dead = run.wait_for(
            lambda: (rows := archived(engine, "dead")) and len(rows) == EVENTS and rows,
            "the dead letter",
            DEAD_WITHIN_SECONDS,
        )
        rescues = run.received()[RESCUE_TASK]
        run.wait_for(
            lambda: drained(engine) and run.received()[RESCUE_TASK] >= rescues + RESCUES_AFTER,
            f"{RESCUES_AFTER} rescues more",
            RESCUES_AFTER * RESCUE_EVERY + 60,
        )
        records = read_records(run.records)
    group = str(dead[0].group_id)
    history = attempts_of(engine, group)
    engine.dispose()

    # What the run did, for the record (`pytest -s`).
    print(
        f"\npoison on {engine.dialect.name} via {broker.split(':')[0]}: "
        f"{len(records.starts)} calls, attempts {[(h.attempt, h.outcome) for h in history]}, "
        f"dead with {dead[0].error!r}"
    )
    assert (set(committed), {group}, {RESCUED_ERROR}) == (
        {row.event_id for row in dead},
        {str(row.group_id) for row in dead},
        {row.error for row in dead},
    )
    assert [(group, n) for n in range(1, MAX_ATTEMPTS + 1)] == [
        (call.group, call.attempt) for call in records.starts
    ]
    lease_expired = schema.AttemptOutcome.LEASE_EXPIRED.value
    assert [lease_expired] * MAX_ATTEMPTS + [schema.AttemptOutcome.DEAD.value] == [
        h.outcome for h in history
    ]
