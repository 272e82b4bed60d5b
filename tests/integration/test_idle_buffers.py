"""Distribution costs what the buffers with events waiting need: a buffer with nothing in it
adds no statement to a run, with a tick or without."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine, delete, event, insert
from sqlalchemy.orm import DeclarativeBase

from outbox import Batch, BufferMixin, Outbox, schema
from outbox._engine import distributor

BUSY = 3


class Base(DeclarativeBase):
    pass


MODELS: list[type[Any]] = [
    type(f"IdleBuffer{i}", (BufferMixin, Base), {"__tablename__": f"test_idle_buffer_{i}"})
    for i in range(BUSY + 30)
]


def noop(batch: Batch[Any]) -> None:
    """Accept every event."""


@pytest.fixture
def buffers(database_url: str) -> Iterator[str]:
    """The database, with the buffer tables of :data:`MODELS`; the first ``BUSY`` hold 25
    events each, the others none."""
    engine = create_engine(database_url)
    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        for model in MODELS[:BUSY]:
            conn.execute(insert(model.__table__), [{}] * 25)
    engine.dispose()
    yield database_url
    engine = create_engine(database_url)
    Base.metadata.drop_all(engine)
    engine.dispose()


def statements_of(app: Outbox, call: Callable[[], Any]) -> int:
    """Statements ``call`` sends, from no claim job pending."""
    with app.engine.begin() as conn:
        conn.execute(delete(schema.jobs))
    sent: list[str] = []

    def count(*args: Any) -> None:
        sent.append(args[2])

    event.listen(app.engine, "before_cursor_execute", count)
    try:
        call()
    finally:
        event.remove(app.engine, "before_cursor_execute", count)
    return len(sent)


def app_with(make_app: Callable[[str], Outbox], url: str, idle: int) -> Outbox:
    """An application of a handler for each busy buffer and for ``idle`` empty ones."""
    app = make_app(url)
    for i, model in enumerate(MODELS[: BUSY + idle]):
        app.handler(model, name=f"handler_{i}", batch_size=10)(noop)
    return app


@pytest.mark.parametrize("with_tick", [False, True], ids=["no_tick", "tick"])
def test_idle_buffers_add_no_statement_to_a_distribution(
    make_app: Callable[[str], Outbox], buffers: str, with_tick: bool
) -> None:
    """3 busy buffers and 3 empty ones, then 30 empty ones: one distribution sends as many
    statements, and enqueues the busy buffers' claim jobs alone."""
    found = []
    for idle in (3, 30):
        app = app_with(make_app, buffers, idle)
        # The handlers' rows are made at the first tick an application takes, once.
        distributor.run_on_tick(app, 100 * idle)
        ticks = iter(range(100 * idle + 1, 100 * idle + 10))

        def run(app: Outbox = app, ticks: Iterator[int] = ticks) -> Any:
            if with_tick:
                return distributor.run_on_tick(app, next(ticks))
            return distributor.run_once(app)

        statements = statements_of(app, run)
        done = run()  # the same again, the busy buffers' claim jobs now pending
        found.append((statements, len(done)))
        assert [3] * BUSY + [0] * idle == [_pending(d) for d in done]
    assert [(found[0][0], BUSY + 3), (found[0][0], BUSY + 30)] == found


def _pending(done: Any) -> int:
    distribution = getattr(done, "distribution", done)
    return 0 if distribution is None else int(distribution.pending)
