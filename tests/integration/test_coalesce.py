"""Coalescing by key (``coalesce=True`` with ``ordering_key``): a group hands over only the
latest event of each key, the others are archived as ``superseded`` once it succeeds, and no
key's older state is ever handed over after a newer one. On SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import os
import random
import threading
from collections import Counter, defaultdict
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, func, insert, select

from outbox import Batch, ConfigurationError, Outbox, RetryPolicy, Settings, schema
from outbox.ops import archive, groups, replay
from outbox.ops.metrics import collect
from outbox.ops.progress import Progress
from outbox.results import BatchResult
from outbox.testing import drain
from outbox.worker import Worker
from tests._support import wait_for
from tests.conftest import FULL_RUN_ENV
from tests.models import ActivityEvent

FAST = Settings(poll_interval=0.05, rescue_interval=0.05)
IMMEDIATE = RetryPolicy(max_attempts=3, scale=0.0, base_delay=0.0, jitter=0.0)
ONCE = RetryPolicy(max_attempts=1)


def _superseded(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        found = conn.execute(
            select(schema.archive.c.event_id)
            .where(schema.archive.c.status == schema.ArchiveStatus.SUPERSEDED)
            .order_by(schema.archive.c.event_id)
        ).scalars()
        return list(found)


def _write(engine: Engine, keys: list[int]) -> list[int]:
    """One event per key given, in that order, in one transaction; their ids."""
    with engine.begin() as conn:
        before = conn.execute(select(func.coalesce(func.max(ActivityEvent.id), 0))).scalar_one()
        conn.execute(insert(ActivityEvent), [{"activity_id": k} for k in keys])
        return list(
            conn.execute(
                select(ActivityEvent.id).where(ActivityEvent.id > before).order_by("id")
            ).scalars()
        )


def test_coalescing_needs_an_ordering_key_and_no_bisection() -> None:
    app = Outbox("sqlite://")
    with pytest.raises(ConfigurationError, match="coalesce=True needs ordering_key"):
        app.handler(ActivityEvent, coalesce=True, name="a")(lambda batch: None)
    with pytest.raises(ConfigurationError, match="coalesce=True and bisect=True do not go"):
        app.handler(
            ActivityEvent, coalesce=True, bisect=True, ordering_key="activity_id", name="b"
        )(lambda batch: None)


def test_a_group_hands_over_the_latest_event_of_each_key(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Ten changes of each of three keys in one group: the handler sees three events, each
    its key's last; the other 27 are archived as superseded, and said so in the result."""
    app = make_app(database_url)
    seen: list[list[tuple[int, int]]] = []

    @app.handler(ActivityEvent, batch_size=100, ordering_key="activity_id", coalesce=True)
    def sync(batch: Batch[ActivityEvent]) -> None:
        seen.append([(e.activity_id, e.id) for e in batch.events])

    ids = _write(app.engine, [1, 2, 3] * 10)
    results: list[BatchResult] = []
    assert Worker(app, concurrency=1, burst=True, on_result=results.append).run()
    latest = [(key, max(i for i, k in zip(ids, [1, 2, 3] * 10, strict=True) if k == key))
              for key in (1, 2, 3)]  # fmt: skip
    assert [latest] == seen
    assert sorted(set(ids) - {i for _, i in latest}) == _superseded(app.engine)
    assert [(30, 3, 27)] == [(r.size, r.succeeded, r.superseded) for r in results]
    # What `outbox status`, the console and the gauges read: the superseded count; and the
    # group, shown, succeeded (its superseded events are all its handler kept of it).
    assert {"superseded": 27} == collect(app)[0].archived
    assert "succeeded" == groups.show(app, results[0].group_id).group.status


def test_a_failed_group_keeps_every_event_until_it_succeeds(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """The attempt that fails archives nothing; the next one coalesces again the same group
    (a later event of its key cannot join it: the key is held while it waits)."""
    app = make_app(database_url)
    app.settings = FAST
    calls: list[list[int]] = []

    @app.handler(
        ActivityEvent,
        ordering_key="activity_id",
        coalesce=True,
        retry=IMMEDIATE,
    )
    def flaky(batch: Batch[ActivityEvent]) -> None:
        calls.append(list(batch.ids))
        archived_before.append(_superseded(app.engine))
        if len(calls) == 1:
            raise RuntimeError("the API said 503")

    archived_before: list[list[int]] = []
    ids = _write(app.engine, [7, 7, 7])
    drain(app)
    assert ([[ids[2]], [ids[2]]], [[], []], ids[:2]) == (
        calls,
        archived_before,
        _superseded(app.engine),
    )


def test_a_group_that_dies_takes_the_events_it_stood_for_to_the_dead_letters(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Nothing is superseded by a group that never succeeded: all its events are dead letters,
    and a replay of them coalesces again."""
    app = make_app(database_url)

    @app.handler(ActivityEvent, ordering_key="activity_id", coalesce=True, retry=ONCE)
    def down(batch: Batch[ActivityEvent]) -> None:
        raise RuntimeError("the API said 503")

    _write(app.engine, [7, 7, 7])
    drain(app)
    assert {"dead": 3} == collect(app)[0].archived


def test_events_the_handler_retries_go_on_and_the_ones_they_stand_for_are_archived(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A key's latest event singled out for a retry goes on alone; its older ones are archived
    as superseded with the group's success: the latest carries their state."""
    app = make_app(database_url)
    app.settings = FAST
    calls: list[list[int]] = []

    @app.handler(
        ActivityEvent,
        ordering_key="activity_id",
        coalesce=True,
        retry=IMMEDIATE,
    )
    def partly(batch: Batch[ActivityEvent]) -> None:
        calls.append(list(batch.ids))
        if len(calls) == 1:
            batch.retry([e for e in batch.events if e.activity_id == 1], "timed out")

    ids = _write(app.engine, [1, 2, 1, 2, 1])
    drain(app)
    assert ([[ids[3], ids[4]], [ids[4]]], [ids[0], ids[1], ids[2]]) == (
        calls,
        _superseded(app.engine),
    )


# The proof, 100,000 updates over 1,000 keys, in the full run (nox -s full).
UPDATES, KEYS = (100_000, 1_000) if os.environ.get(FULL_RUN_ENV) == "1" else (6_000, 100)


def test_no_key_is_ever_handed_an_older_state_after_a_newer_one(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Updates of many keys written in small transactions while a worker of four threads
    handles them: per key, the events handed over are in id order, each group holds one
    event of a key, the last one handed over is the key's last, and every event is either
    handed over or archived as superseded, as the worker counted them."""
    app = make_app(database_url)
    app.settings = FAST
    handed: dict[int, list[int]] = defaultdict(list)
    per_group: list[Counter[int]] = []
    lock = threading.Lock()

    @app.handler(ActivityEvent, batch_size=50, ordering_key="activity_id", coalesce=True)
    def sync(batch: Batch[ActivityEvent]) -> None:
        with lock:
            per_group.append(Counter(e.activity_id for e in batch.events))
            for event in batch.events:
                handed[event.activity_id].append(event.id)

    rng = random.Random(20261130)
    worker = Worker(app, concurrency=4)
    running = threading.Thread(target=worker.run, daemon=True)
    running.start()
    written: list[tuple[int, int]] = []
    try:
        for _ in range(UPDATES // 20):
            keys = [rng.randrange(KEYS) for _ in range(20)]
            written += zip(keys, _write(app.engine, keys), strict=True)
        last = {key: event_id for key, event_id in written}

        def settled() -> bool:
            with lock:
                return all(handed[k] and handed[k][-1] == i for k, i in last.items())

        wait_for(settled, "every key's last event to be handed over", 120)
    finally:
        worker.stop()
        running.join(30)
    superseded = _superseded(app.engine)
    handed_ids = [i for ids in handed.values() for i in ids]
    assert [] == [k for k, ids in handed.items() if ids != sorted(set(ids))]
    assert 1 == max(n for group in per_group for n in group.values())
    assert (len(written), 0) == (
        len(handed_ids) + len(superseded),
        len(set(handed_ids) & set(superseded)),
    )
    stats = worker.stats
    assert (len(handed_ids), len(superseded)) == (stats.events_succeeded, stats.events_superseded)
    print(
        f"{len(written)} updates of {KEYS} keys: {len(handed_ids)} handed over in "
        f"{len(per_group)} groups, {len(superseded)} superseded"
    )


def test_superseded_events_are_never_replayed_and_are_history_to_prune(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A superseded event is an older state its key's later event carried: replay refuses it
    by name and leaves it out of a group's or every status's replay; prune takes it as
    history."""
    app = make_app(database_url)
    handed: list[int] = []

    @app.handler(ActivityEvent, ordering_key="activity_id", coalesce=True)
    def sync(batch: Batch[ActivityEvent]) -> None:
        handed.extend(batch.ids)

    ids = _write(app.engine, [1, 1, 1])
    drain(app)
    with app.engine.connect() as conn:
        group_id = conn.execute(select(schema.archive.c.group_id)).scalars().first()
    with pytest.raises(ConfigurationError, match="superseded events are older states"):
        replay.replay(app, status="superseded")
    every = replay.replay(app, all_statuses=True)
    whole_group = replay.replay(app, group_id=group_id)
    drain(app)
    pruned = archive.prune(app, older_than=0)
    assert ([ids[2]], 0, 0, 2) == (handed, every.events, whole_group.events, pruned)


def test_a_dead_group_replayed_in_chunks_holds_its_key_until_its_last_event_is_back(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A dead group of an ordered handler replayed a chunk at a time, a worker running between
    the chunks: the key's event written after the group died waits until every event of the
    group is back, and is handed over after them."""
    app = make_app(database_url)
    app.settings = FAST
    handed: list[int] = []
    down = [True]

    @app.handler(ActivityEvent, ordering_key="activity_id", batch_size=2, retry=ONCE)
    def sync(batch: Batch[ActivityEvent]) -> None:
        if down[0]:
            raise RuntimeError("the API said 503")
        handed.extend(batch.ids)

    dead = _write(app.engine, [1, 1])
    drain(app)
    later = _write(app.engine, [1])
    drain(app)
    down[0] = False

    class WorkerBetweenChunks(Progress):
        def advance(self, done: int) -> None:
            super().advance(done)
            drain(app)

    replay.replay(app, chunk=1, progress=WorkerBetweenChunks())
    drain(app)
    assert [*dead, *later] == handed
