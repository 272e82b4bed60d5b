"""What the console of an application serving several databases keeps: the registry's list,
read at most once per refresh period; each database's own console, made on first use; and the
reading of every database's numbers for the page of all of them, each database on its own
thread and waited for a bounded time, so that one that is down or hangs neither fails nor
holds the page.

Each database's numbers are its console's status snapshot (:class:`outbox.web._console.
Snapshots`): the page of all databases and that database's own pages share one read per
period, however many viewers either has.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException

from outbox._core import log as _log
from outbox._core.in_flight import InFlight
from outbox.app import Outbox
from outbox.exceptions import ConfigurationError
from outbox.ops import database, fleet, metrics
from outbox.ops.totals import DatabaseTotals, database_totals, fleet_totals
from outbox.web._console import Console
from outbox.web._in_flight import wait
from outbox.web.auth import Auth
from outbox.web.bodies import DatabaseRead, DatabasesStatus, DatabaseStatus, Totals

log = _log.get_logger(__name__)
T = TypeVar("T")

WAIT_SECONDS = 2.0
"""How long a page, an endpoint or ``/healthz`` waits for a database (or the registry) to
answer; one that has not is shown as not answering yet, and its read goes on without them."""
_REGISTRY = "registry"


@dataclass(frozen=True, slots=True)
class _Kept:
    """A database's console, and the application on it that it was made for."""

    view: Outbox
    starlette: Starlette
    console: Console
    generation: int
    """The registry's read it was checked against."""


class Databases:
    """The state of the console of several databases (``starlette_app.state.databases``).

    ``build`` makes the console of one database (``create_app`` with the same auth, refresh
    period, hidden payloads and title).
    """

    def __init__(
        self,
        app: Outbox,
        auth: Auth,
        refresh_seconds: float,
        title: str,
        build: Callable[[Outbox], Starlette],
    ) -> None:
        self.app = app
        self.auth = auth
        self.refresh_seconds = refresh_seconds
        self.title = title
        self._build = build
        self._calls = InFlight("outbox console")
        self._lock = threading.Lock()
        self._listing: dict[str, URL] | None = None
        self._listed_at = 0.0
        self._generation = 0
        self.registry_error: str | None = None
        """Why the registry's last read failed (one line); None when it did not."""
        self._consoles: dict[str, _Kept] = {}
        self._last: dict[str, DatabaseStatus] = {}
        self._failed_at: dict[str, float] = {}
        self._workers: dict[str, tuple[float, int | None]] = {}
        self._metrics: Any = None
        self._metrics_lock = threading.Lock()

    # --- the registry and each database's console ----------------------------------------

    def metrics(self) -> Any:
        """The registry ``/metrics`` serves (made on first use: the metrics extra): one
        collector for every scrape, so that a database that hangs holds one reading thread
        and its outage is logged once, whoever scrapes."""
        with self._metrics_lock:
            if self._metrics is None:
                from prometheus_client import CollectorRegistry

                from outbox.prometheus import OutboxCollector

                self._metrics = CollectorRegistry()
                self._metrics.register(OutboxCollector(self.app, timeout=WAIT_SECONDS))
            return self._metrics

    async def names(self) -> list[str]:
        """The databases the registry lists, in its order: read again once the last read is a
        refresh period old. A registry that fails or does not answer within
        :data:`WAIT_SECONDS` leaves the last good list (and ``registry_error`` says why); with
        none yet, 503."""
        if self._listing is None or time.monotonic() - self._listed_at >= self.refresh_seconds:
            call = self._calls.start(_REGISTRY, self.app.databases)
            await wait([call], WAIT_SECONDS)
            if call.done():
                self._listed(call)
            elif self._listing is None:
                raise HTTPException(
                    503, f"the registry of databases did not answer within {WAIT_SECONDS:g} s"
                )
        if self._listing is None:
            raise HTTPException(503, f"the registry of databases: {self.registry_error}")
        return list(self._listing)

    def _listed(self, call: Future[dict[str, URL]]) -> None:
        self._listed_at = time.monotonic()
        try:
            listing = call.result()
        except ConfigurationError as error:
            self.registry_error = str(error)
            log.warning(_log.WEB_DATABASE_ERROR, error=self.registry_error)
            return
        self.registry_error = None
        if listing != self._listing:
            self._listing = listing
            self._generation += 1
            for kept in (self._consoles, self._last, self._failed_at, self._workers):
                for name in [n for n in kept if n not in listing]:
                    del kept[name]
            self._calls.forget([_REGISTRY, *((kind, n) for n in listing for kind in _KINDS)])

    async def console(self, name: str) -> Starlette | None:
        """The console of database ``name``; None for a name the registry does not list."""
        if name not in await self.names():
            return None
        kept = await self._kept([name])
        if name not in kept:
            raise HTTPException(
                503, f"database {name!r}: its application could not be had from the registry now"
            )
        return kept[name].starlette

    async def _kept(self, names: Collection[str]) -> dict[str, _Kept]:
        """The console of each of ``names``, made or checked again when the registry's list
        changed since: the application on the database (``app.on``, which reads the registry)
        is asked for, and a console is made again when it is another (the URL changed).
        Names whose application did not come back in time are left out."""
        generation = self._generation
        stale = [
            n
            for n in names
            if n not in self._consoles or self._consoles[n].generation != generation
        ]
        calls = {n: self._calls.start(("view", n), _bound(self.app.on, n)) for n in stale}
        await wait(calls.values(), WAIT_SECONDS)
        for name, call in calls.items():
            if not call.done() or call.exception() is not None:
                continue
            view = call.result()
            kept = self._consoles.get(name)
            if kept is None or kept.view is not view:
                starlette = self._build(view)
                kept = _Kept(view, starlette, starlette.state.console, generation)
            elif kept.generation != generation:
                kept = _Kept(view, kept.starlette, kept.console, generation)
            if generation == self._generation:
                self._consoles[name] = kept
        return {n: self._consoles[n] for n in names if n in self._consoles}

    # --- the numbers of every database -----------------------------------------------------

    async def status(self) -> DatabasesStatus:
        """Every database's totals, and all of them taken together; a database that fails
        says why in its line, one that does not answer within :data:`WAIT_SECONDS` says so."""
        names = await self.names()
        kept = await self._kept(names)
        now = time.monotonic()
        calls: dict[str, Future[DatabaseStatus]] = {}
        for name, held in kept.items():
            failed_at = self._failed_at.get(name)
            # A database whose read failed is read again a refresh period later, not at once
            # (its console's snapshot retries on the same period once it has one).
            if failed_at is None or now - failed_at >= self.refresh_seconds:
                calls[name] = self._calls.start(("status", name), _bound(self._read, name, held))
        await wait(calls.values(), WAIT_SECONDS)
        rows = [self._line(name, calls.get(name)) for name in names]
        with_numbers = [row.totals for row in rows if row.totals is not None]
        return DatabasesStatus(
            taken_at=time.time(),
            databases=rows,
            total=sum_of(with_numbers),
            counted=len(with_numbers),
            registry_error=self.registry_error,
        )

    def _line(self, name: str, call: Future[DatabaseStatus] | None) -> DatabaseStatus:
        with self._lock:
            last = self._last.get(name)
        if call is not None and call.done():
            return call.result()
        if call is None and last is not None:
            return last
        return DatabaseStatus(
            name=name,
            read=DatabaseRead.WAITING,
            error=f"no answer yet (waited {WAIT_SECONDS:g} s)",
            taken_at=None if last is None else last.taken_at,
            totals=None if last is None else last.totals,
        )

    def _read(self, name: str, kept: _Kept) -> DatabaseStatus:
        """On the read's own thread: the database's line from its console's snapshot (kept,
        so that a read that returns after the page stopped waiting is shown next time)."""
        try:
            snapshot = kept.console.snapshots.get()
        except Exception as error:  # the database's, shown in its line
            line = DatabaseStatus(name, DatabaseRead.FAILED, _summary(error), None, None)
            with self._lock:
                last = self._last.get(name)
                if last is not None and last.totals is not None:
                    line = DatabaseStatus(
                        name, DatabaseRead.FAILED, line.error, last.taken_at, last.totals
                    )
                self._last[name], self._failed_at[name] = line, time.monotonic()
            return line
        alive = self._workers_alive(name, kept.view, snapshot.taken_at)
        problem = kept.console.snapshots.error
        line = DatabaseStatus(
            name=name,
            read=DatabaseRead.FAILED if problem else DatabaseRead.ANSWERED,
            error=problem,
            taken_at=snapshot.taken_at,
            totals=totals_of(snapshot.handlers, alive),
        )
        with self._lock:
            self._last[name] = line
            self._failed_at.pop(name, None)
        return line

    def _workers_alive(self, name: str, view: Outbox, taken_at: float) -> int | None:
        """The database's live workers, counted once per status snapshot; None when they
        could not be read."""
        with self._lock:
            counted = self._workers.get(name)
        if counted is not None and counted[0] == taken_at:
            return counted[1]
        try:
            alive: int | None = sum(1 for w in fleet.workers(view) if w.alive)
        except Exception as failed:  # the line still has the snapshot's numbers
            log.warning(_log.WEB_DATABASE_ERROR, error=_summary(failed))
            alive = None
        with self._lock:
            self._workers[name] = (taken_at, alive)
        return alive

    # --- health --------------------------------------------------------------------------

    async def health(self) -> dict[str, bool]:
        """Whether each database answers a connection within :data:`WAIT_SECONDS` (one check
        of each in flight at most, however many ask)."""
        names = await self.names()
        kept = await self._kept(names)
        calls = {
            n: self._calls.start(("health", n), _bound(_check_connection, k.view))
            for n, k in kept.items()
        }
        await wait(calls.values(), WAIT_SECONDS)
        return {n: n in calls and calls[n].done() and calls[n].exception() is None for n in names}

    def console_made(self, name: str) -> Console | None:
        """The console of database ``name`` as made so far; None when none is."""
        kept = self._consoles.get(name)
        return None if kept is None else kept.console

    def calls_running(self) -> int:
        """How many reads (of the registry, a database's status or health) have not returned."""
        return self._calls.running()


_KINDS = ("view", "status", "health")


def _bound(work: Callable[..., T], *args: Any) -> Callable[[], T]:
    def call() -> T:
        return work(*args)

    return call


def _check_connection(view: Outbox) -> None:
    # The engine is made here, on the check's thread: a URL whose driver is missing fails
    # this database's check, not the request.
    database.check_connection(view.engine)


def _summary(error: BaseException) -> str:
    return database.error_summary(error) if isinstance(error, DBAPIError) else str(error)


def totals_of(handlers: list[metrics.HandlerStatus], workers_alive: int | None) -> Totals:
    """The handlers of one database taken together, as the API says it."""
    return _answer(database_totals(handlers, workers_alive))


def sum_of(totals: list[Totals]) -> Totals:
    """Databases taken together (:func:`outbox.ops.totals.fleet_totals`)."""
    return _answer(fleet_totals(DatabaseTotals(**msgspec.structs.asdict(t)) for t in totals))


def _answer(totals: DatabaseTotals) -> Totals:
    return Totals(**totals.as_dict())
