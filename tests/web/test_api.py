"""The HTTP API (``outbox.web``): who may do what, every endpoint against the operations layer
it asks, ingest under retrying producers, and errors that say what is wrong and nothing more."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import random
import re
import threading
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import jsonschema_rs
import pytest
from sqlalchemy import Column, Enum, Integer, MetaData, Table, func, insert, select
from starlette.requests import HTTPConnection
from starlette.routing import Route

from outbox import Batch, BufferMixin, Outbox, RetryPolicy, schema
from outbox._db import queries
from outbox._db.dialects import db_now_plus
from outbox.exceptions import ConfigurationError
from outbox.ops import (
    archive,
    edit,
    fleet,
    flow,
    group_operations,
    groups,
    holds,
    ingest,
    metrics,
    operators,
)
from outbox.ops.selection import Selection
from outbox.testing import drain
from outbox.web import Auth, Principal, Role, api, bodies, create_app, openapi
from outbox.web._ingest_bodies import column_schema
from outbox.web.auth import CSRF_COOKIE, CSRF_HEADER
from tests._support import allow_deletes, refuse_deletes
from tests.models import (
    ActivityEvent,
    EmailEvent,
    Employee,
    EmployeeWork,
    ShipmentEvent,
    ShipmentSearch,
    SinkEvent,
)
from tests.users import _column_types as types
from tests.web._site import HostileEvent, create_hostile_table

TOKENS = {
    "viewer": "viewer-token-0123456789",
    "operator": "operator-token-0123456789",
    "admin": "admin-token-0123456789",
    "producer": "producer-token-0123456789",
}
AUTH = Auth(
    tokens={token: Principal(f"{role}-bot", Role(role)) for role, token in TOKENS.items()},
    users={"alice": ("alice-password", Role.OPERATOR), "val": ("val-password", Role.VIEWER)},
)
REMOTE = ("10.1.2.3", 50000)
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


ONE_SHOT = RetryPolicy(max_attempts=1)


def bearer(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


def basic(name: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{name}:{password}".encode()).decode()}


def _fail(batch: Batch[Any]) -> None:
    raise ValueError("the downstream said no")


def _ok(batch: Batch[Any]) -> None:
    return None


@pytest.fixture
def outbox_app(database_url: str, make_app: Callable[[str], Outbox]) -> Outbox:
    """An application with a failing handler (one attempt) and a sink-like one for ingest."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=2, retry=ONE_SHOT, name="fails")(_fail)
    app.handler(SinkEvent, name="accounts")(_ok)
    return app


def client_of(app: Any, client: tuple[str, int] = REMOTE) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=client)
    return httpx.AsyncClient(transport=transport, base_url="http://console")


@pytest.fixture
async def client(outbox_app: Outbox) -> AsyncIterator[httpx.AsyncClient]:
    async with client_of(create_app(outbox_app, auth=AUTH)) as c:
        yield c


def _dead(app: Outbox, commit_events: Any, count: int = 2, **columns: Any) -> uuid.UUID:
    commit_events(app.engine, count, **columns)
    drain(app, handlers=["fails"])
    return groups.find(app, Selection(statuses=("dead",))).groups[-1].group_id


# --- who may do what ------------------------------------------------------------------------


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, 401),
        ({"Authorization": "Bearer wrong-token-0123456789"}, 401),
        (basic("alice", "wrong"), 401),
        ({"Authorization": "Basic !!!"}, 401),
        (bearer("producer"), 403),
        (bearer("viewer"), 200),
        (basic("val", "val-password"), 200),
    ],
    ids=["none", "bad-token", "bad-password", "bad-basic", "producer", "viewer", "basic"],
)
async def test_reads_need_a_principal_allowed_to_read(
    client: httpx.AsyncClient, headers: dict[str, str], expected: int
) -> None:
    """No or wrong credentials: 401; a producer's token may only write events: 403."""
    response = await client.get("/api/v1/status", headers=headers)
    assert expected == response.status_code


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_refusal_asks_for_the_credentials_it_takes(client: httpx.AsyncClient) -> None:
    """401 says how to authenticate (basic, when users are configured) and nothing else."""
    response = await client.get("/api/v1/groups")
    assert (401, 'Basic realm="outbox"', {"error": "authentication required"}) == (
        response.status_code,
        response.headers["www-authenticate"],
        response.json(),
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (bearer("viewer"), 403),
        (bearer("operator"), 200),
        (basic("alice", "alice-password"), 403),  # a browser's credentials: no CSRF token
    ],
    ids=["viewer", "operator-token", "basic-without-csrf"],
)
async def test_writes_need_an_operator_and_a_csrf_token_unless_by_token(
    client: httpx.AsyncClient, outbox_app: Outbox, headers: dict[str, str], expected: int
) -> None:
    """A viewer may not pause; an operator's token may; basic auth (which a browser sends by
    itself) may only with the page's CSRF token."""
    response = await client.post("/api/v1/handlers/fails/pause", headers=headers, json={})
    assert (expected, expected == 200) == (response.status_code, "fails" in flow.paused(outbox_app))


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_browser_s_write_with_the_csrf_token_is_done(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """Basic auth with the CSRF cookie and the same token in the header: the write is done,
    recorded as the user's."""
    client.cookies.set(CSRF_COOKIE, "a-csrf-token-value")
    headers = {**basic("alice", "alice-password"), CSRF_HEADER: "a-csrf-token-value"}
    response = await client.post("/api/v1/handlers/fails/pause", headers=headers, json={})
    wrong = {**basic("alice", "alice-password"), CSRF_HEADER: "another-value"}
    refused = await client.post("/api/v1/handlers/fails/resume", headers=wrong)
    assert (200, "paused by alice", 403) == (
        response.status_code,
        flow.paused(outbox_app)["fails"].reason,
        refused.status_code,
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_nobody_is_let_in_from_loopback_unless_asked_and_never_from_elsewhere(
    outbox_app: Outbox,
) -> None:
    """A loopback role serves unauthenticated requests from 127.0.0.1 only."""
    web = create_app(outbox_app, auth=Auth(loopback_role=Role.VIEWER))
    async with client_of(web, ("127.0.0.1", 1)) as local, client_of(web, REMOTE) as remote:
        local_status = (await local.get("/api/v1/status")).status_code
        remote_status = (await remote.get("/api/v1/status")).status_code
    assert (200, 401) == (local_status, remote_status)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_the_host_application_s_hook_decides_sync_or_async(outbox_app: Outbox) -> None:
    """A sync and an async hook each authenticate by the host's own header."""

    def sync_hook(connection: HTTPConnection) -> Principal | None:
        return Principal("host-user", Role.VIEWER) if connection.headers.get("x-user") else None

    async def async_hook(connection: HTTPConnection) -> Principal | None:
        return sync_hook(connection)

    found = []
    for hook in (sync_hook, async_hook):
        async with client_of(create_app(outbox_app, auth=Auth(hook=hook))) as c:
            found.append((await c.get("/api/v1/status", headers={"x-user": "1"})).status_code)
            found.append((await c.get("/api/v1/status")).status_code)
    assert [200, 401, 200, 401] == found


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({}, "auth: no way to authenticate"),
        ({"tokens": {"short": Principal("x", Role.VIEWER)}}, "tokens: the token of 'x' is shorter"),
        ({"users": {"bob": ("short", Role.VIEWER)}}, "users: the password of 'bob' is shorter"),
    ],
    ids=["nothing", "short-token", "short-password"],
)
def test_an_auth_that_lets_anybody_in_is_refused_where_it_is_made(
    given: dict[str, Any], message: str
) -> None:
    """No way to authenticate, or a guessable secret: refused at construction."""
    with pytest.raises(ConfigurationError) as raised:
        Auth(**given)
    assert str(raised.value).startswith(message)


def test_auth_reads_tokens_and_users_from_the_environment() -> None:
    """``name:role:secret`` entries; a bad role is refused naming the variable."""
    auth = Auth.from_env(
        {
            "OUTBOX_WEB_TOKENS": "ci:viewer:0123456789abcdef0,etl:producer:fedcba9876543210f",
            "OUTBOX_WEB_USERS": "ann:admin:ann-password",
        }
    )
    with pytest.raises(ConfigurationError) as raised:
        Auth.from_env({"OUTBOX_WEB_TOKENS": "ci:boss:0123456789abcdef0"})
    assert (
        {
            "0123456789abcdef0": Principal("ci", Role.VIEWER),
            "fedcba9876543210f": Principal("etl", Role.PRODUCER),
        },
        {"ann": ("ann-password", Role.ADMIN)},
        True,
    ) == (dict(auth.tokens), dict(auth.users), str(raised.value).startswith("OUTBOX_WEB_TOKENS"))


# --- reads and actions agree with the operations layer --------------------------------------


async def test_groups_and_show_answer_what_the_operations_layer_says(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """``GET /groups`` and ``GET /groups/{id}`` equal ``groups.find`` and ``groups.show``."""
    group_id = _dead(outbox_app, commit_events)
    listing = await client.get(
        "/api/v1/groups", params={"status": "dead"}, headers=bearer("viewer")
    )
    detail = await client.get(f"/api/v1/groups/{group_id}", headers=bearer("viewer"))
    expected = groups.show(outbox_app, group_id)
    assert (
        [str(group_id)],
        {"dead": 1},
        ["dead", "dead"],
        [a.outcome.value for a in expected.attempts],
        sorted(e.values["activity_id"] for e in expected.events),
    ) == (
        [g["group_id"] for g in listing.json()["groups"]],
        listing.json()["counts"],
        [e["status"] for e in detail.json()["events"]],
        [a["outcome"] for a in detail.json()["attempts"]],
        sorted(e["values"]["activity_id"] for e in detail.json()["events"]),
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_hidden_payloads_are_never_answered(outbox_app: Outbox, commit_events: Any) -> None:
    """``hide_payloads``: a group's events come without their values."""
    group_id = _dead(outbox_app, commit_events)
    web = create_app(outbox_app, auth=AUTH, hide_payloads=["fails"])
    async with client_of(web) as c:
        detail = await c.get(f"/api/v1/groups/{group_id}", headers=bearer("viewer"))
    assert [{"hidden": True}] * 2 == [e["values"] for e in detail.json()["events"]]


async def test_discard_and_replay_through_the_api_are_recorded_as_their_caller(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """A dry run changes nothing; a replay puts the group back; a discard of another marks it;
    history names the token's principal for both."""
    first = _dead(outbox_app, commit_events)
    second = _dead(outbox_app, commit_events)
    dry = await client.post(
        "/api/v1/groups/replay",
        headers=bearer("operator"),
        json={"group": [str(first)], "dry_run": True},
    )
    replayed = await client.post(
        "/api/v1/groups/replay", headers=bearer("operator"), json={"group": [str(first)]}
    )
    discarded = await client.post(
        "/api/v1/groups/discard",
        headers=bearer("operator"),
        json={"group": [str(second)], "reason": "customer gone"},
    )
    history = await client.get("/api/v1/history", headers=bearer("viewer"))
    assert (
        (True, None, 2),
        (2, 2),
        (200, 1),
        ["discard", "replay"],
        ["operator-bot", "operator-bot"],
        {"replayed": 2, "discarded": 2},
    ) == (
        (dry.json()["dry_run"], dry.json()["operation_id"], dry.json()["events"]),
        (replayed.json()["events"], len(_buffered(outbox_app))),
        (discarded.status_code, len(discarded.json()["groups"])),
        [o["action"] for o in history.json()],
        [o["actor"] for o in history.json()],
        dict(Counter(r.status for r in _archive(outbox_app))),
    )


async def test_retry_through_the_api_makes_a_deferred_group_due_after_a_dry_run(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """A dry run names the deferred group and leaves it due in an hour; the retry makes it
    due now, leaves a dead group named, and history records it as the caller's."""
    deferred, dead = uuid.uuid4(), uuid.uuid4()
    with outbox_app.engine.begin() as conn:
        conn.execute(insert(schema.jobs).values(
            kind="batch", handler="fails", group_id=deferred, priority=0, deferrals=1,
            run_at=db_now_plus(3600),
        ))  # fmt: skip
        conn.execute(insert(schema.archive).values(
            handler="fails", buffer="test_activity_events", event_id=1, group_id=dead,
            status="dead", attempts=1, payload={"id": 1},
        ))  # fmt: skip
    body = {"group": [str(deferred), str(dead)]}
    dry = await client.post(
        "/api/v1/groups/retry", headers=bearer("operator"), json={**body, "dry_run": True}
    )
    due_after_dry = _due(outbox_app)
    done = await client.post("/api/v1/groups/retry", headers=bearer("operator"), json=body)
    history = await client.get("/api/v1/history", headers=bearer("viewer"))
    assert (
        (200, [str(deferred)], None),
        {deferred: False},
        (200, [str(deferred)], [[str(dead), "dead: replay it"]]),
        {deferred: True},
        [("retry", "operator-bot", 1)],
    ) == (
        (
            dry.status_code,
            [g["group_id"] for g in dry.json()["groups"]],
            dry.json()["operation_id"],
        ),
        due_after_dry,
        (
            done.status_code,
            [g["group_id"] for g in done.json()["groups"]],
            [[g["group_id"], why] for g, why in done.json()["skipped"]],
        ),
        _due(outbox_app),
        [(o["action"], o["actor"], o["groups"]) for o in history.json()],
    )


async def test_search_answers_where_a_group_is_as_search_does(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """``GET /search?q=`` answers ``search.search``: a dead group's id found dead; no text is
    a 400 naming it."""
    group_id = _dead(outbox_app, commit_events)
    found = await client.get(f"/api/v1/search?q={group_id}", headers=bearer("viewer"))
    empty = await client.get("/api/v1/search?q=", headers=bearer("viewer"))
    assert (
        (200, [["group_id", "dead", "fails", str(group_id), "dead"]]),
        (400, True),
    ) == (
        (
            found.status_code,
            [
                [f["taken"], f["place"], f["handler"], f["group_id"], f["status"]]
                for f in found.json()["found"]
            ],
        ),
        (empty.status_code, empty.json()["error"].startswith("text: expected")),
    )


def _due(app: Outbox) -> dict[uuid.UUID, bool]:
    """Each batch job's group, and whether it is due now."""
    with app.engine.connect() as conn:
        rows = conn.execute(
            select(schema.jobs.c.group_id, schema.jobs.c.run_at <= db_now_plus(0)).where(
                schema.jobs.c.kind == "batch"
            )
        )
        return {g: bool(due) for g, due in rows}


def _buffered(app: Outbox) -> list[Any]:
    with app.engine.connect() as conn:
        return list(conn.execute(select(ActivityEvent.__table__)))


def _archive(app: Outbox) -> list[Any]:
    with app.engine.connect() as conn:
        return list(conn.execute(select(schema.archive)))


async def test_edit_through_the_api_checks_the_values_against_the_columns(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """A value the column does not take: 400 naming it, nothing written; a good one: the
    event goes back with it."""
    group_id = _dead(outbox_app, commit_events, 1)
    [event] = groups.show(outbox_app, group_id).events
    url = f"/api/v1/groups/{group_id}/events/{event.id}/replay"
    bad = await client.post(url, headers=bearer("operator"), json={"values": {"activity_id": "x"}})
    good = await client.post(url, headers=bearer("operator"), json={"values": {"kind": "fixed"}})
    assert (400, "activity_id: 'x' is not a valid int", 200, ["fixed"]) == (
        bad.status_code,
        bad.json()["error"].split(":", 2)[0] + ":" + bad.json()["error"].split(":", 2)[1],
        good.status_code,
        [row.kind for row in _buffered(outbox_app)],
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("method", "url", "body", "expected", "message"),
    [
        ("get", "/api/v1/groups/not-a-uuid", None, 400, "group_id: 'not-a-uuid' is not a UUID"),
        ("get", f"/api/v1/groups/{uuid.UUID(int=7)}", None, 404, "no group 00000000-0000"),
        (
            "get",
            "/api/v1/groups?status=deadd",
            None,
            400,
            "statuses: 'deadd' is not a group status",
        ),
        (
            "get",
            "/api/v1/groups?handler=nope",
            None,
            404,
            "no handler 'nope' (handlers: accounts, fails)",
        ),
        ("get", "/api/v1/groups?limit=many", None, 400, "limit: 'many' is not a number of groups"),
        ("post", "/api/v1/groups/discard", {}, 400, "discard needs a selection"),
        ("post", "/api/v1/groups/retry", {}, 400, "retry needs a selection"),
        (
            "post",
            "/api/v1/groups/discard",
            {"reason": 5, "handler": ["fails"]},
            400,
            "reason: expected str | null, got int",
        ),
        (
            "post",
            "/api/v1/handlers/fails/pause",
            {"seconds": True},
            400,
            "seconds: expected int | float | null, got bool",
        ),
        ("post", "/api/v1/handlers/fails/pause", {"seconds": -1}, 400, "seconds: expected int"),
        ("post", "/api/v1/history", None, 405, ""),
        ("get", "/api/v1/groups?payload=a%00", None, 400, "payload: a NUL character"),
        ("get", "/api/v1/groups?error=%00", None, 400, "error: a NUL character"),
        ("get", "/api/v1/archive?payload=a%00", None, 400, "payload: a NUL character"),
        ("get", "/api/v1/groups?older_than=1e308", None, 400, "older_than: expected at most"),
    ],
    ids=[
        "uuid",
        "unknown-group",
        "status",
        "handler",
        "limit",
        "empty",
        "empty-retry",
        "reason",
        "bool",
        "negative",
        "method",
        "nul-payload",
        "nul-error",
        "nul-archive",
        "older-than-past-years",
    ],
)
async def test_bad_input_gets_a_4xx_naming_it(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    body: dict[str, Any] | None,
    expected: int,
    message: str,
) -> None:
    """Each bad request: its 4xx, and a message that names what is wrong."""
    response = await client.request(method, url, headers=bearer("operator"), json=body)
    text = (
        response.json().get("error", "")
        if response.headers.get("content-type", "").startswith("application/json")
        else ""
    )
    assert (expected, True) == (response.status_code, message in text), text


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("older_than", ["inf", "-inf", "nan", "1e999"])
async def test_an_age_no_clock_can_subtract_is_a_400_naming_it(
    client: httpx.AsyncClient, older_than: str
) -> None:
    """``older_than`` infinite or not a number: 400 naming it, not a database error."""
    response = await client.get(
        "/api/v1/groups", params={"older_than": older_than}, headers=bearer("viewer")
    )
    assert (400, True) == (
        response.status_code,
        response.json()["error"].startswith("older_than: expected a finite number of seconds"),
    ), response.text


async def test_edit_through_the_api_replays_a_discarded_event(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """An event discarded (refused for good) is fixed and replayed through the API as a dead
    one is, under its own id."""
    group_id = _dead(outbox_app, commit_events, 1)
    group_operations.discard(outbox_app, Selection(group_ids=(group_id,)), actor="ops")
    [event] = groups.show(outbox_app, group_id).events
    url = f"/api/v1/groups/{group_id}/events/{event.id}/replay"
    response = await client.post(
        url, headers=bearer("operator"), json={"values": {"kind": "fixed"}}
    )
    assert ("discarded", 200, [(event.id, "fixed")]) == (
        event.status,
        response.status_code,
        [(row.id, row.kind) for row in _buffered(outbox_app)],
    ), response.text


async def test_a_discarded_group_is_replayed_through_the_api(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """``POST /groups/{group_id}/replay`` puts a discarded group's events back under their
    own ids (a dry run first changes nothing), recorded as a replay by its caller."""
    group_id = _dead(outbox_app, commit_events, 2)
    group_operations.discard(outbox_app, Selection(group_ids=(group_id,)), actor="ops")
    event_ids = sorted(e.id for e in groups.show(outbox_app, group_id).events)
    url = f"/api/v1/groups/{group_id}/replay"
    dry = await client.post(url, headers=bearer("operator"), json={"dry_run": True})
    before = _buffered(outbox_app)
    done = await client.post(url, headers=bearer("operator"))
    replayed = operators.history(outbox_app, action="replay")
    assert (
        (200, 2, True, []),
        (200, 2, [str(group_id)]),
        event_ids,
        [("replay", "operator-bot")],
    ) == (
        (dry.status_code, dry.json()["events"], dry.json()["dry_run"], before),
        (done.status_code, done.json()["events"], [g["group_id"] for g in done.json()["groups"]]),
        sorted(row.id for row in _buffered(outbox_app)),
        [(o.action.value, o.actor) for o in replayed],
    ), done.text


async def test_a_live_group_is_not_replayed_through_the_api(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """A group put off by its downstream is named as left; nothing is recorded."""
    deferred = uuid.uuid4()
    with outbox_app.engine.begin() as conn:
        conn.execute(insert(schema.jobs).values(
            kind="batch", handler="fails", group_id=deferred, priority=0, deferrals=1,
            run_at=db_now_plus(3600),
        ))  # fmt: skip
    response = await client.post(f"/api/v1/groups/{deferred}/replay", headers=bearer("operator"))
    assert (200, [], [[str(deferred), "deferred: not dead or discarded"]], []) == (
        response.status_code,
        response.json()["groups"],
        [[s[0]["group_id"], s[1]] for s in response.json()["skipped"]],
        operators.history(outbox_app),
    ), response.text


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_request_body_that_is_not_a_json_object_is_refused(
    client: httpx.AsyncClient,
) -> None:
    """Not JSON, or JSON that is not an object: 400 saying so."""
    not_json = await client.post(
        "/api/v1/groups/discard",
        headers={**bearer("operator"), "content-type": "application/json"},
        content=b"{",
    )
    a_list = await client.post("/api/v1/groups/discard", headers=bearer("operator"), json=[1])
    assert (400, 400, "request body must be a JSON object") == (
        not_json.status_code,
        a_list.status_code,
        a_list.json()["error"],
    )


async def test_an_unreachable_database_is_a_503_without_its_url_or_password(
    make_app: Callable[[str], Outbox], database_url: str
) -> None:
    """The database down: 503 in one line, no URL, host's password or user's secret in it;
    /healthz says not ok."""
    app = make_app("postgresql+psycopg://outbox:s3cret-pw@127.0.0.1:1/nowhere")
    app.handler(ActivityEvent, name="fails")(_fail)
    async with client_of(create_app(app, auth=AUTH)) as c:
        status = await c.get("/api/v1/status", headers=bearer("viewer"))
        health = await c.get("/healthz")
    assert (503, False, False, 503, {"ok": False}) == (
        status.status_code,
        "s3cret-pw" in status.text,
        "postgresql+psycopg://" in status.text,
        health.status_code,
        health.json(),
    )


# --- the snapshot all viewers share ----------------------------------------------------------


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_many_viewers_cost_one_status_read_per_period(outbox_app: Outbox) -> None:
    """Fifty concurrent status requests within a period: one status read."""
    web = create_app(outbox_app, auth=AUTH, refresh_seconds=60)
    async with client_of(web) as c:
        answers = await asyncio.gather(
            *(c.get("/api/v1/status", headers=bearer("viewer")) for _ in range(50))
        )
    assert ({200}, 1) == ({a.status_code for a in answers}, web.state.console.snapshots.reads)


# --- ingest ---------------------------------------------------------------------------------


async def test_put_writes_an_event_once_under_its_key(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """The first PUT writes (201), the same key again writes nothing (200, the same id)."""
    values = {"account": "a-1", "amount": "12.50", "ref": str(uuid.uuid4()), "data": {"n": 1}}
    first = await client.put(
        "/api/v1/handlers/accounts/events/k-1", headers=bearer("producer"), json=values
    )
    again = await client.put(
        "/api/v1/handlers/accounts/events/k-1", headers=bearer("producer"), json=values
    )
    assert (201, 200, first.json()["event_id"], 1) == (
        first.status_code,
        again.status_code,
        again.json()["event_id"],
        _count(outbox_app, SinkEvent),
    )


def _count(app: Outbox, model: Any) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())


async def test_a_batch_with_one_bad_event_writes_nothing_and_names_every_problem(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """400 naming each event and column at fault; no event written, no key recorded."""
    good = {"key": "ok", "values": {"account": "a", "amount": 1, "ref": str(uuid.uuid4())}}
    bad = {"key": "bad", "values": {"account": "b", "amount": "lots", "colour": "red"}}
    response = await client.post(
        "/api/v1/handlers/accounts/events", headers=bearer("producer"), json={"events": [good, bad]}
    )
    error = response.json()["error"]
    assert (400, True, True, True, 0) == (
        response.status_code,
        "event 1 (key 'bad'): 'colour' is not a column of buffer test_sink_events" in error,
        "event 1 (key 'bad'): amount:" in error,
        "event 1 (key 'bad'): ref: a value is required" in error,
        _count(outbox_app, SinkEvent),
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"account": "x" * 41, "amount": 1, "ref": str(uuid.UUID(int=1))},
            "account: 41 characters",
        ),
        (
            {"account": "a", "amount": True, "ref": str(uuid.UUID(int=1))},
            "amount: expected Decimal, got bool",
        ),
        ({"account": "a", "amount": 1, "ref": "nope"}, "ref: badly formed hexadecimal UUID string"),
        (
            {"account": None, "amount": 1, "ref": str(uuid.UUID(int=1))},
            "account: NULL is not allowed",
        ),
        (
            {"id": 5, "account": "a", "amount": 1, "ref": str(uuid.UUID(int=1))},
            "'id' is outbox's own column",
        ),
        (
            {"account": "a\ud800", "amount": 1, "ref": str(uuid.UUID(int=1))},
            "event 0 (key 'k'): account: a lone surrogate (\\ud800) is not text",
        ),
        (
            {"account": "a\x00", "amount": 1, "ref": str(uuid.UUID(int=1))},
            "event 0 (key 'k'): account: a NUL character",
        ),
        (
            {"account": "a", "amount": -9999999999.995, "ref": str(uuid.UUID(int=1))},
            "amount: -9999999999.995 rounds to -10000000000.00, more than the column's 10 digits",
        ),
    ],
    ids=["too-long", "bool", "uuid", "null", "own", "surrogate", "nul", "rounds-over"],
)
def test_ingest_checks_each_value_against_its_column(
    outbox_app: Outbox, values: dict[str, Any], message: str
) -> None:
    """Each value a column does not take is refused, naming the column, before any write."""
    with pytest.raises(ingest.IngestError) as raised:
        ingest.ingest(outbox_app, "accounts", [("k", values)])
    assert (True, 0) == (message in str(raised.value), _count(outbox_app, SinkEvent)), str(
        raised.value
    )


def _hostile_app(database_url: str, make_app: Callable[[str], Outbox]) -> Outbox:
    """An application whose handler of :class:`HostileEvent` (a bytes column) fails once."""
    create_hostile_table(database_url)
    app = make_app(database_url)
    app.handler(HostileEvent, retry=ONE_SHOT, name="hostile")(_fail)
    return app


async def test_ingest_takes_bytes_in_base64_as_the_api_answers_them(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Bytes PUT in base64 are written as those bytes, and a group's detail answers them in
    the same base64."""
    app = _hostile_app(database_url, make_app)
    sent = base64.b64encode(b"\x00\xff raw \x80").decode()
    async with client_of(create_app(app, auth=AUTH)) as c:
        put = await c.put(
            "/api/v1/handlers/hostile/events/k-1",
            headers=bearer("producer"),
            json={"label": "bytes", "blob": sent},
        )
        with app.engine.connect() as conn:
            stored = conn.execute(select(HostileEvent.blob)).scalar_one()
        drain(app, handlers=["hostile"])
        [dead] = groups.find(app, groups.Selection(statuses=("dead",))).groups
        detail = await c.get(f"/api/v1/groups/{dead.group_id}", headers=bearer("viewer"))
    assert (201, b"\x00\xff raw \x80", [sent]) == (
        put.status_code,
        stored,
        [e["values"]["blob"] for e in detail.json()["events"]],
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_ingest_refuses_bytes_in_hex_saying_bytes_are_base64(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Hex that is not also base64 is a 400 saying bytes are base64; nothing is written."""
    app = _hostile_app(database_url, make_app)
    async with client_of(create_app(app, auth=AUTH)) as c:
        put = await c.put(
            "/api/v1/handlers/hostile/events/k-1",
            headers=bearer("producer"),
            json={"label": "bytes", "blob": "00ff80"},
        )
    assert (400, True, 0) == (
        put.status_code,
        "blob: '00ff80' is not base64: bytes are standard base64 (RFC 4648, padded), not hex"
        in put.json()["error"],
        _count(app, HostileEvent),
    ), put.json()


@pytest.mark.parametrize("database_url", ["postgresql", "mariadb"], indirect=True)
def test_retrying_producers_lose_nothing_and_duplicate_nothing(outbox_app: Outbox) -> None:
    """Eight threads send overlapping batches of 50 keys, each batch twice or three times
    (a retry after a timeout): every key is written exactly once."""
    keys = [f"order-{n}" for n in range(400)]
    batches = [keys[n : n + 50] for n in range(0, 400, 25)]  # each key in two batches
    errors: list[BaseException] = []

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        mine = batches[:]
        rng.shuffle(mine)
        for batch in mine:
            for _ in range(rng.choice((1, 2))):
                try:
                    ingest.ingest(
                        outbox_app,
                        "accounts",
                        [
                            (
                                k,
                                {
                                    "account": k,
                                    "amount": 1,
                                    "ref": str(uuid.uuid5(uuid.NAMESPACE_URL, k)),
                                },
                            )
                            for k in batch
                        ],
                    )
                except BaseException as error:
                    errors.append(error)

    threads = [threading.Thread(target=produce, args=(seed,)) for seed in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with outbox_app.engine.connect() as conn:
        accounts = Counter(conn.execute(select(SinkEvent.account)).scalars())
        recorded = conn.execute(select(func.count()).select_from(schema.ingest_keys)).scalar_one()
    assert ([], set(keys), {1}, 400) == (errors, set(accounts), set(accounts.values()), recorded)


# --- the document ---------------------------------------------------------------------------


def test_the_openapi_document_describes_every_endpoint() -> None:
    """Every API route's path and method is in the document, and nothing else is."""
    routes = {
        (route.path.removeprefix(api.PREFIX).replace(":int}", "}"), method.lower())
        for route in api.ROUTES
        if isinstance(route, Route)
        for method in route.methods or ()
        if method != "HEAD"
    }
    documented = {
        (path, method) for path, item in openapi.spec()["paths"].items() for method in item
    }
    assert routes == documented


def test_the_document_gives_a_bytes_column_as_base64() -> None:
    """An ingest path's bytes column is base64 text, in the pattern ingest reads."""
    blob = column_schema(HostileEvent.__table__.c.blob)
    pattern = re.compile(blob["pattern"])
    assert ("base64", True, True, False) == (
        blob["contentEncoding"],
        bool(pattern.match(base64.b64encode(b"\x00\xff raw").decode())),
        bool(pattern.match("")),
        bool(pattern.match("00ff80")),
    )


def test_the_document_gives_an_enum_column_by_its_members_values() -> None:
    """An enum column takes its members' values, as they are answered, not their names."""
    table = Table(
        "documented_events",
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("color", Enum(types.Color), nullable=False),
        Column("priority", Enum(types.Priority, native_enum=False), nullable=False),
    )
    assert (["red", "dark blue"], [1, 20]) == (
        column_schema(table.c.color)["enum"],
        column_schema(table.c.priority)["enum"],
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_the_status_endpoint_equals_the_status_command(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """``GET /status``'s numbers are ``metrics.collect``'s."""
    commit_events(outbox_app.engine, 3)
    response = await client.get("/api/v1/status", headers=bearer("viewer"))
    expected = {h.handler: h.unclaimed for h in metrics.collect(outbox_app)}
    assert expected == {h["handler"]: h["unclaimed"] for h in response.json()["handlers"]}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_the_scaling_endpoint_answers_desired_workers_as_read_scaling_does(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """Five events waiting: one slot wanted, per band and in total, as
    ``outbox.ops.scaling.read_scaling`` says; a target it does not take, and one that is not a
    number: 400 naming it; a handler it does not know: 404."""
    from outbox.ops.scaling import read_scaling

    commit_events(outbox_app.engine, 5)
    response = await client.get("/api/v1/scaling?handler=fails", headers=bearer("viewer"))
    too_big = await client.get("/api/v1/scaling?target=2", headers=bearer("viewer"))
    not_a_number = await client.get("/api/v1/scaling?target=half", headers=bearer("viewer"))
    unknown = await client.get("/api/v1/scaling?handler=nope", headers=bearer("viewer"))
    body = response.json()
    expected = read_scaling(outbox_app, ["fails"])
    assert (200, 1, 5, [1], 400, True, 400, "target", 404) == (
        response.status_code,
        body["desired_workers"],
        body["runnable"],
        [b["desired_workers"] for b in body["bands"]],
        too_big.status_code,
        "target" in too_big.json()["error"],
        not_a_number.status_code,
        not_a_number.json()["error"].split(":")[0],
        unknown.status_code,
    )
    assert expected.desired_workers == body["desired_workers"]


async def test_the_throughput_endpoint_answers_the_chart_of_the_range_asked_for(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """A day of a handler: 24 hourly buckets, oldest first, what the workers recorded this
    minute in the newest; the API keeps numbers (seconds), as metrics.throughput_charts says.
    A range it does not know: 400 naming it."""
    minute = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    row = {"handler": "accounts", "minute": minute, "succeeded": 3, "dead": 0, "failed": 0}
    with outbox_app.engine.begin() as conn:
        queries.add_throughput(conn, outbox_app.dialect, [row])
    response = await client.get(
        "/api/v1/handlers/accounts/throughput?range=day", headers=bearer("viewer")
    )
    wrong = await client.get(
        "/api/v1/handlers/accounts/throughput?range=year", headers=bearer("viewer")
    )
    body = response.json()
    expected = metrics.throughput_charts(outbox_app, ["accounts"], "day")["accounts"]
    assert (200, "day", 3600, 24, 3, 3600, expected.as_dict(), 400) == (
        response.status_code,
        body["range"],
        body["bucket_seconds"],
        len(body["buckets"]),
        body["buckets"][-1]["succeeded"],
        body["buckets"][-1]["start_ago"],
        body,
        wrong.status_code,
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_an_operator_asks_a_worker_to_drain_or_stop_through_the_api(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """Drain by an operator's token: 200 with the worker and within how many seconds it acts,
    recorded as the token's principal; a viewer: 403; an unknown worker: 404; one too old to
    read it: 409 naming why; nothing asked of the old one."""
    with outbox_app.engine.begin() as conn:
        for worker_id, generation in (("box:1:new", schema.GENERATION), ("box:2:old", 6)):
            conn.execute(
                schema.workers.insert().values(
                    id=worker_id, hostname="box", pid=1, concurrency=1, version="0.9",
                    generation=generation,
                )
            )  # fmt: skip
    drained = await client.post("/api/v1/workers/box:1:new/drain", headers=bearer("operator"))
    viewer = await client.post("/api/v1/workers/box:1:new/stop", headers=bearer("viewer"))
    unknown = await client.post("/api/v1/workers/box:9:none/stop", headers=bearer("operator"))
    old = await client.post("/api/v1/workers/box:2:old/stop", headers=bearer("operator"))
    asked = {w.id: (w.request, w.requested_by) for w in fleet.workers(outbox_app)}
    [operation] = operators.history(outbox_app)
    assert (
        (200, "drain", "box:1:new", True),
        (403, 404, 409),
        True,
        {"box:1:new": ("drain", "operator-bot"), "box:2:old": (None, None)},
        ("drain", "operator-bot", {"worker": "box:1:new"}),
    ) == (
        (
            drained.status_code,
            drained.json()["request"],
            drained.json()["worker"],
            drained.json()["acts_within"] > 0,
        ),
        (viewer.status_code, unknown.status_code, old.status_code),
        "older than schema 0007" in old.json()["error"],
        asked,
        (operation.action, operation.actor, operation.selection),
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_stale_snapshot_is_answered_at_once_while_a_new_one_is_read(
    outbox_app: Outbox, commit_events: Any
) -> None:
    """Past the period, the old snapshot comes back without waiting; one background read
    then brings the new numbers."""
    from outbox.web._console import Snapshots
    from tests._support import wait_for

    snapshots = Snapshots(outbox_app, period=0.0)
    first = snapshots.get()
    commit_events(outbox_app.engine, 2)
    stale = snapshots.get()
    wait_for(lambda: snapshots.reads == 2, "the background read")
    fresh = snapshots.get()

    def unclaimed(snapshot: Any) -> int:
        return next(h.unclaimed for h in snapshot.handlers if h.handler == "fails")

    assert (0, 0, 2, True) == (
        unclaimed(first),
        unclaimed(stale),
        unclaimed(fresh),
        fresh.taken_at >= first.taken_at,
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_prune_forgets_idempotency_keys_past_its_age(outbox_app: Outbox) -> None:
    """A key older than the prune's age is forgotten: the same key then writes again."""
    from sqlalchemy import update

    from outbox._db.dialects import db_now_plus

    values = {"account": "a", "amount": 1, "ref": str(uuid.UUID(int=3))}
    [first] = ingest.ingest(outbox_app, "accounts", [("k", values)])
    archive.prune(outbox_app, older_than=3600)
    [kept] = ingest.ingest(outbox_app, "accounts", [("k", values)])
    with outbox_app.engine.begin() as conn:
        conn.execute(update(schema.ingest_keys).values(received_at=db_now_plus(-7200)))
    archive.prune(outbox_app, older_than=3600)
    [again] = ingest.ingest(outbox_app, "accounts", [("k", values)])
    assert (True, False, True, 2) == (
        first.created,
        kept.created,
        again.created,
        _count(outbox_app, SinkEvent),
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_write_through_the_api_shows_in_the_next_status(outbox_app: Outbox) -> None:
    """A pause through the API: the very next status says paused, however long the period."""
    web = create_app(outbox_app, auth=AUTH, refresh_seconds=3600)
    async with client_of(web) as c:
        before = await c.get("/api/v1/status", headers=bearer("viewer"))
        await c.post("/api/v1/handlers/fails/pause", headers=bearer("operator"), json={})
        after = await c.get("/api/v1/status", headers=bearer("viewer"))

    def paused(response: httpx.Response) -> bool:
        return next(h["paused"] for h in response.json()["handlers"] if h["handler"] == "fails")

    assert (False, True) == (paused(before), paused(after))


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_the_archive_endpoint_pages_events_and_hides_what_it_must(
    outbox_app: Outbox, commit_events: Any
) -> None:
    """``GET /archive``: dead events newest first, a page at a time; a hidden handler's
    values never answered."""
    _dead(outbox_app, commit_events, 3)
    web = create_app(outbox_app, auth=AUTH, hide_payloads=["fails"])
    async with client_of(web) as c:
        first = await c.get("/api/v1/archive", params={"limit": 2}, headers=bearer("viewer"))
        rest = await c.get(
            "/api/v1/archive",
            params={"limit": 2, "before": first.json()["next"]},
            headers=bearer("viewer"),
        )
        bad = await c.get("/api/v1/archive", params={"limit": "x"}, headers=bearer("viewer"))
    events = first.json()["events"] + rest.json()["events"]
    assert ([3, 2, 1], [{"hidden": True}] * 3, None, 400) == (
        [e["id"] for e in events],
        [e["values"] for e in events],
        rest.json()["next"],
        bad.status_code,
    )


# --- hostile input ------------------------------------------------------------------------

SURROGATE = "a\ud800b"
NUL = "a\x00b"
GROUP = uuid.UUID(int=9)


def _sink_values(**more: Any) -> dict[str, Any]:
    return {"account": "a-1", "amount": "12.50", "ref": str(uuid.UUID(int=5)), **more}


def _nothing_written(app: Outbox) -> tuple[int, dict[str, Any], list[Any]]:
    """Events written, handlers paused, operations recorded: what a refused request leaves."""
    return (_count(app, SinkEvent), flow.paused(app), operators.history(app))


@pytest.mark.parametrize("text", [SURROGATE, NUL], ids=["surrogate", "nul"])
@pytest.mark.parametrize(
    ("method", "url", "body", "field"),
    [
        ("put", "/handlers/accounts/events/k", lambda t: _sink_values(account=t), "account"),
        (
            "post",
            "/handlers/accounts/events",
            lambda t: {"events": [{"key": "k", "values": _sink_values(data={"note": [t]})}]},
            "events[0].values.data.note[0]",
        ),
        (
            "post",
            "/handlers/accounts/events",
            lambda t: {"events": [{"key": t, "values": _sink_values()}]},
            "events[0].key",
        ),
        ("post", "/handlers/fails/pause", lambda t: {"reason": t}, "reason"),
        ("post", "/groups/replay", lambda t: {"payload": t}, "payload"),
        ("post", "/groups/discard", lambda t: {"error": t, "reason": "r"}, "error"),
        (
            "post",
            f"/groups/{GROUP}/events/1/replay",
            lambda t: {"values": {"kind": t}},
            "values.kind",
        ),
    ],
    ids=["put", "batch-json", "batch-key", "pause", "replay-filter", "discard-filter", "edit"],
)
async def test_text_no_database_stores_is_a_json_400_naming_its_field(
    client: httpx.AsyncClient,
    outbox_app: Outbox,
    method: str,
    url: str,
    body: Callable[[str], Any],
    field: str,
    text: str,
) -> None:
    """A lone surrogate (valid JSON: ``"\\ud800"``) or a NUL in any string of a body: a JSON
    400 whose message begins with the field, and nothing written, on every database."""
    response = await client.request(
        method,
        f"/api/v1{url}",
        headers={**bearer("admin"), "content-type": "application/json"},
        content=json.dumps(body(text)).encode(),
    )
    assert (400, "application/json", True, (0, {}, [])) == (
        response.status_code,
        response.headers["content-type"],
        response.json()["error"].startswith(f"{field}: a "),
        _nothing_written(outbox_app),
    ), response.text


@pytest.mark.parametrize("text", [SURROGATE, NUL], ids=["surrogate", "nul"])
def test_an_edit_refuses_text_no_database_stores(
    outbox_app: Outbox, commit_events: Any, text: str
) -> None:
    """``archive.edit`` (the API's, the page's and the command's) with a NUL or a lone
    surrogate: refused naming the column, the event still dead."""
    group_id = _dead(outbox_app, commit_events, 1)
    [event] = groups.show(outbox_app, group_id).events
    with pytest.raises(ConfigurationError) as raised:
        edit.edit(outbox_app, group_id, event.id, {"kind": text}, actor="ann")
    assert (True, "dead") == (
        str(raised.value).startswith("kind: a "),
        groups.show(outbox_app, group_id).group.status,
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "request body is nested deeper than"),
        (b'{"reason": ' + b"[" * 50 + b"]" * 50 + b"}", "reason[0][0]"),
        (b'{"seconds": ' + b"9" * 5000 + b"}", "request body is not JSON: a number of 5000"),
        (b'{"seconds": ' + b"9" * 400 + b"}", "request body is not JSON: a number of 400"),
        (b'{"seconds": 1e999}', "seconds: a number past a double's range"),
        (b'{"seconds": NaN}', "request body is not JSON: NaN is not a JSON number"),
        (b'{"seconds": -Infinity}', "request body is not JSON: -Infinity is not a JSON number"),
    ],
    ids=["deep", "deep-field", "digits", "past-double", "overflow", "nan", "infinity"],
)
async def test_deep_nesting_and_huge_numbers_are_a_json_400(
    client: httpx.AsyncClient, outbox_app: Outbox, body: bytes, message: str
) -> None:
    """Nesting past what the API reads, numbers past a double's, JSON's missing NaN: a JSON
    400 saying which, never a 500; nothing paused."""
    response = await client.post(
        "/api/v1/handlers/fails/pause",
        headers={**bearer("operator"), "content-type": "application/json"},
        content=body,
    )
    assert (400, True, {}) == (
        response.status_code,
        response.json()["error"].startswith(message),
        flow.paused(outbox_app),
    ), response.text


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (_sink_values(data=json.loads("[" * 32 + "]" * 32)), "data" + "[0]" * 31 + ": nested"),
        (_sink_values(data={"n": 10**400}), "data.n: a number past a double's range"),
        (_sink_values(data={"n": float("nan")}), "data.n: a number past a double's range"),
        (_sink_values(data={NUL: 1}), "data.a\\x00b: a NUL character"),
    ],
    ids=["deep", "huge", "nan", "nul-key"],
)
def test_ingest_refuses_json_no_database_stores(
    outbox_app: Outbox, values: dict[str, Any], message: str
) -> None:
    """A JSON column's value nested past MariaDB's 32 levels, with a number past a double's
    range or text no database stores: refused naming the column and where within it."""
    with pytest.raises(ingest.IngestError) as raised:
        ingest.ingest(outbox_app, "accounts", [("k", values)])
    assert (f"event 0 (key 'k'): {message}", 0) == (
        str(raised.value)[: len(f"event 0 (key 'k'): {message}")],
        _count(outbox_app, SinkEvent),
    )


CHUNK = 64 * 1024


async def _streamed(web: Any, path: str, headers: dict[str, str], size: int) -> tuple[int, Any]:
    """``size`` bytes of body sent to ``web`` as a chunked request states them (no length), a
    chunk at each read (JSON's blanks, or a form's field of 64 KiB): how many bytes the
    application read, and its answer (status, content type, body)."""
    read = 0
    form = "form" in headers["content-type"]
    chunk = b"f=" + b"x" * (CHUNK - 3) + b"&" if form else b" " * CHUNK

    async def receive() -> dict[str, Any]:
        nonlocal read
        if read >= size:
            return {"type": "http.disconnect"}
        read += CHUNK
        return {"type": "http.request", "body": chunk, "more_body": read < size}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"transfer-encoding", b"chunked"),
            *((k.lower().encode(), v.encode()) for k, v in headers.items()),
        ],
        "client": REMOTE,
        "server": ("console", 80),
        "state": {},
    }
    await web(scope, receive, send)
    [start] = [m for m in sent if m["type"] == "http.response.start"]
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return read, (start["status"], dict(start["headers"]).get(b"content-type"), body)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/api/v1/handlers/accounts/events", "application/json"),
        ("/handlers/fails/pause", "application/x-www-form-urlencoded"),
    ],
    ids=["json", "form"],
)
async def test_a_chunked_body_is_read_no_further_than_the_limit(
    outbox_app: Outbox, path: str, content_type: str
) -> None:
    """A body without a length, past 16 MiB: the application reads at most one chunk past the
    limit and answers a JSON 413, whether an API body or a page's form."""
    from outbox.web._limits import MAX_BODY_BYTES

    web = create_app(outbox_app, auth=AUTH)
    headers = {**bearer("admin"), "content-type": content_type}
    read, (status, kind, body) = await _streamed(web, path, headers, MAX_BODY_BYTES + 64 * CHUNK)
    assert (413, b"application/json", f"request body larger than {MAX_BODY_BYTES} bytes") == (
        status,
        kind,
        json.loads(body)["error"],
    )
    assert read <= MAX_BODY_BYTES + CHUNK, read


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_server_stops_reading_a_chunked_body_at_the_limit(outbox_app: Outbox) -> None:
    """Through uvicorn, a producer's token and a chunked 200 MiB body: a JSON 413, and the
    server stopped taking the body a few socket buffers past the limit."""
    import uvicorn

    from outbox.web._limits import MAX_BODY_BYTES
    from tests._ports import free_ports
    from tests._support import wait_for

    web = create_app(outbox_app, auth=AUTH)
    port = free_ports()
    server = uvicorn.Server(
        uvicorn.Config(web, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    sent = 0

    def body() -> Any:
        nonlocal sent
        while sent < 200 * 1024 * 1024:
            sent += CHUNK
            yield b" " * CHUNK

    try:
        wait_for(lambda: server.started, "the console to listen")
        response = httpx.post(
            f"http://127.0.0.1:{port}/api/v1/handlers/accounts/events",
            headers={**bearer("producer"), "content-type": "application/json"},
            content=body(),
            timeout=30,
        )
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert (413, "application/json") == (
        response.status_code,
        response.headers["content-type"],
    )
    assert sent < MAX_BODY_BYTES + 16 * 1024 * 1024, sent


# --- ingest: a key sent again ---------------------------------------------------------------


async def test_a_key_sent_again_with_other_values_is_a_409_naming_it(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """PUT under a held key with another amount: 409 naming the key, the event as first
    written; the same values again: 200, ``same``."""
    url = "/api/v1/handlers/accounts/events/order-7"
    first = await client.put(url, headers=bearer("producer"), json=_sink_values())
    other = await client.put(url, headers=bearer("producer"), json=_sink_values(amount="13"))
    again = await client.put(url, headers=bearer("producer"), json=_sink_values())
    with outbox_app.engine.connect() as conn:
        amounts = list(conn.execute(select(SinkEvent.amount)).scalars())
    assert (
        (201, "new"),
        (409, "key 'order-7' sent before with other values: nothing of the batch written"),
        ["conflict"],
        (200, "same", first.json()["event_id"]),
        [12.5],
    ) == (
        (first.status_code, first.json()["result"]),
        (other.status_code, other.json()["error"]),
        [e["result"] for e in other.json()["events"]],
        (again.status_code, again.json()["result"], again.json()["event_id"]),
        [float(a) for a in amounts],
    )


async def test_the_same_values_are_compared_as_the_database_stores_them(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """Another spelling of the same values (a number as text or with more zeros, a UUID in
    capitals, an object's keys in another order, a NULL left out) is the same event."""
    ref = uuid.UUID(int=77)
    url = "/api/v1/handlers/accounts/events/k-same"
    given = {"account": "a", "amount": "12.5", "ref": str(ref), "data": {"x": 1, "y": [1, 2]}}
    spelled = {"account": "a", "amount": 12.50, "ref": str(ref).upper(), "note": None}
    spelled["data"] = {"y": [1, 2], "x": 1.0}
    first = await client.put(url, headers=bearer("producer"), json=given)
    again = await client.put(url, headers=bearer("producer"), json=spelled)
    assert (201, 200, "same", 1) == (
        first.status_code,
        again.status_code,
        again.json()["result"],
        _count(outbox_app, SinkEvent),
    ), again.text


async def test_a_batch_says_key_by_key_and_a_conflict_writes_nothing(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """A batch of a key held with the same values, one held with others and a new one: 409,
    each key's result, and the new one not written; without the conflict: 200, written."""
    url = "/api/v1/handlers/accounts/events"
    held = [{"key": k, "values": _sink_values(account=k)} for k in ("same", "changed")]
    await client.post(url, headers=bearer("producer"), json={"events": held})
    changed = {"key": "changed", "values": _sink_values(account="other")}
    new = {"key": "new", "values": _sink_values(account="new")}
    refused = await client.post(
        url, headers=bearer("producer"), json={"events": [held[0], changed, new]}
    )
    counted = _count(outbox_app, SinkEvent)
    done = await client.post(url, headers=bearer("producer"), json={"events": [held[0], new]})
    assert (
        (409, [("same", "same"), ("changed", "conflict"), ("new", "new")], None, 2),
        (200, [("same", "same"), ("new", "new")], 3),
    ) == (
        (
            refused.status_code,
            [(e["key"], e["result"]) for e in refused.json()["events"]],
            refused.json()["events"][2]["event_id"],
            counted,
        ),
        (
            done.status_code,
            [(e["key"], e["result"]) for e in done.json()["events"]],
            _count(outbox_app, SinkEvent),
        ),
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_key_whose_event_was_delivered_is_unchecked(outbox_app: Outbox) -> None:
    """Once its event has left the buffer, a key's values cannot be compared: ``unchecked``,
    nothing written."""
    ingest.ingest(outbox_app, "accounts", [("k", _sink_values())])
    drain(outbox_app, handlers=["accounts"])
    [again] = ingest.ingest(outbox_app, "accounts", [("k", _sink_values(amount="99"))])
    assert (ingest.IngestResult.UNCHECKED, False, 0) == (
        again.result,
        again.created,
        _count(outbox_app, SinkEvent),
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_key_twice_in_a_batch_with_other_values_is_a_conflict(outbox_app: Outbox) -> None:
    """One batch giving a key two sets of values: a conflict naming it; nothing written."""
    with pytest.raises(ingest.IngestConflictError) as raised:
        ingest.ingest(
            outbox_app,
            "accounts",
            [("k", _sink_values()), ("new", _sink_values()), ("k", _sink_values(amount=2))],
        )
    assert (
        "key 'k' sent before with other values: nothing of the batch written",
        [("k", "conflict"), ("new", "new")],
        0,
    ) == (
        str(raised.value),
        sorted((e.key, e.result.value) for e in raised.value.events),
        _count(outbox_app, SinkEvent),
    )


@pytest.mark.parametrize("database_url", ["mariadb"], indirect=True)
def test_a_key_the_database_matches_spelled_otherwise_is_the_key_held(outbox_app: Outbox) -> None:
    """MariaDB's collation matches ``A0`` to a held ``a0``: the key given is answered (not a
    500), compared with the event held under the key it matched."""
    [first] = ingest.ingest(outbox_app, "accounts", [("a0", _sink_values())])
    [again] = ingest.ingest(outbox_app, "accounts", [("A0", _sink_values())])
    assert (("A0", first.event_id, "same"), 1) == (
        (again.key, again.event_id, again.result.value),
        _count(outbox_app, SinkEvent),
    )


# --- the declarations -----------------------------------------------------------------------


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_answers_the_api_builds_are_written_as_they_always_were(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """The answers built from :mod:`outbox.web.bodies`' declarations, byte for byte: fields
    in their order, a number as it was given (5, not 5.0), an error in one field."""
    operator = bearer("operator")
    pause = "/api/v1/handlers/fails/pause"
    paused = await client.post(pause, headers=operator, json={"seconds": 5})
    resumed = await client.post("/api/v1/handlers/fails/resume", headers=operator)
    held = await client.post("/api/v1/held/release", headers=operator, json={})
    refused = await client.post("/api/v1/refused/release", headers=operator, json={})
    values = _sink_values()
    put = await client.put(
        "/api/v1/handlers/accounts/events/k-1", headers=bearer("producer"), json=values
    )
    batch = await client.post(
        "/api/v1/handlers/accounts/events",
        headers=bearer("producer"),
        json={"events": [{"key": "k-1", "values": values}, {"key": "k-2", "values": values}]},
    )
    conflict = await client.put(
        "/api/v1/handlers/accounts/events/k-1",
        headers=bearer("producer"),
        json=_sink_values(amount="13"),
    )
    missing = await client.get("/api/v1/groups/nope", headers=operator)
    first = put.json()["event_id"]
    assert [
        b'{"handler":"fails","paused":true,"seconds":5,"reason":"paused by operator-bot"}',
        b'{"handler":"fails","paused":false,"was_paused":true}',
        b'{"released":0}',
        b'{"released":0}',
        b'{"key":"k-1","event_id":%d,"created":true,"result":"new"}' % first,
        b'{"written":1,"duplicates":1,"events":[{"key":"k-1","event_id":%d,"created":false,'
        b'"result":"same"},{"key":"k-2","event_id":%d,"created":true,"result":"new"}]}'
        % (first, first + 1),
        b'{"error":"key \'k-1\' sent before with other values: nothing of the batch written",'
        b'"events":[{"key":"k-1","event_id":%d,"created":false,"result":"conflict"}]}' % first,
        b'{"error":"group_id: \'nope\' is not a UUID"}',
    ] == [r.content for r in (paused, resumed, held, refused, put, batch, conflict, missing)]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("url", "body", "message"),
    [
        ("/handlers/accounts/events", {}, "events: a value is required"),
        ("/handlers/accounts/events", {"events": []}, "events: expected array of length >= 1"),
        (
            "/handlers/accounts/events",
            {"events": [{"key": "k", "values": {}}] * 5001},
            "events: expected array of length <= 5000",
        ),
        (
            "/handlers/accounts/events",
            {"events": [{"key": "k", "values": {}}, {"key": 7, "values": {}}]},
            "events[1].key: expected str, got int",
        ),
        (
            "/handlers/accounts/events",
            {"events": [{"key": "k" * 201, "values": {}}]},
            "events[0].key: expected str of length <= 200",
        ),
        (
            "/handlers/accounts/events",
            {"events": [{"key": "k", "values": {}, "colour": "red"}]},
            "events[0]: object contains unknown field colour",
        ),
        ("/handlers/accounts/events", {"events": [3]}, "events[0]: expected object, got int"),
        ("/groups/discard", {"group": ["nope"]}, "group[0]: invalid UUID"),
        ("/groups/replay", {"status": ["deadd"]}, "status[0]: invalid enum value 'deadd'"),
        ("/groups/retry", {"handler": "fails"}, "handler: expected array | null, got str"),
        ("/groups/discard", {"error": " "}, "error: expected str matching regex"),
        (
            "/groups/replay",
            {"reason": "x"},
            "unknown field 'reason'; expected some of handler, status, older_than, error, key,"
            " payload, group, dry_run",
        ),
        ("/held/release", {"group_id": "nope"}, "group_id: invalid UUID"),
        ("/handlers/fails/pause", {"seconds": 0.0}, "seconds: expected float > 0.0"),
    ],
    ids=[
        "no-events",
        "no-event",
        "too-many",
        "key-type",
        "key-length",
        "event-field",
        "event-type",
        "uuid",
        "enum",
        "not-a-list",
        "blank",
        "unknown",
        "release-uuid",
        "zero",
    ],
)
async def test_a_body_not_as_declared_is_a_400_naming_the_field(
    client: httpx.AsyncClient, outbox_app: Outbox, url: str, body: Any, message: str
) -> None:
    """Each field read against its declaration: a JSON 400 in one line that begins with the
    field (where in the body), and nothing written."""
    response = await client.post(f"/api/v1{url}", headers=bearer("admin"), json=body)
    error = response.json()["error"]
    assert (400, True, False, 0, {}) == (
        response.status_code,
        error.startswith(message),
        "\n" in error,
        _count(outbox_app, SinkEvent),
        flow.paused(outbox_app),
    ), error


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_a_problem_quoting_a_long_value_is_cut(client: httpx.AsyncClient) -> None:
    """A value quoted in a 400 (a status of 100,000 characters): the message stays short."""
    response = await client.post(
        "/api/v1/groups/replay", headers=bearer("operator"), json={"status": ["x" * 100_000]}
    )
    assert (400, True, True) == (
        response.status_code,
        response.json()["error"].startswith("status[0]: invalid enum value 'xxx"),
        len(response.json()["error"]) <= bodies.MAX_MESSAGE,
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_document_declares_each_buffer_s_columns(outbox_app: Outbox) -> None:
    """A handler's ingest values in the document: every column but outbox's own, those
    without a default required, no other; a batch of its events at most ``MAX_EVENTS``."""
    document = openapi.spec(outbox_app)
    schemas = document["components"]["schemas"]
    values = schemas["accounts.values"]
    batch = schemas["accounts.batch"]["properties"]["events"]
    table = SinkEvent.__table__
    columns = [c for c in table.columns if c.name not in BufferMixin.OWN_COLUMNS]
    assert (
        [c.name for c in columns],
        sorted(c.name for c in columns if not c.nullable and c.default is None),
        False,
        {"type": "string", "maxLength": 40, "pattern": "^[^\\u0000]*$"},
        (1, ingest.MAX_EVENTS, "#/components/schemas/accounts.event"),
        "#/components/schemas/accounts.values",
    ) == (
        list(values["properties"]),
        sorted(values["required"]),
        values["additionalProperties"],
        values["properties"]["account"],
        (batch["minItems"], batch["maxItems"], batch["items"]["$ref"]),
        document["paths"]["/handlers/accounts/events/{key}"]["put"]["requestBody"]["content"][
            "application/json"
        ]["schema"]["$ref"],
    )


def test_every_declaration_is_in_the_document_and_every_reference_resolves() -> None:
    """Each declared body and answer is a schema of the document that an endpoint refers to,
    and every reference names a schema of the document."""
    document = openapi.spec()
    text = json.dumps(document["paths"])
    referred = set(re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(document)))
    declared = {kind.__name__ for kind in (*bodies.REQUESTS, *bodies.ANSWERS)}
    in_paths = {name for name in declared if f'"#/components/schemas/{name}"' in text}
    assert (set(), declared - {"IngestEvent", "Ingested"}) == (
        referred - set(document["components"]["schemas"]),
        in_paths - {"IngestEvent", "Ingested"},
    )


# --- the answers as the document describes them ---------------------------------------------


def _problems(document: dict[str, Any], path: str, method: str, body: Any) -> list[str]:
    """What in ``body``, the 200 answer of ``method`` ``path``, its schema in ``document``
    does not allow; its schema not naming each property (any object allowed) is a problem."""
    schema = document["paths"][path][method]["responses"]["200"]["content"]["application/json"]
    schema = schema["schema"]
    declared = schema.get("items", schema)
    if "$ref" in declared:
        declared = document["components"]["schemas"][declared["$ref"].rsplit("/", 1)[1]]
    if declared.get("additionalProperties") is not False:
        return [f"not described: {declared}"]
    validator = jsonschema_rs.Draft202012Validator(
        {**schema, "components": document["components"]}, validate_formats=True
    )
    return [f"{list(e.instance_path)}: {e.message}" for e in validator.iter_errors(body)]


async def test_every_answer_is_as_the_document_describes_it(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """Every read, and every action's 200, answers what its schema in the document says, and
    no property the schema does not name: a dead group holding a key, a refused group, a
    worker, an hour's throughput, an inbox, a fan-out, a flag handler, replays, a retry, an
    edit and a discard."""
    app = make_app(database_url)
    app.handler(ActivityEvent, retry=ONE_SHOT, ordering_key="kind", name="ordered")(_fail)
    app.handler(EmailEvent, retry=ONE_SHOT, name="mails")(_ok)
    app.fanout(ShipmentEvent, to=[ShipmentSearch], archive=True)
    app.flagged(Employee, flag="needs_work_done", version="version", buffer=EmployeeWork,
                name="payroll")(_ok)  # fmt: skip
    with app.engine.begin() as conn:
        app.inbox("orders").receive(conn, "m-1")
    commit_events(app.engine, 2, kind="alpha")
    drain(app, handlers=["ordered"])
    refuse_deletes(app.engine, EmailEvent.__tablename__)
    commit_events(app.engine, 1, model=EmailEvent)
    drain(app, handlers=["mails"])
    allow_deletes(app.engine, EmailEvent.__tablename__)
    [dead] = groups.find(app, Selection(handlers=("ordered",))).groups
    [refused] = holds.refused_groups(app)
    event = groups.show(app, dead.group_id).events[0].id
    minute = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    with app.engine.begin() as conn:
        conn.execute(schema.workers.insert().values(
            id="box:1:w", hostname="box", pid=1, concurrency=2, version="0.9",
            generation=schema.GENERATION,
        ))  # fmt: skip
        queries.add_throughput(conn, app.dialect, [
            {"handler": "ordered", "minute": minute, "succeeded": 1, "dead": 2, "failed": 1}
        ])  # fmt: skip
    both = {"group": [str(dead.group_id), str(refused.group_id)]}
    asked: list[tuple[str, str, str, dict[str, Any] | None]] = [
        ("get", "/refused", "/refused", None),
        ("get", "/groups/{group_id}", f"/groups/{refused.group_id}", None),
        ("post", "/groups/replay", "/groups/replay", {**both, "dry_run": True}),
        ("post", "/groups/retry", "/groups/retry", both),
        ("post", "/groups/{group_id}/replay", f"/groups/{dead.group_id}/replay", {"dry_run": True}),
        (
            "post",
            "/groups/{group_id}/events/{event_id}/replay",
            f"/groups/{dead.group_id}/events/{event}/replay",
            {"values": {"activity_id": 99}},
        ),
        ("post", "/groups/discard", "/groups/discard", {"group": [str(refused.group_id)]}),
        ("get", "/status", "/status", None),
        ("get", "/scaling", "/scaling", None),
        ("get", "/groups", "/groups", None),
        ("get", "/groups/{group_id}", f"/groups/{dead.group_id}", None),
        ("get", "/search", f"/search?q={dead.group_id}", None),
        ("get", "/history", "/history", None),
        ("get", "/archive", "/archive", None),
        ("get", "/workers", "/workers", None),
        ("get", "/held", "/held", None),
        ("get", "/inboxes", "/inboxes", None),
        ("get", "/fanouts", "/fanouts", None),
        ("get", "/flags", "/flags", None),
        ("get", "/handlers/{handler}/throughput", "/handlers/ordered/throughput", None),
    ]
    problems: dict[tuple[str, str], list[str]] = {}
    async with client_of(create_app(app, auth=AUTH)) as client:
        document = (await client.get("/api/v1/openapi.json")).json()
        for method, path, url, body in asked:
            response = await client.request(
                method, f"/api/v1{url}", headers=bearer("admin"), json=body
            )
            assert 200 == response.status_code, (url, response.text)
            problems[method, url] = _problems(document, path, method, response.json())
    reads = {path for path, item in document["paths"].items() if "get" in item}
    assert (reads, {}) == (
        {path for method, path, _, _ in asked if method == "get"},
        {key: found for key, found in problems.items() if found},
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("/api/v1/search?q=²", (200, '"found":[]')),
        ("/api/v1/groups?limit=²", (400, "limit: ")),
        ("/api/v1/groups?after=live:²", (400, "after: ")),
        ("/api/v1/history?limit=²", (400, "limit and before: ")),
        ("/api/v1/history?before=²", (400, "limit and before: ")),
        ("/api/v1/archive?limit=²", (400, "limit: ")),
        ("/history?before=²", (400, "before: ")),
    ],
    ids=[
        "search",
        "groups-limit",
        "groups-after",
        "history-limit",
        "history-before",
        "archive",
        "page",
    ],
)
async def test_a_digit_no_number_is_made_of_is_refused_or_searched_as_text(
    client: httpx.AsyncClient, url: str, expected: tuple[int, str]
) -> None:
    """A superscript two is a digit to Python's ``isdigit`` but no whole number: a 400 naming
    the parameter, or text searched for (not an event id), never a server error."""
    response = await client.get(url, headers=bearer("viewer"))
    status, said = expected
    assert (status, True) == (response.status_code, said in response.text), response.text[:300]
