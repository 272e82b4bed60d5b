"""The API's OpenAPI document (``GET /api/v1/openapi.json``): every endpoint of
:mod:`outbox.web.api`, its parameters, bodies and answers (a test checks the routes and the
document name the same endpoints).

Bodies and the answers the API builds are the declarations the endpoints read and write with
(:mod:`outbox.web.bodies`; each handler's ingest: :mod:`outbox.web._ingest_bodies`), and the
answers of the operations layer its dataclasses (:mod:`outbox.web._answer_schemas`), as JSON
Schema under ``components``; this module says which endpoint takes and answers which, and its
query parameters.
"""

from __future__ import annotations

import copy
import dataclasses
import typing
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from outbox._core.version import VERSION
from outbox.app import Outbox
from outbox.ops import (
    archive,
    edit,
    fanout,
    flags,
    fleet,
    group_operations,
    groups,
    holds,
    inboxes,
    metrics,
    operators,
    scaling,
    search,
)
from outbox.ops.metrics import ThroughputRange
from outbox.ops.scaling import (
    DEFAULT_APDEX_WINDOW_SECONDS,
    DEFAULT_RATE_WINDOW_SECONDS,
    MAX_WINDOW_SECONDS,
)
from outbox.schema import ArchiveStatus, GroupStatus, OperationAction, WorkerRequest
from outbox.web import _ingest_bodies, bodies
from outbox.web._answer_schemas import AnswerSchemas
from outbox.web.api import PREFIX

_SCHEMAS = "#/components/schemas/"
_ANSWERS = AnswerSchemas(_SCHEMAS + "{name}")
"""The operations layer's answers (dataclasses, as ``jsonable`` writes them), described as the
paths name them."""
# A dataclass within a declared answer (a batch's events): as jsonable writes it, in place of
# msgspec's schema of its fields alone.
_WITHIN = [_ANSWERS.of(kind) for kind in bodies.ANSWERS if dataclasses.is_dataclass(kind)]


def _ref(declared: type[Any]) -> dict[str, Any]:
    return {"$ref": _SCHEMAS + declared.__name__}


def _answer(description: str, declared: Any) -> dict[str, Any]:
    """An answer: a declaration of :mod:`outbox.web.bodies`, or the type the operations layer
    answers (a dataclass, a list of them)."""
    is_struct = isinstance(declared, type) and issubclass(declared, msgspec.Struct)
    schema = _ref(declared) if is_struct else _ANSWERS.of(declared)
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    words = {
        400: "bad input, the message names it",
        401: "not authenticated",
        403: "not allowed to, or a missing CSRF token",
        404: "no such group or handler",
        409: "the operation could not be done as asked",
        413: "request body too large",
        503: "the database could not be reached",
    }
    return {str(code): _answer(words[code], bodies.Error) for code in (401, 403, 503, *codes)}


def _query(
    name: str, schema: dict[str, Any], description: str, many: bool = False
) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": {"type": "array", "items": schema} if many else schema,
        "explode": True,
    }


def _path(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": schema}


def _body(declared: type[Any], required: bool = True) -> dict[str, Any]:
    return {"required": required, "content": {"application/json": {"schema": _ref(declared)}}}


def _op(summary: str, answers: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"summary": summary, "responses": answers, **more}


_UUID = {"type": "string", "format": "uuid"}
_STRING = {"type": "string"}
_NO_NUL = r"^[^\u0000]*$"
"""Every text the API takes: no NUL (nor a lone surrogate, which a pattern cannot say)."""
_TEXT = msgspec.json.schema(bodies.Text)
_LIMIT = {"type": "integer", "minimum": 1, "maximum": 1000}
_ID = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
_SELECTION_QUERY = [
    _query("handler", _STRING, "only this handler (repeatable)", many=True),
    _query(
        "status",
        {"type": "string", "enum": [s.value for s in GroupStatus]},
        "only this status (repeatable)",
        many=True,
    ),
    _query("older_than", msgspec.json.schema(bodies.Age), "made longer ago than these seconds"),
    _query("error", _TEXT, "text in the last error"),
    _query("key", _TEXT, "an ordering key's value"),
    _query("payload", _TEXT, "text in a dead event's values"),
    _query("group", _UUID, "only this group (repeatable)", many=True),
]
_RESULT = group_operations.OperationResult
_CONFLICT = _answer(
    "a key written before with other values: nothing written; each event's result",
    bodies.Conflict,
)

PATHS: dict[str, dict[str, Any]] = {
    "/status": {
        "get": _op(
            "Every handler's status", {"200": _answer("statuses", bodies.Statuses), **_errors()}
        )
    },
    "/scaling": {
        "get": _op(
            "Desired worker slots per band and in total, the time to drain, and Apdex",
            {"200": _answer("the fleet's desired size", scaling.Scaling), **_errors(400, 404)},
            parameters=[
                _query("handler", _STRING, "only these handlers", many=True),
                _query(
                    "target",
                    {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
                    "the share of each promise a backlog is planned to drain within (0.5)",
                ),
                *(
                    _query(
                        name,
                        {"type": "number", "minimum": 60, "maximum": MAX_WINDOW_SECONDS},
                        f"seconds back that {what} counts (default {default:g})",
                    )
                    for name, what, default in (
                        ("rate_window", "the measured rate", DEFAULT_RATE_WINDOW_SECONDS),
                        ("apdex_window", "Apdex", DEFAULT_APDEX_WINDOW_SECONDS),
                    )
                ),
            ],
        )
    },
    "/groups": {
        "get": _op(
            "The groups a selection matches, a page at a time",
            {"200": _answer("a page of groups", groups.Listing), **_errors(400, 404)},
            parameters=[
                *_SELECTION_QUERY,
                _query("limit", _LIMIT, "groups shown"),
                _query(
                    "after",
                    {"type": "string", "pattern": "^(live|dead):[0-9]{1,18}$"},
                    "the next page: a listing's `next`",
                ),
            ],
        )
    },
    "/groups/discard": {
        "post": _op(
            "Give up the groups a selection matches",
            {"200": _answer("what was discarded", _RESULT), **_errors(400, 404)},
            requestBody=_body(bodies.DiscardBody),
        )
    },
    "/groups/replay": {
        "post": _op(
            "Replay the dead groups a selection matches",
            {"200": _answer("what was replayed", _RESULT), **_errors(400, 404)},
            requestBody=_body(bodies.SelectionBody),
        )
    },
    "/groups/retry": {
        "post": _op(
            "Run now the groups a selection matches that wait for a retry or a deferral",
            {"200": _answer("what was made due", _RESULT), **_errors(400, 404)},
            requestBody=_body(bodies.SelectionBody),
        )
    },
    "/search": {
        "get": _op(
            "Where an event id, a group id, an ordering key or an ingest key is",
            {
                "200": _answer(
                    "where it was found, and where it was not looked for", search.SearchResult
                ),
                **_errors(400),
            },
            parameters=[
                {
                    **_query(
                        "q",
                        {**_TEXT, "maxLength": 400},
                        "an event id, a group id, an ordering key or an ingest key",
                    ),
                    "required": True,
                }
            ],
        )
    },
    "/groups/{group_id}": {
        "get": _op(
            "One group in full",
            {"200": _answer("the group", groups.GroupDetail), **_errors(400, 404)},
            parameters=[_path("group_id", _UUID)],
        )
    },
    "/groups/{group_id}/replay": {
        "post": _op(
            "Replay one dead group, or every discarded event of a discarded one",
            {"200": _answer("what was replayed", _RESULT), **_errors(400, 404)},
            parameters=[_path("group_id", _UUID)],
            requestBody=_body(bodies.DryRun, required=False),
        )
    },
    "/groups/{group_id}/events/{event_id}/replay": {
        "post": _op(
            "Replay one dead or discarded event with values changed",
            {"200": _answer("the event it became", edit.EditResult), **_errors(400, 404)},
            parameters=[_path("group_id", _UUID), _path("event_id", {"type": "integer"})],
            requestBody=_body(bodies.EditBody),
        )
    },
    "/handlers/{handler}/pause": {
        "post": _op(
            "Pause a handler across the fleet",
            {"200": _answer("paused", bodies.Paused), **_errors(400, 404)},
            parameters=[_path("handler", _STRING)],
            requestBody=_body(bodies.PauseBody, required=False),
        )
    },
    "/handlers/{handler}/resume": {
        "post": _op(
            "End a handler's pause",
            {"200": _answer("resumed", bodies.Resumed), **_errors(404)},
            parameters=[_path("handler", _STRING)],
        )
    },
    "/handlers/{handler}/events": {
        "post": _op(
            "Write a batch of events, each under its idempotency key, all or nothing",
            {
                "200": _answer("each event, and what became of it", bodies.Written),
                **_errors(400, 404, 413),
                "409": _CONFLICT,
            },
            parameters=[_path("handler", _STRING)],
            requestBody=_body(bodies.IngestBatch),
        )
    },
    "/handlers/{handler}/events/{key}": {
        "put": _op(
            "Write one event under an idempotency key",
            {
                "201": _answer("written now", bodies.Ingested),
                "200": _answer(
                    "written before with the same values: nothing written", bodies.Ingested
                ),
                **_errors(400, 404, 413),
                "409": _CONFLICT,
            },
            parameters=[_path("handler", _STRING), _path("key", msgspec.json.schema(bodies.Key))],
            requestBody={
                "required": True,
                "content": {"application/json": {"schema": msgspec.json.schema(bodies.Values)}},
            },
        )
    },
    "/handlers/{handler}/throughput": {
        "get": _op(
            "What a handler handled over an hour, a day or a week, bucket by bucket",
            {
                "200": _answer("the chart's buckets, oldest first", metrics.ThroughputChart),
                **_errors(400, 404),
            },
            parameters=[
                _path("handler", _STRING),
                _query(
                    "range",
                    {"type": "string", "enum": [r.value for r in ThroughputRange]},
                    "hour (a bucket a minute, the default), day or week (a bucket an hour)",
                ),
            ],
        )
    },
    "/history": {
        "get": _op(
            "Operators' replays, edits and discards, newest first",
            {"200": _answer("operations", list[operators.Operation]), **_errors(400)},
            parameters=[
                _query(
                    "action",
                    {"type": "string", "enum": [a.value for a in OperationAction]},
                    "only this action",
                ),
                _query("limit", _LIMIT, "operations shown"),
                _query("before", _ID, "the next page: before this id"),
            ],
        )
    },
    "/archive": {
        "get": _op(
            "Archived events, newest first",
            {"200": _answer("a page of archived events", archive.ArchivePage), **_errors(400, 404)},
            parameters=[
                _query(
                    "status",
                    {"type": "string", "enum": [s.value for s in ArchiveStatus]},
                    "only this status (repeatable)",
                    many=True,
                ),
                _query("handler", _STRING, "only this handler"),
                _query("group", _UUID, "only this group"),
                _query("payload", _TEXT, "text in the event's values"),
                _query("limit", _LIMIT, "events shown"),
                _query("before", _ID, "the next page: a page's `next`"),
            ],
        )
    },
    "/workers": {
        "get": _op(
            "The fleet's workers",
            {
                "200": _answer("workers", typing.get_type_hints(fleet.workers)["return"]),
                **_errors(),
            },
        )
    },
    **{
        f"/workers/{{worker_id}}/{asked.value}": {
            "post": _op(
                f"Ask one worker to {asked.value}: {what}; it acts at its next heartbeat",
                {
                    "200": _answer(
                        "the worker asked, and within how many seconds it acts", bodies.WorkerAsked
                    ),
                    **_errors(400, 404, 409),
                },
                parameters=[_path("worker_id", _STRING)],
            )
        }
        for asked, what in (
            (WorkerRequest.DRAIN, "finish what it holds, take no more, exit"),
            (WorkerRequest.STOP, "as SIGTERM stops it"),
        )
    },
    "/held": {
        "get": _op(
            "Ordering keys held back by dead groups",
            {
                "200": _answer("held keys", list[holds.HeldKey]),
                **_errors(400, 404),
            },
            parameters=[_query("handler", _STRING, "only this handler")],
        )
    },
    "/held/release": {
        "post": _op(
            "Release held ordering keys",
            {"200": _answer("how many", bodies.Released), **_errors(400, 404)},
            requestBody=_body(bodies.ReleaseHeldBody, required=False),
        )
    },
    "/refused": {
        "get": _op(
            "Groups whose outcome the database refused to record",
            {
                "200": _answer("refused groups", list[holds.RefusedGroup]),
                **_errors(400, 404),
            },
            parameters=[_query("handler", _STRING, "only this handler")],
        )
    },
    "/inboxes": {
        "get": _op(
            "Each inbox, its horizon and the message ids it keeps",
            {"200": _answer("inboxes", list[inboxes.InboxStatus]), **_errors()},
        )
    },
    "/fanouts": {
        "get": _op(
            "Each fan-out, its source and consumers, and the events waiting in each",
            {"200": _answer("fan-outs", list[fanout.FanoutStatus]), **_errors()},
        )
    },
    "/flags": {
        "get": _op(
            "Each flag handler, its business table, and the rows flagged and not taken yet",
            {"200": _answer("flag handlers", list[flags.FlagStatus]), **_errors()},
        )
    },
    "/refused/release": {
        "post": _op(
            "Give refused groups back to the workers",
            {"200": _answer("how many", bodies.Released), **_errors(400, 404)},
            requestBody=_body(bodies.ReleaseRefusedBody, required=False),
        )
    },
}
_INGEST = ("/handlers/{handler}/events", "/handlers/{handler}/events/{key}")


def spec(
    app: Outbox | None = None, ingest: dict[str, _ingest_bodies.IngestBodies] | None = None
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the API; of ``app``'s console when given: its handlers'
    names in every ``{handler}``, and the ingest paths of each handler with the values its
    buffer model takes (column by column; ``ingest``: as the console declared them, else
    declared now), so that a producer outside Python reads there what to send."""
    paths = copy.deepcopy(PATHS)
    requests: list[type[Any]] = list(bodies.REQUESTS)
    if app is not None:
        names = sorted(app.handlers)
        paths = {path: item for path, item in paths.items() if path not in _INGEST}
        for name, declared in (ingest or _ingest_bodies.declare(app)).items():
            paths.update(_ingest_paths(name, declared))
            requests += [declared.values, declared.batch]
    _, asked = bodies.components(requests)
    _, answered = bodies.components(bodies.ANSWERS)
    asked = copy.deepcopy(asked)
    # A selection narrows something: discarding or replaying everything takes a filter (null
    # is no filter).
    filters = [f for f in bodies.SelectionBody.__struct_encode_fields__ if f != "dry_run"]
    for selection in ("SelectionBody", "DiscardBody"):
        asked[selection]["anyOf"] = [
            {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
            for name in filters
        ]
    for item in paths.values():
        for operation in item.values():
            _text(operation.get("parameters", []))
            _text(operation.get("requestBody", {}))
            if "requestBody" in operation:
                operation["responses"].setdefault("413", _errors(413)["413"])
    _text(asked)
    if app is not None:
        _named(paths, names)
        _named(asked, names)
    return {
        "openapi": "3.1.0",
        "info": {"title": "outbox", "version": VERSION},
        "servers": [{"url": PREFIX}],
        "components": {
            "schemas": {**answered, **copy.deepcopy(_ANSWERS.schemas), **asked},
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "basic": {"type": "http", "scheme": "basic"},
            },
        },
        "security": [{"bearer": []}, {"basic": []}],
        "paths": paths,
    }


def _ingest_paths(name: str, declared: _ingest_bodies.IngestBodies) -> dict[str, Any]:
    """The two ingest paths of handler ``name``, its buffer's values in their bodies."""
    one = copy.deepcopy(PATHS["/handlers/{handler}/events/{key}"])
    one["put"]["parameters"] = one["put"]["parameters"][1:]
    one["put"]["requestBody"] = _body(declared.values)
    one["put"]["summary"] = f"Write one event of {name} under an idempotency key"
    batch = copy.deepcopy(PATHS["/handlers/{handler}/events"])
    batch["post"]["parameters"] = []
    batch["post"]["requestBody"] = _body(declared.batch)
    batch["post"]["summary"] = f"Write a batch of events of {name}, all or nothing"
    return {f"/handlers/{name}/events/{{key}}": one, f"/handlers/{name}/events": batch}


def _named(value: Any, names: list[str]) -> None:
    """Every handler parameter, and every handler field of a body, limited to the
    application's handlers' names."""
    if isinstance(value, dict):
        if value.get("name") == "handler" and "schema" in value:
            _one_of(value["schema"], names)
        properties = value.get("properties")
        if isinstance(properties, dict) and "handler" in properties:
            _one_of(properties["handler"], names)
        for item in value.values():
            _named(item, names)
    elif isinstance(value, list):
        for item in value:
            _named(item, names)


def _one_of(schema: Any, names: list[str]) -> None:
    """Every text schema within ``schema`` takes one of ``names``."""
    if isinstance(schema, dict):
        if schema.get("type") == "string":
            schema["enum"] = names
        for item in schema.values():
            _one_of(item, names)
    elif isinstance(schema, list):
        for item in schema:
            _one_of(item, names)


def _text(value: Any) -> Any:
    """Every text schema of a request's parameters and body says it holds no NUL: in its
    pattern (some text, not only spaces: ``_TEXT``'s; others' patterns hold no NUL already)."""
    if isinstance(value, dict):
        kinds = value.get("type")
        text = kinds == "string" or (isinstance(kinds, list) and "string" in kinds)
        if text and "enum" not in value and "format" not in value:
            pattern = value.get("pattern")
            if pattern is None:
                value["pattern"] = _NO_NUL
            elif pattern == _TEXT["pattern"]:
                value["pattern"] = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"
        for item in value.values():
            _text(item)
    elif isinstance(value, list):
        for item in value:
            _text(item)
    return value


DATABASES_PATHS: dict[str, dict[str, Any]] = {
    "/databases": {
        "get": _op(
            "Every database's totals, and all of them taken together",
            {
                "200": _answer("each database's line and the total", bodies.DatabasesStatus),
                **{code: _errors()[code] for code in ("401", "403")},
                "503": _answer("the registry of databases could not be read", bodies.Error),
            },
        )
    },
}
"""The API of the console of several databases; each database's own is under
``/databases/{name}/api/v1`` (its document at ``openapi.json`` there)."""


def databases_spec() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the console of an application serving several databases."""
    _, answered = bodies.components(bodies.DATABASES_ANSWERS)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "outbox (several databases)",
            "version": VERSION,
            "description": (
                "Each database's console, with its own API and document, is under "
                "/databases/{name}/ (its API at /databases/{name}/api/v1)."
            ),
        },
        "servers": [{"url": PREFIX}],
        "components": {
            "schemas": answered,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "basic": {"type": "http", "scheme": "basic"},
            },
        },
        "security": [{"bearer": []}, {"basic": []}],
        "paths": copy.deepcopy(DATABASES_PATHS),
    }


async def databases_document(request: Request) -> Response:
    """``GET /api/v1/openapi.json`` of the console of several databases: served to anyone,
    as it holds no data."""
    return JSONResponse(databases_spec())


async def document(request: Request) -> Response:
    """``GET /api/v1/openapi.json``: served to anyone, as it holds no data (the handlers' names
    and their buffers' columns, no row)."""
    console: Any = request.app.state.console
    return JSONResponse(spec(console.app, console.ingest_bodies))
