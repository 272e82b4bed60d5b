"""Three ``celery beat`` processes on one schedule: one distribution per tick.

Celery runs a periodic task once per beat (celery #2856, #4808), so a shop that runs a spare
beat for safety runs every entry twice. The distribution task takes its tick in the database
(``outbox_handlers.distributed_tick``, one conditional UPDATE) before it distributes: every
beat's task of a tick but one learns that it lost, and does nothing. The proof counts each
tick taken through a trigger (a tick taken twice would be recorded twice) and SIGKILLs one
beat halfway: the other two keep every tick.

``OUTBOX_FULL_RUN=1``: 1,000 ticks on each database; the default run: 10, on PostgreSQL.
``OUTBOX_CELERY_TICK_SECONDS`` sets the tick (1 s, the executor's default). A beat sends an
entry a little later each period (it schedules the next from when it sent the last), so the
executor's entry comes four times a tick, and each message takes the tick it was sent in, even
when it runs after that tick ended: a tick as short as the beat's own latencies can still pass
with no beat's message in it.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import create_engine

from tests.celery_proofs import proof_app
from tests.celery_proofs._harness import FULL, celeries, database_tick, ticks

TICKS = 1_000 if FULL else 10
BEATS = 3
EVERY = float(os.environ.get("OUTBOX_CELERY_TICK_SECONDS", "1.0"))
EVERY_MS = round(EVERY * 1000)
# Every database, each on one of the brokers; the default run: one of them (the tick's one
# statement runs on every database in the conformance tier).
CASES = [("rabbitmq", "postgresql"), ("redis", "mariadb")] if FULL else [("rabbitmq", "postgresql")]
STARTUP_SECONDS = 60.0

pytestmark = pytest.mark.timeout(3 * TICKS * EVERY + 300)


@pytest.mark.parametrize(("broker", "proof_database"), CASES, indirect=True)
def test_three_beats_distribute_once_per_tick(
    broker: str, proof_database: str, tmp_path: Path
) -> None:
    """Three beats: every tick distributed once, none twice; a beat SIGKILLed halfway loses
    no tick beyond the one it was in."""
    engine = create_engine(proof_database)
    settings = {proof_app.DISTRIBUTE_EVERY_ENV: str(EVERY)}
    with celeries(tmp_path, broker, proof_database, settings) as run:
        run.worker("worker", concurrency=2, prefetch=1)
        for n in range(BEATS):
            run.beat(f"beat-{n}")
        first = run.wait_for(lambda: ticks(engine), "a first tick", STARTUP_SECONDS)[0]
        last = first + (TICKS - 1) * EVERY_MS
        half = first + (TICKS // 2) * EVERY_MS
        run.wait_for(
            lambda: database_tick(engine, EVERY_MS) >= half, "half the ticks", TICKS * EVERY + 60
        )
        before = database_tick(engine, EVERY_MS)
        run.kill("beat-0")
        after = database_tick(engine, EVERY_MS)
        run.wait_for(lambda: ticks(engine)[-1] >= last, f"{TICKS} ticks", TICKS * EVERY + 60)
        received = run.received()
    taken = [tick for tick in ticks(engine) if first <= tick <= last]
    engine.dispose()
    twice = {tick: n for tick, n in Counter(taken).items() if n > 1}
    missing = sorted(set(range(first, last + 1, EVERY_MS)) - set(taken))
    # What the run did, for the record (`pytest -s`).
    print(
        f"\n{BEATS} beats, {TICKS} ticks of {EVERY} s on {engine.dialect.name} via "
        f"{broker.split(':')[0]}: {len(taken)} distributions, {len(twice)} ticks taken twice, "
        f"{len(missing)} missed ({[m for m in missing if not before <= m <= after]} away from "
        f"the kill); tasks received: {dict(received)}"
    )
    assert ({}, []) == (twice, [tick for tick in missing if not before <= tick <= after])
