"""The catalogue of log event names outbox emits (docs/operations.md lists them).

The library only emits, through ``structlog.get_logger``; it never configures logging. Names
are stable: dashboards and alerts may match on them. No event carries payloads or passwords.
"""

from __future__ import annotations

import structlog

BATCH_HANDLED = "outbox.batch.handled"  # one line per batch: handler, group, size, outcome, ...
LEASE_LOST = "outbox.lease.lost"
GROUP_CLAIMED = "outbox.group.claimed"
CLAIMS_ENQUEUED = "outbox.distribute.enqueued"
# Events wait with no claim job and nothing distributes (no cron, workers with --no-distribute).
DISTRIBUTION_MISSING = "outbox.distribute.missing"
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
WORKER_PROCESS_RESTARTING = "outbox.worker.process_restarting"
WORKER_PROCESS_FAILED = "outbox.worker.process_failed"
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
ARCHIVE_EDITED = "outbox.archive.edited"  # a dead event replayed with values an operator changed
GROUPS_DISCARDED = "outbox.groups.discarded"  # an operator gave groups up
WEB_DATABASE_ERROR = "outbox.web.database_error"  # the dashboard or API could not read or write
WEB_WRITE = "outbox.web.write"  # a write through the dashboard or the API, with who did it


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """The logger of an outbox module."""
    return structlog.get_logger(name)  # type: ignore[no-any-return]
