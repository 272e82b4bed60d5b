"""A worker's counts of what its handlers handled, and of the seconds its slots spent on
them, added to ``outbox_throughput`` minute by minute (the dashboard's charts, desired
workers' rate of a slot): counted in memory as results come, written by ``run_once()`` in one
statement, so that the hot path pays nothing and the database one row per handler and
minute."""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from collections.abc import Callable

from outbox._db import queries, run_in_transaction
from outbox._db.database_clock import database_clock
from outbox.app import Outbox
from outbox.results import BatchResult, Outcome

Key = tuple[str, dt.datetime]


def minute_of(moment: dt.datetime) -> dt.datetime:
    """The start of the minute ``moment`` is in."""
    return moment.replace(second=0, microsecond=0)


TOLERATED_PROMISES = 4.0
"""Apdex's tolerating zone: an event delivered later than its band's promise but within this
many times it is tolerated; later still, it frustrates."""


def timeliness(result: BatchResult) -> tuple[int, int]:
    """Of the events a batch delivered, how many were delivered within their band's promise
    (satisfied) and how many later, within :data:`TOLERATED_PROMISES` times it (tolerating);
    from each event's creation to the end of its batch, by the ages the result carries.

    When only some of the group's events were delivered (the others retried, discarded or
    dead), the result does not say which: the undelivered ones are taken to be the youngest,
    so that the counts never flatter.
    """
    if not result.succeeded or result.finished_at is None or not result.created_at:
        return 0, 0
    created = result.created_at
    end = result.finished_at
    if created[0].tzinfo is None:
        # SQLite hands back naive times, in UTC; one batch comes from one database.
        end = end.astimezone(dt.UTC).replace(tzinfo=None)
    limit = end - dt.timedelta(seconds=result.promise)
    # One comparison of the oldest answers for the usual batch, delivered in time.
    if min(created) >= limit:
        within, later = len(created), 0
    else:
        tolerated = end - dt.timedelta(seconds=result.promise * TOLERATED_PROMISES)
        within = sum(1 for moment in created if moment >= limit)
        later = sum(1 for moment in created if tolerated <= moment < limit)
    # The events not delivered: the youngest first, so the satisfied ones go first.
    undelivered = len(created) - result.succeeded
    taken = min(undelivered, within)
    within -= taken
    later -= min(undelivered - taken, later)
    return within, later


class Throughput:
    """Counts per handler and minute, kept until written."""

    def __init__(self, app: Outbox, clock: Callable[[], dt.datetime] | None = None) -> None:
        self.app = app
        # By default the database's clock: the minute is the fleet's, whatever this host's
        # clock says.
        self._clock = clock or (lambda: minute_of(database_clock(app.engine).now()))
        self._lock = threading.Lock()
        self._counts: dict[Key, Counter[str]] = {}
        self._busy: dict[Key, float] = {}

    def note(self, result: BatchResult) -> None:
        """Count what one group's attempt did, how many of its delivered events were
        delivered in time (:func:`timeliness`), and the seconds its slot spent on it (the
        batch's duration, whatever became of it: the slot was held all along)."""
        satisfied, tolerating = timeliness(result)
        counts = Counter(
            succeeded=result.succeeded,
            dead=result.dead,
            failed=int(result.outcome in (Outcome.RETRYING, Outcome.DEAD)),
            satisfied=satisfied,
            tolerating=tolerating,
        )
        busy = max(result.duration, 0.0)
        if not +counts and not busy:
            return
        key = (result.handler, self._clock())
        with self._lock:
            self._counts.setdefault(key, Counter()).update(counts)
            self._busy[key] = self._busy.get(key, 0.0) + busy

    def run_once(self) -> int:
        """Write the counts kept so far; how many rows were added to. On a database error the
        counts stay, to be written with the next ones."""
        with self._lock:
            counts, self._counts = self._counts, {}
            busy, self._busy = self._busy, {}
        if not counts:
            return 0
        rows = [
            {
                "handler": handler,
                "minute": minute,
                **{c: n[c] for c in queries.THROUGHPUT_COUNTERS},
                queries.THROUGHPUT_BUSY: busy.get((handler, minute), 0.0),
            }
            for (handler, minute), n in counts.items()
        ]
        try:
            run_in_transaction(
                self.app.engine, lambda conn: queries.add_throughput(conn, self.app.dialect, rows)
            )
        except Exception:
            with self._lock:
                for key, n in counts.items():
                    self._counts.setdefault(key, Counter()).update(n)
                for key, seconds in busy.items():
                    self._busy[key] = self._busy.get(key, 0.0) + seconds
            raise
        return len(rows)
