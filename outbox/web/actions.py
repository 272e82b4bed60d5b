"""The dashboard's writes: each a POST form that needs an operator and the CSRF token of the
``outbox_csrf`` cookie (which pages set), does what it says through the operations layer the
API and the command line use (``outbox.ops.flow``, ``outbox.ops.group_operations``,
``outbox.ops.edit``, ``outbox.ops.holds``), and sends the browser back (303) with a message saying
what was done. A write to many groups (a filter's, or those ticked on a listing) shows its dry
run first, with a button that confirms it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from urllib.parse import urlencode

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from outbox._core import log as _log
from outbox._core.durations import duration
from outbox.exceptions import ConfigurationError
from outbox.ops import edit, fleet, flow, group_operations, holds
from outbox.ops.selection import Selection
from outbox.schema import OperationAction, WorkerRequest
from outbox.web._console import Console, call, console_of, handler_names, require
from outbox.web._inputs import (
    DEAD_STATUSES,
    attempt,
    checked_form,
    filters_of,
    group_id_of,
    selection_of_filters,
)
from outbox.web._render import FLASH_SHOWN, page
from outbox.web.auth import Permission, Principal

log = _log.get_logger(__name__)


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


def _record(principal: Principal, action: str, **fields: Any) -> None:
    log.info(_log.WEB_WRITE, actor=principal.name, via=principal.via, action=action, **fields)


async def _write(request: Request) -> tuple[Principal, Console, FormData]:
    """An operator's form, its CSRF token and its text checked."""
    principal = await require(request, Permission.OPERATE, write=True)
    return principal, console_of(request), checked_form(await request.form())


def _field(form: FormData, name: str) -> str | None:
    value = form.get(name)
    if not isinstance(value, str) or not value.strip():
        return None
    return value.strip()


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}{'' if count == 1 else 's'}"


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
    _, problem = await attempt(
        flow.pause, console.app, name, until=seconds, reason=reason, actor=principal.name
    )
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
    was = await call(flow.resume, console.app, name, actor=principal.name)
    console.snapshots.expire()
    _record(principal, "resume", handler=name)
    message = f"{name} resumed" if was else f"{name} was not paused"
    return _back(request, "pages.handler", message, handler=name)


async def ask_worker(request: Request) -> Response:
    """Ask one worker to drain (finish what it holds, take no more, exit) or to stop (as
    SIGTERM); it acts at its next heartbeat."""
    principal, console, _ = await _write(request)
    worker_id = request.path_params["worker_id"]
    asked = WorkerRequest(request.url.path.rsplit("/", 1)[-1])
    done, problem = await attempt(fleet.ask, console.app, worker_id, asked, actor=principal.name)
    if problem is not None:
        return _back(request, "pages.workers", problem, error=True)
    _record(principal, asked.value, worker=worker_id)
    return _back(request, "pages.workers", done.text())


_DONE = {
    OperationAction.REPLAY: "replayed",
    OperationAction.RETRY: "made due now",
    OperationAction.DISCARD: "discarded",
}


def _result_text(result: group_operations.OperationResult) -> str:
    verb = _DONE[result.action]
    text = f"{verb} {_plural(len(result.groups), 'group')} ({_plural(result.events, 'event')})"
    if result.operation_id is not None:
        text += f": operation {result.operation_id}"
    if result.skipped:
        group, why = result.skipped[0]
        text += f"; {_plural(len(result.skipped), 'group')} left ({group.group_id}: {why})"
    return text


async def replay_group(request: Request) -> Response:
    """Replay one dead (or held) group, or every discarded event of a discarded one."""
    principal, console, _ = await _write(request)
    group_id = group_id_of(request.path_params["group_id"])
    result, problem = await attempt(
        group_operations.replay_group, console.app, group_id, actor=principal.name
    )
    if problem is not None:
        return _back(request, "pages.group", problem, error=True, group_id=group_id)
    console.snapshots.expire()
    _record(principal, "replay", operation=result.operation_id, groups=len(result.groups))
    return _back(
        request, "pages.group", _result_text(result), error=not result.groups, group_id=group_id
    )


async def retry_group(request: Request) -> Response:
    """Run one group now that waits for a retry or a deferral."""
    principal, console, _ = await _write(request)
    group_id = group_id_of(request.path_params["group_id"])
    result, problem = await attempt(
        group_operations.retry,
        console.app,
        Selection(group_ids=(group_id,)),
        actor=principal.name,
    )
    if problem is not None:
        return _back(request, "pages.group", problem, error=True, group_id=group_id)
    console.snapshots.expire()
    _record(principal, "retry", operation=result.operation_id, groups=len(result.groups))
    return _back(
        request, "pages.group", _result_text(result), error=not result.groups, group_id=group_id
    )


async def discard_group(request: Request) -> Response:
    """Give one group up, with a reason."""
    principal, console, form = await _write(request)
    group_id = group_id_of(request.path_params["group_id"])
    result, problem = await attempt(
        group_operations.discard,
        console.app,
        Selection(group_ids=(group_id,)),
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
    """Replay one dead or discarded event with the values given (``changes``: ``column=value``
    lines)."""
    principal, console, form = await _write(request)
    group_id = group_id_of(request.path_params["group_id"])
    event_id: int = request.path_params["event_id"]
    changes, problem = await attempt(changes_of, _field(form, "changes") or "")
    if problem is None:
        result, problem = await attempt(
            edit.edit, console.app, group_id, event_id, changes, actor=principal.name
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


_BULK = {
    OperationAction.REPLAY: group_operations.replay,
    OperationAction.RETRY: group_operations.retry,
    OperationAction.DISCARD: group_operations.discard,
}


def _chosen(form: FormData) -> list[tuple[str, str]]:
    """The groups ticked on a listing, as a selection's ``group`` pairs (a listing's
    checkboxes send their ids; a confirmation page sends them back)."""
    return [("group", v.strip()) for v in form.getlist("group") if isinstance(v, str) and v.strip()]


async def _bulk(request: Request, action: OperationAction) -> Response:
    """Replay, retry or discard what a filter matches, or the groups ticked on a listing: a
    dry run first, shown with a button that confirms it; confirmed, done, and back to the
    listing."""
    principal, console, form = await _write(request)
    pairs = filters_of(form)
    ticked = _chosen(form)
    back = "pages.dead" if _field(form, "from") == "dead" else "pages.groups"
    if _field(form, "ticked") == "yes" and not ticked:
        return _back(request, back, "no groups ticked: tick the groups first", error=True)
    statuses = DEAD_STATUSES if back == "pages.dead" else None
    selection, problem = await attempt(selection_of_filters, console, pairs + ticked, statuses)
    dry_run = _field(form, "confirm") != "yes"
    reason = _field(form, "reason")
    if problem is None:
        options: dict[str, Any] = {"reason": reason} if action == OperationAction.DISCARD else {}
        result, problem = await attempt(
            _BULK[action], console.app, selection, actor=principal.name, dry_run=dry_run, **options
        )
    if problem is not None:
        return _back(request, back, problem, error=True, query=pairs)
    if dry_run:
        context = {
            "result": result,
            "action": action.value,
            "pairs": pairs,
            "ticked": ticked,
            "back": back,
            "from_page": "dead" if back == "pages.dead" else "",
            "reason": reason or "",
        }
        return page(request, principal, "confirm.html", context, refresh=False)
    console.snapshots.expire()
    _record(principal, action.value, operation=result.operation_id, groups=len(result.groups))
    return _back(request, back, _result_text(result), query=pairs)


async def bulk_replay(request: Request) -> Response:
    """``POST /groups/replay``: replay the dead groups a filter matches (dry run first)."""
    return await _bulk(request, OperationAction.REPLAY)


async def bulk_retry(request: Request) -> Response:
    """``POST /groups/retry``: run now the groups a filter matches that wait for a retry or a
    deferral (dry run first)."""
    return await _bulk(request, OperationAction.RETRY)


async def bulk_discard(request: Request) -> Response:
    """``POST /groups/discard``: give up the groups a filter matches (dry run first)."""
    return await _bulk(request, OperationAction.DISCARD)


async def release_held(request: Request) -> Response:
    """Release held ordering keys (one key of a handler, or one group's)."""
    principal, console, form = await _write(request)
    group = _field(form, "group_id")
    count, problem = await attempt(
        holds.release_keys,
        console.app,
        _field(form, "handler"),
        _field(form, "key"),
        None if group is None else group_id_of(group),
        actor=principal.name,
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
    count, problem = await attempt(
        holds.release_refused,
        console.app,
        handler,
        None if group is None else group_id_of(group),
        actor=principal.name,
    )
    if problem is not None:
        return _back(request, "pages.dead", problem, error=True)
    console.snapshots.expire()
    _record(principal, "release_refused", handler=handler, group_id=group, released=count)
    return _back(request, "pages.dead", f"released {_plural(count, 'refused group')}")
