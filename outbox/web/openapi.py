"""The API's OpenAPI document (``GET /api/v1/openapi.json``): every endpoint of
:mod:`outbox.web.api`, its parameters, bodies and answers (a test checks the routes and the
document name the same endpoints)."""

from __future__ import annotations

import copy
import datetime as dt
import decimal
import uuid
from typing import Any

from sqlalchemy import JSON, Column, Enum, Table
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from outbox._core.checks import MAX_WAIT_SECONDS
from outbox._core.values import BASE64_PATTERN, INTERVAL_PATTERN, decimal_digits, integer_range
from outbox._core.version import VERSION
from outbox.app import Outbox
from outbox.buffer import BufferMixin
from outbox.ops.ingest import MAX_EVENTS, IngestResult
from outbox.ops.metrics import ThroughputRange
from outbox.ops.scaling import (
    DEFAULT_APDEX_WINDOW_SECONDS,
    DEFAULT_RATE_WINDOW_SECONDS,
    MAX_WINDOW_SECONDS,
)
from outbox.ops.selection import MAX_AGE_SECONDS
from outbox.schema import ArchiveStatus, GroupStatus, OperationAction, WorkerRequest
from outbox.web.api import PREFIX

_ERROR = {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}
_ANY_OBJECT = {"type": "object", "additionalProperties": True}


def _answer(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": schema or _ANY_OBJECT}},
    }


_INGESTED = {
    "type": "object",
    "properties": {
        "key": {"type": "string"},
        "event_id": {"type": ["integer", "null"]},
        "created": {"type": "boolean"},
        "result": {"type": "string", "enum": [r.value for r in IngestResult]},
    },
    "required": ["key", "event_id", "created", "result"],
}
_CONFLICT = _answer(
    "a key written before with other values: nothing written; each event's result",
    {
        "type": "object",
        "properties": {
            "error": {"type": "string"},
            "events": {"type": "array", "items": _INGESTED},
        },
        "required": ["error", "events"],
    },
)


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
    return {str(code): _answer(words[code], _ERROR) for code in (401, 403, 503, *codes)}


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


_UUID = {"type": "string", "format": "uuid"}
_NO_NUL = r"^[^\u0000]*$"
"""Every text the API takes: no NUL (nor a lone surrogate, which a pattern cannot say)."""


def _json_value(depth: int = 3) -> dict[str, Any]:
    """Any JSON value whose text holds no NUL, nested ``depth`` levels (outbox takes deeper:
    up to ``outbox._core.checks.MAX_JSON_DEPTH``; the document says what every request may hold)."""
    scalars: list[dict[str, Any]] = [
        {"type": "null"},
        {"type": "boolean"},
        {"type": "number"},
        {"type": "string"},
    ]
    if depth == 0:
        return {"anyOf": scalars}
    inner = _json_value(depth - 1)
    return {
        "anyOf": [
            *scalars,
            {"type": "array", "items": inner},
            {"type": "object", "propertyNames": {"type": "string"}, "additionalProperties": inner},
        ]
    }


_JSON_VALUE = _json_value()
_AGE = {"type": "number", "minimum": 0, "maximum": MAX_AGE_SECONDS}
_TEXT = {"type": "string", "minLength": 1, "pattern": r"\S"}  # some text, not only spaces
_SELECTION_QUERY = [
    _query("handler", {"type": "string"}, "only this handler (repeatable)", many=True),
    _query(
        "status",
        {"type": "string", "enum": [s.value for s in GroupStatus]},
        "only this status (repeatable)",
        many=True,
    ),
    _query("older_than", _AGE, "made longer ago than these seconds"),
    _query("error", _TEXT, "text in the last error"),
    _query("key", _TEXT, "an ordering key's value"),
    _query("payload", _TEXT, "text in a dead event's values"),
    _query("group", _UUID, "only this group (repeatable)", many=True),
]
_FILTERS = ("handler", "status", "older_than", "error", "key", "payload", "group")
_SELECTION_BODY: dict[str, Any] = {
    "type": "object",
    # A selection narrows something: discarding or replaying everything takes a filter.
    "anyOf": [{"required": [name]} for name in _FILTERS],
    "properties": {
        "handler": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        "status": {
            "type": "array",
            "minItems": 1,
            "items": {"type": "string", "enum": [s.value for s in GroupStatus]},
        },
        "older_than": _AGE,
        "error": _TEXT,
        "key": _TEXT,
        "payload": _TEXT,
        "group": {"type": "array", "minItems": 1, "items": _UUID},
        "dry_run": {"type": "boolean"},
        "reason": _TEXT,
    },
}


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _op(summary: str, answers: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"summary": summary, "responses": answers, **more}


PATHS: dict[str, dict[str, Any]] = {
    "/status": {"get": _op("Every handler's status", {"200": _answer("statuses"), **_errors()})},
    "/scaling": {
        "get": _op(
            "Desired worker slots per band and in total, the time to drain, and Apdex",
            {"200": _answer("the fleet's desired size"), **_errors(400, 404)},
            parameters=[
                _query("handler", {"type": "string"}, "only these handlers", many=True),
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
            {"200": _answer("a page of groups"), **_errors(400, 404)},
            parameters=[
                *_SELECTION_QUERY,
                _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "groups shown"),
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
            {"200": _answer("what was discarded"), **_errors(400, 404)},
            requestBody=_json_body(_SELECTION_BODY),
        )
    },
    "/groups/replay": {
        "post": _op(
            "Replay the dead groups a selection matches",
            {"200": _answer("what was replayed"), **_errors(400, 404)},
            requestBody=_json_body(
                {
                    **_SELECTION_BODY,
                    "properties": {
                        k: v for k, v in _SELECTION_BODY["properties"].items() if k != "reason"
                    },
                }
            ),
        )
    },
    "/groups/retry": {
        "post": _op(
            "Run now the groups a selection matches that wait for a retry or a deferral",
            {"200": _answer("what was made due"), **_errors(400, 404)},
            requestBody=_json_body(
                {
                    **_SELECTION_BODY,
                    "properties": {
                        k: v for k, v in _SELECTION_BODY["properties"].items() if k != "reason"
                    },
                }
            ),
        )
    },
    "/search": {
        "get": _op(
            "Where an event id, a group id, an ordering key or an ingest key is",
            {"200": _answer("where it was found, and where it was not looked for"), **_errors(400)},
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
            {"200": _answer("the group"), **_errors(400, 404)},
            parameters=[_path("group_id", _UUID)],
        )
    },
    "/groups/{group_id}/replay": {
        "post": _op(
            "Replay one dead group, or every discarded event of a discarded one",
            {"200": _answer("what was replayed"), **_errors(400, 404)},
            parameters=[_path("group_id", _UUID)],
            requestBody={
                "required": False,
                "content": {
                    "application/json": {
                        "schema": {"type": "object", "properties": {"dry_run": {"type": "boolean"}}}
                    }
                },
            },
        )
    },
    "/groups/{group_id}/events/{event_id}/replay": {
        "post": _op(
            "Replay one dead or discarded event with values changed",
            {"200": _answer("the event it became"), **_errors(400, 404)},
            parameters=[_path("group_id", _UUID), _path("event_id", {"type": "integer"})],
            requestBody=_json_body(
                {
                    "type": "object",
                    "properties": {
                        "values": {
                            "type": "object",
                            "minProperties": 1,
                            "propertyNames": {"type": "string"},
                            "additionalProperties": _JSON_VALUE,
                        }
                    },
                    "required": ["values"],
                }
            ),
        )
    },
    "/handlers/{handler}/pause": {
        "post": _op(
            "Pause a handler across the fleet",
            {"200": _answer("paused"), **_errors(400, 404)},
            parameters=[_path("handler", {"type": "string"})],
            requestBody={
                "required": False,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                "seconds": {
                                    "type": "number",
                                    "exclusiveMinimum": 0,
                                    "maximum": MAX_WAIT_SECONDS,
                                },
                                "reason": {"type": "string"},
                            },
                        }
                    }
                },
            },
        )
    },
    "/handlers/{handler}/resume": {
        "post": _op(
            "End a handler's pause",
            {"200": _answer("resumed"), **_errors(404)},
            parameters=[_path("handler", {"type": "string"})],
        )
    },
    "/handlers/{handler}/events": {
        "post": _op(
            "Write a batch of events, each under its idempotency key, all or nothing",
            {
                "200": _answer(
                    "each event, and what became of it",
                    {
                        "type": "object",
                        "properties": {
                            "written": {"type": "integer"},
                            "duplicates": {"type": "integer"},
                            "events": {"type": "array", "items": _INGESTED},
                        },
                        "required": ["written", "duplicates", "events"],
                    },
                ),
                **_errors(400, 404, 413),
                "409": _CONFLICT,
            },
            parameters=[_path("handler", {"type": "string"})],
            requestBody=_json_body(
                {
                    "type": "object",
                    "properties": {
                        "events": {
                            "type": "array",
                            "minItems": 1,
                            "items": {
                                "type": "object",
                                "properties": {
                                    "key": {"type": "string", "minLength": 1, "maxLength": 200},
                                    "values": {
                                        "type": "object",
                                        "propertyNames": {"type": "string"},
                                        "additionalProperties": _JSON_VALUE,
                                    },
                                },
                                "required": ["key", "values"],
                            },
                        }
                    },
                    "required": ["events"],
                }
            ),
        )
    },
    "/handlers/{handler}/events/{key}": {
        "put": _op(
            "Write one event under an idempotency key",
            {
                "201": _answer("written now", _INGESTED),
                "200": _answer("written before with the same values: nothing written", _INGESTED),
                **_errors(400, 404, 413),
                "409": _CONFLICT,
            },
            parameters=[
                _path("handler", {"type": "string"}),
                _path("key", {"type": "string", "minLength": 1, "maxLength": 200}),
            ],
            requestBody=_json_body(
                {
                    "type": "object",
                    "propertyNames": {"type": "string"},
                    "additionalProperties": _JSON_VALUE,
                }
            ),
        )
    },
    "/handlers/{handler}/throughput": {
        "get": _op(
            "What a handler handled over an hour, a day or a week, bucket by bucket",
            {"200": _answer("the chart's buckets, oldest first"), **_errors(400, 404)},
            parameters=[
                _path("handler", {"type": "string"}),
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
            {"200": _answer("operations", {"type": "array", "items": _ANY_OBJECT}), **_errors(400)},
            parameters=[
                _query(
                    "action",
                    {"type": "string", "enum": [a.value for a in OperationAction]},
                    "only this action",
                ),
                _query(
                    "limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "operations shown"
                ),
                _query(
                    "before",
                    {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                    "the next page: before this id",
                ),
            ],
        )
    },
    "/archive": {
        "get": _op(
            "Archived events, newest first",
            {"200": _answer("a page of archived events"), **_errors(400, 404)},
            parameters=[
                _query(
                    "status",
                    {"type": "string", "enum": [s.value for s in ArchiveStatus]},
                    "only this status (repeatable)",
                    many=True,
                ),
                _query("handler", {"type": "string"}, "only this handler"),
                _query("group", _UUID, "only this group"),
                _query("payload", _TEXT, "text in the event's values"),
                _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "events shown"),
                _query(
                    "before",
                    {"type": "integer", "minimum": 0, "maximum": 2**63 - 1},
                    "the next page: a page's `next`",
                ),
            ],
        )
    },
    "/workers": {
        "get": _op(
            "The fleet's workers",
            {"200": _answer("workers", {"type": "array", "items": _ANY_OBJECT}), **_errors()},
        )
    },
    **{
        f"/workers/{{worker_id}}/{asked.value}": {
            "post": _op(
                f"Ask one worker to {asked.value}: {what}; it acts at its next heartbeat",
                {
                    "200": _answer("the worker asked, and within how many seconds it acts"),
                    **_errors(400, 404, 409),
                },
                parameters=[_path("worker_id", {"type": "string"})],
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
                "200": _answer("held keys", {"type": "array", "items": _ANY_OBJECT}),
                **_errors(400, 404),
            },
            parameters=[_query("handler", {"type": "string"}, "only this handler")],
        )
    },
    "/held/release": {
        "post": _op(
            "Release held ordering keys",
            {"200": _answer("how many"), **_errors(400, 404)},
            requestBody={
                "required": False,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {
                                "handler": {"type": "string"},
                                "key": {"type": "string"},
                                "group_id": _UUID,
                            },
                        }
                    }
                },
            },
        )
    },
    "/refused": {
        "get": _op(
            "Groups whose outcome the database refused to record",
            {
                "200": _answer("refused groups", {"type": "array", "items": _ANY_OBJECT}),
                **_errors(400, 404),
            },
            parameters=[_query("handler", {"type": "string"}, "only this handler")],
        )
    },
    "/refused/release": {
        "post": _op(
            "Give refused groups back to the workers",
            {"200": _answer("how many"), **_errors(400, 404)},
            requestBody={
                "required": False,
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {"handler": {"type": "string"}, "group_id": _UUID},
                        }
                    }
                },
            },
        )
    },
}


def spec(app: Outbox | None = None) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the API; of ``app``'s console when given: its handlers'
    names in every ``{handler}``, and the ingest paths of each handler with the values its
    buffer model takes (column by column), so that a producer outside Python reads there what
    to send."""
    paths = _strict(copy.deepcopy(PATHS if app is None else _of_app(app)))
    for item in paths.values():
        for operation in item.values():
            _text(operation.get("parameters", []))
            _text(operation.get("requestBody", {}))
            if "requestBody" in operation:
                operation["responses"].setdefault("413", _errors(413)["413"])
    return {
        "openapi": "3.1.0",
        "info": {"title": "outbox", "version": VERSION},
        "servers": [{"url": PREFIX}],
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "basic": {"type": "http", "scheme": "basic"},
            }
        },
        "security": [{"bearer": []}, {"basic": []}],
        "paths": paths,
    }


_INGEST = ("/handlers/{handler}/events", "/handlers/{handler}/events/{key}")


def _named(value: Any, names: list[str]) -> Any:
    """``value`` with every handler parameter, and every handler field of a body, limited to
    the application's handlers' names."""
    if isinstance(value, dict):
        if value.get("name") == "handler" and "schema" in value:
            schema = value["schema"]
            if schema.get("type") == "array":
                schema["items"] = {"type": "string", "enum": names}
            else:
                value["schema"] = {"type": "string", "enum": names}
        properties = value.get("properties")
        if isinstance(properties, dict) and "handler" in properties:
            handler = properties["handler"]
            if handler.get("type") == "array":
                handler["items"] = {"type": "string", "enum": names}
            else:
                properties["handler"] = {"type": "string", "enum": names}
        for item in value.values():
            _named(item, names)
    elif isinstance(value, list):
        for item in value:
            _named(item, names)
    return value


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


def _strict(value: Any) -> Any:
    """Every object schema that lists its properties takes no others: the API refuses a field
    it does not know (400) rather than ignore it."""
    if isinstance(value, dict):
        if value.get("type") == "object" and "properties" in value:
            value.setdefault("additionalProperties", False)
        for item in value.values():
            _strict(item)
    elif isinstance(value, list):
        for item in value:
            _strict(item)
    return value


def _of_app(app: Outbox) -> dict[str, Any]:
    names = sorted(app.handlers)
    paths: dict[str, Any] = {}
    for path, item in PATHS.items():
        if path in _INGEST:
            continue
        paths[path] = _named(copy.deepcopy(item), names)
    for name in names:
        values = values_schema(app.handlers[name].table)
        one = copy.deepcopy(PATHS["/handlers/{handler}/events/{key}"])
        one["put"]["parameters"] = one["put"]["parameters"][1:]
        one["put"]["requestBody"] = _json_body(values)
        one["put"]["summary"] = f"Write one event of {name} under an idempotency key"
        batch = copy.deepcopy(PATHS["/handlers/{handler}/events"])
        batch["post"]["parameters"] = []
        items = batch["post"]["requestBody"]["content"]["application/json"]["schema"]
        items["properties"]["events"]["items"]["properties"]["values"] = values
        items["properties"]["events"]["maxItems"] = MAX_EVENTS
        batch["post"]["summary"] = f"Write a batch of events of {name}, all or nothing"
        paths[f"/handlers/{name}/events/{{key}}"] = one
        paths[f"/handlers/{name}/events"] = batch
    return paths


def values_schema(table: Table) -> dict[str, Any]:
    """The JSON Schema of the values an event of ``table`` is written with (ingest): each
    column but outbox's own, its JSON type and bounds; the columns without a default
    required; no other property."""
    properties = {}
    required = []
    for column in table.columns:
        if column.name in BufferMixin.OWN_COLUMNS:
            continue
        schema = _column_schema(column)
        if column.nullable:
            schema = {"anyOf": [schema, {"type": "null"}]}
        properties[column.name] = schema
        if not column.nullable and column.default is None and column.server_default is None:
            required.append(column.name)
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _column_schema(column: Column[Any]) -> dict[str, Any]:
    kind = column.type
    members = getattr(kind, "enum_class", None) if isinstance(kind, Enum) else None
    if members is not None:
        return {"enum": [member.value for member in members]}  # enums by value, as answered
    if isinstance(kind, Enum) and kind.enums:
        return {"type": "string", "enum": list(kind.enums)}
    if isinstance(kind, JSON):
        return copy.deepcopy(_JSON_VALUE)
    try:
        python_type = kind.python_type
    except NotImplementedError:
        return {}
    if python_type is bool:
        return {"type": "boolean"}
    if python_type is int:
        low, high = integer_range(column)
        return {"type": "integer", "minimum": low, "maximum": high}
    if python_type is float:
        return {"type": "number"}
    if python_type is decimal.Decimal:
        whole = decimal_digits(column)
        if whole is None:
            return {"type": ["string", "number"], "pattern": r"^-?[0-9]+(\.[0-9]+)?$"}
        # A number is rounded to the column's scale as it is stored: one that rounds onto the
        # bound is refused, so the bound is half a unit of the last place below it; text keeps
        # to the column's places, and so never rounds.
        scale = getattr(kind, "scale", None) or 0
        bound = float(decimal.Decimal(10**whole) - decimal.Decimal(5).scaleb(-scale - 1))
        places = rf"(\.[0-9]{{1,{scale}}})?" if scale else ""
        return {
            "type": ["string", "number"],
            "pattern": rf"^-?[0-9]{{1,{whole}}}{places}$",
            "exclusiveMinimum": -bound,
            "exclusiveMaximum": bound,
        }
    if python_type is str:
        length = getattr(kind, "length", None)
        return {"type": "string", **({"maxLength": length} if length else {})}
    formats = {dt.datetime: "date-time", dt.date: "date", dt.time: "time", uuid.UUID: "uuid"}
    if python_type in formats:
        return {"type": "string", "format": formats[python_type]}
    if python_type is dt.timedelta:
        return {"type": "string", "pattern": INTERVAL_PATTERN}
    if python_type is bytes:
        return {"type": "string", "contentEncoding": "base64", "pattern": BASE64_PATTERN}
    return {}


async def document(request: Request) -> Response:
    """``GET /api/v1/openapi.json``: served to anyone, as it holds no data (the handlers' names
    and their buffers' columns, no row)."""
    console: Any = request.app.state.console
    return JSONResponse(spec(console.app))
