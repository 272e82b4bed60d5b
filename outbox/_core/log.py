"""The catalogue of log event names outbox emits (docs/operations.md lists them), and the logger
that emits them (docs/logging.md).

The library only emits; it never configures logging, neither the standard library's nor
structlog's. Names are stable: dashboards and alerts may match on them. No event carries
payloads or passwords.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog

BATCH_HANDLED = "outbox.batch.handled"  # one line per batch: handler, group, size, outcome, ...
LEASE_LOST = "outbox.lease.lost"
# A lease held here may be lost by now (a claim came back late, the fleet has not heard this
# worker for long): its group goes back unhandled.
LEASE_TOO_OLD = "outbox.lease.too_old"
GROUP_CLAIMED = "outbox.group.claimed"
CLAIMS_ENQUEUED = "outbox.distribute.enqueued"
# A flag handler's newly flagged rows taken into its buffer (debug: each distribution).
FLAGS_TAKEN = "outbox.flags.taken"
# Events wait with no claim job and nothing distributes (no cron, workers with --no-distribute).
DISTRIBUTION_MISSING = "outbox.distribute.missing"
# A scheduled caller found the distribution tick taken by another (debug: expected, not news).
DISTRIBUTE_TICK_LOST = "outbox.distribute.tick_lost"
# A scheduler named a tick too far from the database's (its clock is off, or its message waited
# long in a queue): the database's tick was taken instead.
DISTRIBUTE_TICK_SKEWED = "outbox.distribute.tick_skewed"
# One line per run-once call (outbox run --once, outbox.run_once): what it did, what is left.
RUN_ONCE_DONE = "outbox.run_once.done"
JOBS_RESCUED = "outbox.jobs.rescued"
WORKER_STARTED = "outbox.worker.started"
WORKER_STOPPING = "outbox.worker.stopping"
# An operator asked this worker to drain or stop (outbox workers drain/stop): who, and what.
WORKER_ASKED = "outbox.worker.asked"
WORKER_STOPPED = "outbox.worker.stopped"
WORKER_ABANDONED = "outbox.worker.abandoned"
WORKER_DATABASE_ERROR = "outbox.worker.database_error"
WORKER_DATABASE_RECOVERED = "outbox.worker.database_recovered"
WORKER_LOOP_ERROR = "outbox.worker.loop_error"
# The database's schema asks for newer workers, or was downgraded under this one: it stops.
WORKER_SCHEMA_INCOMPATIBLE = "outbox.worker.schema_incompatible"
# Live workers of an older release ignore a lever this worker's handlers use (rate limits, ...).
OLDER_WORKERS = "outbox.worker.older_workers"
BUFFER_TABLE_MISSING = "outbox.worker.buffer_table_missing"  # its handler is set aside
# MariaDB: a buffer's created_at defaults to the session's local clock (outbox migrate-buffers).
BUFFER_CLOCK_LOCAL = "outbox.worker.buffer_clock_local"
BUFFER_TABLE_FOUND = "outbox.worker.buffer_table_found"  # there again: served again
HANDLER_STOP_FAILED = "outbox.worker.handler_stop_failed"  # a handler's outbox_stop raised
WORKER_PROCESS_EXITED = "outbox.worker.process_exited"
# An executor's message named a job that is leased, finished, not due or paused: nothing done.
EXECUTOR_MESSAGE_SKIPPED = "outbox.executor.skipped"
# An executor could not publish the message for a due job: its sweep publishes it later.
EXECUTOR_PUBLISH_FAILED = "outbox.executor.publish_failed"
# A handler object's outbox_start raised in an executor's process: its jobs are given back.
EXECUTOR_HANDLER_START_FAILED = "outbox.executor.handler_start_failed"
# A paused handler whose messages an executor dropped is no longer paused: its due jobs sent.
EXECUTOR_RESUMED = "outbox.executor.resumed"
# A process stopping mid-job gave back the leases it held: due again at once.
JOBS_GIVEN_BACK = "outbox.jobs.given_back"
WORKER_PROCESS_RESTARTING = "outbox.worker.process_restarting"
WORKER_PROCESS_FAILED = "outbox.worker.process_failed"
# The supervisor's list of worker processes (an application's databases) could not be read.
WORKER_PLAN_FAILED = "outbox.worker.plan_failed"
DATABASE_RETRYING = "outbox.database.retrying"
POOLER_DETECTED = "outbox.database.pooler_detected"
SYNC_ENGINE_DERIVED = "outbox.database.sync_engine_derived"  # from an async URL or engine
LISTENER_RECONNECTING = "outbox.listener.reconnecting"
LISTENER_OFF = "outbox.listener.off"  # a pooler is in front: wake-ups are by polling
SCRAPE_FAILED = "outbox.metrics.scrape_failed"
SCRAPE_RECOVERED = "outbox.metrics.scrape_recovered"
BREAKER_OPENED = "outbox.breaker.opened"  # a handler paused after failed groups in a row
BREAKER_CLOSED = "outbox.breaker.closed"  # a probe succeeded: the handler runs as before
RETRY_AFTER_UNREADABLE = "outbox.retry_after.unreadable"  # a header neither seconds nor a date
COMPLETION_FAILED = "outbox.batch.completion_failed"  # outbox could not record an outcome
ARCHIVE_REPLAYED = "outbox.archive.replayed"
ARCHIVE_PRUNED = "outbox.archive.pruned"
# A retention pass: the days it made, took out (dropped or emptied), the rows it deleted.
ARCHIVE_RETENTION = "outbox.archive.retention"
ARCHIVE_RETENTION_FAILED = "outbox.archive.retention_failed"
ARCHIVE_EDITED = "outbox.archive.edited"  # a dead event replayed with values an operator changed
# A consumer added to a fan-out later, started from the events the archive keeps.
FANOUT_BACKFILLED = "outbox.fanout.backfilled"
GROUPS_DISCARDED = "outbox.groups.discarded"  # an operator gave groups up
# How far a long command is (prune, replay, discard, migrate...), off a terminal: its counts.
PROGRESS = "outbox.progress"
GROUPS_RETRIED = "outbox.groups.retried"  # an operator made waiting groups due now
# The inbox's ready consumers (outbox.inbox.rabbitmq, .redis, .nats): one line per batch
# (debug), one per message whose effect failed (warning) or that was dead-lettered (error).
INBOX_CONSUMER_STARTED = "outbox.inbox.consumer_started"
INBOX_CONSUMER_STOPPED = "outbox.inbox.consumer_stopped"  # with the run's counts
INBOX_BATCH = "outbox.inbox.batch"
INBOX_EFFECT_FAILED = "outbox.inbox.effect_failed"  # rolled back, left for redelivery
INBOX_DEAD_LETTERED = "outbox.inbox.dead_lettered"  # failed max_deliveries times
INBOX_DEAD_LETTER_FAILED = "outbox.inbox.dead_letter_failed"  # left unacknowledged, comes again
INBOX_MESSAGE_REFUSED = "outbox.inbox.refused"  # no message id: dead-lettered unapplied
# The database could not be reached: the batch is held unacknowledged (once per outage).
INBOX_DATABASE_ERROR = "outbox.inbox.database_error"
INBOX_DATABASE_RECOVERED = "outbox.inbox.database_recovered"
INBOX_BROKER_ERROR = "outbox.inbox.broker_error"  # the broker connection lost: reconnecting
INBOX_PRUNED = "outbox.inbox.pruned"  # a consumer's pruning pass deleted ids past the horizon
INBOX_PRUNE_FAILED = "outbox.inbox.prune_failed"  # left for the next pass
WEB_DATABASE_ERROR = "outbox.web.database_error"  # the dashboard or API could not read or write
WEB_WRITE = "outbox.web.write"  # a write through the dashboard or the API, with who did it


# A LogRecord's own attributes: `logging` refuses an `extra` that would overwrite one. No event
# has such a field (a test reads every call), but one passed in a dict gets an underscore
# after its name rather than failing the call that logged it.
_RECORD_ATTRIBUTES = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
# The key=value rendering of an event's fields in a standard library message.
_LOGFMT = structlog.processors.LogfmtRenderer(bool_as_flag=False)
# logging.Logger.log counts from its caller (Logger._emit): two frames up is outbox's own line,
# which a host's `%(module)s`, `%(funcName)s` and `%(lineno)d` then name.
_CALLER = 3


class Logger:
    """The logger of an outbox module: ``log.info(EVENT, key=value, ...)``.

    Where the process configured structlog (the ``outbox`` command does; so may an application
    that uses structlog), an event goes through that configuration, as any structlog logger's.
    Elsewhere (a worker, ``outbox.testing.drain`` or the dashboard inside a Celery, Flask or
    uvicorn process) it goes to the standard library's ``logging.getLogger(name)`` at its own
    level: the message is the event's name and its fields as ``key=value``, the record carries
    ``event`` and each field as attributes (``extra``), and the application's logging
    configuration decides what is shown and where. Decided at each call, so an application that
    configures structlog after importing outbox is followed.
    """

    __slots__ = ("_name", "_structlog")

    def __init__(self, name: str) -> None:
        self._name = name
        self._structlog: Any = structlog.get_logger(name)

    def debug(self, event: str, **fields: Any) -> None:
        """Log ``event`` at DEBUG."""
        self._emit(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: Any) -> None:
        """Log ``event`` at INFO."""
        self._emit(logging.INFO, event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        """Log ``event`` at WARNING."""
        self._emit(logging.WARNING, event, fields)

    def error(self, event: str, **fields: Any) -> None:
        """Log ``event`` at ERROR."""
        self._emit(logging.ERROR, event, fields)

    def exception(self, event: str, **fields: Any) -> None:
        """Log ``event`` at ERROR with the exception being handled."""
        self._emit(logging.ERROR, event, fields, exc_info=True)

    def enabled(self, level: int) -> bool:
        """Whether an event at ``level`` would be logged: for a caller whose fields cost
        something to gather."""
        if structlog.is_configured():
            return level >= _structlog_floor[0] or not _floor_holds()
        return logging.getLogger(self._name).isEnabledFor(level)

    def _emit(
        self, level: int, event: str, fields: dict[str, Any], *, exc_info: bool = False
    ) -> None:
        if structlog.is_configured():
            if level < _structlog_floor[0] and _floor_holds():
                return
            method = "exception" if exc_info else logging.getLevelName(level).lower()
            getattr(self._structlog, method)(event, **fields)
            return
        # Looked up at each call, not at import: `logging.config.dictConfig` disables the
        # loggers that exist when it runs (unless told not to), and an application that
        # imports outbox before configuring its logging would lose outbox's lines.
        stdlib = logging.getLogger(self._name)
        if not stdlib.isEnabledFor(level):
            return
        message = f"{event} {_LOGFMT(None, '', dict(fields))}" if fields else event
        extra = {f"{k}_" if k in _RECORD_ATTRIBUTES else k: v for k, v in fields.items()}
        stdlib.log(
            level,
            message,
            exc_info=exc_info,
            extra={"event": event, **extra},
            stacklevel=_CALLER,
        )


_structlog_floor: tuple[int, Any] = (logging.NOTSET, None)


def filter_below(level: int, wrapper_class: Any) -> None:
    """Say that the process's structlog configuration, whose ``wrapper_class`` is given, drops
    events below ``level`` (the ``outbox`` command's ``--log-level``): such an event then costs
    a comparison, where structlog would build a bound logger for it first (its loggers are not
    cached, so that a configuration made later is followed). Whoever configures structlog
    again, with a wrapper class of its own, gets every event."""
    global _structlog_floor
    _structlog_floor = (level, wrapper_class)


def _floor_holds() -> bool:
    """The configuration :func:`filter_below` described is still the process's."""
    return structlog.get_config()["wrapper_class"] is _structlog_floor[1]


def get_logger(name: str) -> Logger:
    """The logger of an outbox module (``outbox.<module>``, its ``__name__``)."""
    return Logger(name)
