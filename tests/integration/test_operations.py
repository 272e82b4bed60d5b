"""Status, replay, prune and the distribution leader, on PostgreSQL and SQLite."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import (
    JSON,
    DateTime,
    LargeBinary,
    Numeric,
    String,
    Uuid,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outbox import Batch, BufferMixin, Outbox, RetryPolicy, Urgency, schema
from outbox._db import queries
from outbox._db.dialects import db_now_plus
from outbox.exceptions import ConfigurationError
from outbox.ops import operators
from outbox.ops.archive import prune
from outbox.ops.edit import edit
from outbox.ops.metrics import collect
from outbox.ops.replay import replay
from outbox.testing import drain
from outbox.worker import Worker
from tests.models import ActivityEvent

ONE_SHOT = RetryPolicy(max_attempts=1)


class RichBase(DeclarativeBase):
    pass


class RichEvent(BufferMixin, RichBase):
    """An event with columns of many types, to prove the archive round-trips them."""

    __tablename__ = "test_rich_events"
    when: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    ref: Mapped[uuid.UUID] = mapped_column(Uuid)
    amount: Mapped[float] = mapped_column(Numeric(12, 2))
    blob: Mapped[bytes] = mapped_column(LargeBinary)
    data: Mapped[dict[str, object]] = mapped_column(JSON)
    text: Mapped[str] = mapped_column(String(100))


def _always_fail(batch: Batch[ActivityEvent]) -> None:
    raise RuntimeError("downstream refused the batch")


def test_status_counts_unclaimed_and_oldest_age(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """status reports the unclaimed rows and a non-negative oldest age and staleness."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=10, urgency=Urgency.MINUTES, name="noop")(
        lambda batch: None
    )
    commit_events(app.engine, 25)
    (status,) = collect(app)
    assert (25, 0, "MINUTES") == (status.unclaimed, status.claimed, status.urgency)
    assert status.oldest_age is not None
    assert status.oldest_age >= 0
    assert status.staleness == status.oldest_age / 300.0


def test_status_counts_dead_letters(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """Events dead-lettered after their last attempt show as dead in status."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=10, retry=ONE_SHOT, name="fails")(_always_fail)
    commit_events(app.engine, 12)
    drain(app)
    (status,) = collect(app)
    assert (0, 12, {"dead": 12}) == (status.unclaimed, status.dead, status.archived)


def test_replay_puts_dead_letters_back(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """replay moves dead events back into the buffer with their columns; their archive rows
    stay, marked replayed, each pointing at the event it became and at the replay's record."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=10, retry=ONE_SHOT, name="fails")(_always_fail)
    commit_events(app.engine, 5)
    drain(app)
    result = replay(app, handler="fails", status="dead", actor="ops@example")
    with app.engine.connect() as conn:
        events = dict(conn.execute(select(ActivityEvent.id, ActivityEvent.activity_id)).all())
        archived = conn.execute(
            select(schema.archive.c.status, schema.archive.c.operation_id,
                   schema.archive.c.replay_event_id)
        ).all()  # fmt: skip
    history = operators.history(app)
    assert (
        5,
        [0, 1, 2, 3, 4],
        [("replayed", result.operation_id)] * 5,
        set(events),
        [("replay", "ops@example", {"handlers": ["fails"], "statuses": ["dead"]}, 1, 5)],
    ) == (
        result.events,
        sorted(events.values()),
        [(row.status, row.operation_id) for row in archived],
        {row.replay_event_id for row in archived},
        [(o.action, o.actor, o.selection, o.groups, o.events) for o in history],
    )


def test_replay_dry_run_changes_nothing(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """A dry run counts what it would replay and leaves archive and buffer untouched."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=10, retry=ONE_SHOT, name="fails")(_always_fail)
    commit_events(app.engine, 3)
    drain(app)
    result = replay(app, dry_run=True)
    with app.engine.connect() as conn:
        buffered = conn.execute(select(func.count()).select_from(ActivityEvent)).scalar_one()
        archived = conn.execute(select(func.count()).select_from(schema.archive)).scalar_one()
    assert (3, True, 0, 3) == (result.events, result.dry_run, buffered, archived)


def _rich_values(engine: Any) -> dict[str, Any]:
    """The one RichEvent's values, as a fresh session loads them."""
    with Session(engine) as session:
        event = session.scalars(select(RichEvent)).one()
        return {
            "when": event.when.replace(tzinfo=dt.UTC) if event.when.tzinfo is None else event.when,
            "ref": event.ref,
            "amount": float(event.amount),
            "blob": event.blob,
            "data": event.data,
            "text": event.text,
        }


def test_archive_round_trips_column_types(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Archived then replayed, an event keeps its datetime, uuid, numeric, bytes and JSON values
    as the database held them (MariaDB's plain DATETIME keeps whole seconds)."""
    app = make_app(database_url)
    app.handler(RichEvent, batch_size=10, retry=ONE_SHOT, name="rich")(_always_fail)
    with app.engine.begin() as conn:
        RichBase.metadata.drop_all(conn)
        RichBase.metadata.create_all(conn)
    with Session(app.engine) as session:
        session.add(
            RichEvent(
                when=dt.datetime(2026, 3, 1, 12, 30, 15, 123456, tzinfo=dt.UTC),
                ref=uuid.UUID("12345678-1234-5678-1234-567812345678"),
                amount=1234.5,
                blob=b"\x00\x01binary\xff",
                data={"nested": [1, 2, {"x": "y"}], "unicode": "héllo"},
                text="plain",
            )
        )
        session.commit()
    stored = _rich_values(app.engine)
    drain(app)
    replay(app, handler="rich", all_statuses=True)
    assert stored == _rich_values(app.engine)


def _dead_rich_event(app: Outbox) -> tuple[uuid.UUID, int]:
    """One RichEvent dead-lettered: its group's id and its id."""
    app.handler(RichEvent, batch_size=10, retry=ONE_SHOT, name="rich")(_always_fail)
    with app.engine.begin() as conn:
        RichBase.metadata.drop_all(conn)
        RichBase.metadata.create_all(conn)
    with Session(app.engine) as session:
        session.add(
            RichEvent(
                when=dt.datetime(2026, 3, 1, tzinfo=dt.UTC),
                ref=uuid.UUID(int=1),
                amount=1.5,
                blob=b"\x00\x01binary\xff",
                data={},
                text="plain",
            )
        )
        session.commit()
    drain(app)
    with app.engine.connect() as conn:
        row = conn.execute(select(schema.archive)).one()
    return row.group_id, int(row.event_id)


def test_edit_takes_bytes_in_base64(database_url: str, make_app: Callable[[str], Outbox]) -> None:
    """An edit's text for a bytes column is base64, as the API answers bytes."""
    app = make_app(database_url)
    group_id, event_id = _dead_rich_event(app)
    edit(app, group_id, event_id, {"blob": "AP+A"})
    assert b"\x00\xff\x80" == _rich_values(app.engine)["blob"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_edit_refuses_bytes_in_hex_saying_bytes_are_base64(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Hex that is not also base64 is refused, naming the column and saying bytes are base64;
    the event stays dead."""
    app = make_app(database_url)
    group_id, event_id = _dead_rich_event(app)
    with pytest.raises(ConfigurationError) as raised:
        edit(app, group_id, event_id, {"blob": "00ff80"})
    with app.engine.connect() as conn:
        statuses = list(conn.execute(select(schema.archive.c.status)).scalars())
    assert (True, ["dead"]) == (
        "blob: '00ff80' is not base64: bytes are standard base64 (RFC 4648, padded), not hex"
        == str(raised.value),
        statuses,
    ), str(raised.value)


def test_prune_deletes_only_old_archive_rows(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """prune deletes archive rows older than the cut-off, in chunks, and keeps newer ones."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=10, retry=ONE_SHOT, name="fails")(_always_fail)
    commit_events(app.engine, 7)
    drain(app)
    with app.engine.begin() as conn:
        old_ids = list(
            conn.execute(
                select(schema.archive.c.id).order_by(schema.archive.c.id).limit(5)
            ).scalars()
        )
        conn.execute(
            update(schema.archive)
            .where(schema.archive.c.id.in_(old_ids))
            .values(archived_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        )
    deleted = prune(app, older_than=86400.0, chunk=2, status="dead")
    with app.engine.connect() as conn:
        left = conn.execute(select(func.count()).select_from(schema.archive)).scalar_one()
    assert (5, 2) == (deleted, left)


def _add_archived(app: Outbox, status: str, count: int, *, age: float = 0.0) -> None:
    """``count`` archive rows of the "fails" handler with ``status``, archived ``age`` s ago."""
    with app.engine.begin() as conn:
        for n in range(count):
            conn.execute(
                insert(schema.archive).values(
                    handler="fails",
                    buffer=ActivityEvent.__table__.name,
                    event_id=n + 1,
                    group_id=uuid.uuid4(),
                    status=status,
                    attempts=1,
                    payload={"activity_id": 100 + n, "kind": "viewed"},
                    archived_at=db_now_plus(-age),
                )
            )


def _archived_statuses(app: Outbox) -> dict[str, int]:
    with app.engine.connect() as conn:
        return {
            str(s): int(n)
            for s, n in conn.execute(
                select(schema.archive.c.status, func.count()).group_by(schema.archive.c.status)
            )
        }


def test_replay_without_a_status_replays_dead_letters_only(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """Told no status, replay puts back the dead letters and leaves discarded and succeeded
    events archived."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=10, retry=ONE_SHOT, name="fails")(_always_fail)
    commit_events(app.engine, 3)
    drain(app)
    _add_archived(app, "discarded", 2)
    _add_archived(app, "succeeded", 1)
    result = replay(app)
    assert (3, {"dead": 3}, {"discarded": 2, "succeeded": 1, "replayed": 3}) == (
        result.events,
        result.by_status,
        _archived_statuses(app),
    )


def test_replay_takes_several_statuses_in_any_case(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """``status`` takes several statuses, spelled in any case; the others stay archived."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=10, name="fails")(_always_fail)
    _add_archived(app, "dead", 1)
    _add_archived(app, "discarded", 2)
    _add_archived(app, "succeeded", 1)
    result = replay(app, status=["DEAD", "discarded"], dry_run=True)
    everything = replay(app, all_statuses=True, dry_run=True)
    assert ({"dead": 1, "discarded": 2}, 4) == (result.by_status, everything.events)


def test_replay_refuses_a_status_it_does_not_know(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """An unknown status: a ConfigurationError naming the argument and the statuses."""
    app = make_app(database_url)
    with pytest.raises(ConfigurationError) as raised:
        replay(app, status="deadd")
    assert (
        "status: 'deadd' is not an archive status; expected one of succeeded, dead, expired, "
        "discarded, superseded, replayed"
    ) == str(raised.value)


def test_prune_keeps_dead_letters_unless_told(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Told no status, prune deletes succeeded, discarded and expired rows and keeps dead
    letters; ``status="dead"`` prunes them."""
    app = make_app(database_url)
    for status in ("succeeded", "discarded", "expired", "dead"):
        _add_archived(app, status, 2, age=7200.0)
    history = prune(app, older_than=3600.0)
    left = _archived_statuses(app)
    dead = prune(app, older_than=3600.0, status="dead")
    assert (6, {"dead": 2}, 2, {}) == (history, left, dead, _archived_statuses(app))


def test_prune_steps_past_kept_dead_letters_chunk_by_chunk(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Dead letters older than the rows pruned do not stop a prune in chunks: every old row of
    the statuses named goes, however many chunks it takes."""
    app = make_app(database_url)
    _add_archived(app, "dead", 3, age=9000.0)
    _add_archived(app, "succeeded", 5, age=7200.0)
    pruned = prune(app, older_than=3600.0, chunk=2)
    assert (5, {"dead": 3}) == (pruned, _archived_statuses(app))


def test_leader_is_the_oldest_live_worker(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """The longest-running worker with a fresh heartbeat leads; a stale one does not."""
    app = make_app(database_url)
    with app.engine.begin() as conn:
        queries.insert_worker(conn, "first", "host", 1, 1)
    with app.engine.begin() as conn:
        queries.insert_worker(conn, "second", "host", 2, 1)
        conn.execute(
            update(schema.workers)
            .where(schema.workers.c.id == "first")
            .values(started_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        )
    with app.engine.connect() as conn:
        leader_while_fresh = queries.leader_worker_id(conn, stale_seconds=60)
    with app.engine.begin() as conn:
        conn.execute(
            update(schema.workers)
            .where(schema.workers.c.id == "first")
            .values(heartbeat_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
        )
    with app.engine.connect() as conn:
        leader_after_first_went_quiet = queries.leader_worker_id(conn, stale_seconds=60)
    assert ("first", "second") == (leader_while_fresh, leader_after_first_went_quiet)


def test_worker_distributes_when_it_leads(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Callable[..., list[int]]
) -> None:
    """A worker with distribute_every and no cron drains the buffer on its own."""
    app = make_app(database_url)
    app.with_settings(poll_interval=0.05)
    handled: list[int] = []
    app.handler(ActivityEvent, batch_size=10, name="collect")(
        lambda b: handled.extend(e.id for e in b.events)
    )
    ids = commit_events(app.engine, 35)
    worker = Worker(app, concurrency=2, distribute_every=0.1)
    import threading
    import time

    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while sorted(handled) != ids and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.stop()
    thread.join(timeout=10)
    assert ids == sorted(handled)
