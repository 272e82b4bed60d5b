"""The HTTP API: JSON for everything the dashboard shows and every action it offers, and
ingest for producers outside Python; under ``/api/v1``, described by ``/api/v1/openapi.json``.

Each endpoint asks the operations layer (``outbox.ops.groups``, ``outbox.ops.archive``,
``outbox.ops.flow``, ``outbox.ops.ingest``...), as the command line does, so the two always agree.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Any, TypeVar, overload

import msgspec
from starlette.datastructures import ImmutableMultiDict
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from outbox._core import log as _log
from outbox._core.checks import MAX_JSON_DEPTH, json_problem
from outbox._core.values import jsonable
from outbox.ops import (
    archive,
    fanout,
    flags,
    fleet,
    flow,
    group_operations,
    groups,
    holds,
    inboxes,
    ingest,
    metrics,
    operators,
    scaling,
    search,
)
from outbox.ops.edit import edit as edit_event
from outbox.ops.selection import Selection
from outbox.schema import WorkerRequest
from outbox.web import bodies
from outbox.web._console import Console, call, console_of, handler_names, require
from outbox.web.auth import Permission, Principal

PREFIX = "/api/v1"
MAX_BODY_DEPTH = MAX_JSON_DEPTH + 8
"""The deepest request body the API reads: a batch's events, each event's values, and a JSON
column's value within them nested as deep as outbox stores it."""

log = _log.get_logger(__name__)
B = TypeVar("B", bound=bodies.Body)


def answer(value: Any, status: int = 200) -> JSONResponse:
    """``value`` as a JSON answer (a declared answer: its fields in their order)."""
    if isinstance(value, msgspec.Struct):
        value = msgspec.to_builtins(value)
    return JSONResponse(jsonable(value), status_code=status)


async def _read(request: Request, kind: type[B]) -> B:
    """The request's body as a ``kind`` (:mod:`outbox.web.bodies`; no body: an empty object):
    400 naming the field that is not as declared."""
    return bodies.read(await _body(request), kind)


async def _body(request: Request) -> dict[str, Any]:
    """The request's JSON object: 400 naming what is wrong when it is not one, or when a field
    holds what no database stores (:func:`outbox._core.checks.json_problem`); 413 past
    ``MAX_BODY_BYTES``, counted as it is read (:class:`outbox.web._limits.BodyLimit`)."""
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = json.loads(raw, parse_constant=_not_json, parse_int=_integer)
    except RecursionError as error:
        raise HTTPException(
            400, f"request body is nested deeper than {MAX_BODY_DEPTH} levels"
        ) from error
    except (ValueError, UnicodeDecodeError) as error:
        raise HTTPException(400, f"request body is not JSON: {error}") from error
    if not isinstance(body, dict):
        raise HTTPException(400, "request body must be a JSON object")
    problem = json_problem(body, max_depth=MAX_BODY_DEPTH)
    if problem is not None:
        raise HTTPException(400, problem)
    return body


def _not_json(constant: str) -> Any:
    """``NaN``, ``Infinity``: Python's json reads them, JSON has no such number."""
    raise ValueError(f"{constant} is not a JSON number")


def _integer(text: str) -> int:
    """A JSON integer; one past a double's range (309 digits) is refused before Python spends
    the time to convert it."""
    if len(text.lstrip("-")) > 309:
        raise ValueError(f"a number of {len(text)} digits is past a double's range")
    return int(text)


def _uuid(text: str, name: str = "group_id") -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except (ValueError, AttributeError, TypeError) as error:
        raise HTTPException(400, f"{name}: {text!r} is not a UUID") from error


def selection_of(console: Console, given: ImmutableMultiDict[str, Any]) -> Selection:
    """A selection from query parameters or a form's fields (repeated for several)."""
    older_than = given.get("older_than")
    if isinstance(older_than, str):
        try:
            older_than = float(older_than)
        except ValueError as error:
            raise HTTPException(400, f"older_than: {older_than!r} is not seconds") from error
    return Selection(
        handlers=handler_names(console, given.getlist("handler")),
        statuses=tuple(given.getlist("status")),
        older_than=older_than,
        error=given.get("error") or None,
        key=given.get("key") or None,
        payload=given.get("payload") or None,
        group_ids=tuple(_uuid(g) for g in given.getlist("group")),
    )


def _selection(console: Console, body: bodies.SelectionBody) -> Selection:
    """The selection of a body (:class:`outbox.web.bodies.SelectionBody`)."""
    return Selection(
        handlers=handler_names(console, body.handler or []),
        statuses=tuple(body.status or ()),
        older_than=body.older_than,
        error=body.error,
        key=body.key,
        payload=body.payload,
        group_ids=tuple(body.group or ()),
    )


def _hide(console: Console, value: Any) -> Any:
    """A group's detail with the values of events of handlers whose payloads are hidden
    replaced by a note."""
    if isinstance(value, groups.GroupDetail) and not console.shows_payloads(value.group.handler):
        events = [groups.Event(e.id, {"hidden": True}, e.status, e.error) for e in value.events]
        return groups.GroupDetail(value.group, events, value.attempts, value.lease, value.archived)
    return value


def _record(console: Console, principal: Principal, action: str, **fields: Any) -> None:
    """Log a write with who made it, and let the next status read show what it did."""
    console.snapshots.expire()
    log.info(_log.WEB_WRITE, actor=principal.name, via=principal.via, action=action, **fields)


# --- reads ----------------------------------------------------------------------------------


async def status(request: Request) -> Response:
    """Every handler's status, from the snapshot all viewers share, and when it was read."""
    await require(request, Permission.READ)
    console = console_of(request)
    snapshot = await call(console.snapshots.get)
    return answer(bodies.Statuses(snapshot.taken_at, snapshot.handlers))


async def desired_workers(request: Request) -> Response:
    """``GET /scaling``: the worker slots that keep every promise, per band and in total, the
    time to drain at the fleet's size now, and each band's Apdex (:mod:`outbox.ops.scaling`);
    ``desired_workers`` is what an autoscaler follows (KEDA's metrics-api scaler)."""
    await require(request, Permission.READ)
    console = console_of(request)
    names = handler_names(console, request.query_params.getlist("handler"))
    options: dict[str, float] = {}
    for name in ("target", "rate_window", "apdex_window"):
        given = request.query_params.get(name)
        if given is not None:
            try:
                options[name] = float(given)
            except ValueError:
                raise HTTPException(400, f"{name}: expected a number, got {given!r}") from None
    found = await call(scaling.read_scaling, console.app, names, **options)
    return answer(found.as_dict())


async def throughput(request: Request) -> Response:
    """``GET /handlers/{handler}/throughput``: what the handler handled over the ``range``
    (``hour``, a bucket a minute; ``day`` or ``week``, a bucket an hour), oldest first."""
    await require(request, Permission.READ)
    console = console_of(request)
    [name] = handler_names(console, [request.path_params["handler"]])
    span = request.query_params.get("range", metrics.ThroughputRange.HOUR.value)
    charts = await call(metrics.throughput_charts, console.app, [name], span)
    return answer(charts[name].as_dict())


async def list_groups(request: Request) -> Response:
    """``GET /groups``: the groups a selection matches (query parameters as ``outbox groups``'s
    options), a page at a time (``limit``, ``after``)."""
    await require(request, Permission.READ)
    console = console_of(request)
    params = request.query_params
    selection = await call(selection_of, console, params)
    limit = params.get("limit", str(groups.DEFAULT_LIMIT))
    if not limit.isdecimal():
        raise HTTPException(400, f"limit: {limit!r} is not a number of groups")
    listing = await call(
        groups.find, console.app, selection, limit=int(limit), after=params.get("after")
    )
    return answer(listing)


async def show_group(request: Request) -> Response:
    """``GET /groups/{group_id}``: one group in full."""
    await require(request, Permission.READ)
    console = console_of(request)
    detail = await call(groups.show, console.app, _uuid(request.path_params["group_id"]))
    return answer(_hide(console, detail))


async def history(request: Request) -> Response:
    """``GET /history``: operators' replays, edits and discards, newest first."""
    await require(request, Permission.READ)
    console = console_of(request)
    params = request.query_params
    limit = params.get("limit", "50")
    before = params.get("before")
    if not limit.isdecimal() or (before is not None and not before.isdecimal()):
        raise HTTPException(400, "limit and before: expected whole numbers")
    operations = await call(
        operators.history,
        console.app,
        action=params.get("action"),
        limit=int(limit),
        before_id=None if before is None else int(before),
    )
    return answer(operations)


@overload
def _number(params: Any, name: str) -> int | None: ...
@overload
def _number(params: Any, name: str, default: int) -> int: ...
def _number(params: Any, name: str, default: int | None = None) -> int | None:
    """A whole number of the query, or ``default``: 400 naming it when it is not one."""
    value = params.get(name)
    if value is None:
        return default
    if not value.isdecimal():
        raise HTTPException(400, f"{name}: {value!r} is not a whole number")
    return int(value)


def browse_archive(console: Console, params: Any) -> archive.ArchivePage:
    """A page of the archive by the query's filters, the values of hidden handlers' events
    left out: what the API and the archive page answer."""
    handler = params.get("handler") or None
    if handler is not None:
        handler_names(console, [handler])
    group = params.get("group") or None
    found = archive.browse(
        console.app,
        status=params.getlist("status") or None,
        handler=handler,
        group_id=None if group is None else _uuid(group, "group"),
        payload=params.get("payload") or None,
        limit=_number(params, "limit", 50),
        before=_number(params, "before"),
    )
    events = [
        e if console.shows_payloads(e.handler) else dataclasses.replace(e, values={"hidden": True})
        for e in found.events
    ]
    return dataclasses.replace(found, events=events)


async def archived(request: Request) -> Response:
    """``GET /archive``: archived events, newest first, by status, handler, group or payload
    text."""
    await require(request, Permission.READ)
    console = console_of(request)
    return answer(await call(browse_archive, console, request.query_params))


async def find(request: Request) -> Response:
    """``GET /search?q=``: where an event id, a group id, an ordering key or an ingest key
    is."""
    await require(request, Permission.READ)
    text = request.query_params.get("q", "")
    return answer(await call(search.search, console_of(request).app, text))


async def workers(request: Request) -> Response:
    """``GET /workers``: the fleet's workers."""
    await require(request, Permission.READ)
    return answer(await call(fleet.workers, console_of(request).app))


async def held_keys(request: Request) -> Response:
    """``GET /held``: ordering keys held back by dead groups."""
    await require(request, Permission.READ)
    handler = request.query_params.get("handler")
    if handler is not None:
        handler_names(console_of(request), [handler])
    return answer(await call(holds.held_keys, console_of(request).app, handler))


async def refused_groups(request: Request) -> Response:
    """``GET /refused``: groups whose outcome the database refused to record."""
    await require(request, Permission.READ)
    handler = request.query_params.get("handler")
    if handler is not None:
        handler_names(console_of(request), [handler])
    return answer(await call(holds.refused_groups, console_of(request).app, handler))


async def inbox_list(request: Request) -> Response:
    """``GET /inboxes``: each inbox, its horizon and the message ids it keeps."""
    await require(request, Permission.READ)
    return answer(await call(inboxes.inboxes, console_of(request).app))


async def fanout_list(request: Request) -> Response:
    """``GET /fanouts``: each fan-out, its source and consumers and the events waiting in each."""
    await require(request, Permission.READ)
    return answer(await call(fanout.fanouts, console_of(request).app))


async def flag_list(request: Request) -> Response:
    """``GET /flags``: each flag handler, its business table and the rows flagged on it."""
    await require(request, Permission.READ)
    return answer(await call(flags.flag_tables, console_of(request).app))


# --- actions --------------------------------------------------------------------------------


async def discard(request: Request) -> Response:
    """``POST /groups/discard``: give up the groups a selection matches (``dry_run`` first)."""
    principal = await require(request, Permission.OPERATE, write=True)
    console = console_of(request)
    body = await _read(request, bodies.DiscardBody)
    selection = await call(_selection, console, body)
    dry_run = bool(body.dry_run)
    result = await call(
        group_operations.discard,
        console.app,
        selection,
        actor=principal.name,
        reason=body.reason,
        dry_run=dry_run,
    )
    if not dry_run:
        _record(
            console, principal, "discard", operation=result.operation_id, groups=len(result.groups)
        )
    return answer(result)


async def replay(request: Request) -> Response:
    """``POST /groups/replay``: replay the dead groups a selection matches (``dry_run`` first)."""
    principal = await require(request, Permission.OPERATE, write=True)
    console = console_of(request)
    body = await _read(request, bodies.SelectionBody)
    selection = await call(_selection, console, body)
    dry_run = bool(body.dry_run)
    result = await call(
        group_operations.replay, console.app, selection, actor=principal.name, dry_run=dry_run
    )
    if not dry_run:
        _record(
            console, principal, "replay", operation=result.operation_id, groups=len(result.groups)
        )
    return answer(result)


async def replay_group(request: Request) -> Response:
    """``POST /groups/{group_id}/replay``: replay one dead group, or every discarded event of
    a discarded one (``dry_run`` first)."""
    principal = await require(request, Permission.OPERATE, write=True)
    console = console_of(request)
    group_id = _uuid(request.path_params["group_id"])
    dry_run = bool((await _read(request, bodies.DryRun)).dry_run)
    result = await call(
        group_operations.replay_group, console.app, group_id, actor=principal.name, dry_run=dry_run
    )
    if not dry_run:
        _record(console, principal, "replay", operation=result.operation_id, group_id=str(group_id))
    return answer(result)


async def retry(request: Request) -> Response:
    """``POST /groups/retry``: run now the groups a selection matches that wait for a retry
    or a deferral (``dry_run`` first)."""
    principal = await require(request, Permission.OPERATE, write=True)
    console = console_of(request)
    body = await _read(request, bodies.SelectionBody)
    selection = await call(_selection, console, body)
    dry_run = bool(body.dry_run)
    result = await call(
        group_operations.retry, console.app, selection, actor=principal.name, dry_run=dry_run
    )
    if not dry_run:
        _record(
            console, principal, "retry", operation=result.operation_id, groups=len(result.groups)
        )
    return answer(result)


async def edit(request: Request) -> Response:
    """``POST /groups/{group_id}/events/{event_id}/replay``: replay one dead or discarded
    event with the values given in ``values`` changed."""
    principal = await require(request, Permission.OPERATE, write=True)
    console = console_of(request)
    values = (await _read(request, bodies.EditBody)).values
    event_id = request.path_params["event_id"]
    group_id = _uuid(request.path_params["group_id"])
    result = await call(edit_event, console.app, group_id, event_id, values, actor=principal.name)
    _record(console, principal, "edit", operation=result.operation_id, group_id=str(group_id))
    return answer(result)


async def pause(request: Request) -> Response:
    """``POST /handlers/{handler}/pause``: pause a handler across the fleet (``seconds``:
    until then; without: until resumed)."""
    principal = await require(request, Permission.OPERATE, write=True)
    console = console_of(request)
    [name] = handler_names(console, [request.path_params["handler"]])
    body = await _read(request, bodies.PauseBody)
    seconds = body.seconds
    reason = f"paused by {principal.name}" if body.reason is None else body.reason
    await call(flow.pause, console.app, name, until=seconds, reason=reason, actor=principal.name)
    _record(console, principal, "pause", handler=name, seconds=seconds)
    return answer(bodies.Paused(handler=name, paused=True, seconds=seconds, reason=reason))


async def resume(request: Request) -> Response:
    """``POST /handlers/{handler}/resume``: end a handler's pause (and close its breaker)."""
    principal = await require(request, Permission.OPERATE, write=True)
    console = console_of(request)
    [name] = handler_names(console, [request.path_params["handler"]])
    was = await call(flow.resume, console.app, name, actor=principal.name)
    _record(console, principal, "resume", handler=name)
    return answer(bodies.Resumed(handler=name, paused=False, was_paused=was))


async def known_worker(console: Console, worker_id: str) -> None:
    """404 naming ``worker_id`` when no worker has that id."""
    found = {w.id for w in await call(fleet.workers, console.app)}
    if worker_id not in found:
        raise HTTPException(404, f"no worker {worker_id!r} (GET {PREFIX}/workers lists them)")


async def ask_worker(request: Request) -> Response:
    """``POST /workers/{worker_id}/drain`` or ``/stop``: ask one worker, wherever it runs, to
    drain (finish what it holds, take no more, exit) or to stop (as SIGTERM); it acts at its
    next heartbeat, within ``acts_within`` seconds. 409 for a worker too old to read it."""
    principal = await require(request, Permission.OPERATE, write=True)
    console = console_of(request)
    await _read(request, bodies.Nothing)
    worker_id = request.path_params["worker_id"]
    asked = WorkerRequest(request.url.path.rsplit("/", 1)[-1])
    await known_worker(console, worker_id)
    done = await call(fleet.ask, console.app, worker_id, asked, actor=principal.name)
    _record(console, principal, asked.value, worker=worker_id)
    return answer(
        bodies.WorkerAsked(
            worker=done.worker.id,
            hostname=done.worker.hostname,
            pid=done.worker.pid,
            request=done.request,
            acts_within=done.acts_within,
        )
    )


async def release_refused(request: Request) -> Response:
    """``POST /refused/release``: give refused groups back to the workers (``handler``,
    ``group_id``: only those)."""
    principal = await require(request, Permission.OPERATE, write=True)
    console = console_of(request)
    body = await _read(request, bodies.ReleaseRefusedBody)
    handler, group = body.handler, body.group_id
    if handler is not None:
        handler_names(console, [handler])
    count = await call(holds.release_refused, console.app, handler, group, actor=principal.name)
    _record(
        console,
        principal,
        "release_refused",
        handler=handler,
        group_id=None if group is None else str(group),
        released=count,
    )
    return answer(bodies.Released(released=count))


async def release_held(request: Request) -> Response:
    """``POST /held/release``: release held ordering keys (``handler``, ``key``,
    ``group_id``: only those)."""
    principal = await require(request, Permission.OPERATE, write=True)
    console = console_of(request)
    body = await _read(request, bodies.ReleaseHeldBody)
    if body.handler is not None:
        handler_names(console, [body.handler])
    count = await call(
        holds.release_keys, console.app, body.handler, body.key, body.group_id, actor=principal.name
    )
    _record(console, principal, "release_held", released=count)
    return answer(bodies.Released(released=count))


# --- ingest ---------------------------------------------------------------------------------


async def _ingest(
    console: Console, name: str, pairs: list[Any]
) -> list[ingest.Ingested] | Response:
    """``ingest.ingest`` of ``pairs``; a conflict is answered 409, saying key by key what
    became of each event (``events``), as a batch's answer does."""
    try:
        return await call(ingest.ingest, console.app, name, pairs)
    except HTTPException as error:
        conflict = error.__cause__
        if isinstance(conflict, ingest.IngestConflictError):
            return answer(bodies.Conflict(error=str(conflict), events=conflict.events), 409)
        raise


async def put_event(request: Request) -> Response:
    """``PUT /handlers/{handler}/events/{key}``: write one event (the body: its values) under
    the producer's idempotency key; 201 when written now, 200 when it was written before with
    the same values, 409 naming the key when with other values."""
    await require(request, Permission.INGEST, write=True)
    console = console_of(request)
    [name] = handler_names(console, [request.path_params["handler"]])
    values = await _body(request)
    ingested = await _ingest(console, name, [(request.path_params["key"], values)])
    if isinstance(ingested, Response):
        return ingested
    [written] = ingested
    return answer(written, 201 if written.created else 200)


async def post_events(request: Request) -> Response:
    """``POST /handlers/{handler}/events``: write a batch (``events``: a list of ``{"key",
    "values"}``), all or nothing; each event says what became of it (``result``: new, same,
    unchecked; a conflict is a 409 and nothing is written)."""
    await require(request, Permission.INGEST, write=True)
    console = console_of(request)
    [name] = handler_names(console, [request.path_params["handler"]])
    body = await _read(request, bodies.IngestBatch)
    written = await _ingest(console, name, [(event.key, event.values) for event in body.events])
    if isinstance(written, Response):
        return written
    created = sum(1 for w in written if w.created)
    return answer(
        bodies.Written(written=created, duplicates=len(written) - created, events=written)
    )


ROUTES = [
    Route(f"{PREFIX}/status", status, methods=["GET"]),
    Route(f"{PREFIX}/scaling", desired_workers, methods=["GET"]),
    Route(f"{PREFIX}/groups", list_groups, methods=["GET"]),
    Route(f"{PREFIX}/groups/discard", discard, methods=["POST"]),
    Route(f"{PREFIX}/groups/replay", replay, methods=["POST"]),
    Route(f"{PREFIX}/groups/retry", retry, methods=["POST"]),
    Route(f"{PREFIX}/groups/{{group_id}}", show_group, methods=["GET"]),
    Route(f"{PREFIX}/groups/{{group_id}}/replay", replay_group, methods=["POST"]),
    Route(f"{PREFIX}/groups/{{group_id}}/events/{{event_id:int}}/replay", edit, methods=["POST"]),
    Route(f"{PREFIX}/handlers/{{handler}}/pause", pause, methods=["POST"]),
    Route(f"{PREFIX}/handlers/{{handler}}/resume", resume, methods=["POST"]),
    Route(f"{PREFIX}/handlers/{{handler}}/throughput", throughput, methods=["GET"]),
    Route(f"{PREFIX}/handlers/{{handler}}/events", post_events, methods=["POST"]),
    Route(f"{PREFIX}/handlers/{{handler}}/events/{{key}}", put_event, methods=["PUT"]),
    Route(f"{PREFIX}/history", history, methods=["GET"]),
    Route(f"{PREFIX}/archive", archived, methods=["GET"]),
    Route(f"{PREFIX}/search", find, methods=["GET"]),
    Route(f"{PREFIX}/workers", workers, methods=["GET"]),
    Route(f"{PREFIX}/workers/{{worker_id}}/drain", ask_worker, methods=["POST"]),
    Route(f"{PREFIX}/workers/{{worker_id}}/stop", ask_worker, methods=["POST"]),
    Route(f"{PREFIX}/held", held_keys, methods=["GET"]),
    Route(f"{PREFIX}/held/release", release_held, methods=["POST"]),
    Route(f"{PREFIX}/refused", refused_groups, methods=["GET"]),
    Route(f"{PREFIX}/refused/release", release_refused, methods=["POST"]),
    Route(f"{PREFIX}/inboxes", inbox_list, methods=["GET"]),
    Route(f"{PREFIX}/fanouts", fanout_list, methods=["GET"]),
    Route(f"{PREFIX}/flags", flag_list, methods=["GET"]),
]
