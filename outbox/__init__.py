"""outbox: the transactional outbox and buffer-table batching for SQLAlchemy 2.

Write events into buffer tables in the application's own transaction; outbox claims them in
groups and hands each group, in bulk, to a batch handler, with retries, dead letters and an
archive. See the README for a tour.
"""

from outbox._core.values import jsonable
from outbox.app import Outbox, Settings
from outbox.batch import Batch
from outbox.breaker import CircuitBreaker
from outbox.buffer import BufferMixin, add_events, add_events_async
from outbox.exceptions import (
    BufferTableMissingError,
    ConfigurationError,
    DatabaseUnavailableError,
    DataError,
    DownstreamError,
    DownstreamUnavailableError,
    GroupNotFoundError,
    HandlerTimeoutError,
    LocalClockError,
    OutboxError,
    ReplayError,
    SchemaIncompatibleError,
    SchemaMissingError,
    UnsupportedDatabaseError,
)
from outbox.flags import FlaggedRowsMixin
from outbox.handler import Delivery, Handler
from outbox.once import (
    DistributionResult,
    RescueResult,
    RunResult,
    WorkResult,
    distribute_once,
    rescue_once,
    run_once,
    work_once,
)
from outbox.ratelimit import RateLimit
from outbox.retry import RetryAfter, RetryPolicy
from outbox.schema import db_now
from outbox.urgency import Urgency

__all__ = [
    "Batch",
    "BufferMixin",
    "BufferTableMissingError",
    "CircuitBreaker",
    "ConfigurationError",
    "DataError",
    "DatabaseUnavailableError",
    "Delivery",
    "DistributionResult",
    "DownstreamError",
    "DownstreamUnavailableError",
    "FlaggedRowsMixin",
    "GroupNotFoundError",
    "Handler",
    "HandlerTimeoutError",
    "LocalClockError",
    "Outbox",
    "OutboxError",
    "RateLimit",
    "ReplayError",
    "RescueResult",
    "RetryAfter",
    "RetryPolicy",
    "RunResult",
    "SchemaIncompatibleError",
    "SchemaMissingError",
    "Settings",
    "UnsupportedDatabaseError",
    "Urgency",
    "WorkResult",
    "add_events",
    "add_events_async",
    "db_now",
    "distribute_once",
    "jsonable",
    "rescue_once",
    "run_once",
    "work_once",
]
