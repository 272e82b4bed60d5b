"""What an autoscaler follows: the worker slots that keep every band's promise, the time to
drain at the fleet's size now, and each band's Apdex.

:func:`read_scaling` reads it all in one statement that probes indexes and never counts buffer
rows (:func:`outbox._db.queries.scaling_rows`), so that a scrape, a KEDA poll or a run-once
caller pays the same few milliseconds with ten million events waiting as with ten.

**Desired workers** are worker slots (``outbox work --concurrency`` units), summed over the
handlers: a handler with ``Q`` events runnable now, of which the newest has waited ``a``
seconds, to which ``λ`` events arrive a second, whose band promises ``P`` seconds, and whose
slots each handle ``r`` events a second, asks for ``max(Q / (W - a), (Q + λ * L) / (W + L)) /
r`` slots, where ``W = target * P`` and ``L = (1 - target) * P`` (``target``:
:data:`DEFAULT_TARGET`, half the promise). Events are handled oldest first; with these slots
alone, every event waiting now and every event arriving over the next ``L`` seconds is handled
within ``W`` of being written: the first term for the newest waiting, the second for the last
to arrive. ``L``, the rest of the promise, is the autoscaler's own lag (its polling, workers'
start-up): within it the autoscaler asks again, so the slots need not keep up with the arrivals
for ever, only until then. A stream that outgrows the fleet asks for more only once its
backlog, grown over ``L``, would wait longer than ``W``, as a row-count autoscaler at its best
threshold does, but from the promise rather than from a threshold tuned by hand. The horizon
``W - a`` is never taken below :data:`MIN_HORIZON_SHARE` of the promise: a promise already
broken asks for many slots, not for infinitely many.

- *Runnable* events only: the unclaimed ones (once a full batch waits, or the oldest has waited
  the handler's ``max_wait``) and those of groups due now. The events of a paused handler, and
  of groups deferred by a ``RetryAfter``, held back by a rate limit or backing off after a
  failure, are not demand: more workers would not run them sooner. (Events of ordering keys
  held by a dead group still count: telling them apart would mean reading the rows.)
- ``Q`` is read from the ends of the buffer's ids, not counted: the unclaimed rows' lowest and
  highest id, and for claimed groups at most ``batch_size`` events each and no more than the
  buffer holds beyond its unclaimed rows. Ids skipped by rolled-back transactions count as
  events, so ``Q`` may be a little high, never low.
- ``r``, the rate of one slot: what the handler handled (delivered or dead-lettered) over the
  seconds its slots spent running its groups, in the last ``rate_window``
  (``outbox_throughput``'s counts and ``busy_seconds``, which every worker adds to at each
  heartbeat, a batch's whole duration, whatever became of it). A slot's idle time is not in
  it: a handler idle for minutes, or whose slots just grew, measures what a busy slot does.
  Minutes of workers that keep no busy time (older than schema generation 8) count as
  before it: the handler's rate divided by the slots that hold its jobs now. One that handled
  nothing in the window asks for one slot while it has runnable events: its first minute
  measures it. A slot waiting for a turn of a rate limit is busy (it holds the group).
- ``λ``, the arrivals: the rate at which the buffer's rows were written (their ids over the
  ages of the oldest and the newest), while it is at most :data:`STREAM_RATIO` times the rate
  handled lately (a stream, planned for over the autoscaler's lag); written faster (a
  backfill, a step up), they are a backlog to drain within the horizon, and ``λ`` is 0.
- A handler never asks for more slots than it can use: its ``concurrency`` cap, one slot per
  group it has runnable, and, under a fleet-wide rate limit, the slots that the limit keeps busy.
- A band asks for the sum of its handlers' slots, rounded up; the total is the sum of all of
  them, rounded up once. Neither is ever 0 while a lease of theirs is live or a runnable event
  of theirs waits.

**Drain time** at the fleet's size now (the slots of the live workers): the slot-seconds of
work runnable in the band and in every more urgent one (work is taken by priority) divided by
those slots; None while a handler with runnable events has no measured rate, or no worker is
live.

**Apdex** of a band over ``apdex_window`` (an hour by default): (satisfied + tolerating / 2) /
handled, where satisfied events were delivered within their band's promise, tolerating ones
within four times it, and handled counts every event delivered or dead-lettered (a dead letter
frustrates); None when nothing was handled in the window. The counts come from
``outbox_throughput``, filled by workers of schema generation 8 and newer.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from outbox._db import queries
from outbox._services.heartbeat import silent_after
from outbox.app import Outbox
from outbox.exceptions import ConfigurationError
from outbox.handler import Handler
from outbox.ratelimit import Unit

DEFAULT_TARGET = 0.5
"""The share of its band's promise within which events are planned to be handled; the rest is
the autoscaler's lag, over which arrivals are planned for."""
MIN_HORIZON_SHARE = 0.1
"""The shortest horizon a backlog is planned to drain within, as a share of its promise."""
STREAM_RATIO = 2.0
"""Rows written at most this many times as fast as the handler handled lately are a stream to
plan for; faster, a backlog to drain."""
MIN_SPAN_SECONDS = 1.0
"""The shortest time over which the rows waiting are taken to have been written."""
DEFAULT_RATE_WINDOW_SECONDS = 120.0
"""How far back the handled events count towards a slot's rate: this minute and the one before."""
DEFAULT_APDEX_WINDOW_SECONDS = 3600.0
"""How far back the handled events count towards Apdex: an hour."""
MAX_WINDOW_SECONDS = 7 * 86_400.0
"""The longest window either may be: a week, as long as the throughput charts look back."""


@dataclass(frozen=True, slots=True)
class HandlerScaling:
    """What one handler asks of the fleet. Float seconds, by the database clock."""

    handler: str
    urgency: str
    promise: float
    runnable: int
    """Events a worker could start on now (an estimate from index ends, never low)."""
    newest_age: float | None
    """Age of the newest runnable event waiting unclaimed (of the newest event, when only
    claimed groups wait); None when nothing is runnable."""
    oldest_age: float | None
    """Age of the oldest event in the buffer; None when it is empty."""
    live_leases: int
    """Jobs of the handler leased by a worker now."""
    rate_per_slot: float | None
    """Events one slot handles a second, as measured; None when nothing was handled in the
    rate window."""
    arrival_rate: float | None
    """Events arriving a second, as planned for over the autoscaler's lag: the rate at which
    the rows waiting were written (their ids over their ages) while it is about the rate
    handled lately (at most :data:`STREAM_RATIO` times it); 0 when they were written faster (a
    backfill, a step up: a backlog); None when nothing is runnable or nothing was handled
    lately."""
    slots: float
    """The slots that keep its promise, before rounding (0 when nothing is runnable)."""
    work_seconds: float | None
    """Slot-seconds its runnable events take at the measured rate; None without a rate."""
    paused: bool
    handled: int
    """Events delivered or dead-lettered in the Apdex window."""
    satisfied: int
    tolerating: int

    @property
    def apdex(self) -> float | None:
        """(satisfied + tolerating / 2) / handled over the Apdex window; None: none handled."""
        return _apdex(self.satisfied, self.tolerating, self.handled)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {**asdict(self), "apdex": self.apdex}


@dataclass(frozen=True, slots=True)
class BandScaling:
    """What one urgency band asks of the fleet."""

    urgency: str
    promise: float
    handlers: tuple[str, ...]
    runnable: int
    desired_workers: int
    """Worker slots that keep the band's promise (never 0 while a lease of the band is live or
    a runnable event of it waits)."""
    drain_seconds: float | None
    """Seconds the fleet's slots now take to drain the band's runnable events and those of
    every more urgent band; None when not known (no rate measured, or no live worker)."""
    handled: int
    satisfied: int
    tolerating: int

    @property
    def apdex(self) -> float | None:
        """(satisfied + tolerating / 2) / handled over the Apdex window; None: none handled."""
        return _apdex(self.satisfied, self.tolerating, self.handled)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {**asdict(self), "handlers": list(self.handlers), "apdex": self.apdex}


@dataclass(frozen=True, slots=True)
class Scaling:
    """What the fleet should be: desired worker slots, per band and in total, the time to drain
    at its size now, and each band's Apdex (:func:`read_scaling`)."""

    desired_workers: int
    """Worker slots (concurrency units) that keep every promise; never 0 while a lease is
    live or a runnable event waits."""
    fleet_slots: int
    """Slots of the live workers now (the sum of their concurrency)."""
    drain_seconds: float | None
    """Seconds the fleet's slots now take to drain every runnable event; 0 when none waits;
    None when not known."""
    runnable: int
    target: float
    """The share of each promise within which events are planned to be handled."""
    rate_window: float
    apdex_window: float
    bands: tuple[BandScaling, ...]
    """Most urgent band first (by priority)."""
    handlers: tuple[HandlerScaling, ...]

    def workers_for(self, concurrency: int) -> int:
        """Worker processes of ``concurrency`` slots each that give the desired slots."""
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be a whole number >= 1, got {concurrency!r}")
        return math.ceil(self.desired_workers / concurrency)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``outbox status --json``'s ``scaling``, the API's answer)."""
        return {
            "desired_workers": self.desired_workers,
            "fleet_slots": self.fleet_slots,
            "drain_seconds": self.drain_seconds,
            "runnable": self.runnable,
            "target": self.target,
            "rate_window": self.rate_window,
            "apdex_window": self.apdex_window,
            "bands": [b.as_dict() for b in self.bands],
            "handlers": [h.as_dict() for h in self.handlers],
        }


def read_scaling(
    app: Outbox,
    handlers: tuple[str, ...] | list[str] = (),
    *,
    target: float = DEFAULT_TARGET,
    rate_window: float = DEFAULT_RATE_WINDOW_SECONDS,
    apdex_window: float = DEFAULT_APDEX_WINDOW_SECONDS,
) -> Scaling:
    """Desired worker slots, drain time and Apdex of every handler (or the named ones), per
    band and in total, from one statement (see the module's docstring for the formula).

    ``target``: the share of each band's promise within which events are planned to be
    handled (0 < target <= 1); the rest is the autoscaler's lag, over which arrivals are
    planned for (at 1, none are: the autoscaler is taken to act at once). ``rate_window``
    and ``apdex_window``: seconds back that the measured rate and Apdex count (60 s to a
    week). A value out of bounds raises :class:`~outbox.exceptions.ConfigurationError`
    naming it.
    """
    _check_share("target", target)
    _check_window("rate_window", rate_window)
    _check_window("apdex_window", apdex_window)
    selected = app.select_handlers(handlers)
    with queries.reading_connection(app.engine) as conn:
        rows = queries.scaling_rows(
            conn,
            [(h.name, h.table) for h in selected],
            rate_seconds=rate_window,
            apdex_seconds=apdex_window,
            stale_seconds=silent_after(app.settings),
        )
    return plan(selected, rows, target=target, rate_window=rate_window, apdex_window=apdex_window)


def plan(
    selected: list[Handler[Any]],
    rows: list[queries.ScalingRow],
    *,
    target: float = DEFAULT_TARGET,
    rate_window: float = DEFAULT_RATE_WINDOW_SECONDS,
    apdex_window: float = DEFAULT_APDEX_WINDOW_SECONDS,
) -> Scaling:
    """The scaling of ``selected`` from what the read found (``rows``, one per handler): the
    arithmetic of :func:`read_scaling`, apart from the database."""
    by_name = {r.handler: r for r in rows}
    found = [handler_scaling(h, by_name[h.name], target) for h in selected]
    fleet_slots = rows[0].fleet_slots if rows else 0
    bands: list[BandScaling] = []
    done: float | None = 0.0
    by_band: dict[str, list[HandlerScaling]] = {}
    # Work is taken by priority: a band drains after every more urgent one.
    priority = {h.name: (h.urgency.priority, h.urgency.promise) for h in selected}
    for h in sorted(found, key=lambda s: priority[s.handler]):
        by_band.setdefault(h.urgency, []).append(h)
    for name, members in by_band.items():
        runnable = sum(m.runnable for m in members)
        work = [m.work_seconds for m in members if m.runnable]
        known = done is not None and all(w is not None for w in work)
        done = sum((w for w in work if w is not None), done) if known and done is not None else None
        bands.append(
            BandScaling(
                urgency=name,
                promise=members[0].promise,
                handlers=tuple(m.handler for m in members),
                runnable=runnable,
                desired_workers=_rounded(members),
                drain_seconds=_drain(done, runnable, fleet_slots),
                handled=sum(m.handled for m in members),
                satisfied=sum(m.satisfied for m in members),
                tolerating=sum(m.tolerating for m in members),
            )
        )
    runnable = sum(h.runnable for h in found)
    return Scaling(
        desired_workers=_rounded(found),
        fleet_slots=fleet_slots,
        drain_seconds=_drain(done, runnable, fleet_slots),
        runnable=runnable,
        target=target,
        rate_window=rate_window,
        apdex_window=apdex_window,
        bands=tuple(bands),
        handlers=tuple(found),
    )


def handler_scaling(h: Handler[Any], row: queries.ScalingRow, target: float) -> HandlerScaling:
    """What one handler asks of the fleet, from what the read found of it."""
    runnable, newest = (0, None) if row.paused else _runnable(h, row)
    rate = handled = None
    if row.recent_handled and row.recent_seconds > 0:
        handled = row.recent_handled / row.recent_seconds
        if row.busy_handled and row.recent_busy > 0:
            # What a slot does while it runs the handler's groups, however many sat idle.
            rate = row.busy_handled / row.recent_busy
        else:
            # No busy time kept (older workers): the slots in flight now did it.
            rate = handled / max(row.live_leases, 1)
    arrivals = None
    if handled is not None and runnable:
        written = _written(row)
        # Rows written about as fast as they are handled: a stream to plan for. Written much
        # faster, they are a backlog (a backfill, a step up): the backlog's own term drains
        # them, and counting them as a rate too would ask for every slot they would keep busy
        # over the lag.
        arrivals = written if written <= STREAM_RATIO * handled else 0.0
    promise = h.urgency.promise
    slots = 0.0
    if runnable:
        if rate is None:
            slots = 1.0
        else:
            horizon = max(target * promise - (newest or 0.0), MIN_HORIZON_SHARE * promise)
            # Keep up with what arrives, and drain what waits before the horizon.
            # Oldest first: the newest waiting is handled within the horizon, and so is the
            # last to arrive before the autoscaler's lag is over (it asks again by then).
            lag = (1.0 - target) * promise
            arriving = (arrivals or 0.0) * lag
            needed = max(runnable / horizon, (runnable + arriving) / promise)  # W + L = P
            slots = min(needed / rate, _usable(h, runnable, rate))
    return HandlerScaling(
        handler=h.name,
        urgency=h.urgency.name,
        promise=promise,
        runnable=runnable,
        newest_age=newest,
        oldest_age=row.oldest_age,
        live_leases=row.live_leases,
        rate_per_slot=rate,
        arrival_rate=arrivals,
        slots=slots,
        work_seconds=None if rate is None else runnable / rate,
        paused=row.paused,
        handled=row.handled,
        satisfied=row.satisfied,
        tolerating=row.tolerating,
    )


def _written(row: queries.ScalingRow) -> float:
    """Rows written a second over the time the buffer's rows were written in: their ids
    (ids only grow) over the ages of the oldest and the newest (at least a second apart)."""
    if row.first_id is None or row.last_id is None or row.oldest_age is None:
        return 0.0
    newest = row.newest_unclaimed_age if row.newest_unclaimed_age is not None else 0.0
    span = max(row.oldest_age - newest, MIN_SPAN_SECONDS)
    return (row.last_id - row.first_id + 1) / span


def _runnable(h: Handler[Any], row: queries.ScalingRow) -> tuple[int, float | None]:
    """Runnable events and the newest one's age, estimated from the index ends."""
    unclaimed = 0
    if row.first_unclaimed is not None and row.last_unclaimed is not None:
        unclaimed = row.last_unclaimed - row.first_unclaimed + 1
    total = 0
    if row.first_id is not None and row.last_id is not None:
        total = row.last_id - row.first_id + 1
    claimed = min(row.runnable_groups * h.batch_size, max(total - unclaimed, 0))
    # A size-or-time handler's events are due once a batch is full or the oldest has waited.
    due = h.max_wait is None or unclaimed >= h.batch_size
    if not due and h.max_wait is not None:
        due = row.oldest_age is not None and row.oldest_age >= h.max_wait
    if not due:
        unclaimed = 0
    newest = row.newest_unclaimed_age if unclaimed else (row.oldest_age if claimed else None)
    return unclaimed + claimed, newest


def _usable(h: Handler[Any], runnable: int, rate: float) -> float:
    """The most slots the handler can keep busy: its cap, a slot per batch it has runnable,
    and what a fleet-wide rate limit lets through."""
    most = float(math.ceil(runnable / h.batch_size))
    if h.concurrency is not None:
        most = min(most, float(h.concurrency))
    for limit in h.rate_limits:
        if limit.key is not None:
            continue
        for window in limit.windows():
            if not window.exact:
                continue
            per_second = window.capacity / window.period
            events = per_second * (h.batch_size if window.unit is Unit.CALLS else 1)
            most = min(most, max(events / rate, 1.0))
    return most


def _rounded(members: list[HandlerScaling]) -> int:
    """The slots of ``members`` summed and rounded up; at least 1 while one of them has a
    live lease or runnable events."""
    slots = math.ceil(round(sum(m.slots for m in members), 9))
    if any(m.live_leases or m.runnable for m in members):
        return max(slots, 1)
    return slots


def _drain(done: float | None, runnable: int, fleet_slots: int) -> float | None:
    if not runnable:
        return 0.0
    if done is None or fleet_slots < 1:
        return None
    return done / fleet_slots


def _apdex(satisfied: int, tolerating: int, handled: int) -> float | None:
    if handled <= 0:
        return None
    return min((satisfied + tolerating / 2) / handled, 1.0)


def _check_share(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ConfigurationError(
            f"{name} must be a share of the promise above 0 and at most 1, got {value!r}"
        )


def _check_window(name: str, value: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 60 <= value <= MAX_WINDOW_SECONDS
    ):
        raise ConfigurationError(
            f"{name} must be 60 to {MAX_WINDOW_SECONDS:.0f} seconds, got {value!r}"
        )
