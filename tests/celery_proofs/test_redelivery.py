"""A Redis broker whose visibility timeout is shorter than a batch: no group sent twice.

With ``acks_late``, Redis hands a task's message out again each time its visibility timeout
passes while the task still runs, and the task runs again (celery #5935, #3270); a message
prefetched and waiting behind a long task is handed out again the same way. The executor's
message only names a job, which the task leases when it is due and unleased: a redelivered
message finds its job leased (its lease kept alive by the running process) or finished, and
does nothing but say so at debug (``outbox.executor.skipped``).

One worker of two children, prefetch multiplier 4, on an application with ``task_acks_late``
and a visibility timeout of 10 s (swept every second), handling three groups whose handler
takes 30 s each: two run at once, the third waits for a child. Then: each group handled once,
each event delivered once, Redis's redeliveries of job messages seen (the proof provoked
them) and each answered by a no-op.

``OUTBOX_FULL_RUN=1``: the issue's sizes (10 s, 30 s) on PostgreSQL and MariaDB; the default
run: 2 s and 6 s, on PostgreSQL.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from tests.celery_proofs import proof_app
from tests.celery_proofs._harness import (
    FULL,
    RECEIVED,
    archived,
    broker_url,
    celeries,
    commit,
    drained,
    read_records,
    tally,
)

VISIBILITY_TIMEOUT, HANDLER_SECONDS = (10.0, 30.0) if FULL else (2.0, 6.0)
GROUPS = 3
BATCH_SIZE = 5
CONCURRENCY = 2
DATABASES = ["postgresql", "mariadb"] if FULL else ["postgresql"]
SETTINGS = {
    proof_app.VISIBILITY_TIMEOUT_ENV: str(VISIBILITY_TIMEOUT),
    proof_app.HANDLER_SECONDS_ENV: str(HANDLER_SECONDS),
    proof_app.BATCH_SIZE_ENV: str(BATCH_SIZE),
    proof_app.DISTRIBUTE_EVERY_ENV: "1.0",
}
JOB_TASK = "outbox.run_job"
SKIPPED = "outbox.executor.skipped"
# Two rounds of calls (three groups, two children), and time to start and finish.
DRAIN_SECONDS = 2 * HANDLER_SECONDS + 120

pytestmark = pytest.mark.timeout(DRAIN_SECONDS + 120)


@pytest.mark.parametrize("proof_database", DATABASES, indirect=True)
def test_redis_redeliveries_of_long_batches_send_nothing_twice(
    proof_database: str, tmp_path: Path
) -> None:
    """Visibility timeout shorter than the handler: every group handled once, every event
    delivered once, each redelivered job message a no-op."""
    engine = create_engine(proof_database)
    with celeries(tmp_path, broker_url("redis"), proof_database, SETTINGS) as run:
        run.worker("worker", concurrency=CONCURRENCY, prefetch=4)
        run.beat("beat")
        committed = commit(engine, GROUPS * BATCH_SIZE, "long")
        run.wait_for(lambda: drained(engine), "the drain", DRAIN_SECONDS)
        lines = run.log_lines()
    dead = archived(engine, "dead")
    engine.dispose()

    records = read_records(run.records)
    counts = tally(committed, records)
    received = Counter(
        m["id"]
        for line in lines
        if (m := RECEIVED.search(line["message"])) and m["name"] == JOB_TASK
    )
    redelivered = sum(n - 1 for n in received.values())
    skipped = [line for line in lines if line["level"] == "DEBUG" and SKIPPED in line["message"]]
    # What the run did, for the record (`pytest -s`).
    print(
        f"\nvisibility timeout {VISIBILITY_TIMEOUT} s, handler {HANDLER_SECONDS} s, "
        f"{engine.dialect.name} via redis: {len(records.starts)} calls for {GROUPS} groups, "
        f"{counts.delivered} of {counts.committed} events delivered, "
        f"{len(counts.repeated)} twice; {len(received)} job messages, {redelivered} "
        f"redeliveries, {len(skipped)} no-ops"
    )
    assert ([], [], {}, []) == (counts.lost, counts.phantom, counts.repeated, dead)
    assert GROUPS == len(records.starts)
    assert (True, True) == (redelivered > 0, len(skipped) >= redelivered)
