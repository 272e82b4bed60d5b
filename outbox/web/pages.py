"""The dashboard's pages: server-rendered HTML (Jinja2), refreshed in place by a little plain
JavaScript, every action a form that carries the page's CSRF token.

Each page asks the operations layer the API asks (``outbox.metrics`` through the shared
snapshot, ``outbox.groups``, ``outbox.archive``, ``outbox.flow``, ``outbox.fleet``,
``outbox.held``, ``outbox.refused``), so pages, API and command line always agree. A page asked
for with ``X-Outbox-Fragment: 1`` answers its main part only: what ``static/console.js`` swaps
in every refresh period. A write is a POST form: it needs an operator and the CSRF token of the
``outbox_csrf`` cookie (which pages set), does what it says, and sends the browser back (303)
with a message saying what was done.
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlencode

import jinja2
from markupsafe import Markup
from starlette.datastructures import FormData, ImmutableMultiDict
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.templating import Jinja2Templates

from outbox import _log, archive, fleet, flow, groups, held, metrics, refused
from outbox.jsonable import jsonable
from outbox.schema import GroupStatus, OperationAction
from outbox.web._console import Console, call, console_of, handler_names, require
from outbox.web.api import selection_of
from outbox.web.auth import CSRF_COOKIE, CSRF_FIELD, Permission, Principal, new_csrf_token

__all__ = ["FRAGMENT_HEADER", "ROUTES", "error_page", "wants_html"]

T = TypeVar("T")
log = _log.get_logger(__name__)

FRAGMENT_HEADER = "X-Outbox-Fragment"
"""A request with this header set to ``1`` gets the page's main part only (a refresh)."""
PAGE_SIZE = 50
"""Groups a listing page shows."""
RECENT_GROUPS = 20
"""Groups the handler page shows."""
HISTORY_PAGE = 50
"""Operations the history page shows."""
VALUE_SHOWN = 2_000
"""Characters of one text value of an event a page shows; the rest are counted."""
PAYLOAD_SHOWN = 20_000
"""Characters of an event's values (as JSON) a page shows; the rest are counted."""
LISTED = 200
"""Held keys and refused groups the dead letters page lists; the rest are counted."""
FLASH_SHOWN = 300
"""Characters of a message after a write that a page shows."""
FILTERS = ("handler", "status", "older_than", "error", "key", "payload")
"""The query parameters (and form fields) of a selection, as ``outbox groups`` names them."""
DEAD_STATUSES = (GroupStatus.DEAD, GroupStatus.HELD)

_HERE = Path(__file__).parent
_STATIC = {"console.js": "text/javascript; charset=utf-8", "console.css": "text/css; charset=utf-8"}
# Pages run no script but console.js, and load nothing from elsewhere; a bar's width is an
# inline style. No page may be framed (a write button under someone else's page).
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "Vary": FRAGMENT_HEADER,
}
# Characters that would act on the text around them rather than show: control characters and
# the bidirectional overrides and isolates. Shown as \uXXXX instead.
_INVISIBLE = re.compile(
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)
_TOKEN = re.compile(r"[A-Za-z0-9_-]{32,128}")


# --- rendering ------------------------------------------------------------------------------


def _visible(value: Any) -> Any:
    """What a page shows of ``value``: nothing for None, text with its invisible characters
    spelled out (Jinja2 escapes it next)."""
    if value is None:
        return ""
    if isinstance(value, str) and not isinstance(value, Markup):
        return _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", value)
    return value


def duration(seconds: float | None) -> str:
    """Seconds in words a glance takes in: ``4.2 s``, ``35 s``, ``12 min``, ``3.5 h``,
    ``2.0 d``; a dash for none."""
    if seconds is None:
        return "—"
    size = abs(seconds)
    if size < 10:
        text = f"{size:.1f} s"
    elif size < 120:
        text = f"{size:.0f} s"
    elif size < 7200:
        text = f"{size / 60:.0f} min"
    elif size < 172_800:
        text = f"{size / 3600:.1f} h"
    else:
        text = f"{size / 86_400:.1f} d"
    return f"-{text}" if seconds < 0 else text


def _count(value: int, cap: int | None = None) -> str:
    """A count with its thousands marked; ``at least`` when it reached the ``cap`` it was
    counted to."""
    return f"at least {value:,}" if cap is not None and value >= cap else f"{value:,}"


def _first_line(text: str | None, length: int = 200) -> str:
    lines = (text or "").strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= length else f"{line[:length]}…"


def _cut(value: Any) -> Any:
    if isinstance(value, str) and len(value) > VALUE_SHOWN:
        return f"{value[:VALUE_SHOWN]}... ({len(value) - VALUE_SHOWN:,} more characters)"
    if isinstance(value, dict):
        return {k: _cut(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v) for v in value]
    return value


def payload_text(values: Mapping[str, Any]) -> str:
    """An event's values as a page shows them: JSON with every character outside ASCII
    escaped (no control or bidirectional character reaches the page), each text cut at
    :data:`VALUE_SHOWN` characters and the whole at :data:`PAYLOAD_SHOWN`."""
    shown = _cut(jsonable(dict(values)))
    text = json.dumps(shown, ensure_ascii=True, indent=2, sort_keys=True)
    if len(text) > PAYLOAD_SHOWN:
        more = len(text) - PAYLOAD_SHOWN
        text = f"{text[:PAYLOAD_SHOWN]}\n… {more:,} more characters"
    return text


def _when(value: Any) -> str:
    if hasattr(value, "strftime"):
        return str(value.strftime("%Y-%m-%d %H:%M:%S"))
    return str(value)


@jinja2.pass_context
def _link(context: Any, route: str, /, query: Any = None, **params: Any) -> str:
    """The path of a page (under wherever the console is mounted), with a query string."""
    request: Request = context["request"]
    path = request.url_for(route, **{k: str(v) for k, v in params.items()}).path
    pairs = list(query.items() if isinstance(query, Mapping) else query or [])
    pairs = [(k, str(v)) for k, v in pairs if v is not None and v != ""]
    return f"{path}?{urlencode(pairs)}" if pairs else path


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_HERE / "templates"),
        autoescape=True,
        finalize=_visible,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        duration=duration,
        count=_count,
        first_line=_first_line,
        payload=payload_text,
        when=_when,
    )
    env.globals["link"] = _link
    return env


templates = Jinja2Templates(env=_environment())


def wants_html(request: Request) -> bool:
    """Whether the request is a browser's, for a page rather than JSON."""
    return "text/html" in request.headers.get("accept", "")


def _csrf_token(request: Request) -> tuple[str, bool]:
    """The token the page's forms carry, and whether the cookie must be set (missing, or not
    one this console made)."""
    token = request.cookies.get(CSRF_COOKIE, "")
    if _TOKEN.fullmatch(token):
        return token, False
    return new_csrf_token(), True


def _page(
    request: Request,
    principal: Principal | None,
    template: str,
    context: Mapping[str, Any],
    *,
    nav: str = "",
    refresh: bool = True,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """A page, or its main part alone when the request asks for a fragment; sets the CSRF
    cookie when the browser has none."""
    console = console_of(request)
    token, fresh = _csrf_token(request) if principal is not None else ("", False)
    params = request.query_params
    full = {
        "request": request,
        "console_title": console.title,
        "principal": principal,
        "can_operate": principal is not None and principal.role.allows(Permission.OPERATE),
        "csrf_field": CSRF_FIELD,
        "csrf_token": token,
        "flash": params.get("flash", "")[:FLASH_SHOWN],
        "flash_level": "error" if params.get("level") == "error" else "ok",
        "refresh_seconds": console.refresh_seconds if refresh else 0,
        "fragment": request.headers.get(FRAGMENT_HEADER) == "1",
        "nav": nav,
        **context,
    }
    response = templates.TemplateResponse(
        request, template, full, status_code=status_code, headers={**_HEADERS, **(headers or {})}
    )
    if fresh:
        response.set_cookie(
            CSRF_COOKIE,
            token,
            path=request.scope.get("root_path") or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
    return response


def error_page(request: Request, status: int, detail: str, headers: dict[str, str]) -> Response:
    """An error as a small page, its text escaped."""
    return _page(
        request,
        None,
        "error.html",
        {"status": status, "detail": detail},
        refresh=False,
        status_code=status,
        headers=headers,
    )


def _path(
    request: Request, route: str, /, query: Iterable[tuple[str, str]] = (), **params: Any
) -> str:
    path = request.url_for(route, **{k: str(v) for k, v in params.items()}).path
    pairs = list(query)
    return f"{path}?{urlencode(pairs)}" if pairs else path


def _back(
    request: Request,
    route: str,
    message: str,
    /,
    *,
    error: bool = False,
    query: Iterable[tuple[str, str]] = (),
    **params: Any,
) -> Response:
    """After a write: 303 to the page ``route``, saying ``message``."""
    pairs = [*query, ("flash", message[:FLASH_SHOWN])]
    if error:
        pairs.append(("level", "error"))
    return RedirectResponse(_path(request, route, pairs, **params), status_code=303)


# --- what pages ask -------------------------------------------------------------------------


def _filters(given: Any) -> list[tuple[str, str]]:
    """The selection's parameters of a query string or a form, blanks left out."""
    return [
        (name, value.strip())
        for name, value in given.multi_items()
        if name in FILTERS and isinstance(value, str) and value.strip()
    ]


def _selection(
    console: Console, pairs: list[tuple[str, str]], statuses: Iterable[str] | None = None
) -> groups.Selection:
    """A selection of ``pairs`` (``statuses``: the only ones allowed, all when none given)."""
    if statuses is not None:
        allowed = [s.value if isinstance(s, GroupStatus) else s for s in statuses]
        given = [v for k, v in pairs if k == "status"]
        chosen = [s for s in given if s in allowed] or allowed
        pairs = [(k, v) for k, v in pairs if k != "status"] + [("status", s) for s in chosen]
    return selection_of(console, ImmutableMultiDict(pairs), many=True)


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


def _state_text(status: metrics.HandlerStatus) -> str:
    if status.paused:
        return metrics.pause_text(status.pause_cause, status.paused_for, status.pause_reason)
    if status.breaker == "probing":
        return "running: circuit breaker probing (one group at a time)"
    return "running"


def _row(status: metrics.HandlerStatus, deferred: int) -> HandlerRow:
    staleness = status.staleness or 0.0
    level = "late" if staleness > 1 else "warn" if staleness > 0.75 else "ok"
    return HandlerRow(status, deferred, min(staleness, 2.0) * 50, level, _state_text(status))


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
                selection = groups.Selection(handlers=(name,), statuses=(GroupStatus.DEFERRED,))
                listing = groups.find(console.app, selection, limit=1)
                counts[name] = listing.counts.get(GroupStatus.DEFERRED, 0)
            self.counts, self.taken_at = counts, taken_at
        return self.counts


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
    rows = [_row(s, deferred.get(s.handler, 0)) for s in snapshot.handlers]
    said = {
        "as_of": time.strftime("%H:%M:%S UTC", time.gmtime(snapshot.taken_at)),
        "snapshot_error": console.snapshots.error,
    }
    return said, rows


def _group_id(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError as error:
        raise HTTPException(404, f"no group {text!r}: not a group id") from error


def _record(principal: Principal, action: str, **fields: Any) -> None:
    log.info(_log.WEB_WRITE, actor=principal.name, via=principal.via, action=action, **fields)


async def _attempt(work: Any, *args: Any, **kwargs: Any) -> tuple[Any, str | None]:
    """``call(work, ...)``, with input outbox refuses (400, 409) as a message rather than an
    error page: the operator is sent back to the form, told what was wrong."""
    try:
        return await call(work, *args, **kwargs), None
    except HTTPException as error:
        if error.status_code in (400, 409):
            return None, str(error.detail)
        raise


async def _write(request: Request) -> tuple[Principal, Console, FormData]:
    """An operator's form, its CSRF token checked."""
    principal = await require(request, Permission.OPERATE, write=True)
    return principal, console_of(request), await request.form()


def _field(form: FormData, name: str) -> str | None:
    value = form.get(name)
    if not isinstance(value, str) or not value.strip():
        return None
    return value.strip()


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


# --- pages ----------------------------------------------------------------------------------


async def overview(request: Request) -> Response:
    """``/``: every handler's status from the snapshot all viewers share."""
    principal = await require(request, Permission.READ)
    said, rows = await _status(request)
    workers = await call(fleet.workers, console_of(request).app)
    alive = [w for w in workers if w.alive]
    return _page(
        request,
        principal,
        "overview.html",
        {"rows": rows, "workers_alive": len(alive), **said},
        nav="overview",
    )


async def handler_page(request: Request) -> Response:
    """``/handlers/{handler}``: one handler's status, its recent groups, pause and resume."""
    principal = await require(request, Permission.READ)
    console = console_of(request)
    [name] = handler_names(console, [request.path_params["handler"]])
    said, rows = await _status(request)
    [row] = [r for r in rows if r.status.handler == name]
    listing = await call(
        groups.find, console.app, groups.Selection(handlers=(name,)), limit=RECENT_GROUPS
    )
    handler = console.app.get_handler(name)
    return _page(
        request,
        principal,
        "handler.html",
        {
            "row": row,
            "s": row.status,
            **said,
            "listing": listing,
            "breaker": handler.circuit_breaker,
            "alert_staleness": handler.urgency.alert_staleness,
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
    pairs = _filters(request.query_params)
    after = request.query_params.get("after") or None
    try:
        selection = await call(_selection, console, pairs, statuses)
    except HTTPException as error:
        if error.status_code in (400, 404):
            return pairs, None, str(error.detail)
        raise
    listing, problem = await _attempt(
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
    return _page(request, principal, "groups.html", context, nav="groups")


async def dead_page(request: Request) -> Response:
    """``/dead``: dead and held groups (the same filters), held ordering keys and refused
    groups, each with what releases it."""
    principal = await require(request, Permission.READ)
    console = console_of(request)
    pairs, listing, problem = await _listing(request, DEAD_STATUSES)
    chosen = [v for k, v in pairs if k == "handler"]
    only = chosen[0] if len(chosen) == 1 and chosen[0] in console.app.handlers else None
    keys = await call(held.keys, console.app, only)
    held_back = await call(refused.groups, console.app, only)
    context = _listing_context(console, request, pairs, listing, problem, DEAD_STATUSES)
    context.update(page="pages.dead", from_page="dead", held_keys=keys, refused=held_back)
    context.update(listed=LISTED)
    return _page(request, principal, "dead.html", context, nav="dead")


async def group_page(request: Request) -> Response:
    """``/groups/{group_id}``: one group in full, with replay, discard and edit."""
    principal = await require(request, Permission.READ)
    console = console_of(request)
    group_id = _group_id(request.path_params["group_id"])
    detail: groups.GroupDetail = await call(groups.show, console.app, group_id)
    handler = console.app.handlers.get(detail.group.handler)
    columns = (
        []
        if handler is None
        else [c.name for c in handler.table.columns if c.name not in ("id", "group_id")]
    )
    status = detail.group.status
    return _page(
        request,
        principal,
        "group.html",
        {
            "d": detail,
            "g": detail.group,
            "shows_payloads": console.shows_payloads(detail.group.handler),
            "known_handler": handler is not None,
            "columns": [c for c in columns if c != "created_at"],
            "replayable": status in DEAD_STATUSES,
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
    if before is not None and not before.isdigit():
        raise HTTPException(400, f"before: {before!r} is not an operation's number")
    operations, problem = await _attempt(
        archive.history,
        console.app,
        action=action,
        limit=HISTORY_PAGE,
        before_id=None if before is None else int(before),
    )
    operations = operations or []
    return _page(
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


async def workers_page(request: Request) -> Response:
    """``/workers``: the fleet's workers."""
    principal = await require(request, Permission.READ)
    found = await call(fleet.workers, console_of(request).app)
    return _page(request, principal, "workers.html", {"workers": found}, nav="workers")


async def static(request: Request) -> Response:
    """``/static/{name}``: the pages' script and style sheet."""
    await require(request, Permission.READ)
    name = request.path_params["name"]
    if name not in _STATIC:
        raise HTTPException(404, f"no file {name!r}")
    return FileResponse(
        _HERE / "static" / name,
        media_type=_STATIC[name],
        headers={"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"},
    )


# --- writes ---------------------------------------------------------------------------------


async def pause(request: Request) -> Response:
    """Pause a handler across the fleet (``seconds``: for that long; empty: until resumed)."""
    principal, console, form = await _write(request)
    [name] = handler_names(console, [request.path_params["handler"]])
    given = _field(form, "seconds")
    reason = _field(form, "reason") or f"paused by {principal.name}"
    try:
        seconds = None if given is None else float(given)
    except ValueError:
        message = f"seconds: {given!r} is not a number"
        return _back(request, "pages.handler", message, error=True, handler=name)
    _, problem = await _attempt(flow.pause, console.app, name, until=seconds, reason=reason)
    if problem is not None:
        return _back(request, "pages.handler", problem, error=True, handler=name)
    console.snapshots.expire()
    _record(principal, "pause", handler=name, seconds=seconds)
    until = "until resumed" if seconds is None else f"for {duration(seconds)}"
    return _back(request, "pages.handler", f"{name} paused {until}: {reason}", handler=name)


async def resume(request: Request) -> Response:
    """End a handler's pause (and close its circuit breaker)."""
    principal, console, _ = await _write(request)
    [name] = handler_names(console, [request.path_params["handler"]])
    was = await call(flow.resume, console.app, name)
    console.snapshots.expire()
    _record(principal, "resume", handler=name)
    message = f"{name} resumed" if was else f"{name} was not paused"
    return _back(request, "pages.handler", message, handler=name)


def _result_text(result: groups.OperationResult) -> str:
    verb = "replayed" if result.action == "replay" else "discarded"
    text = f"{verb} {_plural(len(result.groups), 'group')} ({_plural(result.events, 'event')})"
    if result.operation_id is not None:
        text += f": operation {result.operation_id}"
    if result.skipped:
        group, why = result.skipped[0]
        text += f"; {_plural(len(result.skipped), 'group')} left ({group.group_id}: {why})"
    return text


async def replay_group(request: Request) -> Response:
    """Replay one dead (or held) group."""
    principal, console, _ = await _write(request)
    group_id = _group_id(request.path_params["group_id"])
    result, problem = await _attempt(
        groups.replay,
        console.app,
        groups.Selection(group_ids=(group_id,)),
        actor=principal.name,
    )
    if problem is not None:
        return _back(request, "pages.group", problem, error=True, group_id=group_id)
    console.snapshots.expire()
    _record(principal, "replay", operation=result.operation_id, groups=len(result.groups))
    return _back(
        request, "pages.group", _result_text(result), error=not result.groups, group_id=group_id
    )


async def discard_group(request: Request) -> Response:
    """Give one group up, with a reason."""
    principal, console, form = await _write(request)
    group_id = _group_id(request.path_params["group_id"])
    result, problem = await _attempt(
        groups.discard,
        console.app,
        groups.Selection(group_ids=(group_id,)),
        actor=principal.name,
        reason=_field(form, "reason"),
    )
    if problem is not None:
        return _back(request, "pages.group", problem, error=True, group_id=group_id)
    console.snapshots.expire()
    _record(principal, "discard", operation=result.operation_id, groups=len(result.groups))
    return _back(
        request, "pages.group", _result_text(result), error=not result.groups, group_id=group_id
    )


def changes_of(text: str) -> dict[str, str | None]:
    """An edit form's ``column=value`` lines as the changes they ask for (``null``: NULL), as
    ``outbox replay --set`` reads them; a ``ConfigurationError`` naming a line without ``=``."""
    from outbox.exceptions import ConfigurationError

    changes: dict[str, str | None] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, equals, value = line.partition("=")
        if not equals or not name.strip():
            raise ConfigurationError(f"{line.strip()[:80]!r}: expected column=value")
        changes[name.strip()] = None if value == "null" else value
    if not changes:
        raise ConfigurationError("no changes: give column=value lines")
    return changes


async def edit_event(request: Request) -> Response:
    """Replay one dead event with the values given (``changes``: ``column=value`` lines)."""
    principal, console, form = await _write(request)
    group_id = _group_id(request.path_params["group_id"])
    event_id: int = request.path_params["event_id"]
    changes, problem = await _attempt(changes_of, _field(form, "changes") or "")
    if problem is None:
        result, problem = await _attempt(
            archive.edit, console.app, group_id, event_id, changes, actor=principal.name
        )
    if problem is not None:
        return _back(request, "pages.group", problem, error=True, group_id=group_id)
    console.snapshots.expire()
    _record(principal, "edit", operation=result.operation_id, group_id=str(group_id))
    message = (
        f"event {event_id} replayed as event {result.new_event_id} with "
        f"{', '.join(result.changed)} changed: operation {result.operation_id}"
    )
    return _back(request, "pages.group", message, group_id=group_id)


async def _bulk(request: Request, action: OperationAction) -> Response:
    """Replay or discard what a filter matches: a dry run first, shown with a button that
    confirms it; confirmed, done, and back to the listing."""
    principal, console, form = await _write(request)
    pairs = _filters(form)
    back = "pages.dead" if _field(form, "from") == "dead" else "pages.groups"
    statuses = DEAD_STATUSES if back == "pages.dead" else None
    selection, problem = await _attempt(_selection, console, pairs, statuses)
    dry_run = _field(form, "confirm") != "yes"
    reason = _field(form, "reason")
    if problem is None:
        if action == OperationAction.REPLAY:
            work: Any = groups.replay
            options: dict[str, Any] = {}
        else:
            work, options = groups.discard, {"reason": reason}
        result, problem = await _attempt(
            work, console.app, selection, actor=principal.name, dry_run=dry_run, **options
        )
    if problem is not None:
        return _back(request, back, problem, error=True, query=pairs)
    if dry_run:
        context = {
            "result": result,
            "action": action.value,
            "pairs": pairs,
            "back": back,
            "from_page": "dead" if back == "pages.dead" else "",
            "reason": reason or "",
        }
        return _page(request, principal, "confirm.html", context, refresh=False)
    console.snapshots.expire()
    _record(principal, action.value, operation=result.operation_id, groups=len(result.groups))
    return _back(request, back, _result_text(result), query=pairs)


async def bulk_replay(request: Request) -> Response:
    """``POST /groups/replay``: replay the dead groups a filter matches (dry run first)."""
    return await _bulk(request, OperationAction.REPLAY)


async def bulk_discard(request: Request) -> Response:
    """``POST /groups/discard``: give up the groups a filter matches (dry run first)."""
    return await _bulk(request, OperationAction.DISCARD)


async def release_held(request: Request) -> Response:
    """Release held ordering keys (one key of a handler, or one group's)."""
    principal, console, form = await _write(request)
    group = _field(form, "group_id")
    count, problem = await _attempt(
        held.release,
        console.app,
        _field(form, "handler"),
        _field(form, "key"),
        None if group is None else _group_id(group),
    )
    if problem is not None:
        return _back(request, "pages.dead", problem, error=True)
    console.snapshots.expire()
    _record(principal, "release_held", released=count)
    return _back(request, "pages.dead", f"released {_plural(count, 'held key')}")


async def release_refused(request: Request) -> Response:
    """Give refused groups (of a handler, or one) back to the workers."""
    principal, console, form = await _write(request)
    group = _field(form, "group_id")
    handler = _field(form, "handler")
    count, problem = await _attempt(
        refused.release, console.app, handler, None if group is None else _group_id(group)
    )
    if problem is not None:
        return _back(request, "pages.dead", problem, error=True)
    console.snapshots.expire()
    _record(principal, "release_refused", handler=handler, group_id=group, released=count)
    return _back(request, "pages.dead", f"released {_plural(count, 'refused group')}")


ROUTES: list[BaseRoute] = [
    Route("/", overview, methods=["GET"], name="pages.overview"),
    Route("/handlers/{handler}", handler_page, methods=["GET"], name="pages.handler"),
    Route("/handlers/{handler}/pause", pause, methods=["POST"], name="pages.pause"),
    Route("/handlers/{handler}/resume", resume, methods=["POST"], name="pages.resume"),
    Route("/groups", group_list, methods=["GET"], name="pages.groups"),
    Route("/groups/replay", bulk_replay, methods=["POST"], name="pages.bulk_replay"),
    Route("/groups/discard", bulk_discard, methods=["POST"], name="pages.bulk_discard"),
    Route("/groups/{group_id}", group_page, methods=["GET"], name="pages.group"),
    Route("/groups/{group_id}/replay", replay_group, methods=["POST"], name="pages.replay"),
    Route("/groups/{group_id}/discard", discard_group, methods=["POST"], name="pages.discard"),
    Route(
        "/groups/{group_id}/events/{event_id:int}/replay",
        edit_event,
        methods=["POST"],
        name="pages.edit",
    ),
    Route("/dead", dead_page, methods=["GET"], name="pages.dead"),
    Route("/held/release", release_held, methods=["POST"], name="pages.release_held"),
    Route("/refused/release", release_refused, methods=["POST"], name="pages.release_refused"),
    Route("/history", history_page, methods=["GET"], name="pages.history"),
    Route("/workers", workers_page, methods=["GET"], name="pages.workers"),
    Route("/static/{name}", static, methods=["GET"], name="pages.static"),
]
