"""The console of an application serving several databases (``outbox.web.databases``): each
database's whole console under ``/databases/NAME/``, acting on that database alone; a page of
every database's totals, which a database that is down or hangs neither fails nor holds; and
``/healthz`` of them all. On two SQLite files and a PostgreSQL database of its own."""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount, Route

from outbox import Batch, Outbox, RetryPolicy, Settings, add_events
from outbox.ops import flow, metrics
from outbox.testing import drain
from outbox.web import create_app, databases, openapi
from outbox.web._console import COUNT_CAP
from outbox.web._databases import WAIT_SECONDS
from outbox.web.auth import CSRF_COOKIE, CSRF_FIELD
from tests._support import scratch_databases, silent_server
from tests.conftest import DEFAULT_POSTGRES_URL, POSTGRES_URL_ENV, reset_schema
from tests.models import ActivityEvent, EmailEvent
from tests.web._site import AUTH, OPERATOR, OPERATOR_TOKEN, VIEWER, attributes, values

pytestmark = [pytest.mark.anyio, pytest.mark.postgres]
REMOTE = ("203.0.113.7", 40000)
HTML = {"Accept": "text/html"}
FIELDS = (
    "unclaimed",
    "groups_in_flight",
    "groups_retrying",
    "groups_refused",
    "dead",
    "alerts",
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _fail(batch: Batch[Any]) -> None:
    raise ValueError("the downstream said no")


def _ok(batch: Batch[Any]) -> None:
    return None


@pytest.fixture(scope="module")
def postgres_tenant() -> Iterator[str]:
    """A PostgreSQL database of this module's own, dropped after it."""
    admin = os.environ.get(POSTGRES_URL_ENV, DEFAULT_POSTGRES_URL)
    with scratch_databases() as create:
        yield create(admin, f"console_many_{uuid.uuid4().hex[:10]}")


@pytest.fixture
def urls(postgres_tenant: str, tmp_path: Any) -> dict[str, str]:
    """Three migrated, empty databases: two SQLite files and a PostgreSQL database."""
    found = {
        "eu": f"sqlite:///{tmp_path}/eu.sqlite3",
        "us": f"sqlite:///{tmp_path}/us.sqlite3",
        "pg": postgres_tenant,
    }
    for url in found.values():
        reset_schema(url)
    return found


@pytest.fixture
def make_many() -> Iterator[Callable[..., Outbox]]:
    """Applications serving several databases; their databases' engines are disposed after
    the test."""
    made: list[Outbox] = []

    def make(registry: Any, settings: Settings | None = None) -> Outbox:
        app = Outbox(databases=registry, settings=settings or Settings())
        app.handler(ActivityEvent, batch_size=2, retry=RetryPolicy(max_attempts=1), name="fails")(
            _fail
        )
        app.handler(EmailEvent, name="mails")(_ok)
        made.append(app)
        return app

    yield make
    for app in made:
        for view in app._views.values():
            if view._engine is not None:
                view._engine.dispose()


def client_of(app: Any) -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=app, client=REMOTE)
    return httpx.AsyncClient(transport=transport, base_url="http://console")


@pytest.fixture
def many(make_many: Callable[..., Outbox], urls: dict[str, str]) -> Outbox:
    return make_many(urls)


@pytest.fixture
async def client(many: Outbox) -> AsyncIterator[httpx.AsyncClient]:
    async with client_of(create_app(many, auth=AUTH)) as c:
        yield c


def _links(html: str, names: tuple[str, ...] = ("href", "action", "src")) -> list[str]:
    """The links of a page to this site: those a browser follows (``href``, ``src``) and
    submits to (``action``)."""
    return [link for name in names for link in attributes(html, name) if link.startswith("/")]


async def _eventually(check: Callable[[], Any], what: str, timeout: float = 10.0) -> Any:
    """Poll the async ``check`` until it answers something true."""
    deadline = time.monotonic() + timeout
    while True:
        found = await check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


# --- each database's own console --------------------------------------------------------------


async def test_each_database_has_its_whole_console_and_every_link_of_it_answers(
    client: httpx.AsyncClient, many: Outbox, commit_events: Any
) -> None:
    """Following every link of the page of all databases, then of one database's console:
    every page answers, and every link of that console stays under its path."""
    commit_events(many.on("us").engine, 2)
    drain(many.on("us"), handlers=["fails"])
    seen: dict[str, int] = {}
    queue = ["/"]
    outside: list[str] = []
    while queue:
        path = queue.pop(0)
        if path in seen or len(seen) > 80:
            continue
        response = await client.get(path, headers=OPERATOR)
        seen[path] = response.status_code
        if "text/html" not in response.headers.get("content-type", ""):
            continue
        for link in _links(response.text, ("href", "src")):
            target = urlsplit(link).path
            if path.startswith("/databases/us/") and not (
                target.startswith("/databases/us/") or target == "/"
            ):
                outside.append(link)
            if target == "/" or target.startswith("/databases/us/"):
                queue.append(link)
    assert ({200}, [], True, True) == (
        set(seen.values()),
        outside,
        "/databases/us/dead" in seen,
        any(p.startswith("/databases/us/groups/") for p in seen),
    ), {p: c for p, c in seen.items() if c != 200}


async def test_a_database_console_shows_that_database_alone(
    client: httpx.AsyncClient, many: Outbox, commit_events: Any
) -> None:
    """Events written to one database are on its console's overview, not on the others'."""
    commit_events(many.on("pg").engine, 3)
    shown = {}
    for name in ("eu", "us", "pg"):
        page = (await client.get(f"/databases/{name}/", headers=VIEWER)).text
        shown[name] = values(page)["fails"]["unclaimed"]
    assert {"eu": "0", "us": "0", "pg": "3"} == shown


async def test_a_database_without_a_trailing_slash_is_sent_to_its_console(
    client: httpx.AsyncClient,
) -> None:
    """``/databases/eu``: redirected to ``/databases/eu/``."""
    response = await client.get("/databases/eu", headers=VIEWER)
    assert (307, "/databases/eu/") == (
        response.status_code,
        urlsplit(response.headers["location"]).path,
    )


async def test_an_action_on_one_database_changes_that_database_alone(
    client: httpx.AsyncClient, many: Outbox
) -> None:
    """A pause through one database's API (a token) and one through another's page (its CSRF
    cookie, under its own path): each database paused as asked, the third not at all."""
    by_api = await client.post(
        "/databases/eu/api/v1/handlers/mails/pause",
        headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"},
        json={"reason": "eu maintenance"},
    )
    await client.get("/databases/pg/handlers/fails", headers=OPERATOR)
    [cookie] = [c for c in client.cookies.jar if c.name == CSRF_COOKIE]
    by_form = await client.post(
        "/databases/pg/handlers/fails/pause",
        data={CSRF_FIELD: cookie.value, "reason": "pg maintenance"},
        headers=OPERATOR,
    )
    assert (200, 303, "/databases/pg/handlers/fails", "/databases/pg") == (
        by_api.status_code,
        by_form.status_code,
        urlsplit(by_form.headers["location"]).path,
        cookie.path,
    )
    assert ({"mails"}, set(), {"fails"}) == (
        set(flow.paused(many.on("eu"))),
        set(flow.paused(many.on("us"))),
        set(flow.paused(many.on("pg"))),
    )


async def test_a_form_without_the_database_consoles_token_is_refused(
    client: httpx.AsyncClient, many: Outbox
) -> None:
    """The CSRF token of one database's console does not do for another's: 403, nothing
    paused."""
    await client.get("/databases/eu/handlers/fails", headers=OPERATOR)
    [cookie] = [c for c in client.cookies.jar if c.name == CSRF_COOKIE]
    refused = await client.post(
        "/databases/us/handlers/fails/pause", data={CSRF_FIELD: cookie.value}, headers=OPERATOR
    )
    assert (403, {}) == (refused.status_code, flow.paused(many.on("us")))


# --- a name the registry does not list ------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "headers", "kind"),
    [
        ("/databases/nowhere/api/v1/status", HTML, "application/json"),
        ("/databases/nowhere/", {}, "application/json"),
        ("/databases/nowhere/groups", HTML, "text/html"),
    ],
    ids=["api", "not-a-browser", "browser"],
)
async def test_a_name_the_registry_does_not_list_is_not_found(
    client: httpx.AsyncClient, path: str, headers: dict[str, str], kind: str
) -> None:
    """404 in the console's form of error: JSON for the API and for clients that are not
    browsers, the error page for a browser; naming the databases there are."""
    response = await client.get(path, headers={**VIEWER, **headers})
    assert (404, kind, True) == (
        response.status_code,
        response.headers["content-type"].split(";")[0],
        "no database 'nowhere' (databases: eu, us, pg)" in response.text.replace("&#39;", "'"),
    )


async def test_a_name_not_listed_is_not_said_to_nobody(client: httpx.AsyncClient) -> None:
    """Without credentials, an unknown database is a 401, as any page: no names given away."""
    response = await client.get("/databases/nowhere/api/v1/status")
    assert (401, False) == (response.status_code, "eu" in response.text)


# --- the page of every database ---------------------------------------------------------------


def _expected(app: Outbox) -> dict[str, str]:
    statuses = metrics.collect(app, count_cap=COUNT_CAP)
    return {
        "unclaimed": str(sum(s.unclaimed for s in statuses)),
        "groups_in_flight": str(sum(s.groups_in_flight for s in statuses)),
        "groups_retrying": str(sum(s.groups_retrying for s in statuses)),
        "groups_refused": str(sum(s.groups_refused for s in statuses)),
        "dead": str(sum(s.dead for s in statuses)),
        "alerts": str(sum(len(s.alerts) for s in statuses)),
    }


async def test_the_page_of_every_database_gives_each_databases_totals_and_theirs(
    client: httpx.AsyncClient, many: Outbox, commit_events: Any
) -> None:
    """Each line is the sum of ``metrics.collect`` over that database's handlers; the line of
    all of them sums the lines; the JSON says the same."""
    commit_events(many.on("eu").engine, 3)
    commit_events(many.on("eu").engine, 2, model=EmailEvent)
    commit_events(many.on("us").engine, 4)
    drain(many.on("us"), handlers=["fails"])
    commit_events(many.on("pg").engine, 1, model=EmailEvent)
    page = (await client.get("/", headers=VIEWER)).text
    answer = (await client.get("/api/v1/databases", headers=VIEWER)).json()
    shown = values(page, row="database")
    expected = {name: _expected(many.on(name)) for name in ("eu", "us", "pg")}
    total = {f: str(sum(int(e[f]) for e in expected.values())) for f in FIELDS}
    assert {**expected, "*": total} == {
        row: {f: fields[f] for f in FIELDS} for row, fields in shown.items()
    }
    assert (
        {"eu": "answered", "us": "answered", "pg": "answered"},
        {name: {f: int(v) for f, v in e.items()} for name, e in expected.items()},
        {f: int(v) for f, v in total.items()},
        3,
    ) == (
        {d["name"]: d["read"] for d in answer["databases"]},
        {d["name"]: {f: d["totals"][f] for f in FIELDS} for d in answer["databases"]},
        {f: answer["total"][f] for f in FIELDS},
        answer["counted"],
    )


async def test_the_oldest_age_of_all_is_the_largest_and_each_name_links_to_its_console(
    client: httpx.AsyncClient, many: Outbox, commit_events: Any
) -> None:
    """The line of all databases has the oldest event of any; each database's name links to
    its console."""
    commit_events(many.on("pg").engine, 1)
    commit_events(many.on("eu").engine, 1)
    answer = (await client.get("/api/v1/databases", headers=VIEWER)).json()
    page = (await client.get("/", headers=VIEWER)).text
    ages = [d["totals"]["oldest_age"] for d in answer["databases"]]
    assert (max(a for a in ages if a is not None), None, True) == (
        answer["total"]["oldest_age"],
        ages[1],
        {"/databases/eu/", "/databases/us/", "/databases/pg/"} <= set(attributes(page, "href")),
    )


async def test_a_database_that_cannot_be_read_shows_why_in_its_line(
    make_many: Callable[..., Outbox], urls: dict[str, str]
) -> None:
    """A PostgreSQL URL on a closed port and a SQLite path in a missing directory: their lines
    say why (no password), the others' numbers are there, and the page answers 200."""
    registry = {
        **urls,
        "closed": "postgresql+psycopg://outbox:s3cret-pw@127.0.0.1:1/nowhere",
        "missing": "sqlite:////nonexistent-directory/outbox.sqlite3",
    }
    app = make_many(registry)
    async with client_of(create_app(app, auth=AUTH)) as client:
        page = await client.get("/", headers=VIEWER)
        answer = (await client.get("/api/v1/databases", headers=VIEWER)).json()
    reads = {d["name"]: (d["read"], d["error"] is not None) for d in answer["databases"]}
    assert (200, False, 3) == (page.status_code, "s3cret-pw" in page.text, answer["counted"])
    assert {
        "eu": ("answered", False),
        "us": ("answered", False),
        "pg": ("answered", False),
        "closed": ("failed", True),
        "missing": ("failed", True),
    } == reads
    assert "unable to open database file" in page.text


@pytest.fixture
def silent_port() -> Iterator[int]:
    with silent_server() as port:
        yield port


async def test_a_database_that_hangs_holds_neither_the_page_nor_more_than_one_thread(
    make_many: Callable[..., Outbox], urls: dict[str, str], silent_port: int
) -> None:
    """A database that accepts and never answers: the page answers within the wait, its line
    says it has no answer yet, the others are read; however many viewers, one read of it is
    in flight."""
    registry = {**urls, "silent": f"postgresql+psycopg://u@127.0.0.1:{silent_port}/db"}
    app = make_many(registry, Settings(network_timeout=20))
    web = create_app(app, auth=AUTH)
    state: databases.Databases = web.state.databases
    async with client_of(web) as client:
        started = time.monotonic()
        first = await client.get("/api/v1/databases", headers=VIEWER)
        took = time.monotonic() - started
        threads = threading.active_count()
        more = await asyncio.gather(*(client.get("/", headers=VIEWER) for _ in range(8)))
        health = await client.get("/healthz")
        running = state.calls_running()
    reads = {d["name"]: d["read"] for d in first.json()["databases"]}
    assert (True, {200}, "waiting", 3) == (
        took < WAIT_SECONDS + 2,
        {r.status_code for r in more},
        reads["silent"],
        [reads[n] for n in ("eu", "us", "pg")].count("answered"),
    )
    # The status read of the silent database, and its health check: one each, however many
    # asked; no thread more than those two.
    assert (2, True, {"ok": False}, 200) == (
        running,
        threading.active_count() <= threads + 1,
        {"ok": health.json()["ok"]},
        health.status_code,
    )


async def test_metrics_of_a_database_that_hangs_hold_one_thread_however_often_scraped(
    make_many: Callable[..., Outbox], urls: dict[str, str], silent_port: int
) -> None:
    """``/metrics`` scraped three times while a database never answers: its gauges are a
    scrape error each time, the others are reported, and one thread reads it."""
    registry = {**urls, "silent": f"postgresql+psycopg://u@127.0.0.1:{silent_port}/db"}
    app = make_many(registry, Settings(network_timeout=20))
    async with client_of(create_app(app, auth=AUTH)) as client:
        texts = [(await client.get("/metrics", headers=VIEWER)).text for _ in range(3)]
    readers = [t for t in threading.enumerate() if t.name == "outbox-scrape silent"]
    assert (1, [True] * 3, [True] * 3) == (
        len(readers),
        ['outbox_scrape_error{database="silent"} 1.0' in t for t in texts],
        ['outbox_scrape_error{database="eu"} 0.0' in t for t in texts],
    )


async def test_every_viewer_of_every_page_shares_one_read_per_database(
    many: Outbox,
) -> None:
    """The page of all databases and a database's own overview, many times within a period:
    one status read per database."""
    web = create_app(many, auth=AUTH, refresh_seconds=60)
    async with client_of(web) as client:
        for _ in range(5):
            assert 200 == (await client.get("/", headers=VIEWER)).status_code
            assert 200 == (await client.get("/databases/eu/", headers=VIEWER)).status_code
    state: databases.Databases = web.state.databases
    reads = {}
    for name in ("eu", "us", "pg"):
        console = state.console_made(name)
        assert console is not None
        reads[name] = console.snapshots.reads
    assert {"eu": 1, "us": 1, "pg": 1} == reads


async def test_a_registry_function_shows_a_database_added_and_a_url_changed(
    make_many: Callable[..., Outbox], urls: dict[str, str], commit_events: Any
) -> None:
    """A registry that is a function is read again each refresh period: a database added
    appears on the page and has its console; a database moved to another URL shows the
    other database."""
    listed = {"eu": urls["eu"]}
    app = make_many(lambda: dict(listed))
    commit_events(app.on("eu").engine, 1)
    web = create_app(app, auth=AUTH, refresh_seconds=0.5)
    async with client_of(web) as client:
        before = values((await client.get("/", headers=VIEWER)).text, row="database")
        missing = await client.get("/databases/us/", headers=VIEWER)
        listed["us"] = urls["us"]

        async def added() -> bool:
            page = (await client.get("/", headers=VIEWER)).text
            return "us" in values(page, row="database")

        await _eventually(added, "the database added to appear")
        found = await client.get("/databases/us/", headers=VIEWER)
        listed["eu"] = urls["pg"]

        async def moved() -> bool:
            page = (await client.get("/databases/eu/", headers=VIEWER)).text
            return values(page)["fails"]["unclaimed"] == "0"

        await _eventually(moved, "the database moved to show its new URL's events")
    assert (["eu", "*"], 404, 200) == (
        list(before),
        missing.status_code,
        found.status_code,
    )


# --- health, metrics and the document -------------------------------------------------------


async def test_healthz_answers_for_each_database_without_authentication(
    make_many: Callable[..., Outbox], urls: dict[str, str]
) -> None:
    """Every database answers: 200, ok; one down: 200, not ok; all down: 503. How many, never
    which: the names are for those who may read them."""
    down = "sqlite:////nonexistent-directory/outbox.sqlite3"
    answers = []
    for registry in (urls, {**urls, "down": down}, {"down": down}):
        async with client_of(create_app(make_many(registry), auth=AUTH)) as client:
            response = await client.get("/healthz")
        answers.append((response.status_code, response.json()))
    assert [
        (200, {"ok": True, "answering": 3, "databases": 3}),
        (200, {"ok": False, "answering": 3, "databases": 4}),
        (503, {"ok": False, "answering": 0, "databases": 1}),
    ] == answers


async def test_metrics_asks_credentials(client: httpx.AsyncClient) -> None:
    """``/metrics`` of all databases: a viewer's, as on the console of one."""
    assert 401 == (await client.get("/metrics")).status_code


async def test_metrics_give_each_database_apart(client: httpx.AsyncClient, many: Outbox) -> None:
    """``/metrics`` of all databases: every database's gauges, labelled with its name."""
    with many.on("us").engine.begin() as conn:
        add_events(conn, EmailEvent, [{"address": f"r{i}@example.com"} for i in range(3)])
    text = (await client.get("/metrics", headers=VIEWER)).text
    found = {
        name: f'outbox_unclaimed_events{{band="HOUR",database="{name}",handler="mails"}}' in text
        for name in ("eu", "us", "pg")
    }
    assert {"eu": True, "us": True, "pg": True} == found
    assert 'outbox_unclaimed_events{band="HOUR",database="us",handler="mails"} 3.0' in text


def test_the_document_of_all_databases_describes_every_endpoint_of_its_api() -> None:
    """Every API route of the console of several databases is in its document, and nothing
    else is."""
    routes = {
        (route.path.removeprefix("/api/v1"), method.lower())
        for route in databases.ROUTES
        if isinstance(route, Route) and route.path.startswith("/api/v1/")
        if not route.path.endswith("openapi.json")
        for method in route.methods or ()
        if method != "HEAD"
    }
    documented = {
        (path, method)
        for path, item in openapi.databases_spec()["paths"].items()
        for method in item
    }
    assert routes == documented


# --- mounted in a host application ----------------------------------------------------------


async def test_mounted_under_a_prefix_every_link_of_every_console_stays_under_it(
    many: Outbox,
) -> None:
    """Inside a host application at /outbox: the page of all databases links under it, a
    database's console links under its own path there, its static files load, a form's
    redirect and the CSRF cookie stay under it."""
    host = Starlette(routes=[Mount("/outbox", app=create_app(many, auth=AUTH))])
    async with client_of(host) as client:
        fleet = (await client.get("/outbox/", headers=VIEWER)).text
        console = (await client.get("/outbox/databases/eu/handlers/mails", headers=OPERATOR)).text
        [cookie] = [c for c in client.cookies.jar if c.name == CSRF_COOKIE]
        paused = await client.post(
            "/outbox/databases/eu/handlers/mails/pause",
            data={CSRF_FIELD: cookie.value},
            headers=OPERATOR,
        )
        static = [
            (await client.get(link, headers=VIEWER)).status_code
            for link in _links(console)
            if "/static/" in link
        ]
    in_console = [
        link
        for link in _links(console)
        if not link.startswith("/outbox/databases/eu/") and link != "/outbox/"
    ]
    assert (
        [],
        True,
        [],
        "/outbox/databases/eu",
        "/outbox/databases/eu/handlers/mails",
        [200, 200],
    ) == (
        [link for link in _links(fleet) if not link.startswith("/outbox/")],
        "/outbox/databases/pg/" in _links(fleet),
        in_console,
        cookie.path,
        urlsplit(paused.headers["location"]).path,
        static,
    )
