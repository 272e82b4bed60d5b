"""The loop of a sync ready consumer (RabbitMQ, Redis): take a batch from the broker, apply it
in one transaction, then acknowledge, redeliver or dead-letter each message the broker's way;
reconnect to a broker that went away, hold a batch while the database is down, prune now and
then, stop when asked.

A broker module subclasses :class:`SyncConsumer` with four methods: ``_open``, ``_close``,
``_take`` and ``_settle``. The async consumer (NATS) has the same steps in
:mod:`outbox.inbox.nats`.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType
from typing import Any

from sqlalchemy import Engine

from outbox._core import log as _log
from outbox.inbox import Inbox
from outbox.inbox._consumer import (
    BATCH_SIZE,
    CONTENTION_RETRIES,
    FAILURE_PAUSE_SECONDS,
    MAX_DELIVERIES,
    PRUNE_CHUNKS,
    PRUNE_INTERVAL_SECONDS,
    Backoff,
    ConsumeResult,
    ContentionError,
    DatabaseDownError,
    Effect,
    Message,
    Outcome,
    Pruning,
    Stopping,
    Tally,
    Verdict,
    apply,
    first_line,
    prune_now,
    refuse,
    report,
)
from outbox.inbox._settings import check_effect, check_settings

Taken = tuple[Message, Any]
"""A delivered message and the broker's handle to settle it by (a delivery tag, an entry id).
A message without an id has ``id == ""``."""
NO_ID = "the message has no id"
"""Why a message without an id was dead-lettered."""


class SyncConsumer:
    """The broker-independent part of a sync consumer (see the module's docstring)."""

    kind = "broker"
    """The broker's name, in log lines."""
    pause_before_retry = True
    """Whether a batch with failures waits :attr:`failure_pause` before its failed messages
    are given back (a broker that redelivers at once); a broker that redelivers only after an
    idle time (Redis) needs no pause of its own."""
    broker_errors: tuple[type[BaseException], ...] = (ConnectionError, OSError)
    """The errors that say the broker connection is lost: reconnect after a pause."""

    def __init__(
        self,
        database: Engine,
        inbox: Inbox,
        effect: Effect,
        *,
        source: str,
        batch_size: int = BATCH_SIZE,
        max_deliveries: int = MAX_DELIVERIES,
        failure_pause: float = FAILURE_PAUSE_SECONDS,
        prune_interval: float = PRUNE_INTERVAL_SECONDS,
        prune_chunks: int = PRUNE_CHUNKS,
    ) -> None:
        if not isinstance(inbox, Inbox):
            raise TypeError(
                f"{self.kind} consumer of {source!r}: inbox must be an outbox.inbox.Inbox "
                f"(app.inbox(...)), got {type(inbox).__name__}"
            )
        self.name = f"inbox {inbox.name!r} from {self.kind} {source!r}"
        check_effect(effect, want_async=False, consumer=self.name)
        check_settings(
            self.name,
            batch_size=batch_size,
            max_deliveries=max_deliveries,
            failure_pause=failure_pause,
            prune_interval=prune_interval,
            prune_chunks=prune_chunks,
        )
        self.engine = database
        self.inbox = inbox
        self.effect = effect
        self.source = source
        self.batch_size = int(batch_size)
        self.failure_pause = float(failure_pause)
        self.prune_chunks = int(prune_chunks)
        self._tally = Tally(int(max_deliveries))
        self._pruning = Pruning(prune_interval)
        self._pruned_once = False
        self._stopping = Stopping()
        self._database_down = False
        self._connected = False
        # Kept across consume() calls, so that a broker that stays away is tried ever more
        # slowly, and said once.
        self._broker_backoff = Backoff()
        self._log = _log.get_logger(type(self).__module__)

    # --- what a broker module provides -------------------------------------------------------

    def _open(self) -> None:
        """Connect to the broker (and make the consumer's queue, group or subscription)."""
        raise NotImplementedError

    def _close(self) -> None:
        """Close the connection; the broker gives back what was not acknowledged."""
        raise NotImplementedError

    def _take(self, limit: int, wait: float) -> list[Taken]:
        """Up to ``limit`` delivered messages, waiting ``wait`` seconds at most for the first."""
        raise NotImplementedError

    def _settle(
        self, taken: Sequence[Taken], verdicts: Sequence[Verdict], errors: Sequence[str]
    ) -> None:
        """Acknowledge, give back or dead-letter each message by its verdict (``HOLD``: give
        back, unacknowledged, as for ``RETRY``); ``errors``: why each failed, in one line."""
        raise NotImplementedError

    def _sleep(self, seconds: float) -> bool:
        """Wait ``seconds`` (the connection kept alive where the broker needs it); whether a
        stop was asked for meanwhile."""
        return self._stopping.wait(seconds)

    # --- the consumer's API ------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the consumer to stop once the batch in hand is settled: :meth:`run` and
        :meth:`consume` return. Safe from a signal handler and from any thread."""
        self._stopping.set()

    def close(self) -> None:
        """Close the broker connection (what was taken and not settled is given back)."""
        if self._connected:
            self._connected = False
            try:
                self._close()
            except Exception as error:  # closing a lost connection: nothing to give back
                self._log.debug(_log.INBOX_BROKER_ERROR, consumer=self.name, error=str(error))

    def __enter__(self) -> SyncConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def consume(self, *, max_messages: int | None = None, timeout: float = 1.0) -> ConsumeResult:
        """Take and apply messages until ``max_messages`` were received, no message came for
        ``timeout`` seconds, or :meth:`stop` was called; what it did. For tests and cron jobs;
        :meth:`run` is the long-running loop. A pruning pass ends the first call, then one
        call every ``prune_interval`` seconds."""
        return self._consume(max_messages, timeout, hold=timeout)

    def _consume(self, max_messages: int | None, timeout: float, hold: float) -> ConsumeResult:
        """:meth:`consume`, a batch held while the database is down for ``hold`` seconds at
        most after the last message came (:meth:`run` holds it until the database answers)."""
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
                if not self._connected:
                    self._open()
                    self._connected = True
                    self._broker_backoff.reset()
                taken = self._take(limit, left)
            except self.broker_errors as error:
                self._lost(error)
                wait = self._broker_backoff.next()
                # consume() keeps to its timeout; run() waits the whole pause.
                self._sleep(wait if math.isinf(hold) else min(wait, max(0.0, left)))
                continue
            if not taken:
                continue
            try:
                result += self._handle(taken, time.monotonic() + hold)
            except self.broker_errors as error:
                # The commit is done; the acks were lost with the connection: the broker
                # delivers the batch again, and the inbox makes each a repeat.
                self._lost(error)
            idle_since = time.monotonic()
            # A consumer that is never idle prunes between its batches.
            self._prune_when_due(between_batches=True)
        # After the messages, not before: a pruning pass waits out a database restart first.
        self._prune_when_due()
        return result

    def run(self, *, handle_signals: bool = True) -> ConsumeResult:
        """Consume until :meth:`stop` is called (or, with ``handle_signals`` in the main
        thread, SIGTERM or SIGINT arrives); the run's counts. The connection is closed at the
        end, what was not settled given back to the broker."""
        total = ConsumeResult()
        self._log.info(
            _log.INBOX_CONSUMER_STARTED,
            consumer=self.name,
            inbox=self.inbox.name,
            source=self.source,
        )
        with self._signals(handle_signals):
            try:
                while not self._stopping.is_set():
                    total += self._consume(None, 1.0, hold=math.inf)
            finally:
                self.close()
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

    def _handle(self, taken: list[Taken], deadline: float) -> ConsumeResult:
        refused = [(m, h) for m, h in taken if not m.id]
        kept = [(self._tally.counted(m), h) for m, h in taken if m.id]
        for message, _ in refused:
            refuse(self._log, self.name, message.source or self.source, message.broker_id)
        if refused:
            self._settle(refused, [Verdict.DEAD] * len(refused), [NO_ID] * len(refused))
        if not kept:
            count = len(refused)
            return ConsumeResult(received=count, dead_lettered=count, refused=count)
        messages = [m for m, _ in kept]
        outcome = self._apply_held(messages, deadline)
        report(self._log, self.name, messages, outcome, self._tally)
        if self.pause_before_retry and Verdict.RETRY in outcome.verdicts:
            # A message given back now is delivered again at once: the pause keeps a message
            # that always fails from spinning.
            self._sleep(self.failure_pause)
        errors = [first_line(e) if e is not None else "" for e in outcome.errors]
        self._settle(kept, outcome.verdicts, errors)
        return outcome.result(refused=len(refused))

    def _apply_held(self, messages: list[Message], deadline: float) -> Outcome:
        """Apply the batch; while the database is down, hold it (unacknowledged) and try
        again after a growing pause, until it is applied, a stop is asked for, or, in
        :meth:`consume`, the call's time is up (then it is given back)."""
        backoff = Backoff()
        contended = 0
        while True:
            try:
                outcome = apply(
                    self.engine,
                    self.inbox,
                    self.effect,
                    messages,
                    self._tally,
                    one_at_a_time=contended >= CONTENTION_RETRIES,
                )
            except DatabaseDownError as error:
                if isinstance(error, ContentionError):
                    contended += 1
                if not self._database_down:
                    self._database_down = True
                    self._log.warning(
                        _log.INBOX_DATABASE_ERROR, consumer=self.name, error=str(error)
                    )
                wait = backoff.next()
                if self._stopping.is_set() or (
                    not math.isinf(deadline) and time.monotonic() + wait > deadline
                ):
                    return Outcome([Verdict.HOLD] * len(messages), [None] * len(messages))
                if self._sleep(wait):
                    return Outcome([Verdict.HOLD] * len(messages), [None] * len(messages))
                continue
            if self._database_down:
                self._database_down = False
                self._log.info(_log.INBOX_DATABASE_RECOVERED, consumer=self.name)
            return outcome

    def _lost(self, error: BaseException) -> None:
        if not self._broker_backoff.failures:  # the first failure in a row: said once
            self._log.warning(_log.INBOX_BROKER_ERROR, consumer=self.name, error=first_line(error))
        self.close()
        self._connected = False

    def _prune_when_due(self, *, between_batches: bool = False) -> None:
        if (self._pruned_once or between_batches) and not self._pruning.due():
            return
        self._pruned_once = True
        prune_now(self.engine, self.prune_chunks, self.name, self._log)

    @contextmanager
    def _signals(self, wanted: bool) -> Iterator[None]:
        """SIGTERM and SIGINT stop the consumer after the batch in hand while :meth:`run` runs
        (main thread only: the only thread Python delivers signals to), and a second one ends
        the process at once; the previous handlers are put back after."""
        if not wanted or threading.current_thread() is not threading.main_thread():
            yield
            return

        def on_signal(signum: int, frame: FrameType | None) -> None:
            if self._stopping.is_set():
                # A second signal: end the process at once, as the signal's default would.
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)
                return
            self.stop()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
