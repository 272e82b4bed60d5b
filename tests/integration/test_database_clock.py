"""A process's reading of the database's clock (``outbox._db.database_clock``): a host whose
clock is minutes wrong still stamps its batches and counts its minutes by the database's time.
On SQLite, PostgreSQL and MariaDB (whose clock columns hold no zone)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import pytest

from outbox import Outbox
from outbox._db.database_clock import DatabaseClock, database_clock
from outbox._services.heartbeat import Heartbeat

OFF_BY = 300.0  # five minutes slow


def test_a_clock_minutes_slow_reads_the_database_s_time_once_measured(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    app = make_app(database_url)
    clock = DatabaseClock(wall=lambda: time.time() - OFF_BY)
    assert abs((clock.now() - dt.datetime.now(dt.UTC)).total_seconds() + OFF_BY) < 1
    with app.engine.connect() as conn:
        clock.measure(conn)
    assert OFF_BY == pytest.approx(clock.offset, abs=1.0)
    assert abs((clock.now() - dt.datetime.now(dt.UTC)).total_seconds()) < 1


def test_each_heartbeat_measures_the_clock_of_its_engine(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    app = make_app(database_url)
    clock = database_clock(app.engine)
    clock.offset = OFF_BY  # as if measured on a host five minutes slow, since put right
    Heartbeat(app, "w", 1, running=list, stopping=lambda: False).run_once()
    assert abs(clock.offset) < 1
    assert clock is database_clock(app.engine)


def test_a_slow_reading_does_not_replace_a_measure(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A reading whose statement took over a second to come back is off by up to half of
    that: it is taken only when there is no measure yet."""
    app = make_app(database_url)
    steps = iter([0.0, 0.01, 100.0, 102.0])
    clock = DatabaseClock(wall=lambda: time.time() + next(steps))
    with app.engine.connect() as conn:
        clock.measure(conn)
        kept = clock.offset
        clock.measure(conn)
    assert kept == clock.offset
