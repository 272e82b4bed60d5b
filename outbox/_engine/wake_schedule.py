"""When an idle worker looks for work next: its share of the fleet's polling, and the moments
at which groups it put off (a retry, a deferral, a rate limit's turn) are due again.

No statement and no thread: the worker's loop asks it how long to wait, and wakes sooner on a
notification or when a job of its own finishes.
"""

from __future__ import annotations

import heapq
import random
import threading
import time

DUE_MARGIN_SECONDS = 0.02
"""A worker wakes this long after a group it put off is due (the database's clock, not its
own, decides when the group is due; the commit came a little after the delay was set)."""
MAX_DUE_NOTED = 1024
"""The most due times a worker remembers to wake at."""


class WakeSchedule:
    """The due times one worker noted, and the wait they leave before its next look for work.
    Thread-safe: the worker's threads note, its loop asks."""

    def __init__(self) -> None:
        self._due: list[float] = []
        """Monotonic times at which groups this worker put off are due again (a heap)."""
        self._turns: list[float] = []
        """Monotonic times at which groups this worker's rate limits gave back are due."""
        self._lock = threading.Lock()

    def note_due(self, seconds: float) -> None:
        """A group this worker deferred, retried or gave back is due in ``seconds``."""
        with self._lock:
            heapq.heappush(self._due, time.monotonic() + seconds)
            if len(self._due) > MAX_DUE_NOTED:
                # The soonest are what matters; a backlog of retries needs no more wake-ups.
                self._due = heapq.nsmallest(MAX_DUE_NOTED // 2, self._due)

    def note_turn(self, seconds: float) -> None:
        """A group this worker's rate limits gave back is due in ``seconds``."""
        with self._lock:
            self._turns.append(time.monotonic() + seconds)

    def poll_timeout(self, interval: float) -> float:
        """Seconds to wait before looking for work again: ``interval`` (the fleet's poll
        interval times its live workers) jittered by ±50%, or less when a group noted due is
        due sooner (a little after it is; at once when it was due already)."""
        timeout = interval * (0.5 + random.random())
        now = time.monotonic()
        with self._lock:
            while self._due and self._due[0] <= now:
                heapq.heappop(self._due)
                timeout = DUE_MARGIN_SECONDS  # due since the last look: look again now
            if self._due:
                timeout = min(timeout, self._due[0] - now + DUE_MARGIN_SECONDS)
        return timeout

    def next_turn(self, max_wait: float) -> float | None:
        """Seconds until the next group a rate limit gave back is due, when that is within
        ``max_wait`` (the wait a worker holds a group for its turn); None otherwise."""
        now = time.monotonic()
        with self._lock:
            # Those past were due at the last look for work: taken, or given back again.
            self._turns = [at for at in self._turns if at > now - DUE_MARGIN_SECONDS]
            soonest = min(self._turns, default=None)
        if soonest is None or soonest - now > max_wait:
            return None
        return max(soonest - now, 0.0) + DUE_MARGIN_SECONDS
