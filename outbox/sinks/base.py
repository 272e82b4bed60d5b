"""What every sink shares: the one seam a sink implements (``send``), and the mapping every sink
would otherwise repeat from what the downstream answered to outbox's outcomes.

A sink's ``send`` hands the group to the downstream and returns the events it did not take, as
:class:`Rejection` values: to retry later (not acknowledged, a per-record 5xx or 429) or to
discard (refused for good, with the downstream's reason). What refuses the whole group it
raises: :class:`outbox.RetryAfter` (the downstream said when to come back),
:class:`outbox.DataError` (it refused what it was sent) or :class:`outbox.DownstreamError` (it
failed: unreachable, a timeout, a 5xx). :func:`settle` turns the rejections into
``batch.retry`` and ``batch.discard``, and a group of which nothing was taken into a failed
attempt, so that an outage reaches the circuit breaker rather than retrying event by event.

A sink depends only on outbox's public API: a new one is a module with a class that
implements ``connect``, ``send``, ``close`` and ``outbox_guarantee`` (see docs/design.md).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import decimal
import enum
import json
import os
import threading
import uuid
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeAlias, TypeVar

from sqlalchemy import inspect as sa_inspect
from sqlalchemy.orm.exc import UnmappedColumnError

from outbox.app import Handler, Outbox
from outbox.batch import Batch
from outbox.buffer import BufferMixin
from outbox.exceptions import (
    ConfigurationError,
    DataError,
    DownstreamError,
    DownstreamUnavailableError,
    OutboxError,
)
from outbox.sinks._secrets import MASK as MASK
from outbox.sinks._secrets import Secrets as Secrets
from outbox.sinks._secrets import describe_error as describe_error

EventT = TypeVar("EventT", bound=BufferMixin)
P = ParamSpec("P")
T = TypeVar("T")

PerEvent: TypeAlias = T | Callable[[Any], T]
"""A sink option given once for every event, or a function of the event (its columns)."""


def per_event(option: PerEvent[T], event: Any) -> T:
    """The option's value for ``event``: the value, or what the function returns for it."""
    if callable(option):
        return option(event)
    return option


# Columns that are outbox's bookkeeping, not the event's: a message does not carry them.
_BOOKKEEPING = frozenset({"group_id"})


def event_values(event: Any) -> dict[str, Any]:
    """An event's columns, by attribute name, but ``group_id`` (which changes between
    attempts, so that the same event would not be the same message)."""
    return {key: getattr(event, key) for key in _value_keys(type(event))}


# Read once per model: inspecting the mapper for each event of a group of 1,000 cost as much
# as encoding it. (Computed twice by two threads at worst, to the same value.)
_VALUE_KEYS: dict[type[Any], tuple[str, ...]] = {}
_ROW_READERS: dict[type[Any], Callable[[Sequence[Any]], dict[str, Any]] | None] = {}


def _value_keys(model: type[Any]) -> tuple[str, ...]:
    keys = _VALUE_KEYS.get(model)
    if keys is None:
        mapper = sa_inspect(model)
        keys = tuple(a.key for a in mapper.column_attrs if a.key not in _BOOKKEEPING)
        _VALUE_KEYS[model] = keys
    return keys


def row_values(model: type[Any]) -> Callable[[Sequence[Any]], dict[str, Any]] | None:
    """What :func:`event_values` reads from an event, read from its row instead (a batch's
    ``rows``: every column of the model's table, in table order), which spares building the
    event; None when a value of the model is not a column of its table."""
    if model not in _ROW_READERS:
        _ROW_READERS[model] = _row_reader(model)
    return _ROW_READERS[model]


def _row_reader(model: type[Any]) -> Callable[[Sequence[Any]], dict[str, Any]] | None:
    mapper = sa_inspect(model)
    position: dict[str, int] = {}
    for index, column in enumerate(mapper.local_table.columns):
        try:
            position[mapper.get_property_by_column(column).key] = index
        except UnmappedColumnError:
            continue
    keys = _value_keys(model)
    if not all(key in position for key in keys):
        return None
    pairs = tuple((key, position[key]) for key in keys)

    def read(row: Sequence[Any]) -> dict[str, Any]:
        return {key: row[index] for key, index in pairs}

    return read


def ordering_key(handler: Handler[Any]) -> Callable[[Any], str | None] | None:
    """Reads the value of ``handler``'s ``ordering_key`` column from an event, as text (the
    message key a sink gives each message by default, so that a consumer can keep per-key
    order too); None when the handler has no ordering key."""
    if handler.ordering_key is None:
        return None
    column = handler.table.c[handler.ordering_key]
    attribute = sa_inspect(handler.model).get_property_by_column(column).key

    def read(event: Any) -> str | None:
        value = getattr(event, attribute)
        return None if value is None else str(value)

    return read


Message: TypeAlias = tuple[str, str | None, bytes]
"""A default message: its id (:func:`message_id`), its key (the ordering key's value as text,
or None) and its payload (:func:`json_payload`)."""


@dataclass(frozen=True, slots=True)
class RowPath:
    """How the default message of an event is read from its row (a batch's ``rows``), which
    spares building the event: about 40% of the CPU a group's messages cost."""

    table: str
    values: Callable[[Sequence[Any]], dict[str, Any]]
    id_at: int
    key_at: int | None

    def fields(self, row: Sequence[Any]) -> tuple[str, str | None, bytes]:
        """The message id (as :func:`message_id` writes it), the key (as
        :func:`ordering_key` reads it) and the payload (as :func:`json_payload` writes it) of
        a row."""
        key = None if self.key_at is None else row[self.key_at]
        return (
            f"{self.table}-{row[self.id_at]}",
            None if key is None else str(key),
            payload_bytes(self.values(row)),
        )

    def messages(self, batch: Batch[Any]) -> list[Message] | None:
        """:meth:`fields` of each row of ``batch``, in its order (the ``i``-th message is
        ``batch.events[i]``'s); None for a batch made of events rather than rows (read those
        from the events)."""
        rows = batch.rows
        if not rows or not hasattr(rows[0], "_fields"):
            return None
        return [self.fields(row) for row in rows]


def row_path(handler: Handler[Any]) -> RowPath | None:
    """How ``handler``'s events' default messages (:func:`json_payload`, :func:`message_id`,
    the :func:`ordering_key` as key) are read from their rows; None when a value of its model
    is not a column of its table. A sink takes it only where its options are the defaults: a
    function of the user's is given the event (:func:`row_messages` checks them)."""
    read = row_values(handler.model)
    if read is None:
        return None
    columns = list(handler.table.columns)
    key = None if handler.ordering_key is None else handler.table.c[handler.ordering_key]
    return RowPath(
        table=handler.table.name,
        values=read,
        id_at=columns.index(handler.table.c.id),
        key_at=None if key is None else columns.index(key),
    )


def json_default(value: Any) -> Any:
    """How the default payload writes what JSON has no type for: times in ISO 8601, UUIDs and
    decimals as text (a decimal keeps its digits), bytes in base64, enums by value."""
    # Called for a value of most events (a time, an amount): the common types are looked up
    # by their class first, a third of what the isinstance checks below cost (for a decimal,
    # 0.3 against 1 µs).
    write = _JSON_WRITERS.get(type(value))
    if write is not None:
        return write(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (uuid.UUID, decimal.Decimal)):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"a {type(value).__qualname__} value cannot be written as JSON")


_JSON_WRITERS: dict[type[Any], Callable[[Any], str]] = {
    dt.datetime: dt.datetime.isoformat,
    dt.date: dt.date.isoformat,
    dt.time: dt.time.isoformat,
    uuid.UUID: str,
    decimal.Decimal: str,
}


# One encoder for every payload: json.dumps with options builds a new one per call.
_JSON = json.JSONEncoder(default=json_default, separators=(",", ":"))


def json_payload(event: Any) -> bytes:
    """The default message body: the event's columns (:func:`event_values`) as a JSON
    object, UTF-8."""
    return _JSON.encode(event_values(event)).encode()


def message_id(event: Any) -> str:
    """The default message id: the buffer table's name and the event's id (``orders-42``),
    the same on every attempt, so that a consumer (or a broker's window) drops a repeat."""
    return f"{type(event).__table__.name}-{event.id}"


def payload_bytes(value: bytes | str | Any) -> bytes:
    """A payload function's result as bytes: bytes as they are, text in UTF-8, anything else
    as JSON."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return _JSON.encode(value).encode()


_DEFAULT_MESSAGE_ID = message_id


def row_messages(
    handler: Handler[Any],
    *,
    payload: Callable[[Any], Any],
    message_id: Callable[[Any], str],
    key: Callable[[Any], str | None] | None,
) -> RowPath | None:
    """How a sink reads the default messages of ``handler``'s groups from their rows, given
    the sink's options; None when it cannot: a ``payload`` or ``message_id`` other than the
    defaults, or a ``key`` given (a function of the user's is given the event), or a model
    with a value that is not a column of its table (see :func:`row_path`). ``key`` None
    means the handler's ordering key (or no key)."""
    if payload is not json_payload or message_id is not _DEFAULT_MESSAGE_ID or key is not None:
        return None
    return row_path(handler)


@dataclass(frozen=True, slots=True)
class Rejection(Generic[EventT]):
    """An event the downstream did not take, and what becomes of it.

    ``retry``: True when it may be taken later (not acknowledged, a per-record 5xx or 429): it
    is retried in a group of its own, with the handler's backoff; False when it never will be
    (a per-record 4xx): it is discarded, archived with ``reason``. ``after``: seconds the
    downstream asked to wait for it (a per-record 429): the retry is a deferral.
    """

    event: EventT
    reason: str
    retry: bool = True
    after: float | None = None


def settle(batch: Batch[EventT], rejections: Iterable[Rejection[EventT]], downstream: str) -> None:
    """Hand what the downstream did not take back to outbox.

    Rejected events are retried (deferred, with ``after``) or discarded, grouped by reason.
    When the downstream took none of the group and refused none of it for good or for a while
    (every event to retry, none with ``after``: nothing was acknowledged), the group fails as
    a whole instead, with :class:`outbox.DownstreamError`: an outage then reaches the circuit
    breaker and the group's backoff, rather than being retried event by event.
    """
    rejected = list(rejections)
    if not rejected:
        return
    plain = {id(r.event) for r in rejected if r.retry and r.after is None}
    if len(batch) > 0 and len(plain) >= len(batch):
        first = next(r.reason for r in rejected if r.retry and r.after is None)
        raise DownstreamError(f"{downstream} took none of the {len(batch)} events: {first}")
    retry: dict[tuple[str, float | None], list[EventT]] = defaultdict(list)
    discard: dict[str, list[EventT]] = defaultdict(list)
    seen: set[int] = set()
    for r in rejected:
        if id(r.event) in seen:
            continue  # the first word on an event is the one taken
        seen.add(id(r.event))
        if r.retry:
            retry[(r.reason, r.after)].append(r.event)
        else:
            discard[r.reason].append(r.event)
    for (reason, after), events in retry.items():
        batch.retry(events, reason, after=after)
    for reason, events in discard.items():
        batch.discard(events, reason)


def unavailable(
    downstream: str, error: BaseException, secrets: Secrets
) -> DownstreamUnavailableError:
    """The error a sink's ``connect`` raises for a downstream it cannot reach or that refuses
    it: one line, naming the downstream and what the client said, secrets masked."""
    return DownstreamUnavailableError(f"{downstream}: {describe_error(error, secrets)}")


def downstream_failed(downstream: str, error: BaseException, secrets: Secrets) -> DownstreamError:
    """The error a sink's ``send`` raises when the downstream failed the whole group (the
    connection lost, a timeout): one line, naming the downstream and what the client said,
    secrets masked."""
    return DownstreamError(f"{downstream}: {describe_error(error, secrets)}")


def not_a_message(event_id: object, error: BaseException, secrets: Secrets) -> DataError:
    """The error a sink raises for an event it cannot make a message of (a function of the
    user's raised, a value has no JSON form): the event's data, not the downstream, is at
    fault."""
    return DataError(f"event {event_id} cannot be made a message: {describe_error(error, secrets)}")


def check_per_event(name: str, option: object) -> None:
    """Refuse, naming it, a :data:`PerEvent` text option that is neither a string nor a
    function of the event."""
    if not (isinstance(option, str) or callable(option)):
        raise ConfigurationError(
            f"{name}: expected a string or a function of the event, got {type(option).__name__}"
        )


def _for_handler(error: OutboxError, handler: Handler[Any]) -> OutboxError:
    """``error`` again, its message starting with the handler it stops."""
    named = type(error)(f"handler {handler.name!r}: {error}")
    named.__cause__ = error.__cause__
    return named


def resend_horizon(app: Outbox, handler: Handler[Any]) -> float:
    """The longest time, in seconds, between two sends of one event by ``handler``.

    A message sent whose acknowledgement was lost (a worker killed, a connection cut) is sent
    again by a later attempt: after the longest wait between two attempts (the last backoff,
    jitter included, or the circuit breaker's longest pause when longer), and after the lease
    of the attempt that was cut off, and the handler's ``timeout`` it may have run for. A
    broker that drops a re-sent message within a window catches every re-send when the window
    is at least this long.
    """
    policy = handler.retry
    backoff = 0.0
    if policy.max_attempts > 1:
        backoff = policy.base(policy.max_attempts - 1) * (1 + policy.jitter)
    if handler.circuit_breaker is not None:
        backoff = max(backoff, handler.circuit_breaker.max_probe_after)
    return backoff + app.settings.lease_seconds + (handler.timeout or 0.0)


def check_dedup_window(
    app: Outbox, handler: Handler[Any], window: float, where: str, lower: str
) -> None:
    """Refuse, in one line, a handler whose events may be re-sent after ``window`` seconds,
    the time ``where`` drops a re-sent message within; ``lower`` says how to lower the
    horizon."""
    horizon = resend_horizon(app, handler)
    if horizon > window:
        raise ConfigurationError(
            f"handler {handler.name!r}: {where} drops a re-sent message within {window:g} s, but "
            f"an event may be re-sent up to {horizon:.0f} s after it was first sent (the "
            f"longest retry wait, the lease and the timeout): raise the window to at least "
            f"{horizon:.0f} s, or {lower}"
        )


class _Described(ABC):
    """What every sink, sync or async, says of itself: where it sends and what it
    guarantees (the sync/async split starts below it: the methods that do I/O)."""

    @property
    @abstractmethod
    def downstream(self) -> str:
        """Where the sink sends, in words, with no secret (``RabbitMQ at amqp://host:5672/``)."""

    @property
    @abstractmethod
    def outbox_guarantee(self) -> str:
        """The delivery guarantee, in words (``outbox status`` shows it)."""

    @property
    def secrets(self) -> Secrets:
        """What the sink masks out of every error it raises (none by default): a sink that
        holds a password or a token returns them here."""
        return _NO_SECRETS


_NO_SECRETS = Secrets()


class AsyncSink(_Described):
    """A ready-made async batch handler: register it (``app.handler(Model, ...)(sink)``), or
    ``await sink(batch)`` inside a handler of your own.

    It connects on first use; registered as a handler, it connects and checks its downstream
    when the worker starts (``outbox_start``), so that a wrong configuration stops the worker
    with one line instead of failing every group. ``sink.blocking()`` is its sync face.
    """

    def __init__(self) -> None:
        self._connected_in: int | None = None
        self._connecting: asyncio.Lock | None = None

    @abstractmethod
    async def connect(self) -> None:
        """Open the client and check the downstream's configuration (raise
        :class:`outbox.DownstreamUnavailableError` or :class:`outbox.ConfigurationError`)."""

    @abstractmethod
    async def send(self, batch: Batch[Any]) -> Sequence[Rejection[Any]]:
        """Send the group; return the events the downstream did not take."""

    @abstractmethod
    async def close(self) -> None:
        """Close the client."""

    async def check(self, app: Outbox, handler: Handler[Any]) -> None:
        """What a sink checks against the handler it is registered as (a dedup window against
        the retry schedule); nothing by default."""

    async def __call__(self, batch: Batch[Any]) -> None:
        """Send ``batch`` and settle what was not taken (see :func:`settle`); no secret
        shows in what it raises."""
        with self.secrets.masking():
            await self._connected()
            settle(batch, await self.send(batch), self.downstream)

    async def outbox_start(self, app: Outbox, handler: Handler[Any]) -> None:
        """Connect and check, when a worker starts (see :mod:`outbox.lifecycle`)."""
        with self.secrets.masking():
            try:
                await self._connected()
            except (DownstreamUnavailableError, ConfigurationError) as error:
                raise _for_handler(error, handler) from None
            await self.check(app, handler)

    async def outbox_stop(self) -> None:
        """Close the client, when the worker stops."""
        if self._connected_in == os.getpid():
            self._connected_in = None
            await self.close()

    async def _connected(self) -> None:
        # A forked child has its parent's object but not its connections or their loop.
        if self._connected_in == os.getpid():
            return
        if self._connecting is None or self._connected_in is not None:
            self._connecting = asyncio.Lock()
            self._connected_in = None
        async with self._connecting:
            if self._connected_in != os.getpid():
                await self.connect()
                self._connected_in = os.getpid()

    def blocking(self) -> BlockingSink:
        """This sink's sync face: a sync handler, or ``sink(batch)`` inside a sync one."""
        return BlockingSink(self)


class Sink(_Described):
    """A ready-made sync batch handler: register it (``app.handler(Model, ...)(sink)``), or call
    ``sink(batch)`` inside a handler of your own. See :class:`AsyncSink`."""

    def __init__(self) -> None:
        self._connected_in: int | None = None
        self._lock = threading.Lock()

    @abstractmethod
    def connect(self) -> None:
        """Open the client and check the downstream's configuration."""

    @abstractmethod
    def send(self, batch: Batch[Any]) -> Sequence[Rejection[Any]]:
        """Send the group; return the events the downstream did not take."""

    @abstractmethod
    def close(self) -> None:
        """Close the client."""

    def check(self, app: Outbox, handler: Handler[Any]) -> None:
        """What a sink checks against the handler it is registered as; nothing by default."""

    def __call__(self, batch: Batch[Any]) -> None:
        """Send ``batch`` and settle what was not taken (see :func:`settle`); no secret
        shows in what it raises."""
        with self.secrets.masking():
            self._connected()
            settle(batch, self.send(batch), self.downstream)

    def outbox_start(self, app: Outbox, handler: Handler[Any]) -> None:
        """Connect and check, when a worker starts (see :mod:`outbox.lifecycle`)."""
        with self.secrets.masking():
            try:
                self._connected()
            except (DownstreamUnavailableError, ConfigurationError) as error:
                raise _for_handler(error, handler) from None
            self.check(app, handler)

    def outbox_stop(self) -> None:
        """Close the client, when the worker stops."""
        with self._lock:
            if self._connected_in == os.getpid():
                self._connected_in = None
                self.close()

    def _connected(self) -> None:
        if self._connected_in == os.getpid():
            return
        with self._lock:
            if self._connected_in != os.getpid():
                self.connect()
                self._connected_in = os.getpid()


class BlockingSink(Sink):
    """The sync face of an :class:`AsyncSink` (``AsyncSink.blocking()``): each call runs the
    async sink on an event loop of its own, in a daemon thread started on first use (the async
    sink's connections live on that loop)."""

    def __init__(self, sink: AsyncSink) -> None:
        super().__init__()
        self.sink = sink
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_in: int | None = None
        self._loop_lock = threading.Lock()

    @property
    def downstream(self) -> str:
        """The async sink's downstream."""
        return self.sink.downstream

    @property
    def outbox_guarantee(self) -> str:
        """The async sink's guarantee."""
        return self.sink.outbox_guarantee

    @property
    def secrets(self) -> Secrets:
        """The async sink's secrets."""
        return self.sink.secrets

    def connect(self) -> None:
        """Connect the async sink, on this sink's loop."""
        self._run(self.sink._connected())

    def send(self, batch: Batch[Any]) -> Sequence[Rejection[Any]]:
        """The async sink's ``send``, on this sink's loop."""
        return self._run(self.sink.send(batch))

    def close(self) -> None:
        """Close the async sink's client."""
        self._run(self.sink.outbox_stop())

    def check(self, app: Outbox, handler: Handler[Any]) -> None:
        """The async sink's checks."""
        self._run(self.sink.check(app, handler))

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        loop = self._running_loop()
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, loop)
        return future.result()

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._loop_lock:
            if self._loop is None or self._loop_in != os.getpid():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=_run_forever, args=(loop,), name="outbox-sink-loop", daemon=True
                )
                thread.start()
                self._loop, self._loop_in = loop, os.getpid()
            return self._loop


def _run_forever(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    loop.run_forever()


def blocking_sink(cls: Callable[P, AsyncSink]) -> Callable[P, BlockingSink]:
    """The sync class of an async sink class: same arguments, a :class:`BlockingSink`."""

    def make(*args: P.args, **kwargs: P.kwargs) -> BlockingSink:
        return cls(*args, **kwargs).blocking()

    make.__name__ = make.__qualname__ = cls.__name__.removeprefix("Async")
    make.__doc__ = f"The sync face of :class:`{cls.__name__}`: the same arguments."
    return make
