"""A worker's counts of what its handlers handled, added to ``outbox_throughput`` minute by
minute (the dashboard's charts): counted in memory as results come, written by ``run_once()``
in one statement, so that the hot path pays nothing and the database one row per handler and
minute."""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from collections.abc import Callable

from outbox._db import queries, run_in_transaction
from outbox.app import Outbox
from outbox.results import BatchResult, Outcome

Key = tuple[str, dt.datetime]


def this_minute() -> dt.datetime:
    """The start of the current minute, UTC."""
    return dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)


class Throughput:
    """Counts per handler and minute, kept until written."""

    def __init__(self, app: Outbox, clock: Callable[[], dt.datetime] = this_minute) -> None:
        self.app = app
        self._clock = clock
        self._lock = threading.Lock()
        self._counts: dict[Key, Counter[str]] = {}

    def note(self, result: BatchResult) -> None:
        """Count what one group's attempt did."""
        counts = Counter(
            succeeded=result.succeeded,
            dead=result.dead,
            failed=int(result.outcome in (Outcome.RETRYING, Outcome.DEAD)),
        )
        if not +counts:
            return
        key = (result.handler, self._clock())
        with self._lock:
            self._counts.setdefault(key, Counter()).update(counts)

    def run_once(self) -> int:
        """Write the counts kept so far; how many rows were added to. On a database error the
        counts stay, to be written with the next ones."""
        with self._lock:
            counts, self._counts = self._counts, {}
        if not counts:
            return 0
        rows = [
            {"handler": handler, "minute": minute, **{c: n[c] for c in queries.THROUGHPUT_COUNTERS}}
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
            raise
        return len(rows)
