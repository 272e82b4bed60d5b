"""Exceptions raised by outbox.

Every exception derives from :class:`OutboxError`::

    OutboxError
    ├── ConfigurationError      bad settings, a bad handler registration, an unknown handler
    ├── SchemaMissingError      the framework's tables are not there: run ``outbox migrate``
    ├── SchemaIncompatibleError  the database's schema generation is one this outbox's workers
    │                           may not work on (too new for them, or downgraded under them)
    ├── BufferTableMissingError  a handler's buffer table is not there: the application's
    │                           migrations create it
    ├── DatabaseUnavailableError  the database cannot be reached (driver error kept as __cause__)
    ├── DownstreamUnavailableError  a handler's downstream (a broker, an API) cannot be reached
    │                           or refuses its configuration when a worker starts
    ├── UnsupportedDatabaseError  a dialect or server version outbox does not run on
    ├── LocalClockError         MariaDB/MySQL: local time would be stored beside UTC (a buffer's
    │                           ``created_at`` default, workers of an older release)
    ├── ReplayError             archived rows that cannot be put back into their buffer
    ├── HandlerTimeoutError     a handler call ran longer than its ``timeout`` (a failed attempt)
    ├── DataError               raised by a handler: the events caused this failure (the
    │                           downstream refused them), not the downstream
    ├── DownstreamError         raised by a handler: the downstream failed (down, 5xx, timeout)
    ├── HandlerFailedError      (in ``outbox.testing``; an AssertionError too) handlers failed
    │                           while ``outbox.testing.inline`` ran them in a test
    └── RetryAfter              raised by a handler: the downstream said when to come back
                                (in ``outbox.retry``; a deferral, not a failed attempt)
"""

from __future__ import annotations

from collections.abc import Mapping


class OutboxError(Exception):
    """The root of every exception outbox raises."""


class ConfigurationError(OutboxError, ValueError):
    """A setting, a handler registration or a name given to outbox is wrong."""


class SchemaMissingError(OutboxError):
    """The framework's tables do not exist in the database."""

    def __init__(self, missing: list[str]) -> None:
        self.missing = missing
        super().__init__(
            f"outbox tables missing: {', '.join(missing)}; run `outbox migrate` to create them"
        )


class SchemaIncompatibleError(OutboxError):
    """This outbox's workers may not work on the database's schema: it needs workers of a newer
    generation, or it was downgraded below the generation they understand.

    ``generation``: the database's schema generation (None: it records none, the tables were
    downgraded below generation 5); ``workers_from``: the oldest worker generation it accepts;
    ``worker_generation``: the generation this outbox understands.
    """

    def __init__(
        self,
        message: str,
        *,
        generation: int | None,
        workers_from: int | None,
        worker_generation: int,
    ) -> None:
        self.generation = generation
        self.workers_from = workers_from
        self.worker_generation = worker_generation
        super().__init__(message)


class BufferTableMissingError(OutboxError):
    """Buffer tables of registered handlers do not exist (not created yet, or dropped).

    ``missing`` maps each such handler's name to its table's name (``schema.table`` when the
    table has a schema). The application owns its buffer tables: its migrations (or
    ``Base.metadata.create_all``) create them, not ``outbox migrate``.
    """

    def __init__(self, missing: Mapping[str, str]) -> None:
        self.missing = dict(sorted(missing.items()))
        named = ", ".join(f"{table!r} of handler {name!r}" for name, table in self.missing.items())
        if len(self.missing) == 1:
            text = f"buffer table {named} does not exist: create it"
        else:
            text = f"buffer tables {named} do not exist: create them"
        super().__init__(f"{text} with the application's migrations (or Base.metadata.create_all)")


class DatabaseUnavailableError(OutboxError):
    """The database cannot be reached; the driver's error is the ``__cause__``."""


class DownstreamUnavailableError(OutboxError):
    """A handler's downstream cannot be reached, or refuses what it is configured with (wrong
    credentials, an unknown stream or exchange), when a worker starts (``outbox_start``, see
    :mod:`outbox.lifecycle`): the worker does not start, rather than fail every group."""


class UnsupportedDatabaseError(OutboxError):
    """The database is of a kind or version that outbox does not support."""


class LocalClockError(OutboxError):
    """MariaDB or MySQL would store a session's local time beside outbox's UTC: a buffer whose
    ``created_at`` defaults to ``CURRENT_TIMESTAMP`` read by a session outside UTC (``outbox
    migrate-buffers`` mends it), or workers of an older release, which write local time,
    running while a migration converts outbox's times to UTC (stop them first)."""


class ReplayError(OutboxError):
    """Archived rows could not be put back into their buffer."""


class GroupNotFoundError(OutboxError, LookupError):
    """No job, buffer row, archived event or attempt of this group is known."""

    def __init__(self, group_id: object) -> None:
        super().__init__(f"no group {group_id}: no job, event or attempt of it is known")
        self.group_id = group_id


class HandlerTimeoutError(OutboxError, TimeoutError):
    """A handler call ran longer than the handler's ``timeout``: the attempt failed."""


class DataError(OutboxError):
    """Raised by a handler: the events caused this failure, not the downstream (it answered,
    and refused what it was sent: a whole-call 400 or 422, a record it cannot read).

    The attempt fails as any failure does (backoff, bisection with ``bisect=True``, dead
    letters when the attempts run out), but a circuit breaker does not count it: a poison
    event says nothing about the downstream's health. ``raise outbox.DataError("...") from
    error`` keeps the original error as the cause.
    """


class DownstreamError(OutboxError):
    """Raised by a handler: the downstream failed (unreachable, a timeout, a 5xx). The attempt
    fails, and a circuit breaker counts it. An exception the handler does not mark is taken
    as the downstream's too, except while bisection isolates a poison event (see
    ``docs/flow-control.md``, "Failures have a cause")."""
