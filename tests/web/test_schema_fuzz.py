"""The API against its own OpenAPI document, fuzzed by schemathesis on every database: no
request the document allows makes a server error, and every answer's status, content type and
body are the document's; and the same requests made hostile (a lone surrogate or a NUL in a
string, a number past a double's, nesting past what outbox stores, the body streamed without a
length) are each a JSON 400 (a 404 where a path names nothing) with nothing written."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from outbox import Batch, Outbox, RetryPolicy, schema
from outbox.ops import flow
from outbox.web import Auth, Principal, Role, create_app
from tests.conftest import FULL_RUN_ENV
from tests.models import ActivityEvent, SinkEvent

TOKEN = "fuzzing-admin-token-0123456789"
EXAMPLES = int(
    os.environ.get("OUTBOX_FUZZ_EXAMPLES", "60" if os.environ.get(FULL_RUN_ENV) == "1" else "5")
)
"""Requests generated per operation and database: 5 in the default run (15 per operation over
the three databases), 60 in the full run (``nox -s full``); ``OUTBOX_FUZZ_EXAMPLES`` for
another number."""
RAW = "\ue000raw\ue000"
"""Stands in a body for JSON text that ``json`` neither reads nor writes (a number past a
double's range, nesting past Python's recursion), put in its place after dumping."""


def _ok(batch: Batch[Any]) -> None:
    return None


def _console(app: Outbox, commit_events: Any) -> Any:
    app.handler(
        ActivityEvent, name="fails", ordering_key="kind", retry=RetryPolicy(max_attempts=1)
    )(_ok)
    # Both ordered, so that any key the document allows is one a handler can match.
    app.handler(SinkEvent, name="accounts", ordering_key="account")(_ok)
    commit_events(app.engine, 3)
    return create_app(app, auth=Auth(tokens={TOKEN: Principal("fuzz", Role.ADMIN)}))


def test_the_api_keeps_to_its_document(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """For every operation of the document, requests it allows: no 5xx, and each answer's
    status code, content type and body are the document's."""
    console = _console(make_app(database_url), commit_events)
    api = schemathesis.openapi.from_asgi("/api/v1/openapi.json", console)
    operations = [result.ok() for result in api.get_all_operations()]

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
        def keeps_to_the_document(case: Any) -> None:
            case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"})

        keeps_to_the_document()
    # Every operation was fuzzed: the generic ones and each handler's two ingest paths.
    assert 27 - 2 + 2 * 2 == len(operations)


# --- hostile ------------------------------------------------------------------------------


def _strings(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The paths of every string within a JSON value, keys of objects included (their path
    ends with ``("key", name)``)."""
    found: list[tuple[Any, ...]] = []
    if isinstance(value, str):
        found.append(path)
    elif isinstance(value, dict):
        for key, inner in value.items():
            found.append((*path, ("key", key)))
            found += _strings(inner, (*path, key))
    elif isinstance(value, list):
        for position, inner in enumerate(value):
            found += _strings(inner, (*path, position))
    return found


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The paths of every value within a JSON value, itself included."""
    found = [path]
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _leaves(inner, (*path, key))
    elif isinstance(value, list):
        for position, inner in enumerate(value):
            found += _leaves(inner, (*path, position))
    return found


def _replaced(value: Any, path: tuple[Any, ...], change: Callable[[Any], Any]) -> Any:
    """``value`` with what is at ``path`` changed (a key renamed when the path ends so)."""
    if not path:
        return change(value)
    step, rest = path[0], path[1:]
    if isinstance(step, tuple):
        return {(change(k) if k == step[1] else k): v for k, v in value.items()}
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[step] = _replaced(value[step], rest, change)
    return copy


@st.composite
def _hostile(draw: st.DrawFn, body: Any) -> tuple[str, str]:
    """What is done to a body: a kind of hostility and the body's JSON text it makes."""
    strings = _strings(body)
    kinds = ["huge", "deep"] + (["surrogate", "nul"] if strings else [])
    kind = draw(st.sampled_from(kinds))
    if kind in ("surrogate", "nul"):
        bad = chr(draw(st.integers(0xD800, 0xDFFF))) if kind == "surrogate" else "\x00"
        path = draw(st.sampled_from(strings))
        at = draw(st.integers(0, 3))
        return kind, json.dumps(_replaced(body, path, lambda s: s[:at] + bad + s[at:]))
    path = draw(st.sampled_from(_leaves(body)))
    if kind == "huge":
        number = draw(st.sampled_from([10**400, float("inf"), float("nan"), "1e999", "-1e400"]))
        raw = number if isinstance(number, str) else json.dumps(number)
    else:
        depth = draw(st.integers(40, 5000))
        raw = "[" * depth + "]" * depth
    return kind, json.dumps(_replaced(body, path, lambda _: RAW)).replace(json.dumps(RAW), raw)


def _written(app: Outbox) -> tuple[Any, ...]:
    """What a write leaves: events in the buffers, idempotency keys, operations, pauses."""
    with app.engine.connect() as conn:
        counts = tuple(
            conn.execute(select(func.count()).select_from(table)).scalar_one()
            for table in (SinkEvent.__table__, ActivityEvent.__table__, schema.ingest_keys)
        )
        operations = conn.execute(select(func.count()).select_from(schema.operations))
        counts = (*counts, operations.scalar_one())
    return (*counts, sorted(flow.paused(app)))


async def _chunks(content: bytes, size: int) -> AsyncIterator[bytes]:
    for start in range(0, len(content), size):
        yield content[start : start + size]


def _send(console: Any, case: Any, content: bytes, chunk: int | None) -> httpx.Response:
    """The case's request with ``content`` as its body, streamed without a length in chunks
    of ``chunk`` bytes (None: whole, with its length)."""

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=console)
        async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
            return await client.request(
                case.method,
                f"/api/v1{case.formatted_path}",
                params=case.query or None,
                headers={"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
                content=content if chunk is None else _chunks(content, chunk),
            )

    return asyncio.run(send())


def test_hostile_bodies_are_a_json_400_and_write_nothing(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """Every operation with a body, its requests made hostile: a JSON 400 naming what is wrong
    (404 where the path names no group, before the body's values are looked at), never a 5xx,
    nothing written; streamed in chunks without a length or sent whole alike."""
    app = make_app(database_url)
    console = _console(app, commit_events)
    api = schemathesis.openapi.from_asgi("/api/v1/openapi.json", console)
    operations = [result.ok() for result in api.get_all_operations()]
    with_body = [op for op in operations if op.body]

    for operation in with_body:

        @given(case=operation.as_strategy(), data=st.data())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
        def refused(case: Any, data: st.DataObject) -> None:
            body = case.body if isinstance(case.body, dict) else {}
            kind, hostile = data.draw(_hostile(body), label="hostile")
            content = hostile.encode()
            chunk = data.draw(st.one_of(st.none(), st.integers(1, 4096)), label="chunk")
            before = _written(app)
            response = _send(console, case, content, chunk)
            allowed = {400, 404} if kind == "deep" or "{group_id}" in case.path else {400}
            assert (True, "application/json", True, before) == (
                response.status_code in allowed,
                response.headers["content-type"],
                bool(response.json().get("error")),
                _written(app),
            ), (kind, response.status_code, response.text[:300])

        refused()
    # The generic ones with a body and each handler's two ingest paths.
    assert 8 + 2 * 2 == len(with_body)


def test_hostile_query_text_is_a_json_400_naming_it(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """A NUL in any query parameter of a read (a URL holds no lone surrogate): a JSON 400, or
    404 for a handler it names, never a 5xx."""
    console = _console(make_app(database_url), commit_events)
    api = schemathesis.openapi.from_asgi("/api/v1/openapi.json", console)
    with_query = [result.ok() for result in api.get_all_operations()]
    with_query = [op for op in with_query if any(True for _ in op.query)]

    for operation in with_query:

        @given(case=operation.as_strategy(), data=st.data())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
        def refused(case: Any, data: st.DataObject) -> None:
            names = [parameter.name for parameter in case.operation.query]
            name = data.draw(st.sampled_from(names), label="parameter")
            text = data.draw(st.text(max_size=5), label="text")
            case.query = {**(case.query or {}), name: text + "\x00"}
            response = _send(console, case, b"", None)
            assert (True, "application/json") == (
                response.status_code in (400, 404),
                response.headers["content-type"],
            ), (name, response.status_code, response.text[:300])

        refused()
    assert 8 == len(with_query)
