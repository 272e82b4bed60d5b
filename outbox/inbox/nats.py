"""A ready consumer of a NATS JetStream stream into an inbox, through a durable pull consumer
(nats-py, ``pip install 'sqlalchemy-outbox[nats]'``): each batch's new messages have their
effect, and their ``Nats-Msg-Id`` is recorded, in one transaction; the batch is acknowledged
after the commit.

    from outbox.inbox.nats import JetStreamConsumer

    orders_in = app.inbox("orders-in", sender="orders")

    async def apply(session: AsyncSession, messages: list[Message]) -> None:
        session.add_all(Order(**m.json()) for m in messages)

    consumer = JetStreamConsumer(async_engine, orders_in, apply, stream="ORDERS",
                                 durable="billing")
    asyncio.run(consumer.run())

The consumer is async, because nats-py is. Its effect follows the database it is given: with
an ``AsyncEngine`` it is an ``async def`` awaited with an ``AsyncSession``; with the Outbox
application or a sync ``Engine`` it is a plain function called with a ``Session`` in a worker
thread (one batch at a time), so that a sync application (or a database with no async driver)
needs no async code but the ``run()``. The other kind is refused where it is given. See
docs/inbox.md, "Ready consumers".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import nats
import nats.aio.client
import nats.aio.msg
import nats.errors
import nats.js
import nats.js.api
import nats.js.errors
from sqlalchemy import Engine

from outbox._core import log as _log
from outbox.app import Outbox
from outbox.exceptions import ConfigurationError
from outbox.inbox import Inbox, prune, prune_async
from outbox.inbox._consumer import (
    BATCH_SIZE,
    CONTENTION_RETRIES,
    FAILURE_PAUSE_SECONDS,
    MAX_DELIVERIES,
    PRUNE_CHUNKS,
    PRUNE_INTERVAL_SECONDS,
    AsyncEffect,
    Backoff,
    ConsumeResult,
    ContentionError,
    DatabaseDownError,
    Effect,
    Message,
    Outcome,
    Pruning,
    Tally,
    Verdict,
    apply,
    apply_async,
    first_line,
    refuse,
    report,
)
from outbox.inbox._settings import check_effect, check_settings, sync_engine

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["ConsumeResult", "JetStreamConsumer", "Message"]

DEFAULT_URL = "nats://127.0.0.1:4222"
MSG_ID_HEADER = "Nats-Msg-Id"
"""The header that holds the message id (the JetStream sink's, and JetStream's own)."""
ACK_WAIT_SECONDS = 30.0
"""How long JetStream waits for a delivered message's ack before it delivers it again (the
durable consumer's ``ack_wait``, when this consumer creates it): from a consumer that went
away. A batch held while the database is down is kept from it by ``in_progress``; keep it
above the time a batch takes to apply, or JetStream delivers the batch again meanwhile (to
another consumer: the inbox makes it a repeat, but the work is done twice)."""
CONNECT_TIMEOUT_SECONDS = 10.0
_FETCH_SECONDS = 0.5
"""How long one pull request waits for messages: a stop is seen within it."""
_NO_ID = "the message has no id"


class JetStreamConsumer:
    """Consumes ``stream`` through the durable pull consumer ``durable`` into ``inbox``: the
    effect of each batch's new messages and their ids in one transaction, then the acks.

    ``database``: an ``AsyncEngine`` (the effect is ``async def effect(session:
    AsyncSession, messages)``), or the Outbox application or an ``Engine`` (the effect is
    ``def effect(session: Session, messages)``, run in a worker thread). The effect is called
    in the batch's transaction with the messages whose ``Nats-Msg-Id`` the inbox did not hold
    (a :class:`Message` each: ``id``, ``body``, ``headers``, ``deliveries``); it must not
    commit. ``servers``: the NATS URL(s); ``connect_options``: more arguments of
    ``nats.connect`` (credentials, TLS). ``stream``: the stream; ``durable``: the consumer's
    durable name, created when missing (on ``subject``, a filter; the whole stream by default,
    with ``ack_wait``), and bound as it is when it exists.

    On failure: an effect that raises rolls the transaction back; the batch's messages are then
    applied one by one, each in its own transaction, so that only the failing one is ``nak``-ed,
    with ``failure_pause`` seconds of delay (JetStream holds it that long). At its
    ``max_deliveries``-th delivery (JetStream's ``num_delivered``) it is ``term``-ed: JetStream
    delivers it no more, publishes a ``$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED`` advisory
    with its stream sequence, and a stream of limits retention keeps it for an operator to read
    (a work-queue or interest stream removes it, as it would an acknowledged one); an error line
    names its id and error. A message without a ``Nats-Msg-Id`` is ``term``-ed the same way at
    once. While the database cannot be reached, the batch is held (kept from redelivery by
    ``in_progress``) and tried again after a growing pause; a lost connection is opened again
    after one (what was not acknowledged comes again after ``ack_wait``, and the inbox makes
    each committed one a repeat).
    """

    def __init__(
        self,
        database: Outbox | Engine | AsyncEngine,
        inbox: Inbox,
        effect: Effect | AsyncEffect,
        *,
        stream: str,
        durable: str,
        subject: str | None = None,
        servers: str | list[str] = DEFAULT_URL,
        connect_options: Mapping[str, Any] | None = None,
        ack_wait: float = ACK_WAIT_SECONDS,
        batch_size: int = BATCH_SIZE,
        max_deliveries: int = MAX_DELIVERIES,
        failure_pause: float = FAILURE_PAUSE_SECONDS,
        prune_interval: float = PRUNE_INTERVAL_SECONDS,
        prune_chunks: int = PRUNE_CHUNKS,
    ) -> None:
        for what, value in (("stream", stream), ("durable", durable)):
            if not isinstance(value, str) or not value:
                raise ConfigurationError(f"{what}: expected a name, got {value!r}")
        if not isinstance(inbox, Inbox):
            raise TypeError(
                f"JetStream consumer of {stream!r}: inbox must be an outbox.inbox.Inbox "
                f"(app.inbox(...)), got {type(inbox).__name__}"
            )
        self.name = f"inbox {inbox.name!r} from JetStream stream {stream!r}"
        check_settings(
            self.name,
            ack_wait=ack_wait,
            batch_size=batch_size,
            max_deliveries=max_deliveries,
            failure_pause=failure_pause,
            prune_interval=prune_interval,
            prune_chunks=prune_chunks,
        )
        self._async_engine: AsyncEngine | None = None
        self._engine: Engine | None = None
        if _is_async_engine(database):
            self._async_engine = database  # type: ignore[assignment]
        else:
            self._engine = sync_engine(database, self.name)  # type: ignore[arg-type]
        check_effect(effect, want_async=self._async_engine is not None, consumer=self.name)
        self.inbox = inbox
        self.effect = effect
        self.stream = stream
        self.durable = durable
        self.subject = subject
        self.servers = _servers(servers)
        self.connect_options = dict(connect_options or {})
        self.ack_wait = float(ack_wait)
        self.batch_size = int(batch_size)
        self.failure_pause = float(failure_pause)
        self.prune_chunks = int(prune_chunks)
        self._tally = Tally(int(max_deliveries))
        self._pruning = Pruning(prune_interval)
        self._pruned_once = False
        self._stopping = threading.Event()
        self._database_down = False
        # Kept across consume() calls, so that a server that stays away is tried ever more
        # slowly, and said once.
        self._broker_backoff = Backoff()
        self._client: nats.aio.client.Client | None = None
        self._subscription: nats.js.JetStreamContext.PullSubscription | None = None
        self._log = _log.get_logger(__name__)

    # --- the consumer's API ------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the consumer to stop once the batch in hand is settled: :meth:`run` and
        :meth:`consume` return. Safe from a signal handler and from any thread."""
        self._stopping.set()

    async def close(self) -> None:
        """Close the connection (what was taken and not acknowledged comes again after
        ``ack_wait``)."""
        client, self._client, self._subscription = self._client, None, None
        if client is not None and not client.is_closed:
            with contextlib.suppress(Exception):  # a lost connection: nothing to give back
                await client.close()

    async def __aenter__(self) -> JetStreamConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def consume(
        self, *, max_messages: int | None = None, timeout: float = 1.0
    ) -> ConsumeResult:
        """Take and apply messages until ``max_messages`` were received, no message came for
        ``timeout`` seconds, or :meth:`stop` was called; what it did. For tests and cron jobs;
        :meth:`run` is the long-running loop. A pruning pass ends the first call, then one
        call every ``prune_interval`` seconds."""
        return await self._consume(max_messages, timeout, hold=timeout)

    async def run(self, *, handle_signals: bool = True) -> ConsumeResult:
        """Consume until :meth:`stop` is called (or, with ``handle_signals`` in the main
        thread, SIGTERM or SIGINT arrives); the run's counts. The connection is closed at the
        end."""
        total = ConsumeResult()
        self._log.info(
            _log.INBOX_CONSUMER_STARTED,
            consumer=self.name,
            inbox=self.inbox.name,
            source=self.stream,
        )
        async with self._signals(handle_signals):
            try:
                while not self._stopping.is_set():
                    total += await self._consume(None, 1.0, hold=float("inf"))
            finally:
                await self.close()
        self._log.info(
            _log.INBOX_CONSUMER_STOPPED,
            consumer=self.name,
            received=total.received,
            new=total.new,
            repeats=total.repeats,
            failed=total.failed,
            dead_lettered=total.dead_lettered,
        )
        return total

    # --- the steps ---------------------------------------------------------------------------

    async def _consume(
        self, max_messages: int | None, timeout: float, hold: float
    ) -> ConsumeResult:
        result = ConsumeResult()
        idle_since = time.monotonic()
        while not self._stopping.is_set():
            if max_messages is not None and result.received >= max_messages:
                break
            left = idle_since + timeout - time.monotonic()
            if left <= 0:
                break
            limit = self.batch_size
            if max_messages is not None:
                limit = min(limit, max_messages - result.received)
            try:
                taken = await self._take(limit, left)
            except _BROKER_ERRORS as error:
                await self._lost(error)
                wait = self._broker_backoff.next()
                # consume() keeps to its timeout; run() waits the whole pause.
                await self._sleep(wait if hold == float("inf") else min(wait, max(0.0, left)))
                continue
            self._broker_backoff.reset()
            if not taken:
                continue
            try:
                result += await self._handle(taken, time.monotonic() + hold)
            except _BROKER_ERRORS as error:
                # Committed, the acks lost: JetStream delivers the batch again after ack_wait,
                # and the inbox makes each a repeat.
                await self._lost(error)
            idle_since = time.monotonic()
            # A consumer that is never idle prunes between its batches.
            await self._prune_when_due(between_batches=True)
        await self._prune_when_due()
        return result

    async def _subscribe(self) -> nats.js.JetStreamContext.PullSubscription:
        client, subscription = self._client, self._subscription
        if subscription is not None and client is not None and not client.is_closed:
            return subscription
        await self.close()
        options = {"connect_timeout": CONNECT_TIMEOUT_SECONDS, **self.connect_options}
        client = await nats.connect(self.servers, **options)
        try:
            config = nats.js.api.ConsumerConfig(
                ack_policy=nats.js.api.AckPolicy.EXPLICIT,
                ack_wait=self.ack_wait,
                # The consumer dead-letters at its own bound; JetStream's would drop silently.
                max_deliver=-1,
                max_ack_pending=max(self.batch_size * 10, 1000),
            )
            subscription = await client.jetstream().pull_subscribe(
                self.subject or "", durable=self.durable, stream=self.stream, config=config
            )
        except nats.js.errors.NotFoundError:
            await client.close()
            # A name to correct, not an outage to wait out.
            raise ConfigurationError(
                f"{self.name}: JetStream has no stream {self.stream!r} (create it first)"
            ) from None
        except nats.js.errors.BadRequestError as error:
            await client.close()
            # A consumer JetStream refuses (a subject filter outside the stream, a durable
            # made with other settings): a configuration to correct, not an outage.
            raise ConfigurationError(
                f"{self.name}: JetStream refused the consumer {self.durable!r} (subject "
                f"{self.subject!r}): {error.description} [{error.err_code}]"
            ) from None
        except BaseException:
            await client.close()
            raise
        self._client, self._subscription = client, subscription
        return subscription

    async def _take(self, limit: int, wait: float) -> list[tuple[Message, nats.aio.msg.Msg]]:
        subscription = await self._subscribe()
        deadline = time.monotonic() + wait
        while not self._stopping.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            try:
                delivered = await subscription.fetch(
                    limit, timeout=max(0.05, min(_FETCH_SECONDS, left))
                )
            except (TimeoutError, nats.errors.TimeoutError):
                # No message within the wait (nats-py raises either): not a lost connection.
                continue
            if delivered:
                return [(self._message(msg), msg) for msg in delivered]
        return []

    def _message(self, msg: nats.aio.msg.Msg) -> Message:
        headers = dict(msg.headers or {})
        metadata = msg.metadata
        return Message(
            id=headers.get(MSG_ID_HEADER, ""),
            body=msg.data,
            headers=headers,
            deliveries=int(metadata.num_delivered or 1),
            source=msg.subject,
            broker_id=str(metadata.sequence.stream if metadata.sequence else ""),
        )

    async def _handle(
        self, taken: list[tuple[Message, nats.aio.msg.Msg]], deadline: float
    ) -> ConsumeResult:
        refused = [msg for m, msg in taken if not m.id]
        kept = [(self._tally.counted(m), msg) for m, msg in taken if m.id]
        for message, msg in taken:
            if not message.id:
                refuse(self._log, self.name, msg.subject, message.broker_id)
        for msg in refused:
            await msg.term()
        if not kept:
            count = len(refused)
            await self._flush()
            return ConsumeResult(received=count, dead_lettered=count, refused=count)
        messages = [m for m, _ in kept]
        outcome = await self._apply_held(messages, [msg for _, msg in kept], deadline)
        report(self._log, self.name, messages, outcome, self._tally)
        for (_, msg), verdict in zip(kept, outcome.verdicts, strict=True):
            if verdict is Verdict.ACK:
                await msg.ack()
            elif verdict is Verdict.DEAD:
                await msg.term()
            else:
                # JetStream holds it failure_pause seconds: a message that always fails
                # does not spin, and the rest of the stream goes on meanwhile.
                await msg.nak(delay=self.failure_pause)
        await self._flush()
        return outcome.result(refused=len(refused))

    async def _apply_held(
        self, messages: list[Message], held: Sequence[nats.aio.msg.Msg], deadline: float
    ) -> Outcome:
        backoff = Backoff()
        contended = 0
        while True:
            try:
                outcome = await self._apply(messages, contended >= CONTENTION_RETRIES)
            except DatabaseDownError as error:
                if isinstance(error, ContentionError):
                    contended += 1
                if not self._database_down:
                    self._database_down = True
                    self._log.warning(
                        _log.INBOX_DATABASE_ERROR, consumer=self.name, error=str(error)
                    )
                wait = backoff.next()
                if self._stopping.is_set() or time.monotonic() + wait > deadline:
                    return Outcome([Verdict.HOLD] * len(messages), [None] * len(messages))
                # Kept from redelivery while held: each in_progress restarts its ack_wait.
                for msg in held:
                    with contextlib.suppress(*_BROKER_ERRORS):
                        await msg.in_progress()
                if await self._sleep(min(wait, self.ack_wait / 2)):
                    return Outcome([Verdict.HOLD] * len(messages), [None] * len(messages))
                continue
            if self._database_down:
                self._database_down = False
                self._log.info(_log.INBOX_DATABASE_RECOVERED, consumer=self.name)
            return outcome

    async def _apply(self, messages: list[Message], one_at_a_time: bool) -> Outcome:
        if self._async_engine is not None:
            effect: AsyncEffect = self.effect  # type: ignore[assignment]
            return await apply_async(
                self._async_engine,
                self.inbox,
                effect,
                messages,
                self._tally,
                one_at_a_time=one_at_a_time,
            )
        assert self._engine is not None
        sync_effect: Effect = self.effect  # type: ignore[assignment]
        return await asyncio.to_thread(
            functools.partial(apply, one_at_a_time=one_at_a_time),
            self._engine,
            self.inbox,
            sync_effect,
            messages,
            self._tally,
        )

    async def _flush(self) -> None:
        client = self._client
        if client is not None:
            await client.flush(timeout=5)

    async def _lost(self, error: BaseException) -> None:
        if not self._broker_backoff.failures:  # the first failure in a row: said once
            self._log.warning(_log.INBOX_BROKER_ERROR, consumer=self.name, error=first_line(error))
        await self.close()

    async def _sleep(self, seconds: float) -> bool:
        """Wait ``seconds``, or less when a stop is asked for; whether it was."""
        deadline = time.monotonic() + max(0.0, seconds)
        while not self._stopping.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await asyncio.sleep(min(0.1, left))
        return self._stopping.is_set()

    def _on_signal(self, signum: int) -> None:
        """The first SIGTERM or SIGINT stops after the batch in hand; a second one ends the
        process at once, as the signal's default would."""
        if self._stopping.is_set():
            asyncio.get_running_loop().remove_signal_handler(signum)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.stop()

    async def _prune_when_due(self, *, between_batches: bool = False) -> None:
        if (self._pruned_once or between_batches) and not self._pruning.due():
            return
        self._pruned_once = True
        try:
            if self._async_engine is not None:
                deleted = await prune_async(self._async_engine, self.prune_chunks)
            else:
                deleted = await asyncio.to_thread(prune, self._engine, self.prune_chunks)  # type: ignore[arg-type]
        except Exception as error:
            self._log.warning(_log.INBOX_PRUNE_FAILED, consumer=self.name, error=first_line(error))
            return
        if deleted:
            self._log.info(_log.INBOX_PRUNED, consumer=self.name, deleted=deleted)

    @contextlib.asynccontextmanager
    async def _signals(self, wanted: bool) -> AsyncIterator[None]:
        """SIGTERM and SIGINT stop the consumer while :meth:`run` runs (the main thread's
        event loop only); the handlers are removed after."""
        if not wanted or threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        installed = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signum, self._on_signal, signum)
                installed.append(signum)
        try:
            yield
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)


_BROKER_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.Error,
    nats.js.errors.Error,
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
)
"""What says the connection to NATS is lost, or JetStream did not answer: connect again."""


def _is_async_engine(database: object) -> bool:
    try:
        from sqlalchemy.ext.asyncio import AsyncEngine
    except ImportError:  # pragma: no cover - SQLAlchemy without its asyncio extension
        return False
    return isinstance(database, AsyncEngine)


def _servers(servers: object) -> list[str]:
    """The server URLs, each ``nats://``, ``tls://``, ``ws://`` or ``wss://`` with a host;
    anything else refused in one line naming the argument."""
    urls = [servers] if isinstance(servers, str) else servers
    if isinstance(urls, list | tuple) and urls:
        for url in urls:
            parts = urlsplit(url) if isinstance(url, str) else None
            if parts is None or parts.scheme not in _SCHEMES or not parts.hostname:
                break
        else:
            return list(urls)
    raise ConfigurationError(
        f"servers: expected nats://host[:port] (or tls://, ws://, wss://), or a list of them, "
        f"got {_shown(servers)}"
    )


def _shown(servers: object) -> str:
    """What refused servers are, without their URLs: one may hold a password or a token."""
    if isinstance(servers, str):
        return f"a URL with scheme {urlsplit(servers).scheme!r}"
    return type(servers).__name__


_SCHEMES = ("nats", "tls", "ws", "wss")
