"""A handler gets every column type a user declares exactly as ``session.get`` loads it, on
every path rows take to a handler, on every dialect.

One buffer model per dialect holds a column of each case of ``_column_types``; each test runs
one path and reports every column that differs, with both values and their types.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, String, literal, select, update
from sqlalchemy.orm import Session

from outbox import Batch, Outbox, RateLimit, RetryAfter, RetryPolicy, schema
from outbox.ops import replay
from outbox.testing import drain
from outbox.worker import Worker
from tests._support import NO_RETRY_AFTER_FLOOR
from tests.users import _column_types as types

HANDLER = "typed"
NO_WAIT = RetryPolicy(max_attempts=3, scale=0, base_delay=0, jitter=0)


@dataclasses.dataclass
class Call:
    """What one handler call received: its attempt, and each event's values, by id."""

    attempt: int
    events: dict[int, dict[str, Any]]
    rows: dict[int, dict[str, Any]]
    fields: set[tuple[str, ...]]


class Recorder:
    """The handler: records what each call received, then does what the path asks of it."""

    def __init__(self, model: type[Any], then: Callable[[Batch[Any], Recorder], None]) -> None:
        self.names = types.attribute_names(model)
        self.then = then
        self.calls: list[Call] = []
        self.replayed = False

    def __call__(self, batch: Batch[Any]) -> None:
        events = {e.id: {n: getattr(e, n) for n in self.names} for e in batch.events}
        rows = [dict(zip(self.names, row, strict=True)) for row in batch.rows]
        fields = {tuple(getattr(row, "_fields", ())) for row in batch.rows}
        self.calls.append(Call(batch.attempt, events, {r["id"]: r for r in rows}, fields))
        self.then(batch, self)


def succeed(batch: Batch[Any], recorder: Recorder) -> None:
    """Every event succeeds."""


def fail_first_attempt(batch: Batch[Any], recorder: Recorder) -> None:
    """The first attempt fails; the retry succeeds."""
    if batch.attempt == 1:
        raise RuntimeError("the first attempt fails")


def retry_every_other(batch: Batch[Any], recorder: Recorder) -> None:
    """The first attempt sends every other event to a group of their own, retried later."""
    if batch.attempt == 1:
        batch.retry(batch.events[::2], "later")


def defer_first_call(batch: Batch[Any], recorder: Recorder) -> None:
    """The first call is answered "later" for the whole group (a deferral, not an attempt)."""
    if len(recorder.calls) == 1:
        raise RetryAfter(0)


def defer_every_other(batch: Batch[Any], recorder: Recorder) -> None:
    """The first call defers every other event (``batch.retry(after=)``)."""
    if len(recorder.calls) == 1:
        batch.retry(batch.events[::2], "rate limited", after=0)


def fail_until_replayed(batch: Batch[Any], recorder: Recorder) -> None:
    """Every attempt fails until the archive has been replayed."""
    if not recorder.replayed:
        raise RuntimeError("fails until replayed")


@dataclasses.dataclass(frozen=True)
class Path:
    """A way rows reach a handler: the handler's options, what it does, and how it is run."""

    then: Callable[[Batch[Any], Recorder], None]
    options: dict[str, Any]
    run: Callable[[Outbox], None]
    replay_status: str | None = None
    """Replay the archive's rows of this status, then run again (their values round-trip)."""
    calls: Callable[[int], list[tuple[int, int]]] = lambda rows: [(1, rows)]
    """(attempt, events) of each handler call, in order, given how many rows were written."""


def _drain(app: Outbox) -> None:
    drain(app)


def _claim_directly(app: Outbox) -> None:
    # What a worker woken by a notification does: a claim without a claim job.
    Worker(app, concurrency=1)._claim_directly(HANDLER)


PATHS = {
    # First attempts: rows handed over by the claim, with a claim job and without one.
    "claim_job": Path(succeed, {}, _drain),
    "direct_claim": Path(succeed, {}, _claim_directly),
    # A capped handler's claim leaves its group to a batch job, which loads the rows.
    "claim_then_load": Path(succeed, {"concurrency": 1}, _drain),
    "retry": Path(
        fail_first_attempt, {"retry": NO_WAIT}, _drain, calls=lambda rows: [(1, rows), (2, rows)]
    ),
    "partial_retry": Path(
        retry_every_other,
        {"retry": NO_WAIT},
        _drain,
        calls=lambda rows: [(1, rows), (2, (rows + 1) // 2)],
    ),
    # Flow control: deferred whole and in part (the attempt not counted), and the claims of
    # sized, keyed and ordered handlers, and of per-key rate limits.
    "deferred": Path(defer_first_call, {}, _drain, calls=lambda rows: [(1, rows), (1, rows)]),
    "partial_deferral": Path(
        defer_every_other, {}, _drain, calls=lambda rows: [(1, rows), (1, (rows + 1) // 2)]
    ),
    "sized_claim": Path(succeed, {"max_batch_bytes": 1_000_000}, _drain),
    "keyed_claim": Path(
        succeed, {"group_by": "position"}, _drain, calls=lambda rows: [(1, 1)] * rows
    ),
    "ordered_claim": Path(succeed, {"ordering_key": "position"}, _drain),
    "per_key_rate_limit": Path(
        succeed,
        {"rate_limit": RateLimit(calls_per_second=10_000), "rate_limit_key": "position"},
        _drain,
    ),
    "replay_dead": Path(
        fail_until_replayed,
        {"retry": RetryPolicy(max_attempts=1)},
        _drain,
        replay_status="dead",
        calls=lambda rows: [(1, rows), (1, rows)],
    ),
    "replay_archived": Path(
        succeed,
        {"archive": True},
        _drain,
        replay_status="succeeded",
        calls=lambda rows: [(1, rows), (1, rows)],
    ),
}


def write_events(engine: Engine, model: type[Any], dialect: str) -> dict[int, dict[str, Any]]:
    """Write one row per sample through the ORM; returns what ``session.get`` loads, by id."""
    with Session(engine) as session, session.begin():
        session.add_all(types.new_events(model, dialect))
    return load_all(engine, model)


def load_all(engine: Engine, model: type[Any]) -> dict[int, dict[str, Any]]:
    """``session.get`` of every row of the buffer, in a fresh session, by id."""
    with Session(engine) as session:
        ids = list(session.scalars(select(model.id).order_by(model.id)))
        return types.loaded(session, model, ids)


def received_mismatches(
    dialect: str, expected: dict[int, dict[str, Any]], calls: list[Call], columns: tuple[str, ...]
) -> types.Mismatches:
    """Every value a handler received that differs from ``session.get``'s, per column."""
    found = types.Mismatches(dialect)
    for n, call in enumerate(calls, 1):
        for kind, received in (("events", call.events), ("rows", call.rows)):
            for id_, values in received.items():
                where = f"call {n} (attempt {call.attempt}), batch.{kind}, id {id_}"
                found.compare(expected[id_], values, where)
        if call.fields != {columns}:
            found.add("batch.rows fields", f"call {n}: expected {columns}, got {call.fields}")
    return found


@pytest.mark.parametrize("path", list(PATHS))
def test_a_handler_receives_each_column_as_session_get_loads_it(
    path: str, database_url: str, dialect: str, model: Any, make_app: Callable[[str], Outbox]
) -> None:
    """What a handler receives equals what ``session.get`` loads, column by column."""
    how = PATHS[path]
    app = make_app(database_url, NO_RETRY_AFTER_FLOOR)
    recorder = Recorder(model, how.then)
    app.handler(model, name=HANDLER, batch_size=100, **how.options)(recorder)
    expected = write_events(app.engine, model, dialect)
    how.run(app)
    if how.replay_status is not None:
        replay.replay(app, status=how.replay_status)
        recorder.replayed = True
        replayed = load_all(app.engine, model)
        expected.update(replayed)
        how.run(app)
    columns = tuple(column.name for column in model.__table__.columns)
    shape = [(call.attempt, len(call.events)) for call in recorder.calls]

    found = received_mismatches(dialect, expected, recorder.calls, columns)

    assert how.calls(types.row_count(dialect)) == shape
    assert {} == found.summary(), found.report()


@pytest.mark.parametrize("status", ["dead", "succeeded"])
def test_replay_writes_back_each_column_as_it_was(
    status: str, database_url: str, dialect: str, model: Any, make_app: Callable[[str], Outbox]
) -> None:
    """Rows archived (dead, or succeeded with ``archive=True``) and replayed load as before."""
    app = make_app(database_url)
    options = PATHS["replay_dead" if status == "dead" else "replay_archived"].options
    then = fail_until_replayed if status == "dead" else succeed
    app.handler(model, name=HANDLER, **options)(Recorder(model, then))
    originals = write_events(app.engine, model, dialect)
    by_position = {values["position"]: values for values in originals.values()}
    drain(app)
    replay.replay(app, status=status)
    replayed = load_all(app.engine, model)
    found = types.Mismatches(dialect)
    for values in replayed.values():
        where = f"replayed row of position {values['position']}"
        found.compare(by_position[values["position"]], values, where)

    assert sorted(by_position) == sorted(v["position"] for v in replayed.values())
    assert {} == found.summary(), found.report()


def test_a_value_its_type_cannot_load_dead_letters_its_group_and_blocks_nothing(
    database_url: str, dialect: str, model: Any, make_app: Callable[[str], Outbox]
) -> None:
    """A stored value its Enum no longer has fails only its own group; later events flow."""
    app = make_app(database_url)
    recorder = Recorder(model, succeed)
    app.handler(model, name=HANDLER, batch_size=1, retry=RetryPolicy(max_attempts=1))(recorder)
    first, *others = write_events(app.engine, model, dialect)
    table = model.__table__
    removed = literal("PURPLE", String)  # as stored by an older version of the application
    with app.engine.begin() as conn:
        conn.execute(
            update(table).where(table.c.id == first).values({table.c.enum_varchar: removed})
        )

    drain(app)
    handled = sorted(id_ for call in recorder.calls for id_ in call.events)
    with app.engine.connect() as conn:
        archived = conn.execute(select(schema.archive.c.event_id, schema.archive.c.status)).all()

    assert [(first, "dead")] == [tuple(row) for row in archived]
    assert others == handled
