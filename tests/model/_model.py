"""The reference model of the handler-outcome contract, written from the documentation alone.

docs/guide.md (what a handler's return, raise, ``retry`` and ``discard`` mean), docs/flow-control.md
(``RetryAfter``, deferrals and ``max_deferrals``, pauses, the circuit breaker, rate limits,
``group_by`` and ``ordering_key``) and the handler-outcome contract say what must become of every
event. This module knows nothing of outbox's code: :func:`expect` says what one call must do,
from what the handler was told to do and the values it passed, and :class:`Checker` holds the
calls a run recorded and the state it ended in against those rules.

The words of a case (what a call does, the kinds of values it passes) are plain data here, so
that a case prints as the code that reproduces it and travels to a subprocess as JSON.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

YEAR_SECONDS = 366 * 86_400.0
MIN_RETRY_AFTER_SECONDS = 1.0
DEFAULT_RETRY_AFTER_SECONDS = 30.0
DEFERRAL_JITTER = 0.1
DEFERRAL_LAG_SECONDS = 0.5
"""A deferred group is back within ``after * 1.1 + 0.5 s`` on a fleet with default settings."""


class _Word(StrEnum):
    """A word of a case; its repr is the code that names it."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}.{self.name}"


class CallKind(_Word):
    """What one handler call does."""

    RETURN = "return"  # after its ops (retry / discard), if any
    RAISE = "raise"  # a plain Exception subclass
    BAD_STR = "bad_str"  # an exception whose __str__ raises
    SYSTEM_EXIT = "system_exit"
    DATA_ERROR = "data_error"  # outbox.DataError
    DOWNSTREAM_ERROR = "downstream_error"  # outbox.DownstreamError
    RETRY_AFTER = "retry_after"
    SLOW = "slow"  # overruns the handler's timeout


class OpKind(_Word):
    RETRY = "retry"
    DISCARD = "discard"


class Pick(_Word):
    """Which events an op passes."""

    FIRST = "first"
    LAST = "last"
    ALL = "all"
    STRANGER = "stranger"  # an event of no group of this call
    TEXT = "text"  # a str instead of events


class ReasonKind(_Word):
    STR = "str"
    NONE = "none"
    DICT = "dict"
    INT = "int"
    BAD_STR = "bad_str"  # an object whose __str__ raises


class AfterKind(_Word):
    SECONDS = "seconds"  # value: the number given
    TIMEDELTA = "timedelta"  # value: its seconds
    AWARE = "aware"  # value: seconds from now of an aware datetime
    NAIVE = "naive"  # value: seconds from now of a naive datetime
    HTTP_DATE = "http_date"  # value: seconds from now, of an HTTP date (whole seconds)
    TEXT_SECONDS = "text_seconds"  # value: seconds, as header text
    GARBAGE = "garbage"  # unreadable header text
    BOOL = "bool"  # True: not a number
    LIST = "list"  # another type


@dataclass(frozen=True)
class After:
    kind: AfterKind
    value: float = 0.0


@dataclass(frozen=True)
class Op:
    """One ``batch.retry`` or ``batch.discard`` in a call."""

    kind: OpKind
    pick: Pick
    reason: ReasonKind = ReasonKind.STR
    after: After | None = None


@dataclass(frozen=True)
class Call:
    """What one handler call does."""

    kind: CallKind = CallKind.RETURN
    ops: tuple[Op, ...] = ()
    after: After | None = None  # RETRY_AFTER's
    reason: ReasonKind | None = None  # RETRY_AFTER's (None: no reason given)


# --- what a call must do --------------------------------------------------------------------


@dataclass(frozen=True)
class Wait:
    """A valid ``after``: the contract's wait in seconds, measured from when it was given."""

    seconds: float


@dataclass(frozen=True)
class Refused:
    """A value refused where it is passed: the exception types the contract allows."""

    types: frozenset[str]


def wait_for(after: After) -> Wait | Refused:
    """The contract's reading of an ``after`` value (``RetryAfter``'s or ``batch.retry``'s)."""
    kind, value = after.kind, after.value
    if kind in (AfterKind.BOOL, AfterKind.LIST):
        return Refused(frozenset({"TypeError"}))
    if kind is AfterKind.NAIVE:
        return Refused(frozenset({"ValueError"}))
    if kind is AfterKind.GARBAGE:
        return Wait(DEFAULT_RETRY_AFTER_SECONDS)
    if not math.isfinite(value) or value > YEAR_SECONDS:
        return Refused(frozenset({"ValueError"}))
    return Wait(max(value, MIN_RETRY_AFTER_SECONDS))


def reason_refused(reason: ReasonKind | None, *, optional: bool) -> bool:
    """Whether a reason of this kind is refused (a TypeError): it must be a str (or None, for
    ``RetryAfter``)."""
    if reason is None or reason is ReasonKind.NONE:
        return not optional
    return reason is not ReasonKind.STR


def picked(pick: Pick, ids: Sequence[int]) -> list[int]:
    """The ids an op passes, for the picks that pass events of the batch."""
    if pick is Pick.FIRST:
        return [ids[0]]
    if pick is Pick.LAST:
        return [ids[-1]]
    return list(ids)


class Effect(StrEnum):
    DELIVERED = "delivered"
    DISCARDED = "discarded"
    FAILED = "failed"  # a failed attempt: back with the next attempt, or dead when spent
    DEFERRED = "deferred"  # back with the same attempt after the wait


@dataclass
class Expectation:
    """What the contract says one call does to each of its events."""

    failed_whole: bool = False
    error_types: frozenset[str] = frozenset()  # for a failure raised in the handler
    error_line: str | None = None  # the exact first line of the error, when the model knows it
    error_prefix: str | None = None  # or how it begins
    cause: str = "downstream"  # "downstream" or "data"
    refused_op: int | None = None  # the op that must raise, when one must
    deferred_whole: Wait | None = None
    events: dict[int, Effect] = field(default_factory=dict)
    reasons: dict[int, str] = field(default_factory=dict)  # discarded / retried: the reason
    waits: dict[int, float] = field(default_factory=dict)  # deferred events: seconds


REASON_TEXT = "rejected by the downstream"


def expect(
    call: Call,
    ids: Sequence[int],
    *,
    ordered: bool,
    timed_out: bool,
    offsets: Sequence[float | None] = (),
) -> Expectation:
    """What ``call`` must do to a group of ``ids`` (deferral budgets are the checker's).

    ``offsets``: for each ``after`` the call gave (its ops', or its ``RetryAfter``'s), the
    seconds from the call's start to the moment its wait counts from; waits are returned in
    seconds from the call's start."""

    def offset(n: int) -> float:
        return (offsets[n] if n < len(offsets) else None) or 0.0

    if timed_out or call.kind is CallKind.SLOW:
        return _failed("HandlerTimeoutError", prefix="HandlerTimeoutError")
    if call.kind is CallKind.RAISE:
        return _failed("Boom", line="Boom: the downstream answered 500")
    if call.kind is CallKind.BAD_STR:
        return _failed("UnprintableError", prefix="UnprintableError")
    if call.kind is CallKind.SYSTEM_EXIT:
        return _failed("SystemExit", line="SystemExit: exit from a library")
    if call.kind is CallKind.DATA_ERROR:
        return _failed("DataError", line="DataError: 422 unreadable record", cause="data")
    if call.kind is CallKind.DOWNSTREAM_ERROR:
        return _failed("DownstreamError", line="DownstreamError: 503 service unavailable")
    if call.kind is CallKind.RETRY_AFTER:
        assert call.after is not None
        wait = wait_for(call.after)
        # Either refusal may come first when both arguments are wrong.
        refused = set(wait.types) if isinstance(wait, Refused) else set()
        if reason_refused(call.reason, optional=True):
            refused.add("TypeError")
        if refused or isinstance(wait, Refused):
            return _failed(*sorted(refused))
        return Expectation(
            deferred_whole=Wait(wait.seconds + offset(0)),
            events=dict.fromkeys(ids, Effect.DEFERRED),
            error_prefix="RetryAfter",
        )
    return _returned(call, ids, ordered=ordered, offset=offset)


def _failed(
    *types: str, line: str | None = None, prefix: str | None = None, cause: str = "downstream"
) -> Expectation:
    return Expectation(
        failed_whole=True,
        error_types=frozenset(types),
        error_line=line,
        error_prefix=prefix,
        cause=cause,
    )


def _returned(
    call: Call, ids: Sequence[int], *, ordered: bool, offset: Callable[[int], float]
) -> Expectation:
    discarded: dict[int, str] = {}
    retried: dict[int, str] = {}
    plain: set[int] = set()
    waits: dict[int, float] = {}
    for n, op in enumerate(call.ops):
        refused: set[str] = set()
        if op.pick is Pick.TEXT:
            refused.add("TypeError")
        elif op.pick is Pick.STRANGER:
            refused.add("ValueError")
        if reason_refused(op.reason, optional=False):
            refused.add("TypeError")
        wait: Wait | None = None
        if op.after is not None:
            reading = wait_for(op.after)
            if isinstance(reading, Refused):
                refused |= reading.types
            else:
                wait = Wait(reading.seconds + offset(n))
        chosen = [] if refused else picked(op.pick, ids)
        clash = discarded if op.kind is OpKind.RETRY else retried
        if any(i in clash for i in chosen):
            refused.add("ValueError")
        if refused:
            expectation = _failed(*sorted(refused))
            expectation.refused_op = n
            return expectation
        for i in chosen:
            if op.kind is OpKind.DISCARD:
                discarded.setdefault(i, REASON_TEXT)
                continue
            retried.setdefault(i, REASON_TEXT)
            if wait is None:
                plain.add(i)
            else:
                waits[i] = max(waits.get(i, 0.0), wait.seconds)
    expectation = Expectation()
    deferred = {i: w for i, w in waits.items() if i not in plain}
    # An ordered handler's call that retries and defers events goes on as one failed attempt.
    together = ordered and bool(plain) and bool(deferred)
    for i in ids:
        if i in discarded:
            expectation.events[i] = Effect.DISCARDED
            expectation.reasons[i] = discarded[i]
        elif i in retried and (i in plain or together):
            expectation.events[i] = Effect.FAILED
            expectation.reasons[i] = retried[i]
            if i in deferred:
                expectation.waits[i] = deferred[i]
        elif i in retried:
            expectation.events[i] = Effect.DEFERRED
            expectation.reasons[i] = retried[i]
            expectation.waits[i] = deferred[i]
        else:
            expectation.events[i] = Effect.DELIVERED
    return expectation


# --- what a run recorded --------------------------------------------------------------------


@dataclass
class Record:
    """One handler call as the handler saw it."""

    index: int  # the call's number in the case's script
    pid: int
    group: str
    attempt: int
    ids: list[int]
    keys: list[Any]  # the events' key column, in id order
    call: Call
    start_mono: float
    start_wall: float
    end_mono: float | None = None  # None: the call never ended (its process was killed)
    end_wall: float | None = None
    raised: str | None = None  # the first line of what the handler raised, if it raised
    op_raised: int | None = None  # which op raised, if one did
    given: list[float | None] = field(default_factory=list)
    """For each op (or the RetryAfter), the wall time its ``after`` counts from."""

    def offsets(self) -> list[float | None]:
        return [None if g is None else g - self.start_wall for g in self.given]

    def start(self, wall: bool) -> float:
        return self.start_wall if wall else self.start_mono

    def end(self, wall: bool) -> float | None:
        return self.end_wall if wall else self.end_mono


@dataclass(frozen=True)
class Options:
    """The handler options the checker needs to know."""

    max_attempts: int
    max_deferrals: int
    bisect: bool = False
    ordered: bool = False
    grouped: bool = False
    rate_limit: float | None = None  # calls per second
    per_key: bool = False  # rate limit and RetryAfter per key
    breaker_failures: int | None = None
    probe_after: float | None = None
    expires_after: float | None = None
    timeout: float | None = None
    archive: bool = False
    killed: bool = False  # processes were killed: attempts may be lost with them
    window_slack: int = 0  # calls a rate-limit window may hold over the limit (0: exact)


@dataclass(frozen=True)
class Archived:
    status: str
    error: str | None
    attempts: int
    age: float  # seconds from the event's creation to its archiving (database clock)


@dataclass
class Final:
    """Where the run left every event."""

    buffered: set[int]
    archived: dict[int, list[Archived]]
    held_keys: set[str]
    due_in: dict[int, float]  # buffered events in a group: seconds until its job is due
    ended_at_wall: float
    settled: bool  # the run ended because nothing more was due, not at its deadline


class Violation(AssertionError):  # noqa: N818 - an assertion that failed, by its name
    pass


@dataclass
class _Event:
    next_attempt: int = 1
    deferrals: int = 0
    # "pending", "delivered", "discarded", "dead"
    state: str = "pending"
    reason: str | None = None
    error_line: str | None = None
    error_prefix: str | None = None
    error_types: frozenset[str] = frozenset()
    finished_at: float | None = None
    earliest: float = 0.0  # when it may be handed over again, at the soonest
    latest: float | None = None  # and at the latest (None: not checked)
    uncertain: bool = False  # its last call's process was killed


class Checker:
    """Holds the calls of a run and the state it ended in against the contract."""

    def __init__(
        self,
        options: Options,
        records: Iterable[Record],
        created: Mapping[int, float],
        keys: Mapping[int, Any],
        *,
        kills: Sequence[float] = (),
    ) -> None:
        self.options = options
        self.records = sorted(records, key=lambda r: (r.start_wall, r.index))
        self.wall = len({r.pid for r in self.records}) > 1 or options.killed
        self.created = dict(created)
        self.keys = dict(keys)
        self.kills = list(kills)
        self.problems: list[str] = []
        self.loop_errors: list[str] = []  # what outbox itself raised while running the case
        self.events = {i: _Event() for i in created}

    # --- helpers

    def _t(self, moment_wall: float, record: Record) -> float:
        """A wall time in the clock the records are compared in."""
        return moment_wall if self.wall else record.start_mono + (moment_wall - record.start_wall)

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def _killed_during(self, record: Record) -> bool:
        return record.end_wall is None or any(
            record.start_wall - 0.1 <= k <= record.end_wall + 2.0 for k in self.kills
        )

    # --- the run

    def check(self, final: Final) -> None:
        """Raise :class:`Violation` listing every broken rule."""
        for error in self.loop_errors:
            self.problem(f"outbox raised {error!r} after a handler call")
        for record in self.records:
            self._check_call(record)
        self._check_windows()
        self._check_pauses()
        self._check_order()
        self._check_final(final)
        if self.problems:
            head = f"{len(self.problems)} contract violation(s):\n  "
            raise Violation(head + "\n  ".join(self.problems[:25]))

    def _check_call(self, record: Record) -> None:
        o = self.options
        start = record.start(self.wall)
        what = (
            f"call {record.index} (group {record.group[:8]}, attempt {record.attempt}, "
            f"ids {record.ids})"
        )
        if o.grouped and len({repr(k) for k in record.keys}) > 1:
            self.problem(f"{what}: group_by, but its events have the keys {record.keys}")
        if o.expires_after is not None:
            slack = 1.0 + (1 / o.rate_limit if o.rate_limit else 0.0) + (o.timeout or 0.0)
            for i in record.ids:
                age = record.start_wall - self.created[i]
                if age > o.expires_after + slack:
                    self.problem(
                        f"{what}: event {i} handed over {age:.2f} s old, past expires_after"
                    )
        for i in record.ids:
            e = self.events.get(i)
            if e is None:
                self.problem(f"{what}: event {i} was never committed")
                continue
            if e.state in ("delivered", "discarded") and not e.uncertain:
                self.problem(f"{what}: event {i} handed over again after it was {e.state}")
            elif e.state == "dead":
                self.problem(f"{what}: event {i} handed over again after it was dead")
            if e.earliest and start < e.earliest - 0.1 and not e.uncertain:
                self.problem(
                    f"{what}: event {i} back {e.earliest - start:.2f} s before its wait was over"
                )
            if e.latest is not None and start > e.latest and not e.uncertain:
                self.problem(f"{what}: event {i} back {start - e.latest:.2f} s after its latest")
            reset = o.ordered and o.bisect  # an ordered half put back unclaimed starts anew
            if record.attempt != e.next_attempt and not (
                (reset and record.attempt == 1)
                or ((o.killed or e.uncertain) and record.attempt > e.next_attempt)
            ):
                self.problem(f"{what}: event {i} should be on attempt {e.next_attempt}")
        self._apply(record, what)

    def _apply(self, record: Record, what: str) -> None:
        o = self.options
        timed_out = _timed_out(record)
        x = expect(
            record.call,
            record.ids,
            ordered=o.ordered,
            timed_out=timed_out,
            offsets=record.offsets(),
        )
        end = record.end(self.wall)
        uncertain = self._killed_during(record)
        if end is None:
            for i in record.ids:  # killed mid-call: nothing is known of this attempt
                if i in self.events:
                    ev = self.events[i]
                    ev.uncertain, ev.earliest, ev.latest = True, 0.0, None
                    ev.next_attempt = record.attempt + 1
            return
        if x.refused_op is not None and record.op_raised != x.refused_op:
            instead = (
                "it was accepted" if record.op_raised is None else f"op {record.op_raised} raised"
            )
            self.problem(
                f"{what}: op {x.refused_op} {record.call.ops[x.refused_op]} must raise one of "
                f"{sorted(x.error_types)}, but {instead}"
            )
        if (
            x.failed_whole
            and not timed_out
            and record.raised is None
            and record.call.kind is not CallKind.SLOW
        ):
            self.problem(f"{what}: should have failed with {sorted(x.error_types)}")
        if x.failed_whole and record.raised is not None:
            head = record.raised.split(":")[0]
            if head not in x.error_types and not timed_out:
                self.problem(
                    f"{what}: raised {record.raised!r}, expected one of {sorted(x.error_types)}"
                )
        given_t = record.start(self.wall)  # the expectation's waits count from the start
        limited = o.rate_limit is not None or o.breaker_failures is not None or o.ordered
        slack_up = DEFERRAL_LAG_SECONDS + 1.0 + (o.timeout or 0.0)
        for i in record.ids:
            e = self.events[i]
            e.uncertain = uncertain
            e.earliest, e.latest = 0.0, None
            if x.failed_whole:
                self._fail(e, record, x.error_line, x.error_prefix, x.error_types, end)
                continue
            if x.deferred_whole is not None:
                self._defer(
                    e,
                    record,
                    x.deferred_whole.seconds,
                    given_t,
                    end,
                    limited,
                    slack_up,
                    "RetryAfter",
                )
                continue
            effect = x.events[i]
            if effect is Effect.DELIVERED:
                e.state, e.finished_at = "delivered", end
            elif effect is Effect.DISCARDED:
                e.state, e.reason, e.finished_at = "discarded", x.reasons[i], end
            elif effect is Effect.FAILED:
                self._fail(e, record, None, x.reasons[i], frozenset(), end)
                if i in x.waits:
                    e.earliest = given_t + x.waits[i]
            else:
                self._defer(e, record, x.waits[i], given_t, end, limited, slack_up, x.reasons[i])

    def _fail(
        self,
        e: _Event,
        record: Record,
        line: str | None,
        prefix: str | None,
        types: frozenset[str],
        end: float,
    ) -> None:
        if record.attempt >= self.options.max_attempts:
            e.state = "dead"
            e.finished_at = end
        e.error_line, e.error_prefix, e.error_types = line, prefix, types
        e.next_attempt = record.attempt + 1

    def _defer(
        self,
        e: _Event,
        record: Record,
        wait: float,
        given: float,
        end: float,
        limited: bool,
        slack_up: float,
        prefix: str,
    ) -> None:
        if e.deferrals >= self.options.max_deferrals:  # spent: a failed attempt, still waiting
            self._fail(e, record, None, prefix, frozenset(), end)
            e.earliest = given + wait
            return
        e.deferrals += 1
        e.next_attempt = record.attempt
        e.earliest = given + wait
        if not limited:
            e.latest = given + wait * (1 + DEFERRAL_JITTER) + slack_up

    # --- across calls

    def _check_windows(self) -> None:
        o = self.options
        if o.rate_limit is None:
            return
        limit = math.floor(o.rate_limit + 1e-9)
        starts: dict[Any, list[float]] = defaultdict(list)
        for r in self.records:
            for key in {repr(k) for k in r.keys} if o.per_key else {None}:
                starts[key].append(r.start(self.wall))
        for key, moments in starts.items():
            most = most_in_any_window(moments, 1.0)
            if most > limit + o.window_slack:
                scope = f"key {key}" if o.per_key else "the handler"
                self.problem(f"{most} calls of {scope} started within one second: limit {limit}")

    def _check_pauses(self) -> None:
        """No call starts while a whole-group RetryAfter's pause or an open breaker holds."""
        o = self.options
        windows: list[tuple[float, float, set[str] | None, str]] = []
        run = 0
        split: set[int] = set()  # events of groups that bisection split: the halves' events
        done = [r for r in self.records if r.end_mono is not None]
        done.sort(key=lambda r: (r.end(self.wall), r.index))
        for r in done:
            timed_out = _timed_out(r)
            x = expect(r.call, r.ids, ordered=o.ordered, timed_out=timed_out, offsets=r.offsets())
            end = r.end(self.wall)
            assert end is not None
            if x.deferred_whole is not None and r.raised and r.raised.startswith("RetryAfter"):
                given = r.start(self.wall)
                keys = {repr(k) for k in r.keys} if o.per_key else None
                spent = any(self.events[i].next_attempt > r.attempt for i in r.ids)
                if not spent:
                    windows.append(
                        (
                            end + 0.1,
                            given + x.deferred_whole.seconds - 0.1,
                            keys,
                            f"call {r.index}'s RetryAfter",
                        )
                    )
            if o.breaker_failures is None or self._killed_during(r):
                run = 0
                continue
            half = o.bisect and bool(split & set(r.ids))
            if o.bisect and x.failed_whole and len(r.ids) > 1:
                split |= set(r.ids)
            downstream = x.failed_whole and not (x.cause == "data" or half)
            run = run + 1 if downstream else 0
            if run >= o.breaker_failures and o.probe_after is not None:
                windows.append(
                    (
                        end + 0.1,
                        end + o.probe_after - 0.1,
                        None,
                        f"the breaker opened by call {r.index}",
                    )
                )
                run = 0
        for r in self.records:
            start = r.start(self.wall)
            keys = {repr(k) for k in r.keys}
            for begin, until, held, why in windows:
                if begin < start < until and (held is None or held & keys):
                    self.problem(
                        f"call {r.index} started {start - begin + 0.1:.2f} s into {why}'s pause"
                    )

    def _check_order(self) -> None:
        """An ordered key's events are handed over as a prefix of what the key has waiting, and
        never after one of its events died."""
        if not self.options.ordered:
            return
        finished: dict[int, float] = {}
        dead: dict[int, float] = {}
        for i, e in self.events.items():
            if e.state in ("delivered", "discarded") and e.finished_at is not None:
                finished[i] = e.finished_at
            if e.state == "dead" and e.finished_at is not None:
                dead[i] = e.finished_at
        by_key: dict[Any, list[int]] = defaultdict(list)
        for i, k in self.keys.items():
            if k is not None:
                by_key[repr(k)].append(i)
        open_calls: dict[str, Record] = {}
        for r in self.records:
            start = r.start(self.wall)
            mine = set(r.ids)
            for k in {repr(x) for x in r.keys if x is not None}:
                top = max(i for i, key in zip(r.ids, r.keys, strict=True) if repr(key) == k)
                for i in by_key[k]:
                    if i in mine or i > top:
                        continue
                    done = finished.get(i)
                    if (done is None or done > start) and not self.events[i].uncertain:
                        self.problem(
                            f"call {r.index}: key {k}'s event {top} handed over before "
                            f"event {i} was done"
                        )
                for i in by_key[k]:
                    if i < min(mine) and i in dead and dead[i] <= start:
                        self.problem(
                            f"call {r.index}: key {k} handed over after its event {i} died"
                        )
                other = open_calls.get(k)
                if (
                    other is not None
                    and other.end(self.wall) is not None
                    and start < (other.end(self.wall) or 0) - 0.05
                    and not self._killed_during(other)
                ):
                    self.problem(f"calls {other.index} and {r.index} hold key {k} at once")
                open_calls[k] = r

    def _check_final(self, final: Final) -> None:
        o = self.options
        now = final.ended_at_wall
        for i, e in self.events.items():
            rows = final.archived.get(i, [])
            statuses = [a.status for a in rows]
            buffered = i in final.buffered
            where = f"event {i}: "
            if len(rows) > 1 or (rows and buffered):
                self.problem(
                    where + f"ended more than once: {statuses}{' and buffered' if buffered else ''}"
                )
                continue
            row = rows[0] if rows else None
            if row is not None and row.status == "expired":
                if o.expires_after is None or row.age < o.expires_after - 0.2:
                    self.problem(
                        where + f"expired {row.age:.2f} s old (expires_after {o.expires_after})"
                    )
                elif e.state in ("delivered", "discarded", "dead") and not e.uncertain:
                    self.problem(where + f"expired, but it was {e.state} before")
                continue
            if e.state == "delivered":
                if (
                    buffered
                    or (row is not None and row.status != "succeeded")
                    or (row and not o.archive)
                ):
                    if not e.uncertain:
                        self.problem(
                            where + f"delivered, but {'buffered' if buffered else statuses}"
                        )
                elif o.archive and row is None and not e.uncertain:
                    self.problem(where + "delivered by an archiving handler, but not archived")
            elif e.state == "discarded":
                wrong = row is None or row.status != "discarded" or row.error != e.reason
                if wrong and not e.uncertain:
                    got = (row.status, row.error) if row else ("buffered" if buffered else "gone")
                    self.problem(where + f"discarded with {e.reason!r}, but ended {got}")
            elif e.state == "dead":
                if row is None or row.status != "dead":
                    if not e.uncertain:
                        self.problem(
                            where
                            + f"dead, but ended {statuses or ('buffered' if buffered else 'gone')}"
                        )
                else:
                    self._check_error(where, e, row.error)
            elif row is not None and row.status == "dead" and e.uncertain:
                self._check_error(where, e, row.error, lenient=True)
            elif row is not None and e.uncertain and row.status in ("succeeded", "discarded"):
                pass
            elif row is not None:
                self.problem(
                    where + f"should still be waiting, but ended {row.status} ({row.error!r})"
                )
            elif not buffered:
                if not (e.uncertain or (o.archive is False and e.next_attempt > 1 and o.killed)):
                    self.problem(where + "lost: neither buffered nor archived, and never delivered")
            elif final.settled:
                key = self.keys.get(i)
                if (
                    not (o.ordered and key is not None and str(key) in final.held_keys)
                    and i not in final.due_in
                ):
                    self.problem(where + "still buffered, in no group, though nothing more was due")
            elif e.earliest > now and i in final.due_in and not o.killed:
                due = final.due_in[i]
                soonest = e.earliest - now
                if due < soonest - 0.5:
                    self.problem(
                        where + f"due in {due:.2f} s, but its wait has {soonest:.2f} s left"
                    )

    def _check_error(
        self, where: str, e: _Event, error: str | None, *, lenient: bool = False
    ) -> None:
        line = (error or "").split("\n", 1)[0]
        if e.error_line is not None and line != e.error_line:
            self.problem(where + f"dead with {line!r}, expected {e.error_line!r}")
        elif e.error_prefix is not None and not line.startswith(e.error_prefix):
            if not lenient:
                self.problem(where + f"dead with {line!r}, expected it to begin {e.error_prefix!r}")
        elif e.error_types and line.split(":")[0] not in e.error_types and not lenient:
            self.problem(where + f"dead with {line!r}, expected one of {sorted(e.error_types)}")


def _timed_out(record: Record) -> bool:
    """Whether a call overran its timeout (an async one is cancelled)."""
    return record.call.kind is CallKind.SLOW or (
        record.raised is not None
        and record.raised.startswith(("HandlerTimeoutError", "CancelledError"))
    )


def most_in_any_window(starts: Sequence[float], window: float) -> int:
    """The most calls that started within any ``window`` seconds (a half-open window)."""
    moments = sorted(starts)
    most = 0
    j = 0
    for i, start in enumerate(moments):
        while moments[j] <= start - window:
            j += 1
        most = max(most, i - j + 1)
    return most
