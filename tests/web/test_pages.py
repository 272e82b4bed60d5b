"""The dashboard's pages (``outbox.web.pages``): each shows what the operations layer answers,
only to whom may see it; each write needs an operator and the page's CSRF token, does what it
says and sends the browser back; and nothing a handler's events hold reaches a page unescaped."""

from __future__ import annotations

import datetime as dt
import html
import re
import subprocess
import sys
import threading
import uuid
import zipfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from sqlalchemy import event, insert, select, update
from starlette.applications import Starlette
from starlette.routing import Mount

from outbox import Batch, CircuitBreaker, Outbox, RateLimit, RetryPolicy, add_events, schema
from outbox._db import queries
from outbox._db.dialects import db_now_plus
from outbox.ops import (
    fleet,
    flow,
    group_operations,
    groups,
    holds,
    metrics,
    operators,
    search,
)
from outbox.ops.selection import Selection
from outbox.testing import drain
from outbox.web import create_app
from outbox.web._render import PAYLOAD_SHOWN, PREVIEW_SHOWN, age, moment
from outbox.web.auth import CSRF_COOKIE, CSRF_FIELD
from outbox.web.pages import FRAGMENT_HEADER
from outbox.worker import Worker
from tests._support import JULIANDAY_ERROR, REFUSAL, allow_deletes, refuse_deletes, wait_for
from tests.models import ActivityEvent, EmailEvent
from tests.web._site import (
    AUTH,
    OPERATOR,
    OPERATOR_TOKEN,
    VIEWER,
    HostileEvent,
    attributes,
    create_hostile_table,
    pairs,
    values,
)

pytestmark = pytest.mark.anyio
SQLITE = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
BUCKET_SECONDS = {"hour": "60", "day": "3,600", "week": "3,600"}
REMOTE = ("203.0.113.7", 40000)
ONE_SHOT = RetryPolicy(max_attempts=1)
HOSTILE = "<script>alert(1)</script>"
PAGES = ["/", "/handlers/fails", "/groups", "/dead", "/history", "/workers", "/inboxes"]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _fail(batch: Batch[Any]) -> None:
    raise ValueError("the downstream said no")


def _ok(batch: Batch[Any]) -> None:
    return None


@pytest.fixture
def outbox_app(database_url: str, make_app: Callable[[str], Outbox]) -> Outbox:
    """A handler that fails every group at its only attempt, and one with a rate limit and a
    circuit breaker that never fails."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=2, retry=ONE_SHOT, name="fails")(_fail)
    app.handler(
        EmailEvent,
        name="mails",
        rate_limit=RateLimit(calls_per_second=5),
        circuit_breaker=CircuitBreaker(failures=3),
    )(_ok)
    return app


def client_of(
    app: Any, client: tuple[str, int] = REMOTE, base_url: str = "http://console"
) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=client)
    return httpx.AsyncClient(transport=transport, base_url=base_url)


@pytest.fixture
async def client(outbox_app: Outbox) -> AsyncIterator[httpx.AsyncClient]:
    async with client_of(create_app(outbox_app, auth=AUTH)) as c:
        yield c


def _dead(app: Outbox, commit_events: Any, count: int = 2, **columns: Any) -> uuid.UUID:
    """Dead-letter ``count`` events of ``fails``; the group made last."""
    commit_events(app.engine, count, **columns)
    drain(app, handlers=["fails"])
    return groups.find(app, Selection(statuses=("dead",))).groups[-1].group_id


def _add_job(app: Outbox, handler: str, *, attempts: int = 0, deferrals: int = 0) -> uuid.UUID:
    """A group waiting for ``handler`` (retrying with attempts, deferred with deferrals)."""
    group_id = uuid.uuid4()
    with app.engine.begin() as conn:
        conn.execute(
            insert(schema.jobs).values(
                kind=schema.JobKind.BATCH,
                handler=handler,
                group_id=group_id,
                priority=0,
                attempts=attempts,
                deferrals=deferrals,
                last_error="boom" if attempts else None,
            )
        )
    return group_id


async def _token(client: httpx.AsyncClient, headers: dict[str, str] = OPERATOR) -> str:
    """The CSRF token a page gives the browser (and the cookie it sets)."""
    response = await client.get("/", headers=headers)
    assert 200 == response.status_code
    return client.cookies[CSRF_COOKIE]


async def _post(
    client: httpx.AsyncClient,
    path: str,
    data: dict[str, Any] | None = None,
    headers: dict[str, str] = OPERATOR,
) -> httpx.Response:
    """A form posted as the browser of ``headers`` posts it: with the page's CSRF token."""
    token = await _token(client, headers)
    return await client.post(path, data={CSRF_FIELD: token, **(data or {})}, headers=headers)


def _flash(response: httpx.Response) -> tuple[str, str, str]:
    """Where a write sent the browser back to, the message and its level."""
    location = urlsplit(response.headers["location"])
    query = parse_qs(location.query)
    return location.path, query.get("flash", [""])[0], query.get("level", ["ok"])[0]


# --- every page, on every database ----------------------------------------------------------


async def test_every_page_renders_for_a_viewer(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """Overview, handler, groups, group, dead letters, history, workers and the static files
    answer a viewer with 200, on SQLite, PostgreSQL and MariaDB."""
    first = _dead(outbox_app, commit_events)
    second = _dead(outbox_app, commit_events)
    group_operations.discard(outbox_app, Selection(group_ids=(second,)), actor="ops", reason="gone")
    flow.pause(outbox_app, "mails", reason="maintenance")
    _add_job(outbox_app, "mails", deferrals=1)
    paths = [
        *PAGES,
        "/handlers/mails",
        "/groups?status=dead&handler=fails&error=said&older_than=0",
        f"/groups/{first}",
        f"/groups/{second}",
        "/dead?payload=activity",
        "/static/console.js",
        "/static/console.css",
    ]
    answers = {path: (await client.get(path, headers=VIEWER)).status_code for path in paths}
    assert {path: 200 for path in paths} == answers


@SQLITE
async def test_a_viewer_is_shown_no_write_forms_and_an_operator_is(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """A viewer's pages carry no form that writes; an operator's carry each with the token."""
    group_id = _dead(outbox_app, commit_events)
    found = {}
    for who, headers in (("viewer", VIEWER), ("operator", OPERATOR)):
        client.cookies.clear()
        pages = [
            (await client.get(path, headers=headers)).text
            for path in ("/handlers/fails", f"/groups/{group_id}", "/groups?handler=fails")
        ]
        found[who] = sum(page.count(f'name="{CSRF_FIELD}"') for page in pages)
    assert (0, True) == (found["viewer"], found["operator"] >= 6)


# --- the numbers are the operations layer's -------------------------------------------------


@SQLITE
async def test_the_overview_shows_the_numbers_metrics_collects(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """Per handler: waiting, in flight, retrying, held keys and dead are metrics.collect's,
    deferred is the groups deferred, and a pause says who paused it and why."""
    _dead(outbox_app, commit_events, count=4)
    commit_events(outbox_app.engine, 3, model=EmailEvent)
    commit_events(outbox_app.engine, 5)
    _add_job(outbox_app, "mails", deferrals=1)
    _add_job(outbox_app, "mails", attempts=2)
    flow.pause(outbox_app, "mails", reason="mail server maintenance")
    page = (await client.get("/", headers=VIEWER)).text
    shown = values(page)
    expected = {
        s.handler: {
            "unclaimed": str(s.unclaimed),
            "groups_in_flight": str(s.groups_in_flight),
            "groups_retrying": str(s.groups_retrying),
            "held_keys": str(len(s.held_keys)),
            "dead": str(s.dead),
            "deferred": str(
                groups.find(
                    outbox_app, Selection(handlers=(s.handler,), statuses=("deferred",))
                ).total
            ),
        }
        for s in metrics.collect(outbox_app)
    }
    assert (expected, True, True) == (
        {h: {k: v for k, v in f.items() if k in expected[h]} for h, f in shown.items() if h},
        "paused by an operator until resumed: mail server maintenance" in page,
        "as of " in page and "refreshed every 5 s" in page,
    )


@SQLITE
async def test_the_overview_charts_the_last_hour_the_workers_recorded(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """Each handler's chart counts the events delivered in the last hour, as the workers
    recorded them (metrics.throughput)."""
    commit_events(outbox_app.engine, 3, model=EmailEvent)
    drain(outbox_app, handlers=["mails"])
    page = (await client.get("/", headers=VIEWER)).text
    recorded = sum(r.succeeded for r in metrics.throughput(outbox_app).get("mails", []))
    assert (3, str(recorded), True) == (
        recorded,
        values(page)["mails"]["last_hour"],
        "events in the last hour" in page and "<polyline" in page,
    )


@SQLITE
@pytest.mark.parametrize(
    ("span", "buckets", "bucket_text"),
    [("hour", 60, "1 min"), ("day", 24, "1 h"), ("week", 168, "1 h")],
)
async def test_the_handler_page_charts_what_was_handled_over_the_range_asked_for(
    client: httpx.AsyncClient, outbox_app: Outbox, span: str, buckets: int, bucket_text: str
) -> None:
    """The chart has a bar a bucket (a minute for an hour, an hour for a day and a week): a
    minute two hours back is in the day's and the week's, not the hour's; links switch the
    range."""
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    rows = [
        {"handler": "mails", "minute": now, "succeeded": 3, "dead": 1, "failed": 1},
        {
            "handler": "mails",
            "minute": now - dt.timedelta(hours=2),
            "succeeded": 40,
            "dead": 0,
            "failed": 0,
        },
    ]
    with outbox_app.engine.begin() as conn:
        queries.add_throughput(conn, outbox_app.dialect, rows)
    page = (await client.get(f"/handlers/mails?range={span}", headers=VIEWER)).text
    bars = pairs(page, "data-bucket", "data-succeeded")
    expected = 3 if span == "hour" else 43
    assert (span, str(buckets), buckets, expected, str(expected), 3, True) == (
        attributes(page, "data-range")[0],
        pairs(page, "data-range", "data-buckets")[span],
        len(bars),
        sum(int(n) for n in bars.values()),
        values(page)[""]["handled"],
        int(bars[str(buckets - 1)]),
        f'a bar <span class="age" title="{BUCKET_SECONDS[span]} s">{bucket_text}</span>' in page,
    )


@SQLITE
async def test_the_handler_page_charts_failed_attempts_with_a_legend(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """Failed attempts (groups that failed and will be retried) are drawn as a marker on their
    bar, the higher the more of them, even a minute that delivered nothing; a legend names
    the three series and each bar's title gives all three counts."""
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    rows = [
        {"handler": "mails", "minute": now, "succeeded": 3, "dead": 1, "failed": 2},
        {
            "handler": "mails",
            "minute": now - dt.timedelta(minutes=10),
            "succeeded": 0,
            "dead": 0,
            "failed": 4,
        },
    ]
    with outbox_app.engine.begin() as conn:
        queries.add_throughput(conn, outbox_app.dialect, rows)
    page = (await client.get("/handlers/mails?range=hour", headers=VIEWER)).text
    bars = dict(re.findall(r'<g data-bucket="(\d+)"[^>]*>(.*?)</g>', page, re.S))
    markers = {
        bucket: float(found.group(1))
        for bucket, bar in bars.items()
        if (found := re.search(r'class="failed"[^>]* y1="([\d.]+)"', bar))
    }
    assert (
        ["49", "59"],
        True,
        ["succeeded", "dead", "failed"],
        "0 delivered, 0 dead-lettered, 4 failed attempts",
        "3 delivered, 1 dead-lettered, 2 failed attempts",
    ) == (
        sorted(markers),
        markers["49"] < markers["59"],
        attributes(page, "data-series"),
        re.search(r"<title>[^<]*: ([^<]*)</title>", bars["49"]).group(1),  # type: ignore[union-attr]
        re.search(r"<title>[^<]*: ([^<]*)</title>", bars["59"]).group(1),  # type: ignore[union-attr]
    )


@SQLITE
async def test_viewers_of_a_chart_cost_one_read_per_status_snapshot(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """Three viewers of a handler's week, within one refresh period: one chart read."""
    statements: list[str] = []
    event.listen(outbox_app.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    for _ in range(3):
        assert 200 == (await client.get("/handlers/mails?range=week", headers=VIEWER)).status_code
    charted = [s for s in statements if "outbox_throughput" in s and "GROUP BY" in s]
    assert 1 == len(charted)


@SQLITE
async def test_the_handler_page_refuses_a_range_it_does_not_know(
    client: httpx.AsyncClient,
) -> None:
    """A range other than hour, day or week: 400 naming it."""
    response = await client.get("/handlers/mails?range=year", headers=VIEWER)
    assert (400, True) == (
        response.status_code,
        "range: expected one of hour, day, week, got 'year'" in response.text,
    )


def test_an_age_carries_its_exact_seconds_and_a_time_its_exact_moment_on_hover() -> None:
    """The page shows the words; the title, what they round."""
    now = dt.datetime(2026, 11, 29, 7, 0, 0, tzinfo=dt.UTC)
    assert (
        '<span class="age" title="183.4 s">3 min 3 s</span>',
        '<span class="age" title="93,784.125 s">1 d 2 h</span>',
        '<time class="age" datetime="2026-11-29T06:56:59.500000+00:00" '
        'title="2026-11-29 06:56:59.500000 UTC">3 min ago</time>',
    ) == (
        str(age(183.4)),
        str(age(93_784.125)),
        str(moment(dt.datetime(2026, 11, 29, 6, 56, 59, 500_000), now)),
    )


@SQLITE
async def test_an_alert_and_a_pause_read_their_ages_with_the_exact_seconds_on_hover(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """The sentences metrics writes (a dead-letter alert, a pause) read as the command prints
    them, each duration in them carrying its exact seconds in its title."""
    _dead(outbox_app, commit_events)
    flow.pause(outbox_app, "mails", until=3600.0, reason="quota")
    handler = (await client.get("/handlers/fails", headers=VIEWER)).text
    overview = (await client.get("/", headers=VIEWER)).text
    window = '<span class="age" title="86,400 s">1 d</span>'
    paused = (
        r'paused by an operator for <span class="age" title="3,5\d\d(\.\d+)? s">5\d min'
        r"( \d+ s)?</span> more: quota"
    )
    assert (True, True, True) == (
        f"2 events dead-lettered in the last {window}, the newest " in handler,
        '<span class="age" title="0' in handler.split("the newest ", 1)[1][:40],
        bool(re.search(paused, overview)),
    )


@SQLITE
async def test_the_overview_draws_staleness_against_the_promise(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """A waiting event gives its handler a staleness (metrics.collect's) and a bar; an empty
    buffer says so."""
    commit_events(outbox_app.engine, 1, model=EmailEvent)
    page = (await client.get("/", headers=VIEWER)).text
    [status] = metrics.collect(outbox_app, ["mails"])
    staleness = float(values(page)["mails"]["staleness"])
    assert (True, True, True) == (
        0 <= staleness <= (status.staleness or 0) + 1,
        'class="bar ok"' in page,
        "empty" in page,
    )


@SQLITE
async def test_the_handler_page_shows_its_limits_breaker_and_recent_groups(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """Rate limits and breaker as metrics.collect words them, and the groups groups.find
    lists for the handler, newest page first."""
    made = [_add_job(outbox_app, "mails") for _ in range(3)]
    page = (await client.get("/handlers/mails", headers=VIEWER)).text
    [status] = metrics.collect(outbox_app, ["mails"])
    listing = groups.find(outbox_app, Selection(handlers=("mails",)), limit=20)
    assert (["5 calls/s, fleet-wide"], [str(g.group_id) for g in listing.groups], True, True) == (
        status.rate_limits,
        attributes(page, "data-group"),
        "5 calls/s, fleet-wide" in page,
        "closed: 0 of 3 failures in a row" in page,
    )
    assert {str(g) for g in made} == set(attributes(page, "data-group"))


@SQLITE
async def test_an_unknown_handler_is_a_404_page(client: httpx.AsyncClient) -> None:
    """A handler the application does not have: 404, naming the ones it has."""
    response = await client.get("/handlers/nope", headers={**VIEWER, "Accept": "text/html"})
    assert (404, True) == (response.status_code, "handlers: fails, mails" in response.text)


@SQLITE
async def test_the_groups_page_lists_what_find_lists_a_page_at_a_time(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """The listing and its counts are groups.find's; the next page's link lists the rest."""
    _dead(outbox_app, commit_events, count=2)
    for _ in range(55):
        _add_job(outbox_app, "mails")
    first = await client.get("/groups", headers=VIEWER)
    [following] = [
        href for href in attributes(first.text, "href") if "after=" in href and "/groups" in href
    ]
    second = await client.get(following, headers=VIEWER)
    everything = groups.find(outbox_app, limit=100)
    assert (
        [str(g.group_id) for g in everything.groups],
        {"waiting": "55", "dead": "1"},
    ) == (
        attributes(first.text, "data-group") + attributes(second.text, "data-group"),
        _counts(first.text),
    )


def _counts(page: str) -> dict[str, str]:
    """The counts by status a listing shows."""
    return pairs(page, "data-count")


@SQLITE
async def test_the_groups_page_filters_as_find_filters(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """Handler, status, error, age: the groups and counts shown are those groups.find gives
    for the same selection; blank fields narrow nothing."""
    dead = _dead(outbox_app, commit_events)
    retrying = _add_job(outbox_app, "mails", attempts=1)
    _add_job(outbox_app, "mails")
    queries = {
        "status=dead&error=DOWNSTREAM&handler=&key=": [dead],
        "handler=mails&status=retrying": [retrying],
        "older_than=3600": [],
    }
    shown = {}
    for query in queries:
        page = (await client.get(f"/groups?{query}", headers=VIEWER)).text
        shown[query] = [uuid.UUID(g) for g in attributes(page, "data-group")]
    assert queries == shown


@SQLITE
async def test_a_bad_filter_is_said_on_the_page(client: httpx.AsyncClient) -> None:
    """A status outbox does not know, or an age that is not seconds: the page says so."""
    answers = [
        await client.get(f"/groups?{query}", headers=VIEWER)
        for query in ("status=deadd", "older_than=soon")
    ]
    assert [(200, True), (200, True)] == [
        (a.status_code, 'class="problem"' in a.text) for a in answers
    ]


@SQLITE
async def test_capped_counts_say_at_least(
    client: httpx.AsyncClient, outbox_app: Outbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the count's cap, the page says how many at least."""
    monkeypatch.setattr(groups, "COUNT_CAP", 3)
    for _ in range(5):
        _add_job(outbox_app, "mails")
    page = (await client.get("/groups", headers=VIEWER)).text
    assert (True, "yes") == ("at least 3 groups" in page, attributes(page, "data-capped")[0])


@SQLITE
async def test_the_group_page_shows_what_show_shows(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """Status, events with their values, and each attempt's error with its traceback."""
    group_id = _dead(outbox_app, commit_events, kind="clicked")
    page = (await client.get(f"/groups/{group_id}", headers=VIEWER)).text
    detail = groups.show(outbox_app, group_id)
    assert (
        [str(e.id) for e in detail.events],
        "dead",
        True,
        True,
        True,
    ) == (
        attributes(page, "data-event"),
        values(page, "none")[""]["status"],
        '"kind": "clicked"' in html.unescape(page),
        "Traceback (most recent call last)" in page,
        "ValueError: the downstream said no" in page,
    )


@SQLITE
async def test_an_unknown_group_is_a_404_page(client: httpx.AsyncClient) -> None:
    """A group outbox has no trace of, or not a group id at all: 404."""
    answers = [
        (await client.get(path, headers=VIEWER)).status_code
        for path in (f"/groups/{uuid.uuid4()}", "/groups/not-a-uuid")
    ]
    assert [404, 404] == answers


@SQLITE
async def test_the_dead_page_lists_dead_and_held_groups_and_held_keys(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """Dead letters are the dead and held groups; a held key is listed with its group, and an
    operator releases it."""
    outbox_app = make_app(database_url)
    outbox_app.handler(
        ActivityEvent, batch_size=1, retry=ONE_SHOT, ordering_key="kind", name="ordered"
    )(_fail)
    outbox_app.handler(EmailEvent, batch_size=1, retry=ONE_SHOT, name="mails")(_fail)
    commit_events(outbox_app.engine, 1, kind="alpha")
    commit_events(outbox_app.engine, 1, model=EmailEvent)
    drain(outbox_app)
    _add_job(outbox_app, "mails")
    async with client_of(create_app(outbox_app, auth=AUTH)) as client:
        page = (await client.get("/dead", headers=VIEWER)).text
        listing = groups.find(outbox_app, Selection(statuses=("dead", "held")))
        shown = (attributes(page, "data-group"), attributes(page, "data-held"), _counts(page))
        released = await _post(
            client, "/held/release", {"handler": "ordered", "key": "alpha"}, OPERATOR
        )
    assert (
        [str(g.group_id) for g in listing.groups],
        ["alpha"],
        {s.value: str(n) for s, n in listing.counts.items()},
    ) == shown
    assert (303, [], "released 1 held key") == (
        released.status_code,
        holds.held_keys(outbox_app),
        _flash(released)[1],
    )


@SQLITE
async def test_the_dead_page_lists_refused_groups_and_an_operator_releases_them(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """A group whose outcome the database refused: listed with its error, released to the
    workers by an operator."""
    refuse_deletes(outbox_app.engine, "test_email_events")
    commit_events(outbox_app.engine, 1, model=EmailEvent)
    drain(outbox_app, handlers=["mails"])
    allow_deletes(outbox_app.engine, "test_email_events")
    [group] = holds.refused_groups(outbox_app)
    page = (await client.get("/dead", headers=VIEWER)).text
    released = await _post(client, "/refused/release", {"group_id": str(group.group_id)})
    assert ([str(group.group_id)], True, "released 1 refused group", []) == (
        attributes(page, "data-refused"),
        REFUSAL in page,
        _flash(released)[1],
        holds.refused_groups(outbox_app),
    )


@SQLITE
async def test_the_history_page_lists_what_operators_did(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """Each operation operators.history records, newest first, with who and why."""
    group_id = _dead(outbox_app, commit_events)
    group_operations.discard(
        outbox_app, Selection(group_ids=(group_id,)), actor="ops", reason="customer gone"
    )
    group_operations.replay(outbox_app, Selection(handlers=("fails",)), actor="ops")
    page = (await client.get("/history", headers=VIEWER)).text
    only = (await client.get("/history?action=discard", headers=VIEWER)).text
    assert (
        [str(o.id) for o in operators.history(outbox_app)],
        [str(o.id) for o in operators.history(outbox_app, action="discard")],
        True,
    ) == (
        attributes(page, "data-operation"),
        attributes(only, "data-operation"),
        "discarded by ops: customer gone" in page or "customer gone" in page,
    )


@SQLITE
async def test_the_workers_page_lists_the_fleet(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """A running worker: listed with its pid, alive, the leader."""
    worker = Worker(outbox_app, handlers=["mails"])
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: fleet.workers(outbox_app), "the worker's heartbeat row")
        page = (await client.get("/workers", headers=VIEWER)).text
        found = fleet.workers(outbox_app)
    finally:
        worker.stop()
        thread.join(timeout=30)
    shown = values(page, "worker")
    assert (
        {w.id: {"pid": str(w.pid), "groups_held": str(w.groups_held)} for w in found},
        True,
    ) == (
        {k: {"pid": str(v.get("pid")), "groups_held": v["groups_held"]} for k, v in shown.items()},
        "leader" in page and "alive" in page,
    )


def _live_worker(app: Outbox, worker_id: str, generation: int = schema.GENERATION) -> None:
    with app.engine.begin() as conn:
        conn.execute(
            insert(schema.workers).values(
                id=worker_id,
                hostname="box",
                pid=7,
                concurrency=1,
                version="0.9",
                generation=generation,
            )
        )


@SQLITE
async def test_an_operator_asks_a_worker_to_drain_from_the_workers_page(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """The drain form: back to the workers page saying what was asked and when it acts; the
    worker's row says draining and who asked; its forms are gone; a viewer sees no form."""
    _live_worker(outbox_app, "box:7:abc")
    before = (await client.get("/workers", headers=OPERATOR)).text
    response = await _post(client, "/workers/box:7:abc/drain")
    page = (await client.get("/workers", headers=OPERATOR)).text
    viewed = (await client.get("/workers", headers=VIEWER)).text
    [worker] = fleet.workers(outbox_app)
    assert (
        (303, "/workers", "ok"),
        True,
        ("drain", "olga"),
        {"box:7:abc": {"alive": "alive", "request": "drain"}},
        (2, 0, 0),
    ) == (
        (response.status_code, _flash(response)[0], _flash(response)[2]),
        _flash(response)[1].startswith("asked worker box:7:abc (box, pid 7) to drain: it acts "),
        (worker.request, worker.requested_by),
        {k: {f: v[f] for f in ("alive", "request")} for k, v in values(page, "worker").items()},
        (
            before.count('<form method="post" action="/workers/'),
            page.count('<form method="post" action="/workers/'),
            viewed.count('<form method="post" action="/workers/'),
        ),
    )


@SQLITE
async def test_asking_a_worker_too_old_to_read_it_says_why_and_asks_nothing(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """A worker of generation 6: back to the page with the reason as an error; no request."""
    _live_worker(outbox_app, "box:7:old", generation=6)
    response = await _post(client, "/workers/box:7:old/stop")
    [worker] = fleet.workers(outbox_app)
    path, message, level = _flash(response)
    assert ("/workers", True, "error", None) == (
        path,
        message.startswith("worker 'box:7:old' runs outbox 0.9, older than schema 0007"),
        level,
        worker.request,
    )


# --- who may see and do what ----------------------------------------------------------------


@SQLITE
@pytest.mark.parametrize("path", [*PAGES, "/static/console.js"])
async def test_pages_need_a_principal(client: httpx.AsyncClient, path: str) -> None:
    """Without credentials: 401 asking for them, as a page for a browser."""
    response = await client.get(path, headers={"Accept": "text/html"})
    assert (401, 'Basic realm="outbox"', True) == (
        response.status_code,
        response.headers["www-authenticate"],
        "authentication required" in response.text,
    )


@SQLITE
async def test_a_write_without_the_csrf_token_is_refused(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """An operator's browser posting without the page's token (or with another) gets 403, and
    nothing is paused."""
    await _token(client)
    missing = await client.post("/handlers/mails/pause", data={}, headers=OPERATOR)
    wrong = await client.post(
        "/handlers/mails/pause", data={CSRF_FIELD: "x" * 43}, headers=OPERATOR
    )
    assert (403, 403, {}) == (missing.status_code, wrong.status_code, flow.paused(outbox_app))


@SQLITE
async def test_a_viewers_write_is_refused(client: httpx.AsyncClient, outbox_app: Outbox) -> None:
    """A viewer, token and all, may not pause: 403, and nothing is paused."""
    response = await _post(client, "/handlers/mails/pause", {}, VIEWER)
    assert (403, {}) == (response.status_code, flow.paused(outbox_app))


@SQLITE
async def test_a_write_by_bearer_token_needs_no_csrf_token(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """A script with an operator's token is no browser: its form needs no CSRF token."""
    response = await client.post(
        "/handlers/mails/pause",
        data={"reason": "by script"},
        headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
    )
    assert (303, "by script") == (response.status_code, flow.paused(outbox_app)["mails"].reason)


@SQLITE
@pytest.mark.parametrize(
    ("base_url", "secure"), [("http://console", False), ("https://console", True)]
)
async def test_the_csrf_cookie_is_strict_and_http_only_and_secure_over_https(
    outbox_app: Outbox, base_url: str, secure: bool
) -> None:
    """The page sets its CSRF cookie once: SameSite=Strict, HttpOnly, Secure over https."""
    async with client_of(create_app(outbox_app, auth=AUTH), base_url=base_url) as client:
        first = await client.get("/", headers=VIEWER)
        again = await client.get("/", headers=VIEWER)
    cookie = first.headers["set-cookie"].lower()
    assert (True, True, secure, None) == (
        "samesite=strict" in cookie,
        "httponly" in cookie,
        "secure" in cookie,
        again.headers.get("set-cookie"),
    )


# --- writes ---------------------------------------------------------------------------------


@SQLITE
async def test_an_operator_pauses_and_resumes_a_handler(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """Pause with seconds and a reason, then resume: each sends the browser back to the
    handler's page, which shows the new state at once."""
    paused = await _post(client, "/handlers/mails/pause", {"seconds": "600", "reason": "deploy"})
    pause = flow.paused(outbox_app)["mails"]
    page = (await client.get("/handlers/mails", headers=OPERATOR)).text
    resumed = await _post(client, "/handlers/mails/resume")
    after = (await client.get("/handlers/mails", headers=OPERATOR)).text
    assert (
        (303, "/handlers/mails", "mails paused for 10 min: deploy", "ok"),
        ("deploy", True),
        True,
        (303, "mails resumed"),
        ({}, True),
    ) == (
        (paused.status_code, *_flash(paused)),
        (pause.reason, 590 < (pause.seconds_left or 0) <= 600 + JULIANDAY_ERROR),
        "paused by an operator for" in page,
        (resumed.status_code, _flash(resumed)[1]),
        (flow.paused(outbox_app), 'data-field="state">running<' in after),
    )


@SQLITE
async def test_a_pause_of_seconds_that_are_not_a_number_is_said(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """Seconds that are not a number, or not ahead: back to the page, told why."""
    answers = [
        _flash(await _post(client, "/handlers/mails/pause", {"seconds": given}))
        for given in ("soon", "-5")
    ]
    assert ([("/handlers/mails", "error")] * 2, {}) == (
        [(path, level) for path, _, level in answers],
        flow.paused(outbox_app),
    )


@SQLITE
async def test_an_operator_replays_a_dead_group(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """Its events are back in the buffer, and the group page says replayed."""
    group_id = _dead(outbox_app, commit_events, count=2)
    response = await _post(client, f"/groups/{group_id}/replay")
    [status] = metrics.collect(outbox_app, ["fails"])
    [operation] = operators.history(outbox_app)
    assert (
        (303, f"/groups/{group_id}", "ok"),
        f"replayed 1 group (2 events): operation {operation.id}",
        2,
        ("replay", "olga"),
    ) == (
        (response.status_code, _flash(response)[0], _flash(response)[2]),
        _flash(response)[1],
        status.unclaimed,
        (operation.action.value, operation.actor),
    )


@SQLITE
async def test_an_operator_discards_a_group_with_a_reason(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """The group is discarded, and the history records who and why."""
    group_id = _dead(outbox_app, commit_events)
    response = await _post(client, f"/groups/{group_id}/discard", {"reason": "customer gone"})
    [operation] = operators.history(outbox_app)
    assert (303, "discarded", ("olga", "customer gone")) == (
        response.status_code,
        groups.show(outbox_app, group_id).group.status,
        (operation.actor, operation.detail),
    )


@SQLITE
async def test_an_operator_edits_a_dead_event_and_replays_it(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """``column=value`` lines change those columns of the event put back; the rest stay."""
    group_id = _dead(outbox_app, commit_events, count=1)
    [event] = groups.show(outbox_app, group_id).events
    response = await _post(
        client, f"/groups/{group_id}/events/{event.id}/replay", {"changes": "kind=fixed\n\n"}
    )
    with outbox_app.engine.connect() as conn:
        rows = conn.execute(select(ActivityEvent.activity_id, ActivityEvent.kind)).all()
    assert ((303, "ok"), [(event.values["activity_id"], "fixed")]) == (
        (response.status_code, _flash(response)[2]),
        [tuple(row) for row in rows],
    )


@SQLITE
async def test_a_discarded_event_is_edited_and_replayed_from_its_group_s_page(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """A discarded group's page offers each event's edit form, and the edit replays it."""
    group_id = _dead(outbox_app, commit_events, count=1)
    group_operations.discard(outbox_app, Selection(group_ids=(group_id,)), actor="ops")
    [event] = groups.show(outbox_app, group_id).events
    page = (await client.get(f"/groups/{group_id}", headers=OPERATOR)).text
    response = await _post(
        client, f"/groups/{group_id}/events/{event.id}/replay", {"changes": "kind=fixed"}
    )
    with outbox_app.engine.connect() as conn:
        rows = conn.execute(select(ActivityEvent.id, ActivityEvent.kind)).all()
    assert (True, (303, "ok"), [(event.id, "fixed")]) == (
        f'id="edit-{event.id}"' in page,
        (response.status_code, _flash(response)[2]),
        [tuple(row) for row in rows],
    )


@SQLITE
async def test_an_operator_replays_a_discarded_group_from_its_page(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """A discarded group's page offers Replay (with the CSRF token); it puts every discarded
    event back under its own id, recorded as a replay by the operator."""
    group_id = _dead(outbox_app, commit_events, count=2)
    group_operations.discard(outbox_app, Selection(group_ids=(group_id,)), actor="ops")
    event_ids = sorted(e.id for e in groups.show(outbox_app, group_id).events)
    page = (await client.get(f"/groups/{group_id}", headers=OPERATOR)).text
    response = await _post(client, f"/groups/{group_id}/replay")
    with outbox_app.engine.connect() as conn:
        back = sorted(conn.execute(select(ActivityEvent.id)).scalars())
    replayed = operators.history(outbox_app, action="replay")
    assert (
        (True, True),
        (303, f"/groups/{group_id}", "ok"),
        f"replayed 1 group (2 events): operation {replayed[0].id}",
        event_ids,
        [("replay", "olga")],
    ) == (
        ('id="replay-form"' in page, CSRF_FIELD in page.split('id="replay-form"')[1][:400]),
        (response.status_code, _flash(response)[0], _flash(response)[2]),
        _flash(response)[1],
        back,
        [(o.action.value, o.actor) for o in replayed],
    )


@SQLITE
@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ("nosuch=1", "'nosuch' is not a column"),
        ("activity_id=many", "activity_id: 'many' is not a valid int"),
        ("no equals sign", "expected column=value"),
        ("", "no changes"),
    ],
    ids=["column", "value", "line", "empty"],
)
async def test_a_bad_edit_is_said_and_nothing_written(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any, changes: str, said: str
) -> None:
    """A column the buffer lacks, a value its column refuses, a line that is no change: back
    to the group's page, told which, and the event stays dead."""
    group_id = _dead(outbox_app, commit_events, count=1)
    [event] = groups.show(outbox_app, group_id).events
    response = await _post(
        client, f"/groups/{group_id}/events/{event.id}/replay", {"changes": changes}
    )
    path, message, level = _flash(response)
    assert ((f"/groups/{group_id}", "error"), True, "dead") == (
        (path, level),
        said in message,
        groups.show(outbox_app, group_id).group.status,
    )


@SQLITE
@pytest.mark.parametrize("action", ["replay", "discard"])
async def test_a_bulk_action_shows_its_dry_run_before_it_is_done(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any, action: str
) -> None:
    """From the groups page's filter: first what it would take (group_operations.replay's or
    group_operations.discard's dry run), nothing done; confirmed, done, and back to the listing."""
    for _ in range(3):
        _dead(outbox_app, commit_events, count=2)
    selection = Selection(handlers=("fails",), statuses=("dead",))
    would = getattr(group_operations, action)(outbox_app, selection, dry_run=True)
    form = {"handler": "fails", "status": "dead", "error": ""}
    dry = await _post(client, f"/groups/{action}", form)
    untouched = groups.find(outbox_app, selection).total
    done = await _post(client, f"/groups/{action}", {**form, "confirm": "yes"})
    path, message, level = _flash(done)
    assert (
        (200, str(len(would.groups)), str(would.events), 3),
        ("/groups", "ok", True),
        0,
    ) == (
        (
            dry.status_code,
            attributes(dry.text, "data-groups")[0],
            attributes(dry.text, "data-events")[0],
            untouched,
        ),
        (path, level, message.startswith(f"{action}ed 3 groups (6 events)")),
        groups.find(outbox_app, selection).total,
    )


@SQLITE
async def test_an_operator_retries_a_deferred_group_now_from_its_page(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """A deferred group's page offers Retry now; pressed, the group is due and the history
    records the operator; a dead group's page offers no Retry now."""
    group_id = _add_job(outbox_app, "mails", deferrals=1)
    _due_later(outbox_app, group_id)
    page = await client.get(f"/groups/{group_id}", headers=OPERATOR)
    response = await _post(client, f"/groups/{group_id}/retry")
    [after] = groups.find(outbox_app, Selection(group_ids=(group_id,))).groups
    [operation] = operators.history(outbox_app)
    assert (
        True,
        (303, f"/groups/{group_id}", "ok"),
        f"made due now 1 group (0 events): operation {operation.id}",
        True,
        ("retry", "olga"),
    ) == (
        'id="retry-form"' in page.text,
        (response.status_code, _flash(response)[0], _flash(response)[2]),
        _flash(response)[1],
        after.due_in is not None and after.due_in <= 0,
        (operation.action.value, operation.actor),
    )


def _due_later(app: Outbox, group_id: uuid.UUID, seconds: float = 3600) -> None:
    with app.engine.begin() as conn:
        conn.execute(
            update(schema.jobs)
            .where(schema.jobs.c.group_id == group_id)
            .values(run_at=db_now_plus(seconds))
        )


@SQLITE
async def test_a_dead_group_s_page_offers_no_retry(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """Retry now is for groups waiting to run: a dead group is replayed instead."""
    group_id = _dead(outbox_app, commit_events)
    page = await client.get(f"/groups/{group_id}", headers=OPERATOR)
    assert (False, True) == ('id="retry-form"' in page.text, 'id="replay-form"' in page.text)


@SQLITE
@pytest.mark.parametrize(("action", "listing"), [("discard", "/dead"), ("retry", "/groups")])
async def test_ticked_groups_are_acted_on_after_a_dry_run_that_counts_them(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any, action: str, listing: str
) -> None:
    """Two of three groups ticked on a listing: the dry run counts the two, carries them to
    its confirming form and does nothing; confirmed, the two are done and the third is left
    as it was."""
    if action == "discard":
        chosen = [_dead(outbox_app, commit_events) for _ in range(3)]
    else:
        chosen = [_add_job(outbox_app, "mails", attempts=1) for _ in range(3)]
        for group_id in chosen:
            _due_later(outbox_app, group_id)
    page = await client.get(listing, headers=OPERATOR)
    form = {
        "from": "dead" if listing == "/dead" else "",
        "ticked": "yes",
        "group": [str(g) for g in chosen[:2]],
    }
    dry = await _post(client, f"/groups/{action}", form)
    before = groups.find(outbox_app, Selection(group_ids=tuple(chosen))).groups
    done = await _post(client, f"/groups/{action}", {**form, "confirm": "yes"})
    after = groups.find(outbox_app, Selection(group_ids=tuple(chosen))).groups

    def as_before(found: list[groups.Group]) -> set[uuid.UUID]:
        """The groups still as they were: dead, or due in an hour."""
        if action == "discard":
            return {g.group_id for g in found if g.status == "dead"}
        return {g.group_id for g in found if g.due_in is not None and g.due_in > 0}

    assert (
        (True, True),
        ("2", set(chosen)),
        (303, listing, "ok"),
        {chosen[2]},
    ) == (
        (
            {str(g) for g in chosen} <= set(attributes(page.text, "value")),
            {str(g) for g in chosen[:2]} <= set(attributes(dry.text, "value")),
        ),
        (attributes(dry.text, "data-groups")[0], as_before(before)),
        (done.status_code, _flash(done)[0], _flash(done)[2]),
        as_before(after),
    )


@SQLITE
async def test_no_group_ticked_is_said(client: httpx.AsyncClient, outbox_app: Outbox) -> None:
    """The ticked groups' buttons with none ticked: back to the listing, told to tick some."""
    response = await _post(client, "/groups/discard", {"ticked": "yes"})
    assert ("/groups", "no groups ticked: tick the groups first", "error") == _flash(response)


@SQLITE
async def test_a_bulk_action_without_a_filter_is_refused(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """An empty filter would take every group: refused, said on the page, nothing done."""
    _dead(outbox_app, commit_events)
    response = await _post(client, "/groups/discard", {"confirm": "yes"})
    assert (("/groups", "error"), 1) == (
        (_flash(response)[0], _flash(response)[2]),
        groups.find(outbox_app, Selection(statuses=("dead",))).total,
    )


@SQLITE
async def test_the_search_page_says_where_a_group_and_an_event_are(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """From the header's box: a dead group's id finds it dead, an event id finds it in the
    buffer and among the archived (each row what search.search answers); too long a text is
    said on the page."""
    group_id = _dead(outbox_app, commit_events, count=1)
    [event] = commit_events(outbox_app.engine, 1)
    overview = await client.get("/", headers=VIEWER)
    by_group = await client.get(f"/search?q={group_id}", headers=VIEWER)
    by_event = await client.get(f"/search?q={event}", headers=VIEWER)
    too_long = await client.get("/search?q=" + "x" * 401, headers=VIEWER)
    expected = [(f.taken.value, f.place.value) for f in search.search(outbox_app, str(event)).found]
    assert (
        True,
        [("group_id", "dead")],
        (True, expected),
        "text: at most 400 characters, got 401",
    ) == (
        'action="/search"' in overview.text,
        _places(by_group.text),
        (("event_id", "buffer") in expected, _places(by_event.text)),
        html.unescape(too_long.text.split('role="alert">')[1].split("<")[0]),
    )


def _places(page: str) -> list[tuple[str, str]]:
    """What the search page found: (taken as, where) of each row."""
    taken, places = attributes(page, "data-taken"), attributes(page, "data-place")
    return list(zip(taken, places, strict=True))


# --- what a page lets through ---------------------------------------------------------------


@pytest.fixture
def hostile_app(database_url: str, make_app: Callable[[str], Outbox]) -> Outbox:
    """A handler whose events hold markup, 100 kB, bytes, an RTL override and NUL, and which
    fails with its label in the error; its events dead-lettered, others waiting."""
    create_hostile_table(database_url)
    app = make_app(database_url)

    def refuse(batch: Batch[HostileEvent]) -> None:
        raise ValueError(f"refused {batch.events[0].label} \u202eevil\x00")

    app.handler(HostileEvent, retry=ONE_SHOT, name="hostile")(refuse)
    row = {
        "label": HOSTILE,
        "body": "\u202e" + "x" * 100_000 + "\x00" + HOSTILE,
        "blob": b"\x00<script>\xff\xfe",
        "data": {"html": HOSTILE, "rtl": "\u202egnp.exe", "nul": "a\x00b"},
    }
    with app.engine.begin() as conn:
        add_events(conn, HostileEvent, [row, {**row, "label": "second " + HOSTILE}])
    drain(app)
    with app.engine.begin() as conn:
        add_events(conn, HostileEvent, [row])
    return app


def _unsafe(page: str) -> list[str]:
    return [text for text in ("<script>alert", "<script>\\", "\u202e", "\x00") if text in page]


@SQLITE
async def test_hostile_values_come_out_escaped(hostile_app: Outbox) -> None:
    """No markup, invisible character or NUL of an event, an error, a filter or a message
    reaches a page as such; a value of 100 kB is cut."""
    [dead] = groups.find(hostile_app, Selection(statuses=("dead",))).groups
    paths = [
        f"/groups/{dead.group_id}",
        "/groups?error=script",
        f"/groups?error={HOSTILE}&key=%E2%80%AE",
        f"/dead?payload={HOSTILE}",
        "/dead?payload=script",
        "/handlers/hostile",
        f"/?flash={HOSTILE}%E2%80%AE&level=error",
        "/history",
        "/archive",
        f"/archive?payload={HOSTILE}",
        f"/search?q={HOSTILE}%E2%80%AE",
        f"/search?q={dead.group_id}",
    ]
    async with client_of(create_app(hostile_app, auth=AUTH)) as client:
        pages = {path: (await client.get(path, headers=VIEWER)) for path in paths}
    group_page = pages[paths[0]].text
    assert (
        {path: (200, []) for path in paths},
        True,
        True,
        True,
        True,
    ) == (
        {path: (r.status_code, _unsafe(r.text)) for path, r in pages.items()},
        "&lt;script&gt;alert(1)&lt;/script&gt;" in group_page,
        "\\u202egnp.exe" in group_page and "98,027 more characters" in group_page,
        "more characters" in group_page,
        len(group_page) < 2 * PAYLOAD_SHOWN + 20_000,
    )


@SQLITE
async def test_payloads_are_collapsed_to_a_one_line_preview_that_opens(
    hostile_app: Outbox,
) -> None:
    """The archive and group pages show each event's values collapsed (a closed details whose
    summary is one escaped line of at most PREVIEW_SHOWN characters), the whole inside."""
    [dead] = groups.find(hostile_app, Selection(statuses=("dead",))).groups
    async with client_of(create_app(hostile_app, auth=AUTH)) as client:
        shown = {
            path: (await client.get(path, headers=VIEWER)).text
            for path in ("/archive", f"/groups/{dead.group_id}")
        }
    previews = {path: _previews(text) for path, text in shown.items()}
    assert {path: (2, True, True, False) for path in shown} == {
        path: (
            len(found),
            all(len(html.unescape(p)) <= PREVIEW_SHOWN + 1 for p in found),
            all("\n" not in p and p.startswith("{") for p in found),
            " open" in text.split('class="payload"')[1].split(">")[0],
        )
        for (path, found), text in zip(previews.items(), shown.values(), strict=True)
    }


def _previews(page: str) -> list[str]:
    """The one-line previews of a page's collapsed payloads, as the page has them."""
    return [part.split("</code>")[0] for part in page.split('<code class="preview">')[1:]]


@SQLITE
async def test_hidden_payloads_are_not_shown(hostile_app: Outbox) -> None:
    """A handler in hide_payloads: its group's page says payload display is off, and shows
    none of its events' values."""
    [dead] = groups.find(hostile_app, Selection(statuses=("dead",))).groups
    console = create_app(hostile_app, auth=AUTH, hide_payloads=["hostile"])
    async with client_of(console) as client:
        page = (await client.get(f"/groups/{dead.group_id}", headers=OPERATOR)).text
    assert (True, False, False, True) == (
        "payload display is off for this handler" in page,
        "xxxxxxxx" in page,
        "gnp.exe" in page,
        'name="changes"' in page,
    )


async def test_pages_show_no_database_url_or_password(make_app: Callable[[str], Outbox]) -> None:
    """A database that cannot be reached: a 503 page saying so in one line, without the URL or
    its password."""
    app = make_app("postgresql+psycopg://outbox:s3cret-pass@127.0.0.1:9/outbox")
    app.handler(ActivityEvent, name="fails")(_fail)
    async with client_of(create_app(app, auth=AUTH)) as client:
        response = await client.get("/", headers={**VIEWER, "Accept": "text/html"})
    assert (503, False, False, True) == (
        response.status_code,
        "s3cret-pass" in response.text,
        "127.0.0.1:9" in response.text,
        "database error" in response.text,
    )


# --- refreshing in place, and mounted under a prefix ----------------------------------------


@SQLITE
async def test_a_fragment_request_answers_the_main_part_only(
    client: httpx.AsyncClient,
) -> None:
    """With X-Outbox-Fragment: 1, the page's main part: no document around it, no header."""
    full = (await client.get("/", headers=VIEWER)).text
    part = (await client.get("/", headers={**VIEWER, FRAGMENT_HEADER: "1"})).text
    assert (True, True, False, False, True) == (
        full.startswith("<!doctype html>"),
        'id="main" data-refresh="5' in full,
        "<html" in part,
        "<nav>" in part,
        part.strip().startswith('<div class="heading">'),
    )


@SQLITE
async def test_pages_answer_with_a_policy_that_runs_only_their_own_script(
    client: httpx.AsyncClient,
) -> None:
    """Content-Security-Policy: scripts from the console only; no framing."""
    response = await client.get("/", headers=VIEWER)
    policy = response.headers["content-security-policy"]
    assert (True, True, "DENY", "no-store") == (
        "script-src 'self'" in policy,
        "frame-ancestors 'none'" in policy,
        response.headers["x-frame-options"],
        response.headers["cache-control"],
    )


@SQLITE
async def test_mounted_under_a_prefix_every_link_stays_under_it(outbox_app: Outbox) -> None:
    """Inside a host application at /outbox: links, forms and redirects keep the prefix."""
    host = Starlette(routes=[Mount("/outbox", app=create_app(outbox_app, auth=AUTH))])
    async with client_of(host) as client:
        page = (await client.get("/outbox/handlers/mails", headers=OPERATOR)).text
        token = client.cookies[CSRF_COOKIE]
        paused = await client.post(
            "/outbox/handlers/mails/pause", data={CSRF_FIELD: token}, headers=OPERATOR
        )
    links = [
        link
        for name in ("href", "action", "src")
        for link in attributes(page, name)
        if link.startswith("/")
    ]
    assert ([], True, "/outbox/handlers/mails") == (
        [link for link in links if not link.startswith("/outbox/")],
        len(links) > 5,
        _flash(paused)[0],
    )


@SQLITE
async def test_the_deferred_count_is_read_once_per_snapshot(
    client: httpx.AsyncClient, outbox_app: Outbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many viewers of the overview within a refresh period: one status read, one count of
    the deferred groups."""
    calls = []
    find = groups.find

    def counted(*args: Any, **kwargs: Any) -> groups.Listing:
        calls.append(args)
        return find(*args, **kwargs)

    monkeypatch.setattr(groups, "find", counted)
    for _ in range(5):
        assert 200 == (await client.get("/", headers=VIEWER)).status_code
    assert len(outbox_app.handlers) == len(calls)


def test_the_templates_and_the_script_ship_in_the_wheel(tmp_path: Path) -> None:
    """A built wheel carries every template, the script and the style sheet the pages use."""
    root = Path(__file__).parents[2]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path), str(root)],
        check=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("sqlalchemy_outbox-*.whl")
    package = root / "outbox" / "web"
    expected = {
        str(path.relative_to(root))
        for folder in ("templates", "static")
        for path in (package / folder).iterdir()
    }
    assert expected == expected & set(zipfile.ZipFile(wheel).namelist())


@SQLITE
async def test_the_handler_page_says_how_close_it_runs_to_its_cap_and_what_it_delivered(
    client: httpx.AsyncClient, outbox_app: Outbox, commit_events: Any
) -> None:
    """Groups in flight against the handler's concurrency cap, its last hour's events, and
    what its rate limit's window spent."""
    commit_events(outbox_app.engine, 3, model=EmailEvent)
    drain(outbox_app, handlers=["mails"])
    page = (await client.get("/handlers/mails", headers=VIEWER)).text
    shown = {field: value for fields in values(page).values() for field, value in fields.items()}
    assert ("3", "0", True, True) == (
        shown.get("last_hour"),
        shown.get("in_flight_of_cap"),
        "events delivered" in page,
        " of 5 calls in the last " in page,
    )


@pytest.mark.parametrize(
    ("content", "content_type"),
    [
        (b"reason=a%00b", "application/x-www-form-urlencoded"),
        (
            b'--b\r\nContent-Disposition: form-data; name="reason"\r\n\r\na\\ud800b\r\n--b--\r\n',
            # A part's text decoded by the charset the request names: this one makes
            # the escape a lone surrogate.
            "multipart/form-data; boundary=b; charset=unicode_escape",
        ),
    ],
    ids=["nul", "surrogate"],
)
async def test_a_form_field_no_database_stores_is_refused_naming_it(
    client: httpx.AsyncClient, outbox_app: Outbox, content: bytes, content_type: str
) -> None:
    """A NUL or a lone surrogate in a form's field: the page says which field, nothing is
    paused, on every database."""
    response = await client.post(
        "/handlers/mails/pause",
        content=content,
        headers={
            "Authorization": f"Bearer {OPERATOR_TOKEN}",
            "content-type": content_type,
            "accept": "text/html",
        },
    )
    assert (400, True, {}) == (
        response.status_code,
        "reason: a " in html.unescape(response.text),
        flow.paused(outbox_app),
    ), response.text
