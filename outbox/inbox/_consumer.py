"""What the ready consumers of :mod:`outbox.inbox` share: the message and the result they hand
out, how a batch is applied (the new messages' effect and their ids in one transaction), the
bound after which a failing message is dead-lettered, the pauses, and the pruning schedule.

Nothing here speaks to a broker: each consumer module (``rabbitmq``, ``redis``, ``nats``)
turns its broker's deliveries into :class:`Message` values, asks :func:`apply` or
:func:`apply_async` what became of them, and acknowledges, redelivers or dead-letters each
the broker's way.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from outbox._core import log as _log
from outbox._db import dialects
from outbox._db.dialects import is_missing_table
from outbox.exceptions import ConfigurationError
from outbox.inbox import Inbox, is_retryable, prune

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession


BATCH_SIZE = 100
"""Messages a consumer takes from its broker at once, and applies in one transaction."""
MAX_DELIVERIES = 5
"""Deliveries of a message whose effect keeps failing before it is dead-lettered."""
FAILURE_PAUSE_SECONDS = 1.0
"""How long a consumer waits after an effect failed before the message is offered again, so
that a message that always fails does not spin."""
BACKOFF_FIRST_SECONDS = 0.5
"""The first wait after the database or the broker could not be reached; doubled at each
failure in a row, jittered."""
BACKOFF_CAP_SECONDS = 30.0
"""The longest wait after the database or the broker could not be reached."""
PRUNE_INTERVAL_SECONDS = 600.0
"""How often a running consumer prunes the ids past their horizon (every inbox's)."""
PRUNE_CHUNKS = 10
"""Transactions (of :data:`outbox.inbox.PRUNE_CHUNK` ids) one pruning pass takes at most."""
CONTENTION_RETRIES = 3
"""Whole-batch retries of a batch whose effect hit transient contention (a deadlock, a lock or
statement timeout) before its messages are applied one at a time, each such failure then
counted against its ``max_deliveries``."""
_REMEMBERED_FAILURES = 10_000
"""Message ids whose failures a consumer counts itself, for brokers that count no deliveries
(a classic RabbitMQ queue); the oldest are forgotten first."""

Effect = Callable[[Session, list["Message"]], object]
"""A sync consumer's effect: called with a session in the batch's transaction and the batch's
new messages."""
AsyncEffect = Callable[["AsyncSession", list["Message"]], Awaitable[object]]
"""An async consumer's effect: awaited with an ``AsyncSession`` in the batch's transaction and
the batch's new messages."""


@dataclass(frozen=True, slots=True)
class Message:
    """One message as a consumer hands it to the effect.

    ``id``: the message id the inbox records (RabbitMQ's ``message_id``, JetStream's
    ``Nats-Msg-Id``, the Redis entry's ``id`` field). ``body``: the bytes as published (the
    sinks' ``payload``). ``headers``: the broker's headers (RabbitMQ's and JetStream's; the
    Redis entry's other fields). ``deliveries``: how many times the broker delivered it,
    this delivery included, as far as it counts them. ``source``: the queue, stream or
    subject it came from. ``broker_id``: the broker's own handle of the delivery (a delivery
    tag, a stream sequence, an entry id), for logs.
    """

    id: str
    body: bytes
    headers: Mapping[str, Any] = field(default_factory=dict)
    deliveries: int = 1
    source: str = ""
    broker_id: str = ""

    def text(self) -> str:
        """The body as UTF-8 text."""
        return self.body.decode()

    def json(self) -> Any:
        """The body decoded as JSON (the sinks' default payload)."""
        return json.loads(self.body)


@dataclass(frozen=True, slots=True)
class ConsumeResult:
    """What one :meth:`consume` call (or a consumer's whole run) did.

    ``received``: messages taken from the broker. ``new``: those whose effect ran and was
    committed. ``repeats``: those whose id the inbox held already (acknowledged, no effect).
    ``failed``: those left to the broker to deliver again (their effect raised, or the
    database could not be reached). ``dead_lettered``: those dead-lettered, after
    ``max_deliveries`` failed deliveries or, ``refused`` of them, for having no message id.
    """

    received: int = 0
    new: int = 0
    repeats: int = 0
    failed: int = 0
    dead_lettered: int = 0
    refused: int = 0

    def __add__(self, other: ConsumeResult) -> ConsumeResult:
        return ConsumeResult(
            received=self.received + other.received,
            new=self.new + other.new,
            repeats=self.repeats + other.repeats,
            failed=self.failed + other.failed,
            dead_lettered=self.dead_lettered + other.dead_lettered,
            refused=self.refused + other.refused,
        )


class Verdict(StrEnum):
    """What becomes of one delivered message."""

    ACK = "ack"  # its effect committed, or it was a repeat
    RETRY = "retry"  # its effect failed: the broker delivers it again
    DEAD = "dead"  # its effect failed too often, or it has no id: dead-lettered
    HOLD = "hold"  # the database could not be reached: neither acknowledged nor counted


@dataclass(slots=True)
class Outcome:
    """What :func:`apply` decided for a batch: a verdict per message, in the batch's order,
    with the error of those that failed, and the counts."""

    verdicts: list[Verdict]
    errors: list[BaseException | None]
    new: int = 0
    repeats: int = 0

    def result(self, refused: int = 0) -> ConsumeResult:
        """The batch's counts."""
        return ConsumeResult(
            received=len(self.verdicts) + refused,
            new=self.new,
            repeats=self.repeats,
            failed=sum(v in (Verdict.RETRY, Verdict.HOLD) for v in self.verdicts),
            dead_lettered=sum(v is Verdict.DEAD for v in self.verdicts) + refused,
            refused=refused,
        )


class DatabaseDownError(Exception):
    """The database could not be reached, or refused the transaction for a reason of its own
    (not the effect's): the batch is held, unacknowledged, and tried again after a pause."""


class ContentionError(DatabaseDownError):
    """The effect hit transient contention (a deadlock, a serialisation failure, a lock or
    statement timeout): the whole batch is tried again, then one message at a time."""


class _EffectError(Exception):
    """The effect raised ``error``: that, and only that, counts against its messages."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


def _outside_effect(error: BaseException, inbox: Inbox) -> Exception:
    """What an error raised outside the effect (connecting, recording the ids, the commit)
    becomes: a configuration to correct (a missing table, a session that cannot hold the
    transaction), raised in one line; else the database's trouble (a driver's bare socket
    error too: asyncpg raises them unwrapped), and the batch is held."""
    if is_missing_table(error):
        return ConfigurationError(
            f"inbox {inbox.name!r}: the inbox table is missing ({dialects.error_summary(error)}):"
            " run `outbox migrate` before the consumer"
        )
    if isinstance(error, TypeError | ConfigurationError):
        return ConfigurationError(first_line(error).partition(": ")[2] or str(error))
    if isinstance(error, DBAPIError):
        return DatabaseDownError(dialects.error_summary(error))
    return DatabaseDownError(first_line(error))


def _in_effect(error: BaseException) -> DatabaseDownError | None:
    """The effect's error, when it is the database's rather than the message's: a connection
    SQLAlchemy invalidated holds the batch, contention retries it; None: it counts against
    the message (a socket error of the effect's own, calling some service, included)."""
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return DatabaseDownError(dialects.error_summary(error))
    if isinstance(error, DBAPIError) and is_retryable(error):
        return ContentionError(dialects.error_summary(error))
    return None


def _refuse_awaitable(result: object, effect: object) -> None:
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        name = getattr(effect, "__qualname__", None) or type(effect).__name__
        raise ConfigurationError(
            f"effect {name} returned an awaitable: a sync consumer calls its effect with a "
            "Session and does not await it; make it a plain `def` doing its work"
        )


def _apply_once(
    engine: Engine, inbox: Inbox, effect: Effect, messages: Sequence[Message]
) -> list[bool]:
    with Session(engine) as session, session.begin():
        # One answer per message, in its place: a re-send in the same batch is not new.
        fresh = inbox.receive_many(session, [m.id for m in messages])
        new = [m for m, is_new in zip(messages, fresh, strict=True) if is_new]
        if new:
            try:
                result = effect(session, new)
                if not inspect.isawaitable(result):
                    # The effect's own rows are written here, so that their errors are its.
                    session.flush()
            except Exception as error:
                raise _EffectError(error) from error
            _refuse_awaitable(result, effect)
    return fresh


async def _apply_once_async(
    engine: AsyncEngine, inbox: Inbox, effect: AsyncEffect, messages: Sequence[Message]
) -> list[bool]:
    from sqlalchemy.ext.asyncio import AsyncSession

    async with AsyncSession(engine) as session, session.begin():
        fresh = await inbox.receive_many_async(session, [m.id for m in messages])
        new = [m for m, is_new in zip(messages, fresh, strict=True) if is_new]
        if new:
            try:
                await effect(session, new)
                await session.flush()
            except Exception as error:
                raise _EffectError(error) from error
    return fresh


class Tally:
    """Each message's failed deliveries as this consumer saw them, and the bound.

    A broker that counts deliveries (JetStream, Redis, a RabbitMQ quorum queue) says how many
    there were; one that does not (a classic RabbitMQ queue says only "redelivered") is
    counted here, in the consumer's memory, so that a message failing in one process is still
    dead-lettered at the bound. A consumer started again counts from the broker's figure.
    """

    def __init__(self, max_deliveries: int) -> None:
        self.max_deliveries = max_deliveries
        self._failures: OrderedDict[str, int] = OrderedDict()

    def deliveries(self, message: Message) -> int:
        """The message's deliveries: the broker's count, or this consumer's, the larger."""
        return max(message.deliveries, self._failures.get(message.id, 0) + 1)

    def counted(self, message: Message) -> Message:
        """The message with the deliveries of :meth:`deliveries`, as the effect, the logs and
        the dead letters see it."""
        deliveries = self.deliveries(message)
        if deliveries == message.deliveries:
            return message
        return dataclasses.replace(message, deliveries=deliveries)

    def failed(self, message: Message) -> Verdict:
        """The message's effect failed: dead-letter it at the bound, or let it come again."""
        if self.deliveries(message) >= self.max_deliveries:
            self._failures.pop(message.id, None)
            return Verdict.DEAD
        self._failures[message.id] = self._failures.get(message.id, 0) + 1
        self._failures.move_to_end(message.id)
        while len(self._failures) > _REMEMBERED_FAILURES:
            self._failures.popitem(last=False)
        return Verdict.RETRY

    def done(self, messages: Sequence[Message]) -> None:
        """These messages were acknowledged: forget their failures."""
        for message in messages:
            self._failures.pop(message.id, None)


def _failed(message: Message, error: BaseException, tally: Tally) -> Outcome:
    """The outcome of a batch of one message whose effect raised."""
    return Outcome([tally.failed(message)], [error])


def apply(
    engine: Engine,
    inbox: Inbox,
    effect: Effect,
    messages: Sequence[Message],
    tally: Tally,
    *,
    one_at_a_time: bool = False,
) -> Outcome:
    """Apply a batch: the new messages' effect and every id in one transaction, committed.

    When the effect raises, the transaction is rolled back and each message is applied alone,
    so that one poison message holds back no other: the ones whose effect then fails are
    retried or dead-lettered by the tally. Only an error the effect raised counts against a
    message. Raises :class:`DatabaseDownError` when the database could not be reached or
    refused the transaction outside the effect, :class:`ContentionError` when the effect hit
    transient contention (unless ``one_at_a_time``: then each message is applied alone and its
    contention counted), and :class:`ConfigurationError` for a missing inbox table: nothing is
    committed or acknowledged then.
    """
    if one_at_a_time and len(messages) > 1:
        return _apply_each(engine, inbox, effect, messages, tally, one_at_a_time)
    try:
        fresh = _apply_once(engine, inbox, effect, messages)
    except _EffectError as failed:
        error = failed.error
        held = _in_effect(error)
        if held is not None and not (one_at_a_time and isinstance(held, ContentionError)):
            raise held from error
        if len(messages) == 1:
            return _failed(messages[0], error, tally)
        return _apply_each(engine, inbox, effect, messages, tally, one_at_a_time)
    except Exception as error:
        raise _outside_effect(error, inbox) from error
    tally.done(messages)
    return _counted(messages, fresh)


def _apply_each(
    engine: Engine,
    inbox: Inbox,
    effect: Effect,
    messages: Sequence[Message],
    tally: Tally,
    one_at_a_time: bool,
) -> Outcome:
    outcome = Outcome([], [])
    for index, message in enumerate(messages):
        try:
            one = apply(engine, inbox, effect, [message], tally, one_at_a_time=one_at_a_time)
        except DatabaseDownError:
            # What was committed stays committed; the rest is held for the next try.
            _hold_rest(outcome, len(messages) - index)
            return outcome
        _join(outcome, one)
    return outcome


def _hold_rest(outcome: Outcome, left: int) -> None:
    outcome.verdicts += [Verdict.HOLD] * left
    outcome.errors += [None] * left


def _join(outcome: Outcome, one: Outcome) -> None:
    outcome.verdicts += one.verdicts
    outcome.errors += one.errors
    outcome.new += one.new
    outcome.repeats += one.repeats


async def apply_async(
    engine: AsyncEngine,
    inbox: Inbox,
    effect: AsyncEffect,
    messages: Sequence[Message],
    tally: Tally,
    *,
    one_at_a_time: bool = False,
) -> Outcome:
    """:func:`apply` for an async consumer: the effect awaited in an ``AsyncSession``."""
    if not one_at_a_time or len(messages) == 1:
        try:
            fresh = await _apply_once_async(engine, inbox, effect, messages)
        except _EffectError as failed:
            error = failed.error
            held = _in_effect(error)
            if held is not None and not (one_at_a_time and isinstance(held, ContentionError)):
                raise held from error
            if len(messages) == 1:
                return _failed(messages[0], error, tally)
        except Exception as error:
            raise _outside_effect(error, inbox) from error
        else:
            tally.done(messages)
            return _counted(messages, fresh)
    outcome = Outcome([], [])
    for index, message in enumerate(messages):
        try:
            one = await apply_async(
                engine, inbox, effect, [message], tally, one_at_a_time=one_at_a_time
            )
        except DatabaseDownError:
            _hold_rest(outcome, len(messages) - index)
            return outcome
        _join(outcome, one)
    return outcome


def _counted(messages: Sequence[Message], fresh: list[bool]) -> Outcome:
    new = sum(fresh)
    return Outcome(
        [Verdict.ACK] * len(messages),
        [None] * len(messages),
        new=new,
        repeats=len(messages) - new,
    )


def first_line(error: BaseException) -> str:
    """An error as one line: its type and the first line of its text."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


class Backoff:
    """The wait after a failure in a row to reach the database or the broker: doubled each
    time from :data:`BACKOFF_FIRST_SECONDS` up to :data:`BACKOFF_CAP_SECONDS`, jittered by up
    to a quarter; :meth:`reset` once it worked again."""

    def __init__(self) -> None:
        self.failures = 0

    def next(self) -> float:
        """Seconds to wait after one more failure."""
        self.failures += 1
        base = min(BACKOFF_CAP_SECONDS, BACKOFF_FIRST_SECONDS * 2 ** (self.failures - 1))
        return float(base * (1 - random.random() / 4))

    def reset(self) -> None:
        """It worked: the next failure waits the first wait again."""
        self.failures = 0


class Pruning:
    """When a running consumer prunes next: every ``interval`` seconds, the first a whole
    interval after it started (a burst of consumers starting together prunes nothing)."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self._clock = clock
        self._next = clock() + interval

    def due(self) -> bool:
        """Whether a pass is due; a True answer schedules the next."""
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self.interval
        return True


def prune_now(engine: Engine, chunks: int, consumer: str, log: _log.Logger) -> int:
    """One pruning pass of every inbox, ``chunks`` transactions at most; an error is logged
    and left for the next pass (the ids are deleted later, nothing is lost)."""
    try:
        deleted = prune(engine, chunks=chunks)
    except Exception as error:
        log.warning(_log.INBOX_PRUNE_FAILED, consumer=consumer, error=first_line(error))
        return 0
    if deleted:
        log.info(_log.INBOX_PRUNED, consumer=consumer, deleted=deleted)
    return deleted


def report(
    log: _log.Logger,
    consumer: str,
    messages: Sequence[Message],
    outcome: Outcome,
    tally: Tally,
) -> None:
    """Log the batch in one line, and each failed or dead-lettered message in one line."""
    for message, verdict, error in zip(messages, outcome.verdicts, outcome.errors, strict=True):
        if verdict is Verdict.DEAD:
            log.error(
                _log.INBOX_DEAD_LETTERED,
                consumer=consumer,
                message_id=message.id,
                deliveries=message.deliveries,
                error=first_line(error) if error else "",
            )
        elif verdict is Verdict.RETRY:
            log.warning(
                _log.INBOX_EFFECT_FAILED,
                consumer=consumer,
                message_id=message.id,
                deliveries=message.deliveries,
                max_deliveries=tally.max_deliveries,
                error=first_line(error) if error else "",
            )
    log.debug(
        _log.INBOX_BATCH,
        consumer=consumer,
        size=len(messages),
        new=outcome.new,
        repeats=outcome.repeats,
    )


def refuse(log: _log.Logger, consumer: str, source: str, broker_id: str) -> None:
    """Log a message without an id, dead-lettered: one line."""
    log.error(
        _log.INBOX_MESSAGE_REFUSED,
        consumer=consumer,
        source=source,
        broker_id=broker_id,
        error="the message has no id: it cannot be told from its redelivery, so it is "
        "dead-lettered unapplied",
    )


class Stopping:
    """A consumer's stop flag: set by :meth:`set` from any thread or a signal handler."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def set(self) -> None:
        """Ask the consumer to stop after the batch in hand."""
        self.event.set()

    def is_set(self) -> bool:
        """Whether a stop was asked for."""
        return self.event.is_set()

    def wait(self, seconds: float) -> bool:
        """Sleep ``seconds``, or less when a stop is asked for; whether it was."""
        return self.event.wait(max(0.0, seconds))
