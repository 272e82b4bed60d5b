"""Ordered keys (``ordering_key``): each key's events are handled in id order, one group of
the key at a time; a failing group holds its key's later events until it succeeds, and a dead
one until it is replayed or its key released, while other keys flow. On SQLite, PostgreSQL and
MariaDB."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select

from outbox import Batch, Outbox, RetryPolicy, schema
from outbox._engine import claimer
from outbox.exceptions import ReplayError
from outbox.ops import holds, metrics, replay
from outbox.testing import drain
from outbox.worker import Worker
from tests._support import NO_RETRY_AFTER_FLOOR
from tests.models import ActivityEvent

Commit = Callable[..., list[int]]
NO_WAIT = RetryPolicy(max_attempts=50, scale=0.0, base_delay=0.0, jitter=0.0)


def _buffered(app: Outbox) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(ActivityEvent)).scalar_one())


FAILURES = ["raise", "bisect", "retry", "defer", "retry_and_defer"]


def _refuse(batch: Batch[ActivityEvent], how: str, rng: random.Random) -> set[int]:
    """A call that fails the ``how`` way; the ids it did not deliver. A partial failure refuses
    an event and its key's later events in the call, as an ordered handler must: those that
    it retries, defers, or (``retry_and_defer``) retries the first and defers the others."""
    if how in ("raise", "bisect"):
        raise RuntimeError("the downstream failed this call")
    first = rng.choice(batch.events)
    later = [e for e in batch.events if e.activity_id == first.activity_id and e.id >= first.id]
    for event in later:
        if how == "retry" or (how == "retry_and_defer" and event is first):
            batch.retry([event], "this record failed")
        else:
            batch.retry([event], "rate limited for this record", after=0)
    return {event.id for event in later}


@pytest.mark.parametrize("how", FAILURES)
def test_keys_are_handled_in_order_through_random_failures(
    how: str, database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """Five keys interleaved, groups of four, a third of the calls failing at random (whole
    calls, whole calls bisected, or some events retried, deferred or both), four threads:
    every key's events arrive in id order, each once, and no call ever carries an event of a
    key while an earlier event of that key is undelivered."""
    app = make_app(database_url, NO_RETRY_AFTER_FLOOR)
    rng = random.Random(7)
    keys = [rng.randrange(5) for _ in range(60)]
    delivered: dict[int, list[int]] = {}
    overtaking: list[tuple[int, int]] = []
    lock = threading.Lock()

    @app.handler(
        ActivityEvent,
        batch_size=4,
        retry=NO_WAIT,
        ordering_key="activity_id",
        bisect=how == "bisect",
    )
    def ordered(batch: Batch[ActivityEvent]) -> None:
        with lock:
            for event in batch.events:
                earlier = [i for i in ids_by_key[event.activity_id] if i < event.id]
                done = set(delivered.get(event.activity_id, [])) | set(batch.ids)
                overtaking.extend((event.id, i) for i in earlier if i not in done)
            refused = _refuse(batch, how, rng) if rng.random() < 1 / 3 else set()
            for event in batch.events:
                if event.id not in refused:
                    delivered.setdefault(event.activity_id, []).append(event.id)

    ids_by_key: dict[int, list[int]] = {}
    for key in keys:
        (event_id,) = commit_events(app.engine, 1, activity_id=key)
        ids_by_key.setdefault(key, []).append(event_id)
    for _ in range(100):
        Worker(app, concurrency=4, burst=True).run()
        if not _buffered(app):
            break
    assert ([], ids_by_key) == (overtaking, {k: v for k, v in sorted(delivered.items())})


@pytest.mark.parametrize(
    ("keys", "groups", "unclaimed"),
    [(["a", "b", "c", "d"], 2, 0), (["a", "b", "a", "b"], 1, 2), (["a", "b", "c", "a"], 2, 1)],
)
def test_bisecting_an_ordered_group_keeps_one_group_per_key(
    keys: list[str],
    groups: int,
    unclaimed: int,
    database_url: str,
    make_app: Callable[[str], Outbox],
    commit_events: Commit,
) -> None:
    """A failing group of four, bisected: the later events of keys the earlier half holds go
    back to the buffer behind them; the later events of other keys go on in a group of their
    own, with the group's attempts and backoff."""
    app = make_app(database_url)
    retry = RetryPolicy(max_attempts=5, scale=0.0, base_delay=3600.0, jitter=0.0)

    @app.handler(ActivityEvent, batch_size=4, retry=retry, ordering_key="kind", bisect=True)
    def ordered(batch: Batch[ActivityEvent]) -> None:
        raise RuntimeError("refused whole")

    for key in keys:
        commit_events(app.engine, 1, kind=key)
    drain(app)
    with app.engine.connect() as conn:
        jobs = conn.execute(select(schema.jobs.c.attempts)).scalars().all()
        left = conn.execute(
            select(func.count()).select_from(ActivityEvent).where(ActivityEvent.group_id.is_(None))
        ).scalar_one()
    assert ([1] * groups, unclaimed) == (sorted(jobs), left)


def _dying(app: Outbox, failing: set[int]) -> list[int]:
    """A handler whose calls fail for good while they carry a key in ``failing``."""
    handled: list[int] = []
    policy = RetryPolicy(max_attempts=1)

    @app.handler(ActivityEvent, batch_size=2, retry=policy, ordering_key="activity_id")
    def ordered(batch: Batch[ActivityEvent]) -> None:
        if any(event.activity_id in failing for event in batch.events):
            raise RuntimeError("refused")
        handled.extend(batch.ids)

    return handled


def test_a_dead_group_holds_its_keys_later_events_other_keys_flow(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    app = make_app(database_url)
    failing = {1}
    handled = _dying(app, failing)
    first = commit_events(app.engine, 2, activity_id=1)
    later = commit_events(app.engine, 2, activity_id=1)
    other = commit_events(app.engine, 2, activity_id=2)
    drain(app)  # the first group of key 1 dies
    failing.clear()  # the downstream is fixed, but the dead group's key stays held
    drain(app)
    status = metrics.collect(app)[0]
    assert (other, 2, ["1"]) == (handled, _buffered(app), status.held_keys)
    assert any("held by dead groups" in alert for alert in status.alerts)
    assert [("ordered", "1")] == [(k.handler, k.key) for k in holds.held_keys(app)]
    del first, later


def test_releasing_a_held_key_lets_its_later_events_go(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    app = make_app(database_url)
    failing = {1}
    handled = _dying(app, failing)
    commit_events(app.engine, 2, activity_id=1)
    drain(app)
    failing.clear()
    later = commit_events(app.engine, 2, activity_id=1)
    drain(app)
    held_back = list(handled)
    assert 1 == holds.release_keys(app, "ordered", key="1")
    drain(app)
    assert ([], later, []) == (held_back, handled, holds.held_keys(app))


def test_replaying_a_dead_group_puts_it_back_ahead_of_its_keys_later_events(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    app = make_app(database_url)
    failing = {1}
    handled = _dying(app, failing)
    dead = commit_events(app.engine, 2, activity_id=1)
    later = commit_events(app.engine, 2, activity_id=1)
    drain(app)  # the first group dies; the later events wait behind it
    failing.clear()
    replayed = replay.replay(app, handler="ordered", status="dead")
    drain(app)
    assert (2, dead + later, []) == (replayed.events, handled, holds.held_keys(app))


def test_a_dead_group_with_an_event_whose_id_is_taken_keeps_holding_its_key(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """A replay that must leave one of a dead group's events archived (its id taken) puts
    the other back and keeps the key held: the later events do not pass the one left."""
    app = make_app(database_url)
    failing = {1}
    handled = _dying(app, failing)
    first, second = commit_events(app.engine, 2, activity_id=1)
    commit_events(app.engine, 1, activity_id=1)
    drain(app)  # the first group dies; the later event waits behind it
    failing.clear()
    with app.engine.begin() as conn:
        conn.execute(ActivityEvent.__table__.insert().values(id=first, activity_id=7))
    with pytest.raises(ReplayError):
        replay.replay(app, handler="ordered", status="dead")
    drain(app)
    assert (["1"], [first]) == ([k.key for k in holds.held_keys(app)], handled)
    del second


def test_keyed_and_ordered_turns_pass_over_a_held_key(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """Keyed groups of ordered keys: a turn skips a key that is held and goes to one whose
    events may go."""
    app = make_app(database_url)
    handled: list[int] = []

    @app.handler(
        ActivityEvent,
        batch_size=10,
        retry=RetryPolicy(max_attempts=1),
        group_by="activity_id",
        ordering_key="activity_id",
    )
    def both(batch: Batch[ActivityEvent]) -> None:
        if batch.events[0].activity_id == 1:
            raise RuntimeError("refused")
        handled.extend(batch.ids)

    commit_events(app.engine, 1, activity_id=1)
    commit_events(app.engine, 1, activity_id=2)
    drain(app)  # key 1 dies and is held; key 2 is handled, and had the last turn
    commit_events(app.engine, 1, activity_id=1)  # waits behind the dead group
    (waiting,) = commit_events(app.engine, 1, activity_id=2)
    claim = claimer.run_once(app, app.get_handler("both"))
    assert (1, ["1"]) == (claim.size if claim else 0, [k.key for k in holds.held_keys(app)])
    drain(app)
    assert waiting in handled


def test_a_claim_that_skips_a_keys_locked_event_takes_none_of_its_later_ones(
    server_database: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """A key's oldest waiting event locked by another statement (MariaDB locks the rows a scan
    reads; an update of a waiting event locks it anywhere): the claim's SKIP LOCKED passes
    over it, and takes none of the key's later events, which would be handed over first. The
    other keys' events go; the key's go in order once the lock is gone."""
    app = make_app(server_database)
    handled: list[int] = []

    @app.handler(ActivityEvent, batch_size=10, ordering_key="activity_id")
    def ordered(batch: Batch[ActivityEvent]) -> None:
        handled.extend(batch.ids)

    (head,) = commit_events(app.engine, 1, activity_id=1)
    (other,) = commit_events(app.engine, 1, activity_id=2)
    (later,) = commit_events(app.engine, 1, activity_id=1)
    table = ActivityEvent.__table__
    with app.engine.connect() as locker:
        locker.begin()
        locker.execute(select(table.c.id).where(table.c.id == head).with_for_update())
        claim = claimer.run_once(app, app.get_handler("ordered"))
        locker.rollback()
    assert claim is not None
    assert [other] == [row.id for row in _group_rows(app, claim.group_id)]
    drain(app)
    assert [other, head, later] == handled


def _group_rows(app: Outbox, group_id: object) -> list[Any]:
    table = ActivityEvent.__table__
    with app.engine.connect() as conn:
        return list(conn.execute(select(table.c.id).where(table.c.group_id == group_id)))
