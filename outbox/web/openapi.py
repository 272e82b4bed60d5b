"""The API's OpenAPI document (``GET /api/v1/openapi.json``): every endpoint of
:mod:`outbox.web.api`, its parameters, bodies and answers (a test checks the routes and the
document name the same endpoints)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from outbox._version import VERSION
from outbox.schema import GroupStatus, OperationAction
from outbox.web.api import PREFIX

_ERROR = {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}
_ANY_OBJECT = {"type": "object", "additionalProperties": True}


def _answer(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": schema or _ANY_OBJECT}},
    }


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
_TEXT = {"type": "string", "minLength": 1}
_SELECTION_QUERY = [
    _query("handler", {"type": "string"}, "only this handler (repeatable)", many=True),
    _query(
        "status",
        {"type": "string", "enum": [s.value for s in GroupStatus]},
        "only this status (repeatable)",
        many=True,
    ),
    _query("older_than", {"type": "number", "minimum": 0}, "made longer ago than these seconds"),
    _query("error", _TEXT, "text in the last error"),
    _query("key", _TEXT, "an ordering key's value"),
    _query("payload", _TEXT, "text in a dead event's values"),
    _query("group", _UUID, "only this group (repeatable)", many=True),
]
_SELECTION_BODY = {
    "type": "object",
    "properties": {
        "handler": {"type": "array", "items": {"type": "string"}},
        "status": {
            "type": "array",
            "items": {"type": "string", "enum": [s.value for s in GroupStatus]},
        },
        "older_than": {"type": "number", "minimum": 0},
        "error": _TEXT,
        "key": _TEXT,
        "payload": _TEXT,
        "group": {"type": "array", "items": _UUID},
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
    "/groups": {
        "get": _op(
            "The groups a selection matches, a page at a time",
            {"200": _answer("a page of groups"), **_errors(400, 404)},
            parameters=[
                *_SELECTION_QUERY,
                _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "groups shown"),
                _query("after", {"type": "string"}, "the next page: a listing's `next`"),
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
            requestBody=_json_body(_SELECTION_BODY),
        )
    },
    "/groups/{group_id}": {
        "get": _op(
            "One group in full",
            {"200": _answer("the group"), **_errors(400, 404)},
            parameters=[_path("group_id", _UUID)],
        )
    },
    "/groups/{group_id}/events/{event_id}/replay": {
        "post": _op(
            "Replay one dead event with values changed",
            {"200": _answer("the event it became"), **_errors(400, 404)},
            parameters=[_path("group_id", _UUID), _path("event_id", {"type": "integer"})],
            requestBody=_json_body(
                {"type": "object", "properties": {"values": _ANY_OBJECT}, "required": ["values"]}
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
                                "seconds": {"type": "number", "exclusiveMinimum": 0},
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
                "200": _answer("each event, and whether it was written now"),
                **_errors(400, 404, 413),
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
                                    "values": _ANY_OBJECT,
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
                "201": _answer("written now"),
                "200": _answer("written before: nothing written"),
                **_errors(400, 404, 413),
            },
            parameters=[
                _path("handler", {"type": "string"}),
                _path("key", {"type": "string", "minLength": 1, "maxLength": 200}),
            ],
            requestBody=_json_body(_ANY_OBJECT),
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
                    "before", {"type": "integer", "minimum": 0}, "the next page: before this id"
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


def spec() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the API."""
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
        "paths": PATHS,
    }


async def document(request: Request) -> Response:
    """``GET /api/v1/openapi.json``: served to anyone, as it holds no data."""
    return JSONResponse(spec())
