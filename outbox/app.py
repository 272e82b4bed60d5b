"""Outbox: the application object (engine, registered handlers, settings)."""

from __future__ import annotations

import datetime as dt
import os
import re
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError

from outbox import _db
from outbox._core import handler_kind
from outbox._core import log as _log
from outbox._db import dialects
from outbox.batch import Batch
from outbox.breaker import CircuitBreaker
from outbox.exceptions import ConfigurationError
from outbox.fanout import checked_targets, copy_on_success
from outbox.flags import ROW_KEY, checked_buffer, flag_source, rows_handler
from outbox.handler import (
    Delivery,
    EventT,
    Handler,
    delivery_of,
    validated,
)
from outbox.inbox import DEFAULT_HORIZON, Inbox, check_sender
from outbox.ratelimit import RateLimit
from outbox.retry import RetryPolicy
from outbox.settings import Settings as Settings
from outbox.urgency import Urgency

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

log = _log.get_logger(__name__)

HandlerFunc = Callable[[Batch[EventT]], None]
# What a handler returns: nothing (sync), or an awaitable outbox runs (async). A type variable,
# so that the decorator hands back the function's own type (a coroutine function stays one).
DatabaseRegistry = Mapping[str, "str | URL"] | Callable[[], Mapping[str, "str | URL"]]
"""The databases an application serves: names to URLs, or a function that returns them."""

_ReturnT = TypeVar("_ReturnT", bound=Awaitable[None] | None)

DATABASE_URL_ENV = "OUTBOX_DATABASE_URL"

DEFAULT_BATCH_SIZE = 1000
DEFAULT_MAX_BATCHES = 50
# A database's name in Outbox(databases=...): shown in logs, metrics labels and commands.
_DATABASE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


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

    ``Outbox(databases=...)`` serves several databases with the same handlers and settings: a
    mapping of names to URLs, or a function that returns one (a tenant registry, read when
    asked). Each database keeps its own buffers, job table, leases and fence; nothing is shared
    between them. ``app.on(name)`` is the application on one of them; ``outbox work`` runs a
    worker process for each (docs/many-databases.md).
    """

    def __init__(
        self,
        url: str | URL | None = None,
        *,
        engine: Engine | AsyncEngine | None = None,
        settings: Settings | None = None,
        databases: DatabaseRegistry | None = None,
    ) -> None:
        if url is not None and engine is not None:
            raise ConfigurationError("give Outbox a database URL or an engine, not both")
        if databases is not None and (url is not None or engine is not None):
            raise ConfigurationError("give Outbox databases, or a database URL or engine, not both")
        if databases is not None and not (callable(databases) or isinstance(databases, Mapping)):
            raise ConfigurationError(
                "Outbox(databases=...) takes a mapping of names to database URLs, or a function "
                f"that returns one; got {type(databases).__name__}"
            )
        self._registry = databases
        self._views: dict[str, Outbox] = {}
        # The console and the metrics read the registry from threads of their own.
        self._views_lock = threading.Lock()
        self.database_name: str | None = None
        """The name of the database this application is bound to (:meth:`on`); None for an
        application of one database."""
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
        self._inboxes: dict[str, Inbox] = {}

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

        if self._registry is not None:
            names = ", ".join(self.databases()) or "none listed now"
            raise ConfigurationError(
                f"this application serves several databases ({names}): name one, with "
                "app.on(name) or the command line's --database NAME"
            )
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
                url,
                idle_transaction_timeout=self.settings.lease_seconds,
                network_timeout=self.settings.network_timeout,
                json_options=self._json,
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
        coalesce: bool = False,
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
        ``coalesce``: with ``ordering_key``, hand each group only the latest event of each key
        (a record that changed ten times is sent once, in its latest state); the others are
        archived as ``superseded`` when the group succeeds.
        """

        def register(
            func: Callable[[Batch[EventT]], _ReturnT],
        ) -> Callable[[Batch[EventT]], _ReturnT]:
            self.add_handler(
                Handler(
                    name=name or handler_kind.default_name(func),
                    model=model,
                    func=func,
                    batch_size=batch_size,
                    urgency=urgency,
                    retry=retry or RetryPolicy(),
                    archive=archive,
                    max_batches=max_batches,
                    timeout=timeout,
                    expires_after=expires_after,
                    delivery=delivery_of(delivery),
                    max_wait=max_wait,
                    concurrency=concurrency,
                    circuit_breaker=circuit_breaker,
                    rate_limit=rate_limit,
                    bisect=bisect,
                    max_batch_bytes=max_batch_bytes,
                    group_by=group_by,
                    ordering_key=ordering_key,
                    rate_limit_key=rate_limit_key,
                    coalesce=coalesce,
                )
            )
            return func

        return register

    def add_handler(self, handler: Handler[Any]) -> None:
        """Register a handler built by hand (``@app.handler`` is the usual way)."""
        handler = validated(handler)
        if handler.name in self._handlers:
            raise ConfigurationError(f"a handler named {handler.name!r} is already registered")
        for other in self._handlers.values():
            if other.table is handler.table:
                raise ConfigurationError(
                    f"buffer {handler.table.name!r} already has handler {other.name!r}; "
                    f"one buffer has exactly one handler (use a buffer model per handler)"
                )
        self._handlers[handler.name] = handler

    def fanout(
        self,
        source: type[Any],
        *,
        to: Sequence[type[Any]],
        name: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        urgency: Urgency = Urgency.REALTIME,
        archive: bool = False,
    ) -> Handler[Any]:
        """Copy each event written to the buffer ``source`` into the buffers ``to``, one per
        consumer, each drained by its own handler (docs/fanout.md). The copying is a handler
        named ``name`` (default ``<source table>.fanout``) of ``batch_size`` events per group,
        in band ``urgency`` (every consumer waits for it), which writes a group's copies in the
        transaction that removes it from ``source``. ``archive``: keep the events in the
        archive, for a consumer added later to start from (``outbox fanout backfill``)."""
        targets = checked_targets(source, to, self._handlers.values())
        handler = Handler(
            name=name or f"{source.__table__.name}.fanout",
            model=source,
            func=copy_on_success,
            batch_size=batch_size,
            urgency=urgency,
            retry=RetryPolicy(),
            archive=archive,
            max_batches=DEFAULT_MAX_BATCHES,
            copy_to=targets,
        )
        self.add_handler(handler)
        return self._handlers[handler.name]

    def flagged(
        self,
        model: type[Any],
        *,
        flag: str,
        buffer: type[Any],
        version: str | None = None,
        name: str | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        urgency: Urgency = Urgency.HOUR,
        retry: RetryPolicy | None = None,
        timeout: float | None = None,
        concurrency: int | None = None,
        circuit_breaker: CircuitBreaker | None = None,
        rate_limit: RateLimit | Sequence[RateLimit] | None = None,
    ) -> Callable[[Callable[[Batch[Any]], _ReturnT]], Callable[[Batch[Any]], _ReturnT]]:
        """Register a handler of the rows of the business model ``model`` whose ``flag`` is set
        (docs/flags.md): it is handed them as a batch of ``model``, and when it succeeds their
        flag is cleared where ``version`` (a column every change moves; the flag itself when it
        is a nullable column, set while the row needs work) is still what it was. ``buffer``:
        its :class:`outbox.FlaggedRowsMixin` model. The other options are :meth:`handler`'s."""

        def register(func: Callable[[Batch[Any]], _ReturnT]) -> Callable[[Batch[Any]], _ReturnT]:
            source = flag_source(model, flag, version)
            refused = handler_kind.refusal(name or handler_kind.default_name(func), func)
            if refused is not None:
                raise ConfigurationError(refused)
            self.add_handler(
                Handler(
                    name=name or handler_kind.default_name(func),
                    model=checked_buffer(model, buffer),
                    func=rows_handler(lambda: self.engine, source, func),
                    batch_size=batch_size,
                    urgency=urgency,
                    retry=retry or RetryPolicy(),
                    archive=False,
                    max_batches=DEFAULT_MAX_BATCHES,
                    timeout=timeout,
                    concurrency=concurrency,
                    circuit_breaker=circuit_breaker,
                    rate_limit=rate_limit,
                    ordering_key=ROW_KEY,
                    flags=source,
                )
            )
            return func

        return register

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
        """The handlers called ``names`` (all of them when empty), in registration order. A
        single name as text is refused: its letters are not handlers' names."""
        if isinstance(names, str):
            raise ConfigurationError(f"handlers: expected a list of names, got the text {names!r}")
        if not names:
            return list(self._handlers.values())
        return [self.get_handler(n) for n in names]

    def resend_horizon(self, handler: Handler[Any] | str) -> float:
        """The longest time, in seconds, between two sends of one event by ``handler``.

        An event whose acknowledgement was lost (a worker killed, a connection cut) is sent
        again by a later attempt, and the attempts between may fail before they reach the
        downstream: the bound is the lease of the attempt that was cut off, every wait between
        two attempts (each backoff with its jitter, or the circuit breaker's longest pause when
        longer), and the ``timeout`` of each attempt before the last. A receiver that drops a
        repeat within a window (a broker's, an inbox's) catches every repeat when the window is
        at least this long. Not counted, as no schedule bounds them: a downstream's
        ``RetryAfter`` deferrals, an operator's pause, and a replay.
        """
        found = self.get_handler(handler) if isinstance(handler, str) else handler
        policy = found.retry
        longest_pause = 0.0
        if found.circuit_breaker is not None:
            longest_pause = found.circuit_breaker.max_probe_after
        gaps = range(1, policy.max_attempts)
        waits = sum(max(policy.base(n) * (1 + policy.jitter), longest_pause) for n in gaps)
        return self.settings.lease_seconds + waits + (found.timeout or 0.0) * max(len(gaps), 1)

    # --- inboxes -------------------------------------------------------------------------

    def inbox(
        self,
        name: str,
        *,
        horizon: float | dt.timedelta = DEFAULT_HORIZON,
        sender: Handler[Any] | str | None = None,
    ) -> Inbox:
        """Declare the inbox ``name`` (:class:`outbox.inbox.Inbox`): the record of the message
        ids a receiver had an effect for, each kept ``horizon`` (seconds or a timedelta; seven
        days unless given), then pruned.

        ``sender``: the handler of this application that sends the messages (its name, or the
        handler), when both sides are outbox: a horizon shorter than its
        :meth:`resend_horizon` is refused, as a message re-sent after its id was pruned would
        have its effect twice.
        """
        if name in self._inboxes:
            raise ConfigurationError(f"an inbox named {name!r} is already declared")
        inbox = Inbox(name, horizon=horizon)
        if sender is not None:
            sender_name = sender if isinstance(sender, str) else sender.name
            check_sender(inbox, sender_name, self.resend_horizon(sender_name))
        self._inboxes[name] = inbox
        return inbox

    @property
    def inboxes(self) -> Mapping[str, Inbox]:
        """The declared inboxes by name."""
        return dict(self._inboxes)

    def with_settings(self, **changes: Any) -> Settings:
        """Replace some settings (validated) and return the new ones (for the databases it
        serves too)."""
        self.settings = replace(self.settings, **changes)
        for view in self._views.values():
            view.settings = self.settings
        return self.settings

    # --- several databases ---------------------------------------------------------------

    @property
    def serves_many(self) -> bool:
        """Whether this application serves several databases (``Outbox(databases=...)``)."""
        return self._registry is not None

    @property
    def databases_change(self) -> bool:
        """Whether its databases may change while it runs: its registry is a function, which
        ``outbox work`` reads again every half minute."""
        return callable(self._registry)

    def databases(self) -> dict[str, URL]:
        """The databases this application serves, by name, as its registry lists them now;
        empty for an application of one database. A name or URL that cannot be used is a
        ConfigurationError naming it. The engine of a database no longer listed is disposed
        of."""
        from sqlalchemy.engine import make_url

        if self._registry is None:
            return {}
        if callable(self._registry):
            try:
                listed = self._registry()
            except Exception as error:  # the application's own registry: said, not a traceback
                raise ConfigurationError(
                    f"Outbox(databases=...)'s function raised {type(error).__name__}: {error}"
                ) from error
        else:
            listed = self._registry
        if not isinstance(listed, Mapping):
            raise ConfigurationError(
                "Outbox(databases=...)'s function must return a mapping of names to database "
                f"URLs; it returned {type(listed).__name__}"
            )
        found: dict[str, URL] = {}
        for name, url in listed.items():
            if not isinstance(name, str) or not _DATABASE_NAME.fullmatch(name):
                raise ConfigurationError(
                    f"database name {name!r}: use letters, digits, '.', '_' and '-' (1 to 63)"
                )
            try:
                found[name] = url if isinstance(url, URL) else make_url(url)
            except (ArgumentError, ValueError, TypeError):
                raise ConfigurationError(
                    f"database {name!r}: cannot parse its URL (a database URL looks like "
                    "postgresql+psycopg://user:password@host:port/database)"
                ) from None
        with self._views_lock:
            gone = [self._views.pop(n) for n in [n for n in self._views if n not in found]]
        for view in gone:
            # Taken out of the registry: its connections are closed (those in use once they
            # are given back), not kept for the life of the process.
            if view._engine is not None:
                view._engine.dispose()
        return found

    def on(self, name: str) -> Outbox:
        """This application on the database ``name`` of its registry: the same handlers and
        settings, an engine of its own (kept while the registry gives the same URL)."""
        if self._registry is None:
            raise ConfigurationError("on(): this application serves one database, not several")
        listed = self.databases()
        if name not in listed:
            known = ", ".join(listed) or "none listed now"
            raise ConfigurationError(f"unknown database {name!r}; its databases: {known}")
        return self._view(name, listed[name])

    def each(self) -> dict[str, Outbox]:
        """This application on each database its registry lists now (:meth:`on` of each,
        from one reading of the registry); empty for an application of one database."""
        if self._registry is None:
            return {}
        return {name: self._view(name, url) for name, url in self.databases().items()}

    def _view(self, name: str, url: URL) -> Outbox:
        with self._views_lock:
            view = self._views.get(name)
            if view is not None and view._url == url:
                return view
            moved, view = view, Outbox(url, settings=self.settings)
            view._handlers = self._handlers  # one registry of handlers for every database
            view._inboxes = self._inboxes
            view.database_name = name
            self._views[name] = view
        if moved is not None and moved._engine is not None:
            moved._engine.dispose()
        return view


def _sync_engine(engine: Engine | AsyncEngine) -> Engine | None:
    """``engine``, or None for an ``AsyncEngine``, which outbox does not run on."""
    from sqlalchemy.ext.asyncio import AsyncEngine

    return None if isinstance(engine, AsyncEngine) else engine
