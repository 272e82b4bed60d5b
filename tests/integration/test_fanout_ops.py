"""A fan-out's operations (``outbox.ops.fanout``): a consumer added later started from what the
archive keeps, each event once, and the reading of each fan-out's buffers. On SQLite,
PostgreSQL and MariaDB."""

from __future__ import annotations

import re
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from outbox import Batch, Outbox, schema
from outbox.exceptions import ConfigurationError, ReplayError
from outbox.ops import fanout, flow, operators
from outbox.ops.progress import Progress, StoppedError
from outbox.testing import drain
from tests.models import ShipmentAnalytics, ShipmentEvent, ShipmentPartner, ShipmentSearch

SEARCH = ShipmentSearch.__tablename__
PARTNER = ShipmentPartner.__tablename__
FANOUT = f"{ShipmentEvent.__tablename__}.fanout"

Seen = dict[str, list[tuple[Any, ...]]]


def _write(engine: Engine, count: int, start: int = 0) -> list[tuple[Any, ...]]:
    """``count`` events written to the source: each one's id, values and ``created_at``."""
    with Session(engine) as session, session.begin():
        events = [
            ShipmentEvent(shipment_id=n, amount=Decimal(f"{n}.25"), data={"n": n, "tags": ["a"]})
            for n in range(start, start + count)
        ]
        session.add_all(events)
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                ShipmentEvent.id,
                ShipmentEvent.shipment_id,
                ShipmentEvent.amount,
                ShipmentEvent.data,
                ShipmentEvent.created_at,
            )
            .where(ShipmentEvent.shipment_id >= start)
            .order_by(ShipmentEvent.id)
        ).all()
    return [tuple(row) for row in rows]


def _count(engine: Engine, model: type[Any]) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())


def _app(
    make_app: Callable[..., Outbox],
    url: str,
    seen: Seen,
    consumers: tuple[type[Any], ...],
    *,
    archive: bool = True,
) -> Outbox:
    """An application fanning the shipments out to ``consumers``, each drained by a handler
    named for its table that records the events it is handed."""
    app = make_app(url)
    app.fanout(ShipmentEvent, to=consumers, batch_size=7, archive=archive)
    for model in consumers:
        name = model.__tablename__

        def handle(batch: Batch[Any], name: str = name) -> None:
            seen.setdefault(name, []).extend(
                (e.id, e.shipment_id, e.amount, e.data, e.created_at) for e in batch
            )

        app.handler(model, name=name, batch_size=5)(handle)
    return app


def _added_later(make_app: Callable[..., Outbox], url: str, seen: Seen) -> tuple[Outbox, Outbox]:
    """The application before the partner consumer was added, and after, with the partner's
    handler paused before the fan-out copies into it."""
    before = _app(make_app, url, seen, (ShipmentSearch,))
    after = _app(make_app, url, seen, (ShipmentSearch, ShipmentPartner))
    flow.pause(after, PARTNER, actor="test")
    return before, after


def test_a_consumer_added_later_gets_the_kept_events_and_the_new_ones_each_once(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """12 events fanned out before the partner was added, 5 after (copied to it, waiting),
    3 more by a worker still of the old configuration: the backfill copies the 15 its buffer
    does not hold, and once resumed the partner is handed all 20 once, each under its id with
    its values and write time."""
    seen: Seen = {}
    before, after = _added_later(make_app, database_url, seen)
    written = _write(before.engine, 12)
    drain(before)
    written += _write(after.engine, 5, start=12)
    drain(after)
    written += _write(before.engine, 3, start=17)
    drain(before)

    result = fanout.backfill(after, PARTNER, actor="test")
    flow.resume(after, PARTNER, actor="test")
    drain(after)

    assert (FANOUT, PARTNER, PARTNER, 15, 5) == (
        result.fanout,
        result.consumer,
        result.handler,
        result.copied,
        result.held,
    )
    assert written == sorted(seen[PARTNER])
    assert written == sorted(seen[SEARCH])
    assert 0 == _count(after.engine, ShipmentPartner)


def test_a_second_backfill_while_still_paused_copies_nothing_again(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Run again before the consumer is resumed, a backfill finds every event held."""
    seen: Seen = {}
    before, after = _added_later(make_app, database_url, seen)
    _write(before.engine, 9)
    drain(before)
    first = fanout.backfill(after, PARTNER, chunk=4)

    again = fanout.backfill(after, PARTNER, chunk=4)

    assert ((9, 0), (0, 9), 9) == (
        (first.copied, first.held),
        (again.copied, again.held),
        _count(after.engine, ShipmentPartner),
    )


def test_a_backfill_after_the_consumer_ran_is_refused(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Once the consumer has handled its backfilled events, paused again it is not
    backfilled again: its buffer no longer says what it got."""
    seen: Seen = {}
    before, after = _added_later(make_app, database_url, seen)
    _write(before.engine, 4)
    drain(before)
    done = fanout.backfill(after, PARTNER)
    flow.resume(after, PARTNER, actor="test")
    drain(after)
    flow.pause(after, PARTNER, actor="test")

    refused = f"backfilled already \\(operation {done.operation_id}\\) and handler"
    with pytest.raises(ReplayError, match=refused):
        fanout.backfill(after, PARTNER)
    with pytest.raises(ReplayError, match=refused):
        fanout.backfill_plan(after, PARTNER)
    assert (4, 0) == (len(seen[PARTNER]), _count(after.engine, ShipmentPartner))


def test_a_consumer_whose_handler_runs_is_refused_and_nothing_is_written(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Its handler not paused: refused in one line saying to pause it; nothing copied or
    recorded, a dry run refused alike."""
    seen: Seen = {}
    app = _app(make_app, database_url, seen, (ShipmentSearch, ShipmentPartner))
    _write(app.engine, 3)
    drain(app)

    for dry_run in (False, True):
        with pytest.raises(ReplayError, match=f"outbox pause {PARTNER}"):
            fanout.backfill(app, PARTNER, dry_run=dry_run)
    assert (0, []) == (_count(app.engine, ShipmentPartner), operators.history(app))


def test_a_fanout_that_does_not_archive_is_refused(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Nothing kept, nothing to start from: the refusal says how to keep events."""
    app = _app(make_app, database_url, {}, (ShipmentSearch,), archive=False)
    with pytest.raises(ConfigurationError, match=r"does not archive .*archive=True"):
        fanout.backfill(app, SEARCH)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_consumer_is_named_by_its_handler_or_its_table_and_another_name_is_refused(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A consumer with a handler is found by the handler's name or its table's; one with
    none, by its table's; an unknown name lists the consumers."""
    app = make_app(database_url)
    app.fanout(ShipmentEvent, to=[ShipmentSearch, ShipmentAnalytics], archive=True)
    app.handler(ShipmentSearch, name="index")(lambda batch: None)
    flow.pause(app, "index", actor="test")
    listed = re.escape("index (test_shipment_search), test_shipment_analytics (no handler here)")
    with pytest.raises(ConfigurationError, match=rf"no consumer 'nope' .*: {listed}$"):
        fanout.backfill(app, "nope")
    with pytest.raises(ConfigurationError, match="this application has no fan-out"):
        fanout.backfill(make_app(database_url), "index")
    found = [
        fanout.backfill_plan(app, given)
        for given in ("index", SEARCH, ShipmentAnalytics.__tablename__)
    ]
    assert [(SEARCH, "index"), (SEARCH, "index"), ("test_shipment_analytics", None)] == [
        (plan.consumer, plan.handler) for plan in found
    ]


def test_a_consumer_with_no_handler_here_is_backfilled_without_a_pause(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """No handler drains it in this application: nothing to pause, its buffer holds every
    copy; the archived events are copied in, under their ids."""
    seen: Seen = {}
    before = _app(make_app, database_url, seen, (ShipmentSearch,))
    written = _write(before.engine, 6)
    drain(before)
    after = make_app(database_url)
    after.fanout(ShipmentEvent, to=[ShipmentSearch, ShipmentAnalytics], archive=True)

    result = fanout.backfill(after, ShipmentAnalytics.__tablename__)

    with after.engine.connect() as conn:
        ids = conn.execute(select(ShipmentAnalytics.id).order_by(ShipmentAnalytics.id)).scalars()
        copied = list(ids)
    assert (None, 6, [row[0] for row in written]) == (result.handler, result.copied, copied)


def test_a_dry_run_counts_and_writes_nothing(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """What it would copy and what the buffer holds, counted; no row, no record."""
    seen: Seen = {}
    before, after = _added_later(make_app, database_url, seen)
    _write(before.engine, 8)
    drain(before)
    _write(after.engine, 2, start=8)
    drain(after)
    history = operators.history(after)

    result = fanout.backfill(after, PARTNER, dry_run=True, chunk=3)

    assert (8, 2, True, None, 2, history) == (
        result.copied,
        result.held,
        result.dry_run,
        result.operation_id,
        _count(after.engine, ShipmentPartner),
        operators.history(after),
    )


def test_the_plan_counts_what_the_archive_keeps_and_what_it_goes_on_from(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Before a backfill: the archived events, no earlier one; after one, still paused: it
    goes on from that one."""
    before, after = _added_later(make_app, database_url, {})
    _write(before.engine, 5)
    drain(before)
    first = fanout.backfill_plan(after, PARTNER)
    done = fanout.backfill(after, PARTNER)

    again = fanout.backfill_plan(after, PARTNER)

    assert ((5, None), (5, done.operation_id)) == (
        (first.archived, first.resumes),
        (again.archived, again.resumes),
    )


class _StopAfter(Progress):
    """Asks to stop once ``chunks`` chunks are done, calling ``then`` instead when given."""

    def __init__(self, chunks: int, then: Callable[[], None] | None = None) -> None:
        self.chunks = chunks
        self.then = then
        self.done = 0

    def advance(self, done: int) -> None:
        self.done += 1

    def should_stop(self) -> bool:
        if self.done < self.chunks:
            return False
        if self.then is None:
            return True
        self.then()
        return False


def test_a_backfill_stopped_between_chunks_goes_on_where_it_stopped(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Stopped after its first chunk, whole; run again while the consumer stays paused, it
    copies the rest; the consumer is handed each event once."""
    seen: Seen = {}
    before, after = _added_later(make_app, database_url, seen)
    written = _write(before.engine, 10)
    drain(before)

    with pytest.raises(StoppedError) as stopped:
        fanout.backfill(after, PARTNER, chunk=4, progress=_StopAfter(1))
    rest = fanout.backfill(after, PARTNER, chunk=4)
    flow.resume(after, PARTNER, actor="test")
    drain(after)

    assert (4, 6, 4, written) == (
        stopped.value.done,
        rest.copied,
        rest.held,
        sorted(seen[PARTNER]),
    )


def test_a_consumer_resumed_during_the_backfill_stops_it(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Resumed after the first chunk: the next one finds it running and stops, saying how
    many were copied; the chunk under way copies nothing."""
    before, after = _added_later(make_app, database_url, {})
    _write(before.engine, 10)
    drain(before)

    def resume() -> None:
        flow.resume(after, PARTNER, actor="test")

    with pytest.raises(ReplayError, match=r"was resumed during the backfill .*: 4 events copied"):
        fanout.backfill(after, PARTNER, chunk=4, progress=_StopAfter(1, resume))
    assert 4 == _count(after.engine, ShipmentPartner)


def test_the_backfill_is_recorded_as_a_replay_naming_the_consumer(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """The operations log has it: a replay by its actor, its selection the fan-out and the
    consumer, counting the events copied."""
    before, after = _added_later(make_app, database_url, {})
    _write(before.engine, 3)
    drain(before)

    result = fanout.backfill(after, PARTNER, actor="ops@example")

    [record] = operators.history(after, action=schema.OperationAction.REPLAY.value)
    assert (
        result.operation_id,
        "ops@example",
        {"backfill": PARTNER, "fanout": FANOUT},
        3,
    ) == (record.id, record.actor, record.selection, record.events)


def test_the_reading_has_each_fanouts_source_and_consumers_with_what_waits(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Events waiting in the source, and in each consumer's buffer after a fan-out with the
    consumers paused; a consumer without a handler here says so."""
    app = make_app(database_url)
    app.fanout(ShipmentEvent, to=[ShipmentSearch, ShipmentAnalytics], archive=True)
    app.handler(ShipmentSearch, name="index")(lambda batch: None)
    flow.pause(app, "index", actor="test")
    _write(app.engine, 4)
    drain(app)
    _write(app.engine, 2, start=4)

    [found] = fanout.fanouts(app)

    assert (
        FANOUT,
        ShipmentEvent.__tablename__,
        True,
        2,
        [("test_shipment_search", "index", 4), ("test_shipment_analytics", None, 4)],
        fanout.COUNT_CAP,
    ) == (
        found.name,
        found.source,
        found.archives,
        found.events,
        [(c.table, c.handler, c.events) for c in found.consumers],
        found.capped_at,
    )
    assert all(c.oldest_age is not None and c.oldest_age >= 0 for c in found.consumers)


def test_copies_into_and_copy_of_link_a_fanout_and_its_consumers(
    make_app: Callable[..., Outbox],
) -> None:
    """The fan-out's consumers in order, with their handlers; a consumer's handler names the
    fan-out; another handler is neither."""
    app = make_app("sqlite://")
    app.fanout(ShipmentEvent, to=[ShipmentSearch, ShipmentAnalytics])
    app.handler(ShipmentSearch, name="index")(lambda batch: None)
    app.handler(ShipmentPartner, name="partner")(lambda batch: None)
    assert (
        [
            fanout.Consumer("test_shipment_search", "index"),
            fanout.Consumer("test_shipment_analytics", None),
        ],
        FANOUT,
        None,
        [],
        [],
    ) == (
        fanout.copies_into(app, FANOUT),
        fanout.copy_of(app, "index"),
        fanout.copy_of(app, "partner"),
        fanout.copies_into(app, "index"),
        fanout.fanouts(make_app("sqlite://")),
    )
