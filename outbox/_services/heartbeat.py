"""The heartbeat: a worker tells the fleet it lives, keeps the leases of the jobs it runs, and
learns how many workers there are and whether it leads them.

A worker is *gone* once its heartbeat is older than ``Settings.worker_stale_after``. Workers
heartbeat every third of the shorter of that and the lease (:func:`heartbeat_interval`), so a
gone worker has missed two heartbeats and a third is due: one late heartbeat (a slow commit, a
pause of the process) is not taken for a death. Its jobs are then rescued at once
(:mod:`outbox._services.rescuer`), rather than when their leases run out.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from outbox._db import queries, run_in_transaction
from outbox._db.database_clock import database_clock
from outbox.app import Outbox, Settings

# Heartbeats per stale age (and per lease): the heartbeats a worker may miss, less one, before
# the fleet takes it for gone.
HEARTBEATS_PER_STALE_AGE = 3
# A gap between two of a worker's own heartbeats longer than this many intervals means that it
# too was cut off (a database outage, a stalled connection): until its heartbeats have been
# steady for a whole stale age again, it judges no other worker gone, since they were most
# likely cut off with it.
STEADY_GAP_INTERVALS = 1.5
# A worker whose last written heartbeat began this many intervals ago or more takes no new
# work and hands none to a handler: half an interval later the fleet may take it for gone.
HEARD_WITHIN_INTERVALS = 2.5


def heartbeat_interval(settings: Settings) -> float:
    """Seconds between a worker's heartbeats: a third of the shorter of the lease and the stale
    age, so that leases are renewed twice before they could run out, and a gone worker is known
    within three intervals."""
    return min(settings.lease_seconds, settings.worker_stale_after) / HEARTBEATS_PER_STALE_AGE


def older_release_stale_after(settings: Settings) -> float:
    """Seconds without a heartbeat after which a worker of a release before 0.2 (it records no
    generation) is forgotten: it heartbeats every third of its own lease, whatever
    ``worker_stale_after`` says, so it is judged by the lease (fleets share their lease
    setting), never by less than the stale age. Its jobs are never rescued before their leases
    run out (see ``queries.gone_workers``)."""
    return max(settings.worker_stale_after, settings.lease_seconds)


def silent_after(settings: Settings) -> float:
    """Seconds without a heartbeat after which a holder is shown as silent (``outbox status``):
    two intervals, a heartbeat missed."""
    return 2 * heartbeat_interval(settings)


@dataclass(frozen=True)
class Beat:
    """What one heartbeat learned."""

    live_workers: int
    """Workers whose heartbeat is recent, this one included (at least 1)."""
    leading: bool
    """Whether this worker leads the fleet (the oldest live one): it distributes."""


@dataclass
class Heartbeat:
    """One worker's heartbeat. ``running``: the ids of the jobs it runs now, whose leases are
    extended; only those, so that a job whose finishing write failed runs out its lease and is
    rescued. ``stopping``: a stopping worker does not put back a row it deleted. ``clock``:
    monotonic seconds (injected by tests)."""

    app: Outbox
    worker_id: str
    concurrency: int
    running: Callable[[], Sequence[int]]
    stopping: Callable[[], bool]
    clock: Callable[[], float] = time.monotonic
    _last_beat: float | None = field(default=None, init=False, repr=False)
    _beat_began: float | None = field(default=None, init=False, repr=False)
    _steady_since: float | None = field(default=None, init=False, repr=False)

    def run_once(self) -> Beat:
        """Touch (or insert) the worker's row, extend its leases, count the fleet and find its
        leader, in one transaction."""
        settings = self.app.settings
        running = list(self.running())
        began = self.clock()

        def work(conn: Any) -> Beat:
            if not queries.touch_worker(conn, self.worker_id) and not self.stopping():
                queries.insert_worker(
                    conn, self.worker_id, socket.gethostname(), os.getpid(), self.concurrency
                )
            queries.extend_leases(conn, self.worker_id, running, settings.lease_seconds)
            live = database_clock(self.app.engine).measured(
                lambda: queries.live_workers_and_now(conn, settings.worker_stale_after)
            )
            leader = queries.leader_worker_id(conn, settings.worker_stale_after)
            return Beat(max(live, 1), leader == self.worker_id)

        beat = run_in_transaction(self.app.engine, work)
        self._beat_began = began
        self._note_beat()
        return beat

    def heard(self) -> bool:
        """Whether the fleet heard this worker recently enough to take it for alive a while
        yet: its last heartbeat to be written began less than :data:`HEARD_WITHIN_INTERVALS`
        intervals ago (one heartbeat missed is not enough; half an interval short of the stale
        age is). True before the first: a worker heartbeats as it starts, before it runs
        anything."""
        began = self._beat_began
        within = HEARD_WITHIN_INTERVALS * heartbeat_interval(self.app.settings)
        return began is None or self.clock() - began < within

    def asked(self) -> queries.WorkerAsked | None:
        """What an operator asked of this worker (drain or stop), left in its row; None:
        nothing. Read on its own, after the heartbeat: a schema downgraded below the
        generation that brought the request must not stop the heartbeat, nor the schema
        watch that stops the worker."""
        with self.app.engine.connect() as conn:
            return queries.worker_request(conn, self.worker_id)

    def _note_beat(self) -> None:
        now = self.clock()
        gap = STEADY_GAP_INTERVALS * heartbeat_interval(self.app.settings)
        if self._last_beat is None or now - self._last_beat > gap:
            self._steady_since = now
        self._last_beat = now

    def judges_in(self) -> float | None:
        """Seconds until :meth:`may_judge_others` holds, if this worker's heartbeats stay
        steady (0.0: it holds now); None when they are not steady now (no heartbeat yet, or
        the last one too long ago)."""
        if self._steady_since is None or self._last_beat is None:
            return None
        now = self.clock()
        if now - self._last_beat > STEADY_GAP_INTERVALS * heartbeat_interval(self.app.settings):
            return None
        return max(0.0, self._steady_since + self.app.settings.worker_stale_after - now)

    def may_judge_others(self) -> bool:
        """Whether this worker's own heartbeats have been steady for a whole stale age, so that
        another worker silent that long is gone rather than cut off with it."""
        if self._steady_since is None or self._last_beat is None:
            return False
        now = self.clock()
        gap = STEADY_GAP_INTERVALS * heartbeat_interval(self.app.settings)
        steady_for = now - self._steady_since
        return now - self._last_beat <= gap and steady_for >= self.app.settings.worker_stale_after
