"""Generated handler behaviour: a case's script, played by a real handler, call by call.

A :class:`Case` is the handler's options, the events written and the script of what each call
does (:class:`tests.model._model.Call`); after the script, every call returns. The handler
builds the real values the script names (an HTTP date, a naive ``datetime``, a ``dict``
reason, an exception whose ``__str__`` raises), passes them to outbox and records what it did
(:class:`tests.model._model.Record`) for the checker. Cases are plain data: they print as
the code that rebuilds them, and travel to ``outbox work`` subprocesses as JSON.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import email.utils
import json
import math
import os
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import outbox
from outbox import Batch, CircuitBreaker, Outbox, RateLimit, RetryAfter, RetryPolicy
from tests.model._model import (
    REASON_TEXT,
    After,
    AfterKind,
    Call,
    CallKind,
    Op,
    OpKind,
    Options,
    Pick,
    ReasonKind,
    Record,
)
from tests.model._tables import ModelEvent

HANDLER = "modelled"
SLOW_OVERRUN_SECONDS = 0.4


@dataclass(frozen=True)
class Setup:
    """The handler's options and the events a case writes."""

    events: int = 4
    keys: int = 0  # events get the key ``id % keys`` (0: every key NULL)
    batch_size: int = 2
    max_attempts: int = 3
    max_deferrals: int = 100
    bisect: bool = False
    ordered: bool = False
    grouped: bool = False
    rate_limit: float | None = None  # calls per second
    per_key: bool = False
    breaker: tuple[int, float] | None = None  # failures, probe_after
    expires_after: float | None = None
    timeout: float | None = None
    is_async: bool = False
    archive: bool = False


@dataclass(frozen=True)
class Case:
    setup: Setup
    calls: tuple[Call, ...]

    def options(self, *, killed: bool = False, window_slack: int = 0) -> Options:
        s = self.setup
        return Options(
            max_attempts=s.max_attempts,
            max_deferrals=s.max_deferrals,
            bisect=s.bisect,
            ordered=s.ordered,
            grouped=s.grouped,
            rate_limit=s.rate_limit,
            per_key=s.per_key,
            breaker_failures=s.breaker[0] if s.breaker else None,
            probe_after=s.breaker[1] if s.breaker else None,
            expires_after=s.expires_after,
            timeout=s.timeout,
            archive=s.archive,
            killed=killed,
            window_slack=window_slack,
        )


# --- values -------------------------------------------------------------------------------


class Boom(Exception):  # noqa: N818 - the model expects its errors by this name
    """A plain failure of the downstream."""


class UnprintableError(Exception):
    """An exception whose ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text for this error")


class UnprintableReason:
    """A reason whose ``__str__`` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no text for this reason")

    __repr__ = __str__


def after_value(after: After) -> tuple[Any, float]:
    """The value an ``after`` names, and the wall time its wait counts from."""
    now = time.time()
    v = after.value
    kind = after.kind
    if kind is AfterKind.SECONDS:
        return (int(v) if v == int(v) and abs(v) < 1e15 else v), now
    if kind is AfterKind.TIMEDELTA:
        return dt.timedelta(seconds=v), now
    if kind is AfterKind.AWARE:
        return dt.datetime.fromtimestamp(now + v, dt.UTC), now
    if kind is AfterKind.NAIVE:
        return dt.datetime.fromtimestamp(now + v, dt.UTC).replace(tzinfo=None), now
    if kind is AfterKind.HTTP_DATE:
        # An HTTP date has whole seconds: the next whole second after now + v, counted from
        # v seconds before it. A date already past asks for nothing: the floor counts from now.
        target = math.ceil(now + v)
        text = email.utils.formatdate(target, usegmt=True)
        return text, (target - v) if target > now else now
    if kind is AfterKind.TEXT_SECONDS:
        return f"{v:g}", now
    if kind is AfterKind.GARBAGE:
        return "soon, maybe", now
    if kind is AfterKind.BOOL:
        return True, now
    return [v], now


def reason_value(kind: ReasonKind | None) -> Any:
    if kind is ReasonKind.STR:
        return REASON_TEXT
    if kind is ReasonKind.DICT:
        return {"code": 422}
    if kind is ReasonKind.INT:
        return 422
    if kind is ReasonKind.BAD_STR:
        return UnprintableReason()
    return None


def events_for(pick: Pick, batch: Batch[Any]) -> Any:
    events = list(batch.events)
    if pick is Pick.FIRST:
        return events[:1]
    if pick is Pick.LAST:
        return events[-1:]
    if pick is Pick.ALL:
        return events
    if pick is Pick.STRANGER:
        return [types.SimpleNamespace(id=max(batch.ids) + 1_000_000)]
    return "not events"


def first_line(error: BaseException) -> str:
    try:
        message = str(error)
    except Exception:
        message = "<exception str() failed>"
    return f"{type(error).__qualname__}: {message}".split("\n", 1)[0]


def _error_of(kind: CallKind) -> BaseException:
    if kind is CallKind.RAISE:
        return Boom("the downstream answered 500")
    if kind is CallKind.BAD_STR:
        return UnprintableError()
    if kind is CallKind.SYSTEM_EXIT:
        return SystemExit("exit from a library")
    if kind is CallKind.DATA_ERROR:
        return getattr(outbox, "DataError")("422 unreadable record")  # noqa: B009 - not on every version
    return getattr(outbox, "DownstreamError")("503 service unavailable")  # noqa: B009


# --- the handler ------------------------------------------------------------------------


class Script:
    """Hands out the case's calls in order (then plain returns) and keeps the records."""

    def __init__(
        self, calls: tuple[Call, ...], sink: Callable[[Record], None] | None = None
    ) -> None:
        self.calls = calls
        self.records: list[Record] = []
        self._sink = sink
        self._lock = threading.Lock()
        self._next = 0

    def begin(self, batch: Batch[Any]) -> Record:
        with self._lock:
            index = self._next
            self._next += 1
        call = self.calls[index] if index < len(self.calls) else Call()
        keys = [getattr(row, "account") for row in batch.rows]  # noqa: B009
        record = Record(
            index=index,
            pid=os.getpid(),
            group=str(batch.group_id),
            attempt=batch.attempt,
            ids=batch.ids,
            keys=keys,
            call=call,
            start_mono=time.monotonic(),
            start_wall=time.time(),
        )
        if self._sink is not None:
            self._sink(record)  # its start, in case the process dies in the call
        return record

    def end(self, record: Record, error: BaseException | None) -> None:
        record.end_mono, record.end_wall = time.monotonic(), time.time()
        if error is not None:
            record.raised = first_line(error)
        with self._lock:
            self.records.append(record)
        if self._sink is not None:
            self._sink(record)


def _play(batch: Batch[Any], record: Record) -> float | None:
    """Everything a call does but sleep: returns the seconds to sleep for a SLOW call."""
    call = record.call
    if call.kind is CallKind.SLOW:
        return None
    if call.kind is CallKind.RETRY_AFTER:
        assert call.after is not None
        value, given = after_value(call.after)
        record.given = [given]
        raise RetryAfter(value, reason=reason_value(call.reason))
    if call.kind is not CallKind.RETURN:
        raise _error_of(call.kind)
    record.given = [None] * len(call.ops)
    for n, op in enumerate(call.ops):
        try:
            events = events_for(op.pick, batch)
            reason = reason_value(op.reason)
            if op.kind is OpKind.DISCARD:
                batch.discard(events, reason)
            elif op.after is None:
                batch.retry(events, reason)
            else:
                value, record.given[n] = after_value(op.after)
                batch.retry(events, reason, after=value)
        except BaseException:
            record.op_raised = n
            raise
    return 0.0


def make_handler(script: Script, setup: Setup) -> Callable[[Batch[Any]], Any]:
    """The handler that plays ``script``: sync or async as ``setup`` says."""
    overrun = (setup.timeout or 0.0) + SLOW_OVERRUN_SECONDS

    def modelled(batch: Batch[ModelEvent]) -> None:
        record = script.begin(batch)
        error: BaseException | None = None
        try:
            if _play(batch, record) is None:
                time.sleep(overrun)
        except BaseException as raised:
            error = raised
            raise
        finally:
            script.end(record, error)

    async def modelled_async(batch: Batch[ModelEvent]) -> None:
        record = script.begin(batch)
        error: BaseException | None = None
        try:
            if _play(batch, record) is None:
                await asyncio.sleep(overrun)
        except BaseException as raised:
            error = raised
            raise
        finally:
            script.end(record, error)

    return modelled_async if setup.is_async else modelled


def register(app: Outbox, case: Case, script: Script) -> None:
    """Register the case's handler on ``app``."""
    s = case.setup
    handler = make_handler(script, s)
    app.handler(
        ModelEvent,
        name=HANDLER,
        batch_size=s.batch_size,
        retry=RetryPolicy(
            max_attempts=s.max_attempts,
            scale=0.0,
            base_delay=0.05,
            jitter=0.0,
            max_deferrals=s.max_deferrals,
        ),
        archive=s.archive,
        bisect=s.bisect,
        ordering_key="account" if s.ordered else None,
        group_by="account" if s.grouped else None,
        rate_limit=None if s.rate_limit is None else RateLimit(calls_per_second=s.rate_limit),
        rate_limit_key="account" if s.per_key else None,
        circuit_breaker=None
        if s.breaker is None
        else CircuitBreaker(
            failures=s.breaker[0], probe_after=s.breaker[1], max_probe_after=s.breaker[1] * 2
        ),
        expires_after=s.expires_after,
        timeout=s.timeout,
    )(handler)


# --- as JSON, for subprocesses ---------------------------------------------------------------


def case_to_json(case: Case) -> str:
    return json.dumps(dataclasses.asdict(case))


def case_from_json(text: str) -> Case:
    data = json.loads(text)
    setup = data["setup"]
    if setup["breaker"] is not None:
        setup["breaker"] = tuple(setup["breaker"])
    return Case(Setup(**setup), tuple(_call(c) for c in data["calls"]))


def _after(data: dict[str, Any] | None) -> After | None:
    return None if data is None else After(AfterKind(data["kind"]), data["value"])


def _call(data: dict[str, Any]) -> Call:
    ops = tuple(
        Op(OpKind(o["kind"]), Pick(o["pick"]), ReasonKind(o["reason"]), _after(o["after"]))
        for o in data["ops"]
    )
    reason = None if data["reason"] is None else ReasonKind(data["reason"])
    return Call(CallKind(data["kind"]), ops, _after(data["after"]), reason)


def record_to_json(record: Record) -> str:
    data = dataclasses.asdict(record)
    return json.dumps(data, default=str)


def record_from_json(text: str) -> Record:
    data = json.loads(text)
    data["call"] = _call(data["call"])
    return Record(**data)
