"""This process's reading of the database's clock.

Every point in time outbox stores or compares in SQL is the database's (leases, heartbeats,
due times, ages). A few are taken in the process: when a batch finished, against which its
events' ages, lateness and timeliness are counted, and the minute its throughput is counted in.
Those come from here: the process's own clock, corrected by how far it was found off the
database's at the last measure (each heartbeat), so that a host whose clock is minutes wrong
reports the same ages as the rest of its fleet.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine

from outbox._db import queries

T = TypeVar("T")

MAX_TRUSTED_ROUND_TRIP_SECONDS = 1.0
"""A reading whose statement took longer to come back is off by up to half of that: it
replaces an earlier measure only when there is none."""


class DatabaseClock:
    """The database's time, read from this process's clock and the offset between the two.

    ``wall``: this process's clock, in Unix seconds (injected by tests)."""

    def __init__(self, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        self.offset = 0.0
        """Seconds the database's clock is ahead of this process's (behind: < 0); 0 until
        measured."""
        self._measured = False

    def now(self) -> dt.datetime:
        """The database's time now, aware, in UTC."""
        return dt.datetime.fromtimestamp(self._wall() + self.offset, dt.UTC)

    def measure(self, conn: Connection) -> None:
        """Read the database's time in ``conn`` and take the offset from it."""
        self.measured(lambda: (None, queries.database_now(conn)))

    def measured(self, read: Callable[[], tuple[T, Any]]) -> T:
        """Run ``read``, one statement that returns something and the database's time, and
        take the offset from that time, against the middle of the round trip (a statement's
        time is taken after it was sent and before its answer); returns the something."""
        sent = self._wall()
        found, now = read()
        received = self._wall()
        if received - sent > MAX_TRUSTED_ROUND_TRIP_SECONDS and self._measured:
            return found  # off by up to half of it: the last measure is the better one
        if now.tzinfo is None:  # SQLite and MariaDB: naive, in UTC
            now = now.replace(tzinfo=dt.UTC)
        self.offset = now.timestamp() - (sent + received) / 2
        self._measured = True
        return found


_clocks: weakref.WeakKeyDictionary[Engine, DatabaseClock] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def database_clock(engine: Engine) -> DatabaseClock:
    """The clock of the database behind ``engine``, one per engine."""
    with _lock:
        clock = _clocks.get(engine)
        if clock is None:
            clock = _clocks[engine] = DatabaseClock()
        return clock
