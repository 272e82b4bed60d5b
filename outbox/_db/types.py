"""The values the database layer hands back: jobs, claims, refused groups, index sizes."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload


@dataclass(frozen=True, slots=True)
class JobRow:
    """A job as a worker holds it after acquiring it."""

    id: int
    kind: str
    handler: str
    slot: int | None
    group_id: uuid.UUID | None
    priority: int
    attempts: int
    lease_token: uuid.UUID
    last_error: str | None
    deferrals: int = 0
    """Attempts put off for a downstream's Retry-After (not counted in ``attempts``)."""
    lease_owner: str | None = None
    """The worker it is leased to."""


@dataclass(frozen=True, slots=True)
class HandlerState:
    """What the fleet agrees on about a handler (its row of ``outbox_handlers``)."""

    name: str
    paused: bool
    paused_for: float | None
    """Seconds until the pause ends by itself; None when not paused, or paused until resumed."""
    cause: str | None
    """Who paused it (:class:`outbox.schema.PauseCause`), while paused."""
    reason: str | None
    failures: int
    """Consecutive failed groups, counted for the circuit breaker."""
    trips: int
    """Consecutive openings of the circuit breaker."""


@dataclass(frozen=True, slots=True)
class HeldKey:
    """An ordering key a dead group holds back: its later events wait until it is released."""

    handler: str
    key: str
    group_id: uuid.UUID
    error: str | None


@dataclass(frozen=True, slots=True)
class RecentDeadLetters:
    """A handler's dead letters archived within a window, and the newest one's error."""

    handler: str
    since: float
    """The window, in seconds back from now."""
    count: int
    newest_age: float
    """Seconds since the newest was archived, by the database clock."""
    newest_error: str | None


@dataclass(frozen=True, slots=True)
class PrunedChunk:
    """What one chunk of a prune deleted, and where the next chunk's pick starts."""

    deleted: int
    last_archived_at: dt.datetime | None
    """The latest ``archived_at`` of the rows deleted; None when none were."""


@dataclass(frozen=True)
class RefusedGroup:
    """A group whose finishing write the database refused."""

    handler: str
    group_id: uuid.UUID
    attempts: int
    error: str | None


@dataclass(frozen=True, slots=True)
class SilentHolder:
    """A leased job whose holder has stopped heartbeating. Seconds, by the database clock."""

    handler: str
    kind: str
    group_id: uuid.UUID | None
    """The group of a batch job; None for a claim job."""
    holder: str
    """The holding worker's id."""
    heartbeat_age: float
    """Seconds since the holder's last heartbeat."""
    lease_left: float
    """Seconds until the job's lease runs out (negative: it has)."""


class UnreadableRowsError(Exception):
    """Rows were claimed, but one of their stored values could not be turned into Python: by
    the driver, or by its column's type (an Enum member since removed, a TypeDecorator's
    ``process_result_value`` that raises). The claim itself stands."""


class TupleRows(Sequence[Any]):
    """Claimed rows as the driver returned them, plain tuples, that become ``Row`` objects only
    when something reads them as rows.

    A claim on PostgreSQL whose columns all come from psycopg as their Python values (no
    column type processes them) needs no ``Row`` to be built per event: a handler that reads
    ``batch.events`` gets its instances from the tuples, and the worker reads ids and creation
    times from them by position. Anything that indexes or iterates this sequence gets the same
    ``Row`` objects a SQLAlchemy result gives, built once, on first use.

    ``tuples`` may carry values past the table's columns (the claim's own), left out of the
    rows; ``fields``: the table's column names, in order; ``make_row``: a ``Row`` of a tuple of
    the table's columns, as the claim's result would have made it.
    """

    __slots__ = ("_made", "fields", "make_row", "tuples")

    def __init__(
        self,
        tuples: list[tuple[Any, ...]],
        fields: tuple[str, ...],
        make_row: Callable[[tuple[Any, ...]], Any],
    ) -> None:
        self.tuples = tuples
        self.fields = fields
        self.make_row = make_row
        self._made: list[Any] | None = None

    def rows(self) -> list[Any]:
        """The rows as ``Row`` objects (built on the first call)."""
        if self._made is None:
            width, make = len(self.fields), self.make_row
            self._made = [make(values[:width]) for values in self.tuples]
        return self._made

    def __len__(self) -> int:
        return len(self.tuples)

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return self.rows()[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.rows())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TupleRows):
            other = other.rows()
        return self.rows() == other

    __hash__ = None  # type: ignore[assignment]  # as a list's: it compares by its rows

    def __repr__(self) -> str:
        return repr(self.rows())


@dataclass(frozen=True, slots=True)
class LeasedClaim:
    """A group claimed on PostgreSQL together with its leased batch job."""

    rows: Sequence[Any]
    """The claimed rows, all columns in table order, by id; empty when nothing was claimed
    (a :class:`TupleRows` when they were read as the driver's tuples)."""
    job_id: int | None
    """The group's batch job; None when nothing was claimed."""
    more: bool
    """Unclaimed rows remained past the last claimed id (a hint; see below)."""


@dataclass(frozen=True, slots=True)
class IndexInfo:
    """An index of a buffer table, as ``outbox reindex`` sees it."""

    name: str
    bytes: int
    leftover: bool
    """An invalid index left by an interrupted ``REINDEX ... CONCURRENTLY``."""


# Spellings MariaDB and MySQL show for a default of the session's local clock (NOW() and
# LOCALTIMESTAMP are shown as CURRENT_TIMESTAMP, in lower case by MariaDB).
_LOCAL_DEFAULTS = ("current_timestamp", "now(", "localtime")


@dataclass(frozen=True, slots=True)
class SessionClock:
    """A session's time zone: its name, its offset from UTC now, and whether it is UTC."""

    time_zone: str
    """``@@session.time_zone``: ``SYSTEM``, an offset such as ``-05:00``, or a zone's name."""
    offset_seconds: int
    """Local time minus UTC, now, in seconds."""
    utc: bool
    """The zone is UTC all year: no offset now, and none in January or July."""


@dataclass(frozen=True, slots=True)
class CreatedAtClock:
    """A buffer table's ``created_at`` column as the database describes it."""

    default: str | None
    """The column's default as the database shows it (``current_timestamp()``,
    ``utc_timestamp(6)``); None when it has none."""
    column_type: str
    """Its type as declared: ``datetime``, ``datetime(6)``, ``timestamp(6)`` ..."""

    @property
    def local(self) -> bool:
        """A DATETIME whose default is the session's local clock, not UTC. (A TIMESTAMP's
        CURRENT_TIMESTAMP is stored as UTC by the server itself.)"""
        default = (self.default or "").lower()
        return (
            self.column_type.lower().startswith("datetime")
            and default.startswith(_LOCAL_DEFAULTS)
            and "utc" not in default
        )

    @property
    def whole_seconds(self) -> bool:
        """The column keeps whole seconds (a DATETIME with no fractional precision)."""
        return "(" not in self.column_type


@dataclass(frozen=True, slots=True)
class Conversion:
    """A buffer's rows with ids in (``converted_through``, ``last_local_id``] hold local time
    of ``time_zone``."""

    buffer: str
    time_zone: str
    last_local_id: int
    converted_through: int


@dataclass(frozen=True, slots=True)
class SchemaGeneration:
    """What the database says of its schema (the row of ``outbox_schema``)."""

    generation: int
    """The schema generation the database is at: its newest migration's number."""
    workers_from: int
    """The oldest worker generation that may work on it."""
    migrated_at: dt.datetime
    migrated_by: str | None
    """The outbox version that migrated it (or created the tables)."""


@dataclass(frozen=True, slots=True)
class WorkerVersion:
    """Live workers of one outbox version and schema generation."""

    version: str | None
    """None: workers that record no version (older than outbox 0.2)."""
    generation: int | None
    """The schema generation they understand; None: they record none (older than 5)."""
    live: int


@dataclass(frozen=True, slots=True)
class GroupFilter:
    """Which groups a listing takes; ``None``: any. ``statuses``:
    :class:`outbox.schema.GroupStatus` values; ``older_than``: seconds; ``error`` and
    ``payload``: text they hold, any case (a payload: a dead event's)."""

    handlers: Collection[str] | None = None
    statuses: Collection[str] | None = None
    older_than: float | None = None
    error: str | None = None
    group_ids: Collection[uuid.UUID] | None = None
    payload: str | None = None


@dataclass(frozen=True, slots=True)
class GroupRow:
    """A group as an operator's listing shows it."""

    position: int
    """Where it is in its listing's order (a job's id; a dead group's first archive row's):
    the next page starts after it."""
    handler: str
    group_id: uuid.UUID
    status: str
    """:class:`outbox.schema.GroupStatus`."""
    attempts: int
    deferrals: int
    age: float
    """Seconds since its job was made (a dead group: since it was archived)."""
    due_in: float | None
    """Seconds until its next run (< 0: overdue); None when it has none to tell."""
    worker: str | None
    """The worker that holds its lease."""
    error: str | None
    """Its last error (with traceback)."""


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """An attempt of a group that did not end in success."""

    attempt: int
    outcome: str
    """:class:`outbox.schema.AttemptOutcome`."""
    worker: str | None
    error: str | None
    age: float
    """Seconds since it ended."""
    handler: str = ""
    """The handler whose group it is."""


@dataclass(frozen=True, slots=True)
class OperationRow:
    """An operator's replay, edit or discard, as recorded."""

    id: int
    action: str
    """:class:`outbox.schema.OperationAction`."""
    actor: str
    selection: str | None
    """The filter it was given, as JSON."""
    groups: int
    events: int
    detail: str | None
    done_at: dt.datetime


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """A worker of the fleet: where it runs, since when, how lately heard from, what it holds,
    and whether it leads (distributes for the fleet). Ages are seconds, by the database
    clock."""

    id: str
    hostname: str
    pid: int
    concurrency: int
    version: str | None
    generation: int | None
    started_age: float
    heartbeat_age: float
    groups_held: int
    """Jobs it holds a lease on now."""
    alive: bool
    """It heartbeated recently enough to count as alive."""
    leader: bool = False
    """It is the live worker that distributes for the fleet."""
    request: str | None = None
    """What an operator asked of it (``drain`` or ``stop``, acted on at its next heartbeat);
    None: nothing."""
    requested_by: str | None = None
    """Who asked."""


@dataclass(frozen=True, slots=True)
class WorkerAsked:
    """An operator's request to one worker, as its heartbeat reads it."""

    request: str
    """``drain`` or ``stop``."""
    requested_by: str | None


@dataclass(frozen=True, slots=True)
class ThroughputRow:
    """What a handler handled in one minute: events delivered and dead-lettered, groups that
    failed an attempt."""

    handler: str
    minute: dt.datetime
    """The minute's start, UTC."""
    succeeded: int
    dead: int
    failed: int


@dataclass(frozen=True, slots=True)
class ThroughputBucket:
    """What a handler handled in one bucket of a chart (``throughput_buckets``): events
    delivered and dead-lettered, groups that failed an attempt."""

    handler: str
    ago: int
    """Buckets back from now: 0 is the newest."""
    succeeded: int
    dead: int
    failed: int


@dataclass(frozen=True, slots=True)
class ScalingRow:
    """What one handler has waiting, running and handled, as the scaling read finds it
    (``scaling_rows``): index ends rather than counts. Ages are float seconds, by the
    database clock."""

    handler: str
    first_unclaimed: int | None
    """The lowest id of an unclaimed row; None when none waits unclaimed."""
    last_unclaimed: int | None
    newest_unclaimed_age: float | None
    """Age of the newest unclaimed row."""
    first_id: int | None
    """The lowest id in the buffer; None when it is empty."""
    last_id: int | None
    oldest_age: float | None
    """Age of the oldest row in the buffer."""
    runnable_groups: int
    """Batch jobs a worker may lease now: not leased, due (not deferred, throttled or backing
    off)."""
    live_leases: int
    """Jobs of the handler leased now, lease not run out."""
    paused: bool
    recent_handled: int
    """Events succeeded or dead-lettered over the rate window."""
    recent_seconds: float
    """Seconds the minutes of ``recent_handled`` cover (the minutes in which it handled
    something; this minute as far as it has gone)."""
    recent_busy: float
    """Seconds worker slots spent running the handler's groups over the rate window (in the
    minutes that recorded it)."""
    busy_handled: int
    """Events succeeded or dead-lettered in the minutes of ``recent_busy``."""
    handled: int
    """Events succeeded or dead-lettered over the Apdex window."""
    satisfied: int
    tolerating: int
    fleet_slots: int
    """Slots of the live workers (the sum of their concurrency), fleet-wide."""
