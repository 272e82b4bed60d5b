"""Outbox: the application object (engine, registered handlers, settings)."""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sqlalchemy import JSON, Engine, Float, Table, TypeDecorator
from sqlalchemy import inspect as sa_inspect
from sqlalchemy.engine import URL
from sqlalchemy.types import TypeEngine

from outbox import _db
from outbox._core import handler_kind as _handler_kind
from outbox._core import log as _log
from outbox._core.checks import MAX_WAIT_SECONDS, is_number
from outbox._db import dialects
from outbox.batch import Batch
from outbox.breaker import CircuitBreaker
from outbox.buffer import BufferMixin
from outbox.exceptions import ConfigurationError
from outbox.ratelimit import RateLimit, Unit
from outbox.retry import MIN_RETRY_AFTER_SECONDS, RetryPolicy
from outbox.urgency import Urgency

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

log = _log.get_logger(__name__)

EventT = TypeVar("EventT", bound=BufferMixin)
HandlerFunc = Callable[[Batch[EventT]], None]
# What a handler returns: nothing (sync), or an awaitable outbox runs (async). A type variable,
# so that the decorator hands back the function's own type (a coroutine function stays one).
_ReturnT = TypeVar("_ReturnT", bound=Awaitable[None] | None)

DATABASE_URL_ENV = "OUTBOX_DATABASE_URL"

DEFAULT_BATCH_SIZE = 1000
DEFAULT_MAX_BATCHES = 50
DEFAULT_LEASE_SECONDS = 60.0
DEFAULT_POLL_INTERVAL_SECONDS = 1.0
DEFAULT_RESCUE_INTERVAL_SECONDS = 5.0
DEFAULT_WORKER_STALE_SECONDS = 20.0
MAX_BATCH_SIZE = 100_000
MAX_MAX_BATCHES = 10_000

# The buffer's own columns, which no option may name as an event's.
_BOOKKEEPING = ("id", "group_id", "created_at")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,199}$")


@dataclass(frozen=True, slots=True)
class Settings:
    """Settings shared by every handler of an application. Durations are float seconds.

    ``lease_seconds``: how long a worker holds a job before others may rescue it; workers
    extend the leases of running jobs every third of it. ``poll_interval``: how long an idle
    worker waits before looking for work again. ``rescue_interval``: how often workers look for
    expired leases. ``worker_stale_after``: a worker silent this long is gone: its jobs are
    rescued then, before their leases end, and workers heartbeat every third of it (or of the
    lease, when shorter).
    ``listen``: on PostgreSQL, idle workers LISTEN for new events and wake at once. Workers
    whose connections go through a pooler (PgBouncer), where LISTEN hears nothing, find work by
    polling instead without being told; ``False`` turns listening off everywhere.
    ``min_retry_after``: the shortest a deferral waits (:class:`outbox.RetryAfter`,
    ``batch.retry(after=)``), whatever the downstream said (1 s; at most an hour): a
    ``Retry-After: 0`` must not turn into a hundred calls a second. Tests of an application's
    handlers may lower it to run deferrals at once.
    """

    lease_seconds: float = DEFAULT_LEASE_SECONDS
    poll_interval: float = DEFAULT_POLL_INTERVAL_SECONDS
    rescue_interval: float = DEFAULT_RESCUE_INTERVAL_SECONDS
    worker_stale_after: float = DEFAULT_WORKER_STALE_SECONDS
    listen: bool = True
    min_retry_after: float = MIN_RETRY_AFTER_SECONDS

    def __post_init__(self) -> None:
        for name in ("lease_seconds", "poll_interval", "rescue_interval", "worker_stale_after"):
            value = getattr(self, name)
            if not value > 0:
                raise ConfigurationError(f"Settings.{name} must be > 0 seconds, got {value!r}")
        if not (is_number(self.min_retry_after) and 0 <= self.min_retry_after <= 3600):
            raise ConfigurationError(
                "Settings.min_retry_after must be a number of seconds from 0 to 3600, "
                f"got {self.min_retry_after!r}"
            )


class Delivery(StrEnum):
    """How often a handler may see a group.

    ``AT_LEAST_ONCE`` (the default): a group whose attempt was interrupted (its worker died, its
    handler timed out) is handed over again; handlers must be idempotent.
    ``AT_MOST_ONCE``: for handlers that are not idempotent. A group whose attempt was
    interrupted is dead-lettered instead of being run again: it may or may not have been
    delivered, and running it twice is the one thing not allowed. A handler that raises still
    has its group retried: by raising, it said that it delivered nothing.
    """

    AT_LEAST_ONCE = "at_least_once"
    AT_MOST_ONCE = "at_most_once"


@dataclass(frozen=True, slots=True)
class Handler(Generic[EventT]):
    """A registered batch handler and its options (see :meth:`Outbox.handler`)."""

    name: str
    model: type[EventT]
    func: Callable[[Batch[EventT]], Awaitable[None] | None] = field(repr=False)
    batch_size: int
    urgency: Urgency
    retry: RetryPolicy
    archive: bool
    max_batches: int
    timeout: float | None = None
    expires_after: float | None = None
    delivery: Delivery = Delivery.AT_LEAST_ONCE
    max_wait: float | None = None
    concurrency: int | None = None
    circuit_breaker: CircuitBreaker | None = None
    rate_limit: RateLimit | Sequence[RateLimit] | None = None
    bisect: bool = False
    max_batch_bytes: int | None = None
    group_by: str | None = None
    ordering_key: str | None = None
    rate_limit_key: str | None = None
    is_async: bool = field(init=False, repr=False, compare=False)
    """Whether ``func`` returns a coroutine (``async def`` and the like), decided once here."""
    rate_limits: tuple[RateLimit, ...] = field(init=False, repr=False, compare=False)
    """Every rate limit of the handler, each with the key it applies per (``rate_limit_key``
    for those that name none), the key named as the table names its column."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_async", _handler_kind.is_async(self.func))
        object.__setattr__(self, "rate_limits", _rate_limits(self))

    @property
    def table(self) -> Table:
        """The buffer table the handler drains."""
        return self.model.__table__  # type: ignore[attr-defined, no-any-return]


class Outbox:
    """The application object: where the database is, and which handler drains which buffer.

    ``Outbox(url)`` or ``Outbox(engine=engine)``; with neither, the URL comes from
    ``OUTBOX_DATABASE_URL``. The engine is created on first use, so the CLI's
    ``--database-url`` can still replace the URL after the application module is imported.

    An async URL (``postgresql+asyncpg://``, ``sqlite+aiosqlite://``...) or an ``AsyncEngine``
    is not used as such: outbox runs its own work on a sync engine it creates from the same URL
    on the driver's sync sibling (:func:`outbox._db.sync_url`), with the ``AsyncEngine``'s
    ``json_serializer`` and ``json_deserializer`` but not its ``connect_args`` or pool settings
    (pass ``engine=create_engine(...)`` to choose them).
    """

    def __init__(
        self,
        url: str | URL | None = None,
        *,
        engine: Engine | AsyncEngine | None = None,
        settings: Settings | None = None,
    ) -> None:
        if url is not None and engine is not None:
            raise ConfigurationError("give Outbox a database URL or an engine, not both")
        self._url = url
        self._engine: Engine | None = None
        # Whether the URL is an AsyncEngine's: its engine is derived even when the URL names a
        # driver with a sync side too (create_async_engine("postgresql+psycopg://...")).
        self._from_async_engine = False
        # An AsyncEngine's JSON functions, which decide what its JSON columns hold: the derived
        # engine reads and writes JSON with them too.
        self._json: _db.JsonFunctions = {}
        if engine is not None:
            self._engine = _sync_engine(engine)
            if self._engine is None:
                self._url = engine.url
                self._from_async_engine = True
                self._json = _db.json_functions(engine)
            else:
                dialects.name_of(self._engine.dialect)
                dialects.configure_engine(self._engine)
                self._engine = dialects.read_committed(self._engine)
        self.settings = settings or Settings()
        self._handlers: dict[str, Handler[Any]] = {}

    # --- database ------------------------------------------------------------------------

    @property
    def url(self) -> URL:
        """The database URL outbox connects to (from the engine, the constructor or
        ``OUTBOX_DATABASE_URL``); for an async driver's URL, the sync one derived from it."""
        if self._engine is not None:
            return self._engine.url
        return _db.sync_url(self._given_url())

    def _given_url(self) -> URL:
        """The database URL as given, async driver and all."""
        from sqlalchemy.engine import make_url

        raw = self._url or os.environ.get(DATABASE_URL_ENV)
        if not raw:
            raise ConfigurationError(
                f"no database: pass a URL to Outbox(...), --database-url, or set {DATABASE_URL_ENV}"
            )
        return make_url(raw)

    @property
    def engine(self) -> Engine:
        """The engine outbox runs on, created from the URL on first use."""
        if self._engine is None:
            given = self._given_url()
            url = _db.sync_url(given)
            self._engine = _db.create_outbox_engine(
                url, idle_transaction_timeout=self.settings.lease_seconds, json_options=self._json
            )
            dialects.name_of(self._engine.dialect)
            if url is not given or self._from_async_engine:
                log.info(
                    _log.SYNC_ENGINE_DERIVED,
                    driver=url.drivername,
                    async_driver=given.drivername,
                    database=_db.describe(url),
                )
        return self._engine

    @property
    def dialect(self) -> str:
        """``postgresql``, ``sqlite`` or ``mysql``."""
        return dialects.name_of(self.engine.dialect)

    @property
    def supports(self) -> dialects.Supports:
        """What the database can do (asked instead of its name)."""
        return dialects.supports(self.dialect)

    def use_database(self, url: str | URL) -> None:
        """Point the application at another database (the CLI's ``--database-url``)."""
        if self._engine is not None:
            self._engine.dispose()
        self._engine = None
        self._url = url
        self._from_async_engine = False

    # --- handlers ------------------------------------------------------------------------

    def handler(
        self,
        model: type[EventT],
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        urgency: Urgency = Urgency.HOUR,
        retry: RetryPolicy | None = None,
        archive: bool = False,
        max_batches: int = DEFAULT_MAX_BATCHES,
        name: str | None = None,
        timeout: float | None = None,
        expires_after: float | None = None,
        delivery: Delivery | str = Delivery.AT_LEAST_ONCE,
        max_wait: float | None = None,
        concurrency: int | None = None,
        circuit_breaker: CircuitBreaker | None = None,
        rate_limit: RateLimit | Sequence[RateLimit] | None = None,
        bisect: bool = False,
        max_batch_bytes: int | None = None,
        group_by: str | None = None,
        ordering_key: str | None = None,
        rate_limit_key: str | None = None,
    ) -> Callable[[Callable[[Batch[EventT]], _ReturnT]], Callable[[Batch[EventT]], _ReturnT]]:
        """Register a batch handler for the buffer model ``model``: a function, or an
        ``async def`` one, that takes the batch (see the guide, "Async handlers").

        ``batch_size``: the most events in one group. ``urgency``: the band (priority and
        promise). ``retry``: attempts and backoff (default ``RetryPolicy()``). ``archive``: copy
        the rows of succeeded groups to ``outbox_archive`` instead of only deleting them.
        ``max_batches``: the most claim jobs the distributor keeps pending for this handler.
        ``name``: defaults to the function's name; the CLI and the tables know it by this name.
        ``timeout``: seconds a handler call may take; a longer call fails the attempt (an async
        handler is cancelled; a sync one's late result is ignored). ``expires_after``: seconds
        after which an event is archived as ``expired`` instead of handled. ``delivery``:
        :class:`Delivery`, at least once (default) or at most once. ``max_wait``: seconds; claim
        a group only when a full batch is waiting or the oldest unclaimed event has waited this
        long (default: claim at once).
        ``concurrency``: the most groups of this handler in flight at once across all workers,
        enforced by the database (default: no cap). ``circuit_breaker``: pause the handler
        after consecutive failed groups, then probe one group at a time
        (:class:`outbox.CircuitBreaker`; default: none). ``rate_limit``: calls and/or events
        the whole fleet, or each key, may send in any window, enforced in the database
        (:class:`outbox.RateLimit`, or a sequence of them all kept at once; default: none).
        ``bisect``: a group that fails as a whole is split in halves for its next attempt,
        until a poison event is alone (and ends dead on its own) and the others are delivered.
        ``max_batch_bytes``: a group also closes before its events' own columns, as text, pass
        this many bytes (bulk APIs cap request bodies); an event larger than that goes alone.
        ``group_by``: a column of the buffer; each group holds events of one value of it, and
        claims take the keys in turn, so that one key's backlog cannot hold up the others.
        ``ordering_key``: a column of the buffer;
        the events of one key are handled in id order, one group of the key at a time, and a
        group that fails holds the key's later events until it succeeds (or, dead, until it
        is replayed or its key released: ``outbox held``). ``rate_limit_key``: a column of the
        buffer; the limits of ``rate_limit`` that name no ``key`` apply to each of its values
        on its own (a limit per tenant): the shorthand of ``RateLimit(..., key=...)``.
        """

        def register(
            func: Callable[[Batch[EventT]], _ReturnT],
        ) -> Callable[[Batch[EventT]], _ReturnT]:
            self.add_handler(
                Handler(
                    name=name or _handler_kind.default_name(func),
                    model=model,
                    func=func,
                    batch_size=batch_size,
                    urgency=urgency,
                    retry=retry or RetryPolicy(),
                    archive=archive,
                    max_batches=max_batches,
                    timeout=timeout,
                    expires_after=expires_after,
                    delivery=_delivery(delivery),
                    max_wait=max_wait,
                    concurrency=concurrency,
                    circuit_breaker=circuit_breaker,
                    rate_limit=rate_limit,
                    bisect=bisect,
                    max_batch_bytes=max_batch_bytes,
                    group_by=group_by,
                    ordering_key=ordering_key,
                    rate_limit_key=rate_limit_key,
                )
            )
            return func

        return register

    def add_handler(self, handler: Handler[Any]) -> None:
        """Register a handler built by hand (``@app.handler`` is the usual way)."""
        handler = _validated(handler)
        if handler.name in self._handlers:
            raise ConfigurationError(f"a handler named {handler.name!r} is already registered")
        for other in self._handlers.values():
            if other.table is handler.table:
                raise ConfigurationError(
                    f"buffer {handler.table.name!r} already has handler {other.name!r}; "
                    f"one buffer has exactly one handler (use a buffer model per handler)"
                )
        self._handlers[handler.name] = handler

    @property
    def handlers(self) -> Mapping[str, Handler[Any]]:
        """The registered handlers by name."""
        return dict(self._handlers)

    def get_handler(self, name: str) -> Handler[Any]:
        """The handler called ``name``; the error lists the ones that exist."""
        try:
            return self._handlers[name]
        except KeyError:
            known = ", ".join(sorted(self._handlers)) or "none registered"
            raise ConfigurationError(f"unknown handler {name!r}; known handlers: {known}") from None

    def select_handlers(self, names: tuple[str, ...] | list[str] = ()) -> list[Handler[Any]]:
        """The handlers called ``names`` (all of them when empty), in registration order."""
        if not names:
            return list(self._handlers.values())
        return [self.get_handler(n) for n in names]

    def with_settings(self, **changes: Any) -> Settings:
        """Replace some settings (validated) and return the new ones."""
        self.settings = replace(self.settings, **changes)
        return self.settings


def _sync_engine(engine: Engine | AsyncEngine) -> Engine | None:
    """``engine``, or None for an ``AsyncEngine``, which outbox does not run on."""
    from sqlalchemy.ext.asyncio import AsyncEngine

    return None if isinstance(engine, AsyncEngine) else engine


def _delivery(value: Delivery | str) -> Delivery:
    try:
        return Delivery(value)
    except ValueError:
        choices = ", ".join(d.value for d in Delivery)
        raise ConfigurationError(f"delivery must be one of {choices}, got {value!r}") from None


# What each option of a handler must be (or None, but for those in _REQUIRED), checked before
# its value, so that a wrong kind of value is refused here rather than failing every group.
_OPTION_KINDS: dict[str, tuple[type, ...]] = {
    "batch_size": (int,),
    "max_batches": (int,),
    "urgency": (Urgency,),
    "delivery": (Delivery,),
    "retry": (RetryPolicy,),
    "archive": (bool,),
    "bisect": (bool,),
    "concurrency": (int,),
    "max_batch_bytes": (int,),
    "timeout": (int, float),
    "expires_after": (int, float),
    "max_wait": (int, float),
    "circuit_breaker": (CircuitBreaker,),
    "group_by": (str,),
    "ordering_key": (str,),
    "rate_limit_key": (str,),
}
_REQUIRED = ("batch_size", "max_batches", "urgency", "delivery", "retry", "archive", "bisect")


def _check_kinds(handler: Handler[Any]) -> None:
    for option, kinds in _OPTION_KINDS.items():
        value = getattr(handler, option)
        if value is None and option not in _REQUIRED:
            continue
        # A bool is an int to isinstance, but True as a batch size is a mistake.
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            names = " or ".join(kind.__name__ for kind in kinds)
            optional = "" if option in _REQUIRED else " or None"
            raise ConfigurationError(
                f"handler {handler.name!r}: {option} must be {names}{optional}, got {value!r}"
            )


# Column types a key option cannot have. group_by finds each key's rows by the value it read
# back, which a float may not equal once read (MariaDB's FLOAT is single precision) and a JSON
# document may not equal as stored; ordering_key compares a column with itself, which JSON
# cannot on PostgreSQL. rate_limit_key is read in Python only: any type will do.
_UNFIT_KEY_TYPES: dict[str, tuple[type[TypeEngine[Any]], ...]] = {
    "group_by": (Float, JSON),
    "ordering_key": (JSON,),
}
_WHY_UNFIT = {
    "group_by": "a float or JSON value read back may not compare equal to the stored one",
    "ordering_key": "JSON has no equality on every database",
}


def _underlying(column_type: TypeEngine[Any]) -> TypeEngine[Any]:
    """The type a TypeDecorator stores its values as (the type itself for any other)."""
    while isinstance(column_type, TypeDecorator):
        column_type = column_type.impl_instance
    return column_type


def _column_key(model: type[Any], name: str | None) -> str | None:
    """A column named by the model's attribute (``page``) or the table's column
    (``page_path``): the key the table knows it by (``table.c``), which its SQL uses."""
    if name is None or name in model.__table__.c:
        return name
    mapper = sa_inspect(model, raiseerr=False)
    attribute = None if mapper is None else mapper.attrs.get(name)
    columns: list[Any] = list(getattr(attribute, "columns", ()))
    if len(columns) == 1 and columns[0].table is model.__table__:
        return str(columns[0].key)
    return name


def _validated(handler: Handler[Any]) -> Handler[Any]:
    """The handler, its options checked, its key columns named as the table names them."""
    _check_kinds(handler)
    model = handler.model
    if not (isinstance(model, type) and issubclass(model, BufferMixin)):
        raise ConfigurationError(
            f"{getattr(model, '__name__', model)!r} is not a buffer model: "
            "a handler's model must inherit outbox.BufferMixin"
        )
    if getattr(model, "__table__", None) is None:
        raise ConfigurationError(f"{model.__name__} is not a mapped model (no __table__)")
    if not _NAME.fullmatch(handler.name):
        raise ConfigurationError(
            f"handler name {handler.name!r} is not valid: letters, digits, _ . : -, "
            "starting with a letter or _, at most 200 characters"
        )
    if not 1 <= handler.batch_size <= MAX_BATCH_SIZE:
        raise ConfigurationError(
            f"handler {handler.name!r}: batch_size must be 1..{MAX_BATCH_SIZE}, "
            f"got {handler.batch_size}"
        )
    if not 1 <= handler.max_batches <= MAX_MAX_BATCHES:
        raise ConfigurationError(
            f"handler {handler.name!r}: max_batches must be 1..{MAX_MAX_BATCHES}, "
            f"got {handler.max_batches}"
        )
    if handler.concurrency is not None and handler.concurrency < 1:
        raise ConfigurationError(
            f"handler {handler.name!r}: concurrency must be >= 1 or None, "
            f"got {handler.concurrency!r}"
        )
    keys = {
        option: _column_key(model, getattr(handler, option))
        for option in ("group_by", "ordering_key", "rate_limit_key")
    }
    for option, column in keys.items():
        if column is not None and (column not in handler.table.c or column in _BOOKKEEPING):
            raise ConfigurationError(
                f"handler {handler.name!r}: {option} must name a column of "
                f"{handler.table.name!r} other than {', '.join(_BOOKKEEPING)} (its attribute "
                f"on {model.__name__}, or its name in the table), got {column!r}"
            )
    _check_rate_limits(handler)
    for option, unfit in _UNFIT_KEY_TYPES.items():
        column = keys[option]
        if column is None:
            continue
        column_type = _underlying(handler.table.c[column].type)
        if isinstance(column_type, unfit):
            raise ConfigurationError(
                f"handler {handler.name!r}: {option} cannot be {column!r}, a "
                f"{type(column_type).__name__} column: a key is compared in SQL, and "
                f"{_WHY_UNFIT[option]} (use an integer, string, enum, UUID or date column)"
            )
    if handler.max_batch_bytes is not None and handler.max_batch_bytes < 1:
        raise ConfigurationError(
            f"handler {handler.name!r}: max_batch_bytes must be >= 1 or None, "
            f"got {handler.max_batch_bytes!r}"
        )
    for option, zero_allowed in (("max_wait", True), ("timeout", False), ("expires_after", False)):
        value = getattr(handler, option)
        if value is not None and not (
            is_number(value)
            and (value > 0 or (zero_allowed and value == 0))
            and value <= MAX_WAIT_SECONDS
        ):
            lowest = ">= 0" if zero_allowed else "> 0"
            raise ConfigurationError(
                f"handler {handler.name!r}: {option} must be {lowest} seconds and at most a "
                f"year ({MAX_WAIT_SECONDS:.0f}), or None, got {value!r}"
            )
    refused = _handler_kind.refusal(handler.name, handler.func)
    if refused is not None:
        raise ConfigurationError(refused)
    return replace(
        handler,
        group_by=keys["group_by"],
        ordering_key=keys["ordering_key"],
        rate_limit_key=keys["rate_limit_key"],
    )


def _given_limits(handler: Handler[Any]) -> tuple[RateLimit, ...] | None:
    """The limits as given: None when ``rate_limit`` is not a limit or a sequence of them."""
    given = handler.rate_limit
    if given is None:
        return ()
    if isinstance(given, RateLimit):
        return (given,)
    if isinstance(given, Sequence) and not isinstance(given, str):
        limits = tuple(given)
        if all(isinstance(limit, RateLimit) for limit in limits):
            return limits
    return None


def _rate_limits(handler: Handler[Any]) -> tuple[RateLimit, ...]:
    """The handler's limits, each with its key resolved (see ``Handler.rate_limits``)."""
    limits = _given_limits(handler) or ()
    if getattr(handler.model, "__table__", None) is None:
        return limits  # not a mapped model: refused at registration
    return tuple(
        replace(limit, key=_column_key(handler.model, limit.key or handler.rate_limit_key))
        if limit.key or handler.rate_limit_key
        else limit
        for limit in limits
    )


def _check_rate_limits(handler: Handler[Any]) -> None:
    """``rate_limit``: limits whose keys are columns of the buffer, and whose events windows
    each hold a whole group (a group larger than one could never be sent within it)."""
    if _given_limits(handler) is None:
        raise ConfigurationError(
            f"handler {handler.name!r}: rate_limit must be RateLimit, a sequence of RateLimit, "
            f"or None, got {handler.rate_limit!r}"
        )
    if handler.rate_limit_key is not None and not handler.rate_limits:
        raise ConfigurationError(
            f"handler {handler.name!r}: rate_limit_key needs a rate_limit to apply per key"
        )
    for limit in handler.rate_limits:
        if limit.key is not None and (
            limit.key not in handler.table.c or limit.key in _BOOKKEEPING
        ):
            raise ConfigurationError(
                f"handler {handler.name!r}: rate_limit's key must name a column of "
                f"{handler.table.name!r} other than {', '.join(_BOOKKEEPING)} (its attribute "
                f"on {handler.model.__name__}, or its name in the table), got {limit.key!r}"
            )
        for window in limit.windows():
            if window.unit is Unit.EVENTS and window.exact and window.capacity < handler.batch_size:
                raise ConfigurationError(
                    f"handler {handler.name!r}: rate_limit allows {window.capacity} events "
                    f"in {window.period:g} s, fewer than batch_size {handler.batch_size}: a "
                    f"full group could never be sent within it (lower batch_size)"
                )
