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
What sinks share besides the seam has a module each: :mod:`outbox.sinks.encoding` (an event
to a message), :mod:`outbox.sinks.options` (options given per event),
:mod:`outbox.sinks.secrets` (masking), :mod:`outbox.sinks.errors` (what a sink raises) and
:mod:`outbox.sinks.dedup_window` (a broker's de-duplication window against the retry
schedule).
"""

from __future__ import annotations

import asyncio
import os
import threading
from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Callable, Coroutine, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, TypeVar

from outbox.app import Handler, Outbox
from outbox.batch import Batch
from outbox.buffer import BufferMixin
from outbox.exceptions import (
    ConfigurationError,
    DownstreamError,
    DownstreamUnavailableError,
    OutboxError,
)
from outbox.sinks.secrets import Secrets

EventT = TypeVar("EventT", bound=BufferMixin)
P = ParamSpec("P")
T = TypeVar("T")


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


def _for_handler(error: OutboxError, handler: Handler[Any]) -> OutboxError:
    """``error`` again, its message starting with the handler it stops."""
    named = type(error)(f"handler {handler.name!r}: {error}")
    named.__cause__ = error.__cause__
    return named


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
