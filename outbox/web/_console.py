"""What the dashboard's pages and the API share: the application, who may do what, the status
snapshot every viewer reads, and the mapping of outbox's errors to HTTP answers."""

from __future__ import annotations

import hmac
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sqlalchemy.exc import DataError, DBAPIError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request

from outbox._core import log as _log
from outbox.app import Outbox
from outbox.exceptions import ConfigurationError, GroupNotFoundError, OutboxError
from outbox.ops import database, flags, metrics
from outbox.ops.flags import FlagStatus
from outbox.web._ingest_bodies import IngestBodies
from outbox.web._ingest_bodies import declare as declare_ingest_bodies
from outbox.web.auth import CSRF_COOKIE, CSRF_FIELD, CSRF_HEADER, Auth, Permission, Principal

log = _log.get_logger(__name__)
T = TypeVar("T")

REFRESH_SECONDS = 5.0
"""How often the pages refresh, and how old the shared status snapshot may be."""
COUNT_CAP = 100_000
"""Rows a status snapshot counts at most per buffer and per archive status: past it, pages say
"at least"."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The status of every handler, read once for every viewer of a refresh period."""

    handlers: list[metrics.HandlerStatus]
    taken_at: float
    """``time.time()`` when it was read."""
    throughput: dict[str, list[Any]] = field(default_factory=dict)
    """Each handler's last hour, minute by minute (:func:`outbox.ops.metrics.throughput`)."""
    flags: dict[str, FlagStatus] = field(default_factory=dict)
    """Each flag handler's business table and its flagged rows, by handler
    (:func:`outbox.ops.flags.flag_tables`)."""


class Snapshots:
    """One status read per refresh period, whoever asks: N open dashboards cost the database
    one aggregate read per period, not N.

    The first viewer waits for the first read; after that, a viewer finding the snapshot older
    than the period is answered with it at once while one background read takes a new one
    (stale while it revalidates), so that no page waits for the aggregate. Counts of rows stop
    at ``count_cap`` (said as "at least" on the page). A failed read is kept as ``error`` and
    tried again at the next period; the last good snapshot stays.
    """

    def __init__(self, app: Outbox, period: float, count_cap: int | None = COUNT_CAP) -> None:
        self._app = app
        self._period = period
        self._count_cap = count_cap
        self._lock = threading.Lock()
        self._first = threading.Lock()
        self._latest: Snapshot | None = None
        self._read_at = 0.0
        self._reading = False
        self._generation = 0
        self.error: str | None = None
        """Why the last read failed (one line); None when it did not."""
        self.reads = 0
        """How many reads it made (for tests and the benchmark)."""

    def get(self) -> Snapshot:
        """The latest snapshot; the first read (or one after a failure left none) is waited for."""
        with self._lock:
            latest = self._latest
            if latest is not None:
                if time.monotonic() - self._read_at >= self._period and not self._reading:
                    self._reading = True
                    threading.Thread(target=self._read_in_background, daemon=True).start()
                return latest
        with self._first:
            if self._latest is None:
                self._store(self._read())
            assert self._latest is not None
            return self._latest

    def _read(self) -> Snapshot:
        handlers = metrics.collect(self._app, count_cap=self._count_cap)
        flagged = flags.flag_tables(self._app, count_cap=self._count_cap)
        snapshot = Snapshot(
            handlers,
            time.time(),
            metrics.throughput(self._app),
            {each.handler: each for each in flagged},
        )
        self.reads += 1
        return snapshot

    def _store(self, snapshot: Snapshot, generation: int | None = None) -> None:
        with self._lock:
            if generation is None or generation == self._generation:
                self._latest, self._read_at, self.error = snapshot, time.monotonic(), None

    def _read_in_background(self) -> None:
        generation = self._generation
        try:
            self._store(self._read(), generation)
        except Exception as error:  # kept for the pages to show; the last snapshot stays
            message = database.error_summary(error) if isinstance(error, DBAPIError) else str(error)
            log.warning(_log.WEB_DATABASE_ERROR, error=message)
            with self._lock:
                self.error, self._read_at = message, time.monotonic()
        finally:
            with self._lock:
                self._reading = False

    def expire(self) -> None:
        """Forget the latest snapshot, so that the next viewer reads again: after a write, the
        page it sends the operator back to shows what the write did (a read under way, begun
        before the write, is not kept)."""
        with self._lock:
            self._latest = None
            self._generation += 1


@dataclass
class Console:
    """The dashboard's and the API's shared state (``starlette_app.state.console``)."""

    app: Outbox
    auth: Auth
    refresh_seconds: float = REFRESH_SECONDS
    hidden_payloads: frozenset[str] = frozenset()
    """Handlers whose events' values are never shown."""
    title: str = "outbox"
    snapshots: Snapshots = field(init=False)
    ingest_bodies: dict[str, IngestBodies] = field(init=False)
    """What each handler's ingest takes, declared from its buffer's columns (the document's)."""

    def __post_init__(self) -> None:
        self.snapshots = Snapshots(self.app, self.refresh_seconds)
        self.ingest_bodies = declare_ingest_bodies(self.app)

    def shows_payloads(self, handler: str) -> bool:
        """Whether the values of ``handler``'s events may be shown."""
        return handler not in self.hidden_payloads


def console_of(request: Request) -> Console:
    console: Console = request.app.state.console
    return console


class Served(Protocol):
    """What every page and check needs of the console that serves it: the console of one
    database (:class:`Console`), or that of several (``outbox.web._databases.Databases``)."""

    app: Outbox
    auth: Auth
    refresh_seconds: float
    title: str


def served_by(request: Request) -> Served:
    """The console ``request`` is served by: ``state.console`` of one database, else
    ``state.databases`` of several."""
    state = request.app.state
    served: Served = state.console if hasattr(state, "console") else state.databases
    return served


async def require(request: Request, permission: Permission, *, write: bool = False) -> Principal:
    """The principal of ``request`` if it may do ``permission``: 401 when it proves nobody,
    403 when its role does not allow it, or when a write that a browser could have sent by
    itself (basic auth, the host's hook, loopback) lacks the page's CSRF token."""
    principal = await authenticate(request)
    if not principal.role.allows(permission):
        raise HTTPException(403, f"{principal.role.value} may not {permission.value}")
    if write and principal.via != "token":
        await _check_csrf(request)
    return principal


async def authenticate(request: Request) -> Principal:
    """Who ``request`` comes from: 401 when it proves nobody."""
    auth = served_by(request).auth
    principal = await auth.principal(request)
    if principal is None:
        headers = {"WWW-Authenticate": 'Basic realm="outbox"' if auth.asks_for_basic else "Bearer"}
        raise HTTPException(401, "authentication required", headers=headers)
    return principal


async def _check_csrf(request: Request) -> None:
    cookie = request.cookies.get(CSRF_COOKIE, "")
    given = request.headers.get(CSRF_HEADER, "")
    if not given and request.headers.get("content-type", "").startswith(
        ("application/x-www-form-urlencoded", "multipart/form-data")
    ):
        form = await request.form()
        value = form.get(CSRF_FIELD, "")
        given = value if isinstance(value, str) else ""
    if not cookie or not given or not hmac.compare_digest(cookie.encode(), given.encode()):
        raise HTTPException(403, "CSRF token missing or wrong: reload the page and try again")


async def call(work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking operation off the event loop, its errors as HTTP answers: 400 for input
    outbox refuses (the message names it), 404 for a group it does not know, 503 for a
    database it cannot reach (in one line, no URL or password)."""
    try:
        return await run_in_threadpool(work, *args, **kwargs)
    except GroupNotFoundError as error:
        raise HTTPException(404, str(error)) from error
    except ConfigurationError as error:
        raise HTTPException(400, str(error)) from error
    except OutboxError as error:
        raise HTTPException(409, str(error)) from error
    except DataError as error:
        # A value the database would not take (one no check above it caught): the input's.
        raise HTTPException(
            400, f"the database refused a value: {database.error_summary(error)}"
        ) from error
    except DBAPIError as error:
        summary = database.error_summary(error)
        log.warning(_log.WEB_DATABASE_ERROR, error=summary)
        raise HTTPException(503, f"database error: {summary}") from error


def handler_names(console: Console, names: Collection[str]) -> tuple[str, ...]:
    """``names`` checked against the application's handlers: 404 naming an unknown one."""
    for name in names:
        if name not in console.app.handlers:
            known = ", ".join(sorted(console.app.handlers)) or "none"
            raise HTTPException(404, f"no handler {name!r} (handlers: {known})")
    return tuple(names)
