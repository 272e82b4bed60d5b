"""The dashboard's pages: server-rendered HTML (Jinja2), refreshed in place by a little plain
JavaScript, every action a form that carries the page's CSRF token.

Each page asks the operations layer the API asks (``outbox.ops.metrics`` and
``outbox.ops.flags`` through the shared snapshot, ``outbox.ops.groups``, ``outbox.ops.archive``,
``outbox.ops.operators``, ``outbox.ops.fleet``, ``outbox.ops.holds``, ``outbox.ops.inboxes``,
``outbox.ops.fanout``), so pages, API and command line always agree. A page asked for with
``X-Outbox-Fragment: 1`` answers its main part only: what ``static/console.js`` swaps in every
refresh period. How a page is drawn is :mod:`outbox.web._render`; what its forms do,
:mod:`outbox.web.actions`. :data:`ROUTES` serves both.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Route

from outbox.ops import (
    fanout,
    fleet,
    flow,
    group_operations,
    groups,
    holds,
    inboxes,
    metrics,
    operators,
    search,
)
from outbox.ops.selection import Selection
from outbox.schema import ArchiveStatus, GroupStatus, OperationAction
from outbox.web import actions
from outbox.web._console import Console, call, console_of, handler_names, require
from outbox.web._inputs import (
    DEAD_STATUSES,
    FILTERS,
    attempt,
    filters_of,
    group_id_of,
    selection_of_filters,
)
from outbox.web._render import FRAGMENT_HEADER, page
from outbox.web.api import browse_archive
from outbox.web.auth import Permission

__all__ = ["FRAGMENT_HEADER", "ROUTES"]

PAGE_SIZE = 50
"""Groups a listing page shows."""
RECENT_GROUPS = 20
"""Groups the handler page shows."""
HISTORY_PAGE = 50
"""Operations the history page shows."""
LISTED = 200
"""Held keys and refused groups the dead letters page lists; the rest are counted."""

_STATIC_DIR = Path(__file__).parent / "static"
_STATIC = {"console.js": "text/javascript; charset=utf-8", "console.css": "text/css; charset=utf-8"}


@dataclass(frozen=True, slots=True)
class HandlerRow:
    """A handler's line on the overview: its status and what the page draws of it."""

    status: metrics.HandlerStatus
    deferred: int
    bar_width: float
    """The staleness bar's fill, in per cent of its width (which is twice the promise)."""
    bar_level: str
    """``ok``, ``warn`` (past three quarters of the promise) or ``late`` (past it)."""
    state: str
    """Running, or paused and why, in words."""
    minutes: list[int]
    """Events delivered in each of the last 60 minutes, oldest first (the chart)."""


def _state_text(status: metrics.HandlerStatus) -> str:
    if status.paused:
        return metrics.pause_text(status.pause_cause, status.paused_for, status.pause_reason)
    if status.breaker == "probing":
        return "running: circuit breaker probing (one group at a time)"
    return "running"


def _row(
    status: metrics.HandlerStatus, deferred: int, minutes: list[Any], taken_at: float
) -> HandlerRow:
    staleness = status.staleness or 0.0
    level = "late" if staleness > 1 else "warn" if staleness > 0.75 else "ok"
    width = min(staleness, 2.0) * 50
    return HandlerRow(
        status, deferred, width, level, _state_text(status), per_minute(minutes, taken_at)
    )


def per_minute(rows: list[Any], taken_at: float, minutes: int = 60) -> list[int]:
    """Events delivered in each of the last ``minutes`` minutes up to ``taken_at``, oldest
    first; a minute with no row counts 0."""
    last = int(taken_at // 60)
    counts = [0] * minutes
    for row in rows:
        index = minutes - 1 - (last - int(row.minute.timestamp() // 60))
        if 0 <= index < minutes:
            counts[index] += row.succeeded
    return counts


class _Deferred:
    """The groups each handler has deferred (not a number the status has), counted once per
    status snapshot, however many viewers ask."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken_at = -1.0
        self.counts: dict[str, int] = {}

    def get(self, console: Console, taken_at: float) -> dict[str, int]:
        with self._lock:
            return self._get(console, taken_at)

    def _get(self, console: Console, taken_at: float) -> dict[str, int]:
        if taken_at != self.taken_at:
            counts = {}
            for name in console.app.handlers:
                selection = Selection(handlers=(name,), statuses=(GroupStatus.DEFERRED,))
                listing = groups.find(console.app, selection, limit=1)
                counts[name] = listing.counts.get(GroupStatus.DEFERRED, 0)
            self.counts, self.taken_at = counts, taken_at
        return self.counts


class _Charts:
    """Each handler's throughput chart of each range, read once per status snapshot however
    many viewers refresh it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._read: dict[tuple[str, str], tuple[float, metrics.ThroughputChart]] = {}

    def get(
        self, console: Console, name: str, given: str, taken_at: float
    ) -> metrics.ThroughputChart:
        """``name``'s chart of the range ``given`` (a ConfigurationError naming a wrong one),
        as of the snapshot taken at ``taken_at``."""
        span = metrics.throughput_range(given)
        with self._lock:
            kept = self._read.get((name, span))
            if kept is None or kept[0] != taken_at:
                chart = metrics.throughput_charts(console.app, [name], span)[name]
                kept = self._read[(name, span)] = (taken_at, chart)
            return kept[1]


def _charts(request: Request) -> _Charts:
    state = request.app.state
    if not hasattr(state, "throughput_charts"):
        state.throughput_charts = _Charts()
    found: _Charts = state.throughput_charts
    return found


def _deferred(request: Request) -> _Deferred:
    state = request.app.state
    if not hasattr(state, "deferred_groups"):
        state.deferred_groups = _Deferred()
    found: _Deferred = state.deferred_groups
    return found


async def _status(request: Request) -> tuple[dict[str, Any], list[HandlerRow]]:
    """What a page says of the shared snapshot (when it was read, whether the last read
    failed), and every handler's line."""
    console = console_of(request)
    snapshot = await call(console.snapshots.get)
    deferred = await call(_deferred(request).get, console, snapshot.taken_at)
    rows = [
        _row(
            s,
            deferred.get(s.handler, 0),
            snapshot.throughput.get(s.handler, []),
            snapshot.taken_at,
        )
        for s in snapshot.handlers
    ]
    said = {
        "taken_at": snapshot.taken_at,
        "as_of": time.strftime("%H:%M:%S UTC", time.gmtime(snapshot.taken_at)),
        "snapshot_error": console.snapshots.error,
    }
    return said, rows


async def overview(request: Request) -> Response:
    """``/``: every handler's status from the snapshot all viewers share."""
    principal = await require(request, Permission.READ)
    said, rows = await _status(request)
    workers = await call(fleet.workers, console_of(request).app)
    alive = [w for w in workers if w.alive]
    return page(
        request,
        principal,
        "overview.html",
        {"rows": rows, "workers_alive": len(alive), **said},
        nav="overview",
    )


async def handler_page(request: Request) -> Response:
    """``/handlers/{handler}``: one handler's status, its recent groups, pause and resume; a
    fan-out's consumers, or the fan-out a consumer's handler drains the copies of; a flag
    handler's business table and its flagged rows (of the shared snapshot)."""
    principal = await require(request, Permission.READ)
    console = console_of(request)
    [name] = handler_names(console, [request.path_params["handler"]])
    said, rows = await _status(request)
    [row] = [r for r in rows if r.status.handler == name]
    flagged = (await call(console.snapshots.get)).flags.get(name)
    listing = await call(groups.find, console.app, Selection(handlers=(name,)), limit=RECENT_GROUPS)
    handler = console.app.get_handler(name)
    limits = await call(flow.limit_use, console.app, name)
    span = request.query_params.get("range", "hour")
    chart = await call(_charts(request).get, console, name, span, said["taken_at"])
    return page(
        request,
        principal,
        "handler.html",
        {
            "row": row,
            "s": row.status,
            **said,
            "listing": listing,
            "breaker": handler.circuit_breaker,
            "concurrency": handler.concurrency,
            "limit_use": limits,
            "alert_staleness": handler.urgency.alert_staleness,
            "chart": chart,
            "ranges": [r.value for r in metrics.ThroughputRange],
            "copies_into": fanout.copies_into(console.app, name),
            "archives": handler.archive,
            "copy_of": fanout.copy_of(console.app, name),
            "flags": flagged,
        },
    )


def _listing_context(
    console: Console,
    request: Request,
    pairs: list[tuple[str, str]],
    listing: groups.Listing | None,
    problem: str | None,
    statuses: Iterable[GroupStatus],
) -> dict[str, Any]:
    params = request.query_params
    chosen = set(params.getlist("status"))
    return {
        "listing": listing,
        "problem": problem,
        "pairs": pairs,
        "values": {name: params.get(name, "") for name in FILTERS if name != "status"},
        "handler_names": sorted(console.app.handlers),
        "statuses": [(s.value, s.value in chosen) for s in statuses],
        "narrowed": bool(pairs),
    }


async def _listing(
    request: Request, statuses: Iterable[GroupStatus] | None
) -> tuple[list[tuple[str, str]], groups.Listing | None, str | None]:
    console = console_of(request)
    pairs = filters_of(request.query_params)
    after = request.query_params.get("after") or None
    try:
        selection = await call(selection_of_filters, console, pairs, statuses)
    except HTTPException as error:
        if error.status_code in (400, 404):
            return pairs, None, str(error.detail)
        raise
    listing, problem = await attempt(
        groups.find, console.app, selection, limit=PAGE_SIZE, after=after
    )
    return pairs, listing, problem


async def group_list(request: Request) -> Response:
    """``/groups``: the groups a filter matches, a page at a time, counted by status."""
    principal = await require(request, Permission.READ)
    pairs, listing, problem = await _listing(request, None)
    context = _listing_context(
        console_of(request), request, pairs, listing, problem, list(GroupStatus)
    )
    context.update(page="pages.groups", from_page="")
    return page(request, principal, "groups.html", context, nav="groups")


async def dead_page(request: Request) -> Response:
    """``/dead``: dead and held groups (the same filters), held ordering keys and refused
    groups, each with what releases it."""
    principal = await require(request, Permission.READ)
    console = console_of(request)
    pairs, listing, problem = await _listing(request, DEAD_STATUSES)
    chosen = [v for k, v in pairs if k == "handler"]
    only = chosen[0] if len(chosen) == 1 and chosen[0] in console.app.handlers else None
    keys = await call(holds.held_keys, console.app, only)
    held_back = await call(holds.refused_groups, console.app, only)
    context = _listing_context(console, request, pairs, listing, problem, DEAD_STATUSES)
    context.update(page="pages.dead", from_page="dead", held_keys=keys, refused=held_back)
    context.update(listed=LISTED)
    return page(request, principal, "dead.html", context, nav="dead")


async def group_page(request: Request) -> Response:
    """``/groups/{group_id}``: one group in full, with replay, discard and edit."""
    principal = await require(request, Permission.READ)
    console = console_of(request)
    group_id = group_id_of(request.path_params["group_id"])
    detail: groups.GroupDetail = await call(groups.show, console.app, group_id)
    handler = console.app.handlers.get(detail.group.handler)
    columns = (
        []
        if handler is None
        else [c.name for c in handler.table.columns if c.name not in ("id", "group_id")]
    )
    status = detail.group.status
    return page(
        request,
        principal,
        "group.html",
        {
            "d": detail,
            "g": detail.group,
            "shows_payloads": console.shows_payloads(detail.group.handler),
            "known_handler": handler is not None,
            "columns": [c for c in columns if c != "created_at"],
            "replayable": status in DEAD_STATUSES or status == ArchiveStatus.DISCARDED,
            "retryable": status in group_operations.RETRIED,
            "discardable": isinstance(status, GroupStatus) and status != GroupStatus.IN_FLIGHT,
        },
        nav="groups",
    )


async def history_page(request: Request) -> Response:
    """``/history``: operators' replays, edits and discards, newest first."""
    principal = await require(request, Permission.READ)
    console = console_of(request)
    params = request.query_params
    action = params.get("action") or None
    before = params.get("before") or None
    if before is not None and not before.isdecimal():
        raise HTTPException(400, f"before: {before!r} is not an operation's number")
    operations, problem = await attempt(
        operators.history,
        console.app,
        action=action,
        limit=HISTORY_PAGE,
        before_id=None if before is None else int(before),
    )
    operations = operations or []
    return page(
        request,
        principal,
        "history.html",
        {
            "operations": operations,
            "problem": problem,
            "action": action or "",
            "actions": [a.value for a in OperationAction],
            "older": operations[-1].id if len(operations) == HISTORY_PAGE else None,
            "selection_text": lambda s: json.dumps(s, ensure_ascii=True, sort_keys=True),
        },
        nav="history",
    )


async def archive_page(request: Request) -> Response:
    """``/archive``: archived events, newest first, by status, handler, group or payload text;
    each with what became of it."""
    principal = await require(request, Permission.READ)
    console = console_of(request)
    params = request.query_params
    found, problem = await attempt(browse_archive, console, params)
    return page(
        request,
        principal,
        "archive.html",
        {
            "page": found,
            "problem": problem,
            "statuses": [s.value for s in ArchiveStatus],
            "chosen": params.getlist("status"),
            "handlers": sorted(console.app.handlers),
            "given": {k: params.get(k) or "" for k in ("handler", "group", "payload")},
        },
        nav="archive",
    )


async def search_page(request: Request) -> Response:
    """``/search?q=``: where an event id, a group id, an ordering key or an ingest key is."""
    principal = await require(request, Permission.READ)
    text = request.query_params.get("q", "")
    result, problem = (
        (None, None)
        if not text.strip()
        else await attempt(search.search, console_of(request).app, text)
    )
    return page(
        request,
        principal,
        "search.html",
        {
            "result": result,
            "problem": problem,
            "text": text,
            "handlers": set(console_of(request).app.handlers),
        },
        refresh=False,
    )


async def workers_page(request: Request) -> Response:
    """``/workers``: the fleet's workers, each with what an operator asked of it, and (for an
    operator) drain and stop."""
    principal = await require(request, Permission.READ)
    found = await call(fleet.workers, console_of(request).app)
    return page(request, principal, "workers.html", {"workers": found}, nav="workers")


async def inboxes_page(request: Request) -> Response:
    """``/inboxes``: each inbox, its horizon and the message ids it keeps (counted up to
    :data:`outbox.ops.inboxes.COUNT_CAP`, so that a page load costs a bounded read)."""
    principal = await require(request, Permission.READ)
    found = await call(inboxes.inboxes, console_of(request).app)
    return page(request, principal, "inboxes.html", {"inboxes": found}, nav="inboxes")


async def static(request: Request) -> Response:
    """``/static/{name}``: the pages' script and style sheet."""
    await require(request, Permission.READ)
    name = request.path_params["name"]
    if name not in _STATIC:
        raise HTTPException(404, f"no file {name!r}")
    return FileResponse(
        _STATIC_DIR / name,
        media_type=_STATIC[name],
        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
    )


ROUTES: list[BaseRoute] = [
    Route("/", overview, methods=["GET"], name="pages.overview"),
    Route("/handlers/{handler}", handler_page, methods=["GET"], name="pages.handler"),
    Route("/handlers/{handler}/pause", actions.pause, methods=["POST"], name="pages.pause"),
    Route("/handlers/{handler}/resume", actions.resume, methods=["POST"], name="pages.resume"),
    Route("/groups", group_list, methods=["GET"], name="pages.groups"),
    Route("/groups/replay", actions.bulk_replay, methods=["POST"], name="pages.bulk_replay"),
    Route("/groups/retry", actions.bulk_retry, methods=["POST"], name="pages.bulk_retry"),
    Route("/groups/discard", actions.bulk_discard, methods=["POST"], name="pages.bulk_discard"),
    Route("/groups/{group_id}", group_page, methods=["GET"], name="pages.group"),
    Route("/groups/{group_id}/replay", actions.replay_group, methods=["POST"], name="pages.replay"),
    Route("/groups/{group_id}/retry", actions.retry_group, methods=["POST"], name="pages.retry"),
    Route(
        "/groups/{group_id}/discard", actions.discard_group, methods=["POST"], name="pages.discard"
    ),
    Route(
        "/groups/{group_id}/events/{event_id:int}/replay",
        actions.edit_event,
        methods=["POST"],
        name="pages.edit",
    ),
    Route("/dead", dead_page, methods=["GET"], name="pages.dead"),
    Route("/held/release", actions.release_held, methods=["POST"], name="pages.release_held"),
    Route(
        "/refused/release", actions.release_refused, methods=["POST"], name="pages.release_refused"
    ),
    Route("/history", history_page, methods=["GET"], name="pages.history"),
    Route("/archive", archive_page, methods=["GET"], name="pages.archive"),
    Route("/search", search_page, methods=["GET"], name="pages.search"),
    Route("/workers", workers_page, methods=["GET"], name="pages.workers"),
    Route("/workers/{worker_id}/drain", actions.ask_worker, methods=["POST"], name="pages.drain"),
    Route("/workers/{worker_id}/stop", actions.ask_worker, methods=["POST"], name="pages.stop"),
    Route("/inboxes", inboxes_page, methods=["GET"], name="pages.inboxes"),
    Route("/static/{name}", static, methods=["GET"], name="pages.static"),
]
