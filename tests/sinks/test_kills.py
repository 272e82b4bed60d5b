"""Workers SIGKILLed at random while they send: nothing lost, and duplicates only where the
sink's guarantee allows them.

For each sink kind: two ``outbox work`` processes sending through the sink, and, over and over,
a batch of events committed (now and then one rolled back), and the process that leased one of
their groups SIGKILLed a random moment later (while it sends the group, or finishes it), then
started again. Then every committed event is stored at least once, no rolled-back one is, the
first copy of each event comes in id order per key, and:

- where the downstream drops a re-send (JetStream's duplicate window, an API's idempotency
  key), nothing is stored twice;
- elsewhere (Redis Streams, RabbitMQ) an event is stored twice only when its group was in
  flight at a kill (at most the events of the groups the killed process held), each copy with
  the same message id and the same values.

``OUTBOX_SINK_KILLS=full`` (``nox -s sinks``) runs 10,000 events and 100 kills per sink on
each of SQLite, PostgreSQL and MariaDB; the test run's small size is 800 events and 8 kills
per sink, each sink on one of the databases.
"""

from __future__ import annotations

import importlib
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, select

from outbox import schema
from tests._support import wait_for
from tests.faults._processes import OutboxProcess, drained
from tests.models import SinkEvent
from tests.sinks import sink_app
from tests.sinks._contract import commit_events, event_id, event_rows, roll_back_events

FULL = os.environ.get("OUTBOX_SINK_KILLS") == "full"
EVENTS = 10_000 if FULL else 800
KILLS = 100 if FULL else 8
WORKERS = 2
CONCURRENCY = 2
# A process is up this long (at random) before the events it is killed over are committed:
# long enough to have started, and to have started on earlier ones.
UP_SECONDS = (0.8, 1.5)
# The kill lands this long (at random) after a group of them was leased: while it is sent, or
# finished.
KILL_AFTER_SECONDS = (0.0, 0.03)
LEASED_WITHIN_SECONDS = 3.0
# Each group is held this long once sent, before outbox records it: a kill then often lands
# where every message was acknowledged and the group is sent again (see sink_app).
HOLD_SECONDS = 0.05
DRAIN_SECONDS = 300.0 if FULL else 120.0
KINDS = ["http", "nats", "rabbitmq", "redis"]
DATABASES = ["sqlite", "postgresql", "mariadb"]
# The test run's small size puts each kind on one database, in turn; the full size on each.
CASES = (
    [(kind, database) for kind in KINDS for database in DATABASES]
    if FULL
    else [(kind, DATABASES[n % len(DATABASES)]) for n, kind in enumerate(KINDS)]
)

pytestmark = pytest.mark.timeout(1800 if FULL else 400)


def _workers(
    kind: str, target: str, url: str, tmp_path: Path, sync: bool
) -> Callable[[str], OutboxProcess]:
    env = {
        sink_app.KIND_ENV: kind,
        sink_app.DESTINATION_ENV: target,
        sink_app.SYNC_ENV: "1" if sync else "0",
        sink_app.HOLD_ENV: str(HOLD_SECONDS),
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }

    def start(name: str) -> OutboxProcess:
        return OutboxProcess(
            name,
            url,
            ["work", "--concurrency", str(CONCURRENCY)],
            handled_dir=tmp_path,
            log_dir=tmp_path,
            env=env,
            app="tests.sinks.sink_app:app",
        )

    return start


@pytest.mark.parametrize(("kind", "database_url"), CASES, indirect=["database_url"])
def test_workers_killed_at_random_lose_nothing(
    kind: str, database_url: str, tmp_path: Path
) -> None:
    """Random SIGKILLs while sending: every committed event stored, the rolled-back never,
    first copies in order per key, duplicates only as the sink's guarantee allows."""
    module: Any = importlib.import_module(f"tests.sinks.kinds.{kind}")
    engine: Engine = create_engine(database_url)
    rng = random.Random(os.environ.get("OUTBOX_SINK_KILLS_SEED"))
    committed: list[int] = []
    per = EVENTS // KILLS
    in_flight = 0
    with module.destination() as target:
        start = _workers(kind, target, database_url, tmp_path, sync=rng.random() < 0.5)
        processes = [start(f"worker-{n}-0") for n in range(WORKERS)]
        started = [time.monotonic()] * WORKERS
        kills = 0
        try:
            while kills < KILLS:
                time.sleep(max(min(started) + rng.uniform(*UP_SECONDS) - time.monotonic(), 0))
                committed += commit_events(engine, event_rows(per, kills * per))
                if kills % 4 == 0:
                    roll_back_events(engine, event_rows(5, 100_000 + kills))
                pids = [p.pid for p in processes]
                holder = _holder(engine, pids)
                time.sleep(rng.uniform(*KILL_AFTER_SECONDS))
                in_flight += holder is not None
                victim = rng.randrange(WORKERS) if holder is None else pids.index(holder)
                processes[victim].signal(signal.SIGKILL)
                processes[victim].wait(10)
                kills += 1
                processes[victim] = start(f"worker-{victim}-{kills}")
                started[victim] = time.monotonic()
            wait_for(lambda: drained(engine, SinkEvent), "the drain", DRAIN_SECONDS)
        finally:
            codes = [p.stop() for p in processes]
        stored = module.read_stored(target)
    engine.dispose()

    twice = {i: n for i, n in Counter(event_id(m.message_id) for m in stored).items() if n > 1}
    # What the run did, for the record (`pytest -s`; nox -s sinks prints it).
    print(
        f"\n{kind} on {engine.dialect.name}: {len(committed)} events, {KILLS} kills "
        f"({in_flight} with a group leased), {len(stored)} messages stored, "
        f"{sum(n - 1 for n in twice.values())} duplicates"
    )
    # The kills landed while groups were leased, not only between them.
    assert in_flight >= KILLS // 2, in_flight
    ids = [event_id(m.message_id) for m in stored]
    copies = Counter(ids)
    assert (set(committed), [0] * WORKERS) == (set(copies), codes)
    if module.DEDUPLICATES:
        assert {} == twice
    else:
        held = KILLS * CONCURRENCY * sink_app.BATCH_SIZE
        assert sum(n - 1 for n in twice.values()) <= held
        values: dict[str, list[Any]] = defaultdict(list)
        for message in stored:
            values[message.message_id].append(message.values)
        assert [] == [m for m, v in values.items() if any(x != v[0] for x in v)]
    first: dict[str | None, list[int]] = defaultdict(list)
    seen: set[int] = set()
    for message, i in zip(stored, ids, strict=True):
        if i not in seen:
            seen.add(i)
            first[message.key].append(i)
    assert {key: sorted(v) for key, v in first.items()} == dict(first)


def _holder(engine: Engine, pids: list[int]) -> int | None:
    """The pid of one of ``pids`` that holds a leased batch job, as soon as one does (None
    when none does within ``LEASED_WITHIN_SECONDS``)."""
    jobs = schema.jobs
    query = select(jobs.c.lease_owner).where(
        jobs.c.kind == schema.JobKind.BATCH, jobs.c.lease_owner.is_not(None)
    )
    deadline = time.monotonic() + LEASED_WITHIN_SECONDS
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            owners = conn.execute(query).scalars().all()
        held = [int(owner.split(":")[1]) for owner in owners]
        for pid in held:
            if pid in pids:
                return pid
        time.sleep(0.005)
    return None
