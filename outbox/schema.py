"""The framework's own tables, defined once.

The alembic migrations in ``migrations/`` create exactly these (a test proves it);
``outbox schema sql`` prints their DDL for teams that manage schema by hand.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Connection,
    DateTime,
    Double,
    Index,
    Insert,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    Uuid,
    event,
    insert,
    text,
)
from sqlalchemy.dialects.mysql import DATETIME as MYSQL_DATETIME
from sqlalchemy.dialects.mysql import VARBINARY
from sqlalchemy.dialects.mysql import VARCHAR as MYSQL_VARCHAR
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.expression import FunctionElement
from sqlalchemy.types import TypeDecorator, TypeEngine

from outbox._core.version import VERSION

GENERATION = 11
"""The schema generation of these tables: the number of the newest migration outbox ships.
A worker records it as the generation it understands; ``outbox_schema`` records the generation
the database is at (a test checks that the newest migration declares the same)."""
WORKERS_FROM = 1
"""The oldest worker generation that works correctly on these tables: every migration so far
only added, so workers of every generation do (a test checks the newest migration says so)."""


def timestamp() -> TypeEngine[Any]:
    """The type of every point in time outbox stores: ``DateTime(timezone=True)``, to the
    microsecond on every database. MariaDB's and MySQL's plain DATETIME keeps whole seconds,
    which would cut a lease of a few seconds short by up to one: there it is DATETIME(6)."""
    return DateTime(timezone=True).with_variant(MYSQL_DATETIME(fsp=6), "mysql", "mariadb")


class db_now(FunctionElement[Any]):  # noqa: N801 - named like the SQL function it renders
    """The database's current time. Every lease and backoff is computed from it.

    Public as ``outbox.db_now``: the ``created_at`` default of every buffer table, which
    compiles to each database's own clock when the DDL runs, so a migration that writes
    ``server_default=outbox.db_now()`` runs on every supported database. How it renders on
    each database, its package of ``outbox._db`` says (``@compiles`` in its ``clock`` module).
    """

    type = DateTime(timezone=True)
    inherit_cache = True


NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

# SQLite only autoincrements a column declared exactly INTEGER PRIMARY KEY.
_BIG_ID = BigInteger().with_variant(Integer(), "sqlite")
_NAME = String(200)
_VERSION = String(64)


class JobKind(StrEnum):
    """What a job of ``outbox_jobs`` does: claim one group, or handle one group."""

    CLAIM = "claim"
    BATCH = "batch"


class JobState(StrEnum):
    """Where a job stands, as ``outbox status`` counts them (derived from its lease columns)."""

    WAITING = "waiting"
    """Due or scheduled, never attempted."""
    RETRYING = "retrying"
    """Attempted and failed; its next attempt is scheduled."""
    RUNNING = "running"
    """Leased by a worker now."""
    REFUSED = "refused"
    """Held: the database refused to record its group's outcome (``outbox refused``)."""


class PauseCause(StrEnum):
    """Who paused a handler (``outbox_handlers.pause_cause``)."""

    OPERATOR = "operator"
    """``outbox pause`` or :func:`outbox.ops.flow.pause`: until the given time, or until resumed."""
    RETRY_AFTER = "retry_after"
    """A handler raised :class:`outbox.RetryAfter` for a whole group: until then."""
    BREAKER = "breaker"
    """The handler's circuit breaker opened after consecutive failed groups."""


class ArchiveStatus(StrEnum):
    """Why an event is in ``outbox_archive``."""

    SUCCEEDED = "succeeded"
    DEAD = "dead"
    EXPIRED = "expired"
    DISCARDED = "discarded"
    SUPERSEDED = "superseded"
    """Folded into a later event of its key by a coalescing handler (``coalesce=True``), when
    their group succeeded: the later event carried the state it had (or, retried by the
    handler, carries it on; should that one die, replaying it restores the state). Never
    replayed itself."""
    REPLAYED = "replayed"
    """Put back into its buffer by a replay: kept as a record of what was replayed, marked with
    the operation that did it (``operation_id``) and the event it became (``replay_event_id``)."""


class GroupStatus(StrEnum):
    """Where a group stands, as ``outbox groups`` lists them. A group with a job is the first
    that holds of refused, in flight, paused, retrying, deferred, waiting; a dead group is held
    while one of its ordering keys is held back, dead otherwise."""

    IN_FLIGHT = "in_flight"
    """A worker holds its lease now."""
    WAITING = "waiting"
    """Due or scheduled, never attempted."""
    RETRYING = "retrying"
    """Attempted and failed; its next attempt is scheduled."""
    DEFERRED = "deferred"
    """Put off by its downstream (``RetryAfter``), not yet failed."""
    PAUSED = "paused"
    """Not in flight, and its handler is paused: it waits for the handler to resume."""
    REFUSED = "refused"
    """The database refused to record its outcome: held until released (``outbox refused``)."""
    HELD = "held"
    """Dead, and holding its ordering keys' later events back until replayed or released."""
    DEAD = "dead"
    """Dead-lettered: its events are in the archive."""


class AttemptOutcome(StrEnum):
    """How an attempt of a group ended, when not in success (``outbox_attempts.outcome``)."""

    FAILED = "failed"
    """The handler failed it; the group waits for its next attempt."""
    DEAD = "dead"
    """The handler failed its last attempt: the group was dead-lettered."""
    DEFERRED = "deferred"
    """The downstream said when to come back (``RetryAfter``): not counted as an attempt."""
    LEASE_EXPIRED = "lease_expired"
    """Its worker stopped, or went silent, before finishing it: the group was rescued."""
    REFUSED = "refused"
    """The database refused to record its outcome: held until an operator releases it."""


class OperationAction(StrEnum):
    """What an operator did (``outbox_operations.action``)."""

    REPLAY = "replay"
    """Archived events put back into their buffers."""
    EDIT = "edit"
    """A dead event's values changed and replayed as a new event."""
    DISCARD = "discard"
    """Groups given up: their events archived (or kept archived) as discarded."""
    PAUSE = "pause"
    """A handler paused by an operator."""
    RESUME = "resume"
    """A handler's pause ended by an operator."""
    RELEASE = "release"
    """Refused groups given back to the workers, or held ordering keys let go."""
    RETRY = "retry"
    """Groups waiting for a retry or a deferral made due now."""
    DRAIN = "drain"
    """A worker asked to finish what it holds, take no more and exit."""
    STOP = "stop"
    """A worker asked to stop, as SIGTERM stops it."""


class WorkerRequest(StrEnum):
    """What an operator asked of one worker (``outbox_workers.request``), which it acts on at
    its next heartbeat."""

    DRAIN = "drain"
    """Finish the groups it holds, however long they take; take no more; exit."""
    STOP = "stop"
    """Stop taking work; what it holds finishes within its shutdown grace period (SIGTERM)."""


jobs = Table(
    "outbox_jobs",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("kind", String(8), nullable=False, comment="'claim' or 'batch'"),
    Column("handler", _NAME, nullable=False),
    Column("slot", SmallInteger, nullable=True, comment="claim jobs: 0 .. max_batches - 1"),
    Column("group_id", Uuid, nullable=True, comment="batch jobs: the group they handle"),
    Column("priority", SmallInteger, nullable=False),
    Column("run_at", timestamp(), nullable=False, server_default=db_now()),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    Column("lease_owner", _NAME, nullable=True),
    Column("lease_token", Uuid, nullable=True),
    Column("lease_expires_at", timestamp(), nullable=True),
    Column("last_error", Text, nullable=True),
    Column("created_at", timestamp(), nullable=False, server_default=db_now()),
    Column(
        "deferrals",
        Integer,
        nullable=False,
        server_default=text("0"),
        comment="attempts put off for the downstream's Retry-After, not counted in attempts",
    ),
    # Serves acquisition: the next free jobs by priority, then due time.
    Index(
        "ix_outbox_jobs_ready",
        "priority",
        "run_at",
        "id",
        postgresql_where=text("lease_token IS NULL"),
        sqlite_where=text("lease_token IS NULL"),
    ),
    # Serves rescue: leases that ran out.
    Index(None, "lease_expires_at"),
    # One claim job per slot: overlapping distributors cannot enqueue more than max_batches.
    Index("uq_outbox_jobs_claim_slot", "handler", "slot", unique=True),
    # One batch job per group.
    Index("uq_outbox_jobs_group_id", "group_id", unique=True),
)

archive = Table(
    "outbox_archive",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("handler", _NAME, nullable=False),
    Column("buffer", _NAME, nullable=False, comment="the buffer table the event came from"),
    Column("event_id", BigInteger, nullable=False),
    Column("group_id", Uuid, nullable=True),
    Column(
        "status",
        String(16),
        nullable=False,
        comment="succeeded, dead, expired, discarded or replayed",
    ),
    Column("attempts", Integer, nullable=False),
    Column("error", Text, nullable=True),
    Column("payload", JSON().with_variant(JSONB(), "postgresql"), nullable=False),
    Column("created_at", timestamp(), nullable=True),
    Column("archived_at", timestamp(), nullable=False, server_default=db_now()),
    Column(
        "operation_id",
        BigInteger,
        nullable=True,
        comment="the operation (outbox_operations) that replayed or discarded it",
    ),
    Column(
        "replay_event_id",
        BigInteger,
        nullable=True,
        comment="the id of the event a replay made of it, in its buffer",
    ),
    Index(None, "handler", "status"),
    Index(None, "archived_at"),
    Index(None, "group_id"),
)

handlers = Table(
    "outbox_handlers",
    metadata,
    Column("name", _NAME, primary_key=True),
    Column("paused_at", timestamp(), nullable=True, comment="set while the handler is paused"),
    Column(
        "paused_until",
        timestamp(),
        nullable=True,
        comment="when the pause ends by itself; NULL while paused: until resumed",
    ),
    Column("pause_cause", String(16), nullable=True, comment="operator, retry_after or breaker"),
    Column("pause_reason", Text, nullable=True),
    Column(
        "failures",
        Integer,
        nullable=False,
        server_default=text("0"),
        comment="consecutive failed groups (circuit breaker)",
    ),
    Column(
        "trips",
        Integer,
        nullable=False,
        server_default=text("0"),
        comment="consecutive openings of the circuit breaker; > 0 while it probes",
    ),
    Column(
        "distributed_tick",
        BigInteger,
        nullable=True,
        comment="the newest distribution tick taken for the handler; NULL: none yet",
    ),
)

attempts = Table(
    "outbox_attempts",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("handler", _NAME, nullable=False),
    Column("group_id", Uuid, nullable=False),
    Column("attempt", Integer, nullable=False, comment="the group's attempts when it ended"),
    Column(
        "outcome",
        String(16),
        nullable=False,
        comment="failed, dead, deferred, lease_expired or refused",
    ),
    Column("worker", _NAME, nullable=True, comment="the worker that held it; NULL: not known"),
    Column("error", Text, nullable=True, comment="type, message and traceback"),
    Column("finished_at", timestamp(), nullable=False, server_default=db_now()),
    # Serves a group's history (outbox show) and the prune's check that a group is gone.
    Index(None, "group_id"),
    # Serves prune by age.
    Index(None, "finished_at"),
)

operations = Table(
    "outbox_operations",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column(
        "action",
        String(16),
        nullable=False,
        comment="replay, edit, discard, pause, resume, release, drain or stop",
    ),
    Column("actor", _NAME, nullable=False, comment="who did it: user@host, or a login"),
    Column("selection", Text, nullable=True, comment="the filter it was given, as JSON"),
    Column("groups", Integer, nullable=False, server_default=text("0")),
    Column("events", Integer, nullable=False, server_default=text("0")),
    Column("detail", Text, nullable=True),
    Column("done_at", timestamp(), nullable=False, server_default=db_now()),
    Index(None, "done_at"),
)

# Text a MariaDB column compares byte for byte, without padding, and still reads as text.
EXACT_VARCHAR_200 = MYSQL_VARCHAR(200, charset="utf8mb4", collation="utf8mb4_nopad_bin")

ingest_keys = Table(
    "outbox_ingest_keys",
    metadata,
    Column("handler", _NAME, primary_key=True),
    Column(
        "key",
        # Compared exactly on MariaDB too (its text collations take "K" for "k", "k " for "k").
        String(200).with_variant(EXACT_VARCHAR_200, "mysql", "mariadb"),
        primary_key=True,
        comment="the producer's idempotency key",
    ),
    Column("event_id", BigInteger, nullable=False, comment="the event it wrote, in its buffer"),
    Column("received_at", timestamp(), nullable=False, server_default=db_now()),
    # Serves prune by age.
    Index(None, "received_at"),
)

MESSAGE_ID_LENGTH = 400
"""The longest message id the inbox keeps as it is; a longer one is kept as its SHA-256."""


class ExactText(TypeDecorator[str]):
    """Text compared byte for byte on every database: MariaDB's text collations would take
    "A1" for "a1", or "x " for "x", and an inbox would drop a message it never received. There
    it is ``VARBINARY`` (four bytes a character, UTF-8's longest), written and read as text."""

    impl = String
    cache_ok = True

    def __init__(self, length: int) -> None:
        super().__init__(length)
        self.length = length

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(VARBINARY(4 * self.length))
        return dialect.type_descriptor(String(self.length))

    def process_bind_param(self, value: str | None, dialect: Dialect) -> Any:
        if value is not None and dialect.name in ("mysql", "mariadb"):
            return value.encode()
        return value

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        return value.decode() if isinstance(value, bytes | bytearray) else value


inbox = Table(
    "outbox_inbox",
    metadata,
    Column("inbox", ExactText(200), primary_key=True),
    Column(
        "message_id",
        ExactText(MESSAGE_ID_LENGTH),
        primary_key=True,
        comment="the sender's message id",
    ),
    Column("received_at", timestamp(), nullable=False, server_default=db_now()),
    Column(
        "expires_at",
        timestamp(),
        nullable=False,
        comment="received_at plus the inbox's horizon: pruned once past",
    ),
    # Serves the prune of expired ids.
    Index(None, "expires_at"),
)

throughput = Table(
    "outbox_throughput",
    metadata,
    Column("handler", _NAME, primary_key=True),
    Column("minute", timestamp(), primary_key=True, comment="the minute counted, UTC"),
    Column("succeeded", BigInteger, nullable=False, server_default=text("0")),
    Column("dead", BigInteger, nullable=False, server_default=text("0")),
    Column("failed", BigInteger, nullable=False, server_default=text("0"), comment="groups"),
    Column(
        "satisfied",
        BigInteger,
        nullable=False,
        server_default=text("0"),
        comment="events handled within their band's promise",
    ),
    Column(
        "tolerating",
        BigInteger,
        nullable=False,
        server_default=text("0"),
        comment="events handled later than their band's promise, within four times it",
    ),
    Column(
        "busy_seconds",
        Double,
        nullable=False,
        server_default=text("0"),
        comment="seconds worker slots spent running this handler's groups in the minute",
    ),
)

held_keys = Table(
    "outbox_held_keys",
    metadata,
    Column("handler", _NAME, primary_key=True),
    Column("key", String(400), primary_key=True, comment="the ordering key's value, as text"),
    Column("group_id", Uuid, nullable=False, comment="the dead group that holds the key"),
    Column("error", Text, nullable=True),
    Column("held_at", timestamp(), nullable=False, server_default=db_now()),
)

rate_limits = Table(
    "outbox_rate_limits",
    metadata,
    Column("handler", _NAME, primary_key=True),
    Column("key", _NAME, primary_key=True, comment="'calls' or 'events'"),
    Column(
        "tat",
        timestamp(),
        nullable=True,
        comment="the theoretical arrival time of the next call (GCRA); NULL: now",
    ),
    Column(
        "starts",
        Text,
        nullable=True,
        comment="the recent starts the limit's window counts; NULL: none",
    ),
    Column(
        "starts_until",
        timestamp(),
        nullable=True,
        comment="when the last of the recent starts leaves the window",
    ),
)

workers = Table(
    "outbox_workers",
    metadata,
    Column("id", _NAME, primary_key=True),
    Column("hostname", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("started_at", timestamp(), nullable=False, server_default=db_now()),
    Column("heartbeat_at", timestamp(), nullable=False, server_default=db_now()),
    Column(
        "version",
        _VERSION,
        nullable=True,
        comment="the worker's outbox version; NULL: a worker older than outbox 0.2",
    ),
    Column(
        "generation",
        Integer,
        nullable=True,
        comment="the schema generation the worker understands; NULL: older than 5",
    ),
    Column(
        "request",
        String(8),
        nullable=True,
        comment="what an operator asked of the worker: drain or stop; NULL: nothing",
    ),
    Column("requested_by", _NAME, nullable=True, comment="who asked it"),
    Index(None, "heartbeat_at"),
)

schema_state = Table(
    "outbox_schema",
    metadata,
    Column("id", SmallInteger, primary_key=True, autoincrement=False, comment="1: one row"),
    Column(
        "generation",
        Integer,
        nullable=False,
        comment="the schema generation the database is at: its newest migration's number",
    ),
    Column(
        "workers_from",
        Integer,
        nullable=False,
        comment="the oldest worker generation that may work on it; older ones stop",
    ),
    Column("migrated_at", timestamp(), nullable=False, server_default=db_now()),
    Column("migrated_by", _VERSION, nullable=True, comment="the outbox version that migrated"),
)


def generation_row(
    generation: int = GENERATION, workers_from: int = WORKERS_FROM, version: str = VERSION
) -> Insert:
    """The INSERT of ``outbox_schema``'s one row: the database is at ``generation``, and
    workers of ``workers_from`` or newer may work on it."""
    return insert(schema_state).values(
        id=1, generation=generation, workers_from=workers_from, migrated_by=version
    )


@event.listens_for(schema_state, "after_create")
def _record_generation(target: Table, connection: Connection, **kw: Any) -> None:
    # Tables created without the migrations (``metadata.create_all``) are at this generation
    # too; ``outbox schema sql`` prints the same row.
    connection.execute(generation_row())


TABLE_NAMES = tuple(metadata.tables)
