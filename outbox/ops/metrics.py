"""Status numbers per handler and per band: backlog, age, staleness, groups, dead letters, alerts.

Staleness is the age of the oldest unhandled event divided by the band's promise: above 1, the
fleet is behind its promise. A handler raises an alert when its staleness passes its band's
``alert_staleness`` or one of its groups has failed ``alert_attempts`` times; when its events
wait with nothing distributing them (:mod:`outbox._services.distribution_watch`); and, whatever
its band, while events it dead-lettered in the last ``dead_since`` seconds (``DEAD_SINCE``: a
day) wait in the archive for an operator. Jobs whose holder stopped heartbeating are listed with
when they will be rescued.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection

from outbox import lifecycle, schema
from outbox._core.durations import Timed
from outbox._db import queries
from outbox._services import distribution_watch
from outbox._services.heartbeat import silent_after
from outbox.app import Outbox, Settings
from outbox.exceptions import ConfigurationError
from outbox.handler import Handler


@dataclass(frozen=True, slots=True)
class SilentHolding:
    """A job of a handler held by a worker that stopped heartbeating. Float seconds, by the
    database clock."""

    kind: str
    """``batch`` (a group) or ``claim``."""
    group_id: str | None
    holder: str
    """The silent worker's id (host:pid:random)."""
    heartbeat_age: float
    """Seconds since the holder's last heartbeat."""
    rescue_in: float
    """Seconds until the job is due to be rescued (0: now): when the holder counts as gone
    (``Settings.worker_stale_after``) or its lease runs out, whichever comes first; the next
    rescue, every ``rescue_interval``, frees it."""

    def text(self) -> Timed:
        """One line's worth: what, who, since when, and when it comes back."""
        what = f"group {self.group_id}" if self.group_id else f"a {self.kind} job"
        when = Timed("now") if self.rescue_in <= 0 else Timed("in ", self.rescue_in)
        return (
            Timed(f"{what} held by {self.holder}, whose heartbeat stopped ", self.heartbeat_age)
            + " ago: rescued "
            + when
        )


# How far back `outbox check` looks for dead letters to alert on: a day, so that a daily check
# sees each one at least once, and a dead letter an operator has seen (and left archived) stops
# paging by the next day. 0 or None: no dead-letter alert.
DEAD_SINCE = 86_400.0
# The newest dead letter's error in an alert: its first line, cut to this many characters.
ERROR_SHOWN = 200


@dataclass(frozen=True, slots=True)
class HandlerStatus:
    """Where one handler stands. Ages are float seconds, by the database clock."""

    handler: str
    buffer: str
    urgency: str
    promise: float
    unclaimed: int
    """Events written and not yet claimed."""
    claimed: int
    """Events in groups waiting, running or retrying."""
    oldest_age: float | None
    """Age of the oldest event still in the buffer; None when it is empty."""
    staleness: float | None
    """``oldest_age / promise``: above 1, the handler is behind its promise."""
    claims_pending: int
    groups_waiting: int
    groups_in_flight: int
    groups_retrying: int
    groups_refused: int
    """Groups whose finishing write the database refused: held until released
    (``outbox refused``)."""
    max_failed_attempts: int
    """The most failed attempts of any group waiting to be retried (0: none)."""
    paused: bool = False
    """No worker runs the handler's groups now (``outbox pause``, a Retry-After, its circuit
    breaker); its events wait."""
    paused_for: float | None = None
    """Seconds until the pause ends by itself; None while not paused, or paused until
    resumed."""
    pause_cause: str | None = None
    """Who paused it: ``operator``, ``retry_after`` or ``breaker``."""
    pause_reason: str | None = None
    breaker: str | None = None
    """The circuit breaker's state, for a handler that has one: ``closed``, ``open`` (the
    handler is paused by it) or ``probing`` (one group at a time until one succeeds)."""
    consecutive_failures: int = 0
    """Groups failed in a row, counted for the circuit breaker."""
    held_keys: list[str] = field(default_factory=list)
    """Ordering keys dead groups hold back (``outbox held``): their later events wait."""
    rate_limit: str | None = None
    """The handler's shared rate limits in words, all of them (``10 calls/s and 2 calls/s per
    account_id``); None without."""
    rate_limits: list[str] = field(default_factory=list)
    """Each of the handler's shared rate limits in words, saying whether it is fleet-wide or per
    key (``10 calls/s, fleet-wide``, ``2 calls/s per account_id``)."""
    guarantee: str | None = None
    """The delivery guarantee the handler's object states (a ready-made sink, see
    :mod:`outbox.lifecycle`), in words; None for a plain function. What the object checked
    when it started (a JetStream stream's duplicate window) is in it once it started in this
    process: ``outbox status`` starts it to read it."""
    refused_at_start: str | None = None
    """Why a worker would refuse to start the handler (its object's start check, which
    ``outbox status`` and ``outbox check`` run: :func:`outbox.lifecycle.refusal`), in one
    line; None when it starts, or when no start check was run."""
    archived: dict[str, int] = field(default_factory=dict)
    """Archived events by status: succeeded, dead, expired, discarded, superseded."""
    recent_dead: int = 0
    """Events dead-lettered within the alert window (``dead_since``)."""
    undistributed_age: float | None = None
    """Seconds the oldest claimable event has waited while the handler had no claim job (it
    was not distributed yet); None when none waits so."""
    silent_holdings: list[SilentHolding] = field(default_factory=list)
    """The handler's jobs held by workers that stopped heartbeating, and when each is
    rescued."""
    alerts: list[str] = field(default_factory=list)
    """Broken promises, in words; empty when all hold."""
    capped_at: int | None = None
    """The cap the counts of rows were read with (``collect(count_cap=...)``): a count equal
    to it means at least that many; None: exact counts."""

    @property
    def dead(self) -> int:
        """Events dead-lettered into the archive."""
        return self.archived.get(schema.ArchiveStatus.DEAD, 0)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for ``outbox status --json``)."""
        data = asdict(self)
        data["dead"] = self.dead
        return data


@dataclass(frozen=True, slots=True)
class BandStatus:
    """The handlers of one urgency band, taken together."""

    urgency: str
    promise: float
    handlers: list[str]
    unclaimed: int
    oldest_age: float | None
    staleness: float | None
    max_failed_attempts: int
    dead: int
    alerts: int

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def collect(
    app: Outbox,
    handlers: tuple[str, ...] | list[str] = (),
    *,
    dead_since: float | None = DEAD_SINCE,
    count_cap: int | None = None,
) -> list[HandlerStatus]:
    """The status of every handler (or the named ones), read on one connection.

    ``dead_since``: a handler alerts while it has dead letters archived less than this many
    seconds ago; 0 or None: no dead-letter alert. ``count_cap``: count buffer and archive rows
    no further than this (each such count then says "at least", see
    :attr:`HandlerStatus.capped_at`), so that a status of huge tables costs a bounded read;
    None: exact counts.
    """
    if count_cap is not None and (
        isinstance(count_cap, bool) or not isinstance(count_cap, int) or count_cap < 1
    ):
        raise ValueError(f"count_cap must be a whole number >= 1, got {count_cap!r}")
    if dead_since is not None and not dead_since >= 0:
        raise ValueError("dead_since must be >= 0 seconds (0 or None: no dead-letter alert)")
    selected = app.select_handlers(handlers)
    with app.engine.connect() as conn:
        silent = _silent_holdings(conn, app.settings)
        recent_dead = (
            {d.handler: d for d in queries.recent_dead_letters(conn, dead_since)}
            if dead_since
            else {}
        )
        jobs = queries.job_counts(conn)
        archived = queries.archive_counts(conn, count_cap, [h.name for h in selected])
        failed = queries.max_failed_attempts(conn)
        states = queries.handler_states(conn)
        held: dict[str, list[str]] = {}
        for key in queries.held_keys(conn):
            held.setdefault(key.handler, []).append(key.key)
        statuses = [
            _handler_status(
                conn,
                h,
                jobs,
                archived,
                failed,
                states.get(h.name),
                held,
                recent_dead.get(h.name),
                count_cap,
            )
            for h in selected
        ]
        return [
            _with_distribution(conn, h, s, silent.get(h.name, []))
            for h, s in zip(selected, statuses, strict=True)
        ]


THROUGHPUT_MINUTES = 60
"""The minutes :func:`throughput` reads by default: the dashboard's last hour."""


def throughput(
    app: Outbox, minutes: int = THROUGHPUT_MINUTES
) -> dict[str, list[queries.ThroughputRow]]:
    """What each handler handled, minute by minute, over the last ``minutes`` (the minutes in
    which it handled nothing are absent), as the workers recorded it (``outbox_throughput``,
    written at each heartbeat)."""
    if isinstance(minutes, bool) or not isinstance(minutes, int) or not 1 <= minutes <= 10_080:
        raise ValueError(f"minutes must be 1 to 10080 (a week), got {minutes!r}")
    found: dict[str, list[queries.ThroughputRow]] = {}
    with app.engine.connect() as conn:
        for row in queries.throughput_since(conn, minutes * 60.0):
            found.setdefault(row.handler, []).append(row)
    return found


class ThroughputRange(StrEnum):
    """How far back a throughput chart looks (:func:`throughput_charts`)."""

    HOUR = "hour"
    """The last hour, a bar a minute."""
    DAY = "day"
    """The last day, a bar an hour."""
    WEEK = "week"
    """The last week, a bar an hour."""


BUCKETS: dict[ThroughputRange, tuple[int, int]] = {
    ThroughputRange.HOUR: (60, 60),
    ThroughputRange.DAY: (24, 3600),
    ThroughputRange.WEEK: (168, 3600),
}
"""Each range's buckets: how many, and how many seconds each."""


@dataclass(frozen=True, slots=True)
class ThroughputBucket:
    """One bar of a chart: what a handler handled in ``bucket_seconds`` that began
    ``start_ago`` seconds ago (by the database clock)."""

    start_ago: int
    succeeded: int
    """Events delivered."""
    dead: int
    """Events dead-lettered."""
    failed: int
    """Groups that failed an attempt (retried or dead)."""


@dataclass(frozen=True, slots=True)
class ThroughputChart:
    """What a handler handled over a range, bucket by bucket, oldest first; every bucket is
    there (0 when nothing was counted in it)."""

    handler: str
    range: ThroughputRange
    bucket_seconds: int
    buckets: list[ThroughputBucket]

    @property
    def succeeded(self) -> int:
        """Events delivered over the whole range."""
        return sum(b.succeeded for b in self.buckets)

    @property
    def failed(self) -> int:
        """Groups that failed an attempt over the whole range."""
        return sum(b.failed for b in self.buckets)

    @property
    def dead(self) -> int:
        """Events dead-lettered over the whole range."""
        return sum(b.dead for b in self.buckets)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the API's answer)."""
        return {
            **asdict(self),
            "succeeded": self.succeeded,
            "failed": self.failed,
            "dead": self.dead,
        }


def throughput_range(given: str | None) -> ThroughputRange:
    """A chart's range from its name (None: the hour); a ConfigurationError naming a wrong
    one."""
    if given is None:
        return ThroughputRange.HOUR
    try:
        return ThroughputRange(given)
    except ValueError:
        ranges = ", ".join(r.value for r in ThroughputRange)
        raise ConfigurationError(f"range: expected one of {ranges}, got {given!r}") from None


def throughput_charts(
    app: Outbox, handlers: list[str] | tuple[str, ...], span: ThroughputRange | str
) -> dict[str, ThroughputChart]:
    """What each of ``handlers`` handled over ``range`` (an hour: a bar a minute; a day or
    a week: a bar an hour), summed by the database, as the workers recorded it
    (``outbox_throughput``). ``outbox prune --older-than`` deletes the minutes past its age:
    pruned to less than a week, a week's chart shows what is left. ``span``: a
    :class:`ThroughputRange` or its name (a ConfigurationError for another)."""
    chosen = throughput_range(str(span))
    names = [h.name for h in app.select_handlers(handlers)]
    count, seconds = BUCKETS[chosen]
    sums: dict[str, list[list[int]]] = {name: [[0, 0, 0] for _ in range(count)] for name in names}
    with app.engine.connect() as conn:
        found = queries.throughput_buckets(conn, names, float(count * seconds), seconds)
    for row in found:
        # A minute a worker's clock dated a little ahead of the database's is the newest.
        index = count - 1 - min(max(row.ago, 0), count - 1)
        counts = sums[row.handler][index]
        counts[0] += row.succeeded
        counts[1] += row.dead
        counts[2] += row.failed
    return {
        name: ThroughputChart(
            name,
            chosen,
            seconds,
            [
                ThroughputBucket((count - index) * seconds, *counts)
                for index, counts in enumerate(sums[name])
            ],
        )
        for name in names
    }


def _silent_holdings(conn: Connection, settings: Settings) -> dict[str, list[SilentHolding]]:
    by_handler: dict[str, list[SilentHolding]] = {}
    for job in queries.silent_holders(conn, silent_after(settings)):
        rescue_in = max(min(settings.worker_stale_after - job.heartbeat_age, job.lease_left), 0.0)
        by_handler.setdefault(job.handler, []).append(
            SilentHolding(
                kind=job.kind,
                group_id=None if job.group_id is None else str(job.group_id),
                holder=job.holder,
                heartbeat_age=job.heartbeat_age,
                rescue_in=rescue_in,
            )
        )
    return by_handler


def _with_distribution(
    conn: Connection, h: Handler[Any], status: HandlerStatus, silent: list[SilentHolding]
) -> HandlerStatus:
    """The status with its silent holders, and whether anything distributes its events."""
    age = distribution_watch.undistributed_age(conn, h)
    alerts = list(status.alerts)
    if age is not None and age > distribution_watch.alert_after(h):
        alerts.append(distribution_watch.alert_text(age))
    return replace(status, undistributed_age=age, silent_holdings=silent, alerts=alerts)


def _handler_status(
    conn: Connection,
    h: Handler[Any],
    jobs: dict[tuple[str, str, str], int],
    archived: dict[tuple[str, str], int],
    failed: dict[str, int],
    state: queries.HandlerState | None,
    held: dict[str, list[str]],
    dead: queries.RecentDeadLetters | None = None,
    cap: int | None = None,
) -> HandlerStatus:
    def count(kind: str, state: str) -> int:
        return jobs.get((h.name, kind, state), 0)

    age = queries.oldest_event_age(conn, h.table)
    staleness = None if age is None else age / h.urgency.promise
    max_failed = failed.get(h.name, 0)
    paused = state is not None and state.paused
    return HandlerStatus(
        handler=h.name,
        buffer=h.table.name,
        urgency=h.urgency.name,
        promise=h.urgency.promise,
        unclaimed=queries.count_buffer_rows(conn, h.table, unclaimed=True, cap=cap),
        claimed=queries.count_buffer_rows(conn, h.table, unclaimed=False, cap=cap),
        capped_at=cap,
        oldest_age=age,
        staleness=staleness,
        claims_pending=sum(
            count(schema.JobKind.CLAIM, s) for s in schema.JobState if s != schema.JobState.REFUSED
        ),
        groups_waiting=count(schema.JobKind.BATCH, schema.JobState.WAITING),
        groups_in_flight=count(schema.JobKind.BATCH, schema.JobState.RUNNING),
        groups_retrying=count(schema.JobKind.BATCH, schema.JobState.RETRYING),
        groups_refused=count(schema.JobKind.BATCH, schema.JobState.REFUSED),
        max_failed_attempts=max_failed,
        paused=paused,
        paused_for=state.paused_for if paused and state else None,
        pause_cause=state.cause if paused and state else None,
        pause_reason=state.reason if paused and state else None,
        breaker=_breaker_state(h, state),
        consecutive_failures=state.failures if state else 0,
        held_keys=held.get(h.name, []),
        rate_limit=_rate_limit(h),
        rate_limits=[
            limit.describe() + ("" if limit.key else ", fleet-wide") for limit in h.rate_limits
        ],
        guarantee=lifecycle.guarantee(h),
        archived={
            status: archived[(h.name, status)]
            for status in schema.ArchiveStatus
            if (h.name, status) in archived
        },
        recent_dead=0 if dead is None else dead.count,
        alerts=_alerts(
            h,
            age,
            staleness,
            max_failed,
            count(schema.JobKind.BATCH, schema.JobState.REFUSED),
            state if paused else None,
            len(held.get(h.name, [])),
        )
        + _dead_alerts(dead),
    )


def _rate_limit(h: Handler[Any]) -> str | None:
    if not h.rate_limits:
        return None
    return " and ".join(limit.describe() for limit in h.rate_limits)


def _breaker_state(h: Handler[Any], state: queries.HandlerState | None) -> str | None:
    if h.circuit_breaker is None:
        return None
    if state is None or not state.trips:
        return "closed"
    return "open" if state.paused and state.cause == schema.PauseCause.BREAKER else "probing"


def pause_text(cause: str | None, paused_for: float | None, reason: str | None) -> Timed:
    """A pause in words: who paused the handler, until when, and why."""
    until = Timed("until resumed") if paused_for is None else Timed("for ", paused_for, " more")
    by = {
        schema.PauseCause.OPERATOR.value: "by an operator",
        schema.PauseCause.RETRY_AFTER.value: "by the downstream's Retry-After",
        schema.PauseCause.BREAKER.value: "by its circuit breaker",
    }.get(str(cause), f"by {cause}")
    return f"paused {by} " + until + (f": {reason.splitlines()[0][:200]}" if reason else "")


def _alerts(
    h: Handler[Any],
    age: float | None,
    staleness: float | None,
    failed: int,
    refused: int,
    pause: queries.HandlerState | None,
    held: int = 0,
) -> list[str]:
    band = h.urgency
    alerts = []
    if held:
        # Whatever the band: the keys' later events wait for an operator.
        alerts.append(
            f"{held} ordering key{'s' * (held > 1)} held by dead groups: their later events "
            "wait (outbox held list)"
        )
    if refused:
        # Whatever the band: such a group waits for an operator, however long it takes.
        alerts.append(
            f"{refused} group{'s' * (refused > 1)} held: the database refused to record "
            "their outcome (outbox refused list)"
        )
    if staleness is not None and age is not None and staleness > band.alert_staleness:
        # A paused handler is late for a reason the alert names: no worker runs it. A rate
        # limit may be why too: the backlog cannot drain faster than it allows.
        why = (
            Timed()
            if pause is None
            else " (" + pause_text(pause.cause, pause.paused_for, pause.reason) + ")"
        )
        if h.rate_limits:
            why += f" (rate limit {_rate_limit(h)})"
        alerts.append(
            Timed("oldest event is ", age, f" old: staleness {staleness:.2f} is above ")
            + Timed(f"{band.alert_staleness:g} for the {band.name} promise of ", band.promise)
            + why
        )
    if failed >= band.alert_attempts:
        alerts.append(
            f"a group has failed {failed} attempts: {band.name} alerts at {band.alert_attempts}"
        )
    return alerts


def _dead_alerts(dead: queries.RecentDeadLetters | None) -> list[str]:
    # Whatever the band: a dead letter waits for an operator to replay or prune it.
    if dead is None or not dead.count:
        return []
    error = (dead.newest_error or "no error recorded").strip().splitlines() or [""]
    return [
        Timed(
            f"{dead.count} event{'s' * (dead.count > 1)} dead-lettered in the last ",
            dead.since,
            ", the newest ",
            dead.newest_age,
            f" ago: {error[0][:ERROR_SHOWN]} (outbox replay --status dead)",
        )
    ]


def bands(statuses: list[HandlerStatus]) -> list[BandStatus]:
    """The handler statuses summed up per urgency band, most urgent band first."""
    by_band: dict[str, list[HandlerStatus]] = {}
    for status in statuses:
        by_band.setdefault(status.urgency, []).append(status)
    result = []
    for name, members in by_band.items():
        ages = [s.oldest_age for s in members if s.oldest_age is not None]
        stalenesses = [s.staleness for s in members if s.staleness is not None]
        result.append(
            BandStatus(
                urgency=name,
                promise=members[0].promise,
                handlers=[s.handler for s in members],
                unclaimed=sum(s.unclaimed for s in members),
                oldest_age=max(ages) if ages else None,
                staleness=max(stalenesses) if stalenesses else None,
                max_failed_attempts=max(s.max_failed_attempts for s in members),
                dead=sum(s.dead for s in members),
                alerts=sum(len(s.alerts) for s in members),
            )
        )
    return sorted(result, key=lambda b: b.promise)
