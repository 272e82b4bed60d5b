"""The dashboard in a real browser (Debian's chromium, driven by Playwright): its numbers are
the operations layer's and refresh in place; an operator replays a dead group, edits and
replays a dead event, runs a deferred group now, discards two ticked groups after their dry
run, pauses and resumes a handler, and a real ``outbox work`` process handles what was
replayed or run; payloads show collapsed and open; the header's search finds an event id, a
group id, an ordering key and an ingest key; writes without credentials, by a viewer or
without the CSRF token are refused.

Playwright never downloads a browser here: it drives ``/usr/bin/chromium`` (``apt-get install
chromium``; ``.ci/run`` installs it). Without it the tests are skipped, or fail when
``CI=true``.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from sqlalchemy import Engine, insert

from outbox import Outbox, add_events, schema
from outbox._db.dialects import db_now_plus
from outbox.ops import fleet, flow, groups, ingest, metrics
from outbox.ops.selection import Selection
from outbox.web import Auth, Role, create_app
from tests._ports import free_ports
from tests._support import wait_for
from tests.acceptance._cli import LEASE, Cli, Running
from tests.conftest import reset_schema
from tests.models import ActivityEvent, EmailEvent, SinkEvent
from tests.web import console_app

CHROMIUM = Path("/usr/bin/chromium")
APP = "tests.web.console_app:app"
USERS = {"olga": ("olga-password", Role.OPERATOR), "vic": ("vic-password", Role.VIEWER)}
REFRESH_SECONDS = 1.0
TIMEOUT_MS = 15_000

pytestmark = pytest.mark.postgres

try:
    from playwright import sync_api
except ImportError:  # the dev extra brings it; without it, as without a browser
    sync_api = None  # type: ignore[assignment]


def _unavailable(what: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} (CI=true: the browser tests must not skip)", pytrace=False)
    pytest.skip(what)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless chromium, Debian's."""
    if sync_api is None:
        _unavailable("playwright is not installed (pip install -e '.[dev]')")
    if not CHROMIUM.exists():
        _unavailable(f"no browser at {CHROMIUM}: apt-get install chromium")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture(scope="module")
def database(postgres_url: str) -> str:
    """The session's PostgreSQL database, emptied once for this module's tests."""
    reset_schema(postgres_url)
    return postgres_url


@pytest.fixture(scope="module")
def output_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the worker's handlers record what they handled."""
    return tmp_path_factory.mktemp("handled")


@pytest.fixture(scope="module")
def worker(
    database: str, output_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Running]:
    """A real ``outbox work`` process on the test application."""
    cli = Cli(tmp_path_factory.mktemp("worker"), output_dir)
    env = {console_app.OUTPUT_DIR_ENV: str(output_dir)}
    try:
        yield cli.start("--app", APP, "--database-url", database, "work", *LEASE, env=env)
    finally:
        cli.close()


@pytest.fixture(scope="module")
def app(database: str) -> Iterator[Outbox]:
    """The application the dashboard shows (and the test writes events with)."""
    outbox = console_app.build(database)
    try:
        yield outbox
    finally:
        outbox.engine.dispose()


@pytest.fixture(scope="module")
def dashboard(app: Outbox, worker: Running) -> Iterator[str]:
    """The console served by uvicorn on a free port of 127.0.0.1; its base URL."""
    with _served(app, "the dashboard") as url:
        yield url


@contextmanager
def _served(app: Outbox, what: str) -> Iterator[str]:
    """``app``'s console served by uvicorn on a free port of 127.0.0.1; its base URL."""
    console = create_app(app, auth=Auth(users=USERS), refresh_seconds=REFRESH_SECONDS)
    port = free_ports()
    server = uvicorn.Server(
        uvicorn.Config(console, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, f"{what} to listen")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _context(browser: Any, dashboard: str, user: str | None) -> Any:
    credentials = None if user is None else {"username": user, "password": USERS[user][0]}
    context = browser.new_context(
        base_url=dashboard, http_credentials=credentials, viewport={"width": 1280, "height": 800}
    )
    context.set_default_timeout(TIMEOUT_MS)
    return context


@pytest.fixture
def operator(browser: Any, dashboard: str) -> Iterator[Any]:
    """A page of an operator's browser (basic auth)."""
    context = _context(browser, dashboard, "olga")
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture
def viewer(browser: Any, dashboard: str) -> Iterator[Any]:
    """A page of a viewer's browser (basic auth)."""
    context = _context(browser, dashboard, "vic")
    try:
        yield context.new_page()
    finally:
        context.close()


def _commit(engine: Engine, model: type[Any], rows: list[dict[str, Any]]) -> None:
    with engine.begin() as conn:
        add_events(conn, model, rows)


def _dead_group(app: Outbox, activity_id: int) -> str:
    """The dead group of the event with ``activity_id``, once the worker has dead-lettered
    it."""

    def found() -> str | None:
        listing = groups.find(app, Selection(statuses=("dead",), payload=f"{activity_id}"))
        for group in listing.groups:
            detail = groups.show(app, group.group_id)
            if any(e.values.get("activity_id") == activity_id for e in detail.events):
                return str(group.group_id)
        return None

    return wait_for(found, f"the worker to dead-letter event {activity_id}")


def _overview_numbers(page: Any) -> dict[str, dict[str, str]]:
    rows: dict[str, dict[str, str]] = page.eval_on_selector_all(
        "tr[data-handler]",
        """rows => Object.fromEntries(rows.map(row => [row.dataset.handler, Object.fromEntries(
            Array.from(row.querySelectorAll('[data-field][data-value]'))
                .map(cell => [cell.dataset.field, cell.dataset.value]))]))""",
    )
    return rows


FIELDS = ("unclaimed", "groups_in_flight", "groups_retrying", "held_keys", "dead")


def _collected(app: Outbox) -> dict[str, dict[str, str]]:
    return {
        s.handler: {
            "unclaimed": str(s.unclaimed),
            "groups_in_flight": str(s.groups_in_flight),
            "groups_retrying": str(s.groups_retrying),
            "held_keys": str(len(s.held_keys)),
            "dead": str(s.dead),
        }
        for s in metrics.collect(app)
    }


def test_the_overview_shows_what_metrics_collects_and_refreshes_in_place(
    app: Outbox, operator: Any
) -> None:
    """Each handler's numbers are metrics.collect's; events written while the page is open
    appear without a reload, and the page says when its numbers were read."""
    flow.pause(app, "mail", reason="held for the test")
    try:
        _commit(app.engine, EmailEvent, [{"address": f"a{n}@example.com"} for n in range(7)])
        operator.goto("/")

        def agree() -> bool:
            operator.reload()
            shown = _overview_numbers(operator)
            return {h: {f: v[f] for f in FIELDS} for h, v in shown.items()} == _collected(app)

        wait_for(agree, "the overview to show metrics.collect's numbers")
        before = int(_overview_numbers(operator)["mail"]["unclaimed"])
        operator.evaluate("() => { window.notReloaded = true; }")
        _commit(app.engine, EmailEvent, [{"address": f"b{n}@example.com"} for n in range(3)])
        operator.wait_for_function(
            "n => document.querySelector('tr[data-handler=mail] [data-field=unclaimed]')"
            ".dataset.value == n",
            arg=str(before + 3),
        )
        asof = operator.inner_text(".asof")
        assert (True, True, True) == (
            operator.evaluate("() => window.notReloaded === true"),
            bool(re.fullmatch(r"as of \d\d:\d\d:\d\d UTC; refreshed every 1 s", asof)),
            "paused by an operator until resumed: held for the test"
            in operator.inner_text("tr[data-handler=mail]"),
        )
    finally:
        flow.resume(app, "mail")


def test_an_operator_replays_a_dead_group_and_the_worker_handles_it(
    app: Outbox, operator: Any, output_dir: Path
) -> None:
    """From the dead letters to the group's page; its replay is handled by the worker."""
    flag = output_dir / console_app.FLAKY_FLAG
    flag.touch()
    _commit(app.engine, ActivityEvent, [{"activity_id": 1001, "kind": "flaky"}])
    group_id = _dead_group(app, 1001)
    flag.unlink()
    operator.goto("/dead")
    with operator.expect_navigation():
        operator.click(f"tr[data-group='{group_id}'] a")
    with operator.expect_navigation():
        operator.click("#replay-form button")
    flash = operator.inner_text(".flash")
    wait_for(
        lambda: (1001, "flaky") in console_app.handled(output_dir), "the worker to handle 1001"
    )
    operator.reload()
    assert (True, "replayed") == (
        flash.startswith("replayed 1 group (1 event): operation "),
        operator.get_attribute("[data-field=status]", "data-value"),
    )


def test_an_operator_edits_a_dead_event_and_the_worker_handles_the_new_values(
    app: Outbox, operator: Any, output_dir: Path
) -> None:
    """A poison event's kind changed on its group's page: the worker handles it as changed."""
    _commit(app.engine, ActivityEvent, [{"activity_id": 2002, "kind": "poison"}])
    group_id = _dead_group(app, 2002)
    operator.goto(f"/groups/{group_id}")
    operator.click("details.edit summary")
    operator.fill("details.edit textarea[name=changes]", "kind=fixed")
    with operator.expect_navigation():
        operator.click("details.edit button[type=submit]")
    flash = operator.inner_text(".flash")
    wait_for(
        lambda: (2002, "fixed") in console_app.handled(output_dir), "the worker to handle 2002"
    )
    said = r"event \d+ replayed as event \d+ with kind changed: operation \d+"
    assert (True, False) == (
        bool(re.fullmatch(said, flash)),
        (2002, "poison") in console_app.handled(output_dir),
    )


def test_an_operator_runs_a_deferred_group_now_and_the_worker_handles_it(
    app: Outbox, operator: Any, output_dir: Path
) -> None:
    """A group its downstream deferred for an hour: Retry now on its page, and the worker
    handles it at once."""
    group_id = uuid.uuid4()
    with app.engine.begin() as conn:
        conn.execute(
            insert(ActivityEvent.__table__).values(
                activity_id=3003, kind="later", group_id=group_id
            )
        )
        conn.execute(
            insert(schema.jobs).values(
                kind="batch", handler="deliver", group_id=group_id, priority=0, deferrals=1,
                run_at=db_now_plus(3600), last_error="RetryAfter: come back in an hour",
            )
        )  # fmt: skip
    operator.goto(f"/groups/{group_id}")
    status = operator.get_attribute("[data-field=status]", "data-value")
    with operator.expect_navigation():
        operator.click("#retry-form button")
    flash = operator.inner_text(".flash")
    wait_for(
        lambda: (3003, "later") in console_app.handled(output_dir), "the worker to handle 3003"
    )
    assert ("deferred", True) == (
        status,
        bool(re.fullmatch(r"made due now 1 group \(1 event\): operation \d+", flash)),
    )


def test_an_operator_ticks_two_dead_groups_and_discards_them_after_the_dry_run(
    app: Outbox, operator: Any
) -> None:
    """Two of three dead groups ticked on the dead letters page: the dry run counts two,
    confirmed they are discarded, and the third stays dead."""
    chosen = []
    for activity_id in (4001, 4002, 4003):
        _commit(app.engine, ActivityEvent, [{"activity_id": activity_id, "kind": "poison"}])
        chosen.append(_dead_group(app, activity_id))
    operator.goto("/dead?handler=deliver")
    for group_id in chosen[:2]:
        operator.check(f"tr[data-group='{group_id}'] input[type=checkbox]")
    with operator.expect_navigation():
        operator.click("#discard-ticked")
    counted = operator.get_attribute(".dry-run", "data-groups")
    operator.fill("#confirm-form input[name=reason]", "ticked in a browser")
    with operator.expect_navigation():
        operator.click("#confirm-form button")
    flash = operator.inner_text(".flash")
    assert ("2", True, ["discarded", "discarded", "dead"]) == (
        counted,
        flash.startswith("discarded 2 groups (2 events): operation "),
        [str(groups.show(app, uuid.UUID(g)).group.status) for g in chosen],
    )


def test_payloads_show_collapsed_and_open_on_a_click(app: Outbox, operator: Any) -> None:
    """41 archived events with big payloads: the archive page shows each on one line, its
    height bounded; a click opens one in full."""
    group_id = uuid.uuid4()
    payload = {f"field_{n:02}": f"value {n} " * 8 for n in range(30)}
    with app.engine.begin() as conn:
        conn.execute(
            insert(schema.archive),
            [
                {
                    "handler": "deliver", "buffer": "test_activity_events", "event_id": 90_000 + n,
                    "group_id": group_id, "status": "succeeded", "attempts": 1,
                    "payload": {"id": 90_000 + n, **payload},
                }
                for n in range(41)
            ],
        )  # fmt: skip
    operator.goto(f"/archive?group={group_id}")
    rows = operator.locator("tr[data-archived]").count()
    height = operator.evaluate("() => document.documentElement.scrollHeight")
    first = operator.locator("details.payload").first
    shown_before = first.locator("pre.payload").is_visible()
    first.locator("summary").click()
    assert (41, True, False, True, True) == (
        rows,
        height < 2_500,
        shown_before,
        first.locator("pre.payload").is_visible(),
        '"field_29": "value 29' in first.locator("pre.payload").inner_text(),
    ), height


def _search(page: Any, text: str) -> list[tuple[str, str]]:
    """Search from the header's box; (taken as, where) of each place found."""
    page.goto("/")
    page.fill("header form.search input[name=q]", text)
    with page.expect_navigation():
        page.press("header form.search input[name=q]", "Enter")
    found: list[tuple[str, str]] = page.eval_on_selector_all(
        "tr[data-taken]", "rows => rows.map(r => [r.dataset.taken, r.dataset.place])"
    )
    return [tuple(f) for f in found]  # type: ignore[misc]


def test_the_header_search_finds_each_kind_of_key(app: Outbox, viewer: Any) -> None:
    """An event id, a group id, an ordering key and an ingest key: each found where it is."""
    [written] = ingest.ingest(
        app, "deliver", [("order-5005", {"activity_id": 5005, "kind": "poison"})]
    )
    dead_group = _dead_group(app, 5005)
    _commit(app.engine, SinkEvent, [
        {"account": "closed-7", "amount": 1, "note": "poison", "ref": uuid.uuid4()}
    ])  # fmt: skip

    def held() -> bool:
        return "closed-7" in metrics.collect(app, ["accounts"])[0].held_keys

    wait_for(held, "the worker to hold the key closed-7")
    assert (
        True,
        [("group_id", "dead")],
        True,
        [("ingest_key", "dead")],
    ) == (
        ("event_id", "dead") in _search(viewer, str(written.event_id)),
        _search(viewer, dead_group),
        ("ordering_key", "dead") in _search(viewer, "closed-7"),
        _search(viewer, "order-5005"),
    )


def test_an_operator_pauses_and_resumes_a_handler(app: Outbox, operator: Any) -> None:
    """The pause form pauses the handler across the fleet, with its reason; resume ends it."""
    operator.goto("/handlers/mail")
    operator.fill("#pause-form input[name=reason]", "a browser's pause")
    with operator.expect_navigation():
        operator.click("#pause-form button")
    paused = (operator.inner_text("p.state"), flow.paused(app).get("mail"))
    with operator.expect_navigation():
        operator.click("#resume-form button")
    assert (
        "paused by an operator until resumed: a browser's pause",
        "a browser's pause",
        "running",
        {},
    ) == (
        paused[0],
        paused[1].reason if paused[1] else None,
        operator.inner_text("p.state"),
        flow.paused(app),
    )


def test_the_handler_page_switches_its_chart_between_an_hour_a_day_and_a_week(
    operator: Any,
) -> None:
    """Each range link draws the chart again with its buckets (60 minutes, 24 and 168 hours)
    and marks itself current; a refresh keeps the range."""
    operator.goto("/handlers/deliver")
    shown = []
    for span in ("day", "week", "hour"):
        with operator.expect_navigation():
            operator.click(f"nav.ranges a[data-range={span}]")
        operator.evaluate("() => { window.before = document.querySelector('#main > *'); }")
        operator.wait_for_function("() => document.querySelector('#main > *') !== window.before")
        shown.append(
            (
                operator.get_attribute("svg.chart", "data-range"),
                operator.get_attribute("svg.chart", "data-buckets"),
                operator.get_attribute("nav.ranges a[aria-current]", "data-range"),
            )
        )
    assert [("day", "24", "day"), ("week", "168", "week"), ("hour", "60", "hour")] == shown


def test_an_age_reads_in_minutes_and_seconds_with_its_exact_seconds_on_hover(
    app: Outbox, operator: Any
) -> None:
    """An event written 200 s ago to a paused handler: its overview row says the oldest is
    some minutes and seconds old, and the title holds the seconds they round down."""
    flow.pause(app, "mail", reason="an age to read")
    try:
        created = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=200)
        _commit(app.engine, EmailEvent, [{"address": "old@example.com", "created_at": created}])
        operator.goto("/")
        cell = "tr[data-handler=mail] [data-field=oldest_age] .age"
        operator.wait_for_selector(cell)
        text, title = operator.inner_text(cell), operator.get_attribute(cell, "title")
    finally:
        flow.resume(app, "mail")
    seconds = float(title.removesuffix(" s").replace(",", ""))
    minutes, rest = divmod(int(seconds), 60)
    assert (True, True, f"{minutes} min" + (f" {rest} s" if rest else "")) == (
        bool(re.fullmatch(r"\d+ min( \d+ s)?", text)),
        seconds >= 200,
        text,
    )


def _fragments_after(page: Any) -> list[str]:
    """The refreshes (fragment requests) the page sends from now on."""
    sent: list[str] = []
    page.on(
        "request",
        lambda r: sent.append(r.url) if r.headers.get("x-outbox-fragment") == "1" else None,
    )
    return sent


def test_the_live_toggle_stops_refreshes_and_is_remembered_after_a_reload(
    operator: Any,
) -> None:
    """Paused: periods pass with no refresh sent, and the toggle says so; after a reload it is
    still paused; resumed, the page refreshes again."""
    operator.goto("/")
    operator.click("#live-toggle")
    sent = _fragments_after(operator)
    operator.wait_for_function("() => Number(document.getElementById('main').dataset.skipped) >= 2")
    paused = (operator.inner_text("#live-toggle"), len(sent))
    operator.reload()
    operator.wait_for_function("() => Number(document.getElementById('main').dataset.skipped) >= 2")
    reloaded = (operator.inner_text("#live-toggle"), len(sent))
    with operator.expect_request(lambda r: r.headers.get("x-outbox-fragment") == "1"):
        operator.click("#live-toggle")
    assert (("paused", 0), ("paused", 0), "live") == (
        paused,
        reloaded,
        operator.inner_text("#live-toggle"),
    )


def test_an_operator_drains_a_worker_from_the_workers_page_and_sees_it_leave(
    database: str, operator: Any, output_dir: Path, tmp_path: Path, app: Outbox
) -> None:
    """A second ``outbox work`` process: its Drain button asks it, the page says so, the
    worker exits 0 and its row leaves the page as it refreshes."""
    cli = Cli(tmp_path, output_dir)
    try:
        second = cli.start("--app", APP, "--database-url", database, "work", *LEASE)
        pid = second.popen.pid
        [worker_id] = wait_for(
            lambda: [w.id for w in fleet.workers(app) if w.pid == pid], "the second worker's row"
        )
        operator.on("dialog", lambda dialog: dialog.accept())
        operator.goto("/workers")
        with operator.expect_navigation():
            operator.click(f"tr[data-worker='{worker_id}'] form.drain button")
        flash = operator.inner_text(".flash")
        operator.wait_for_selector(f"tr[data-worker='{worker_id}']", state="detached")
        code = second.wait(timeout=30)
    finally:
        cli.close()
    assert (True, 0, []) == (
        flash.startswith(f"asked worker {worker_id} ("),
        code,
        [w for w in fleet.workers(app) if w.id == worker_id],
    )


def _post_from_page(page: Any, path: str, token: str | None) -> int:
    """A form posted by the page's own script, with the CSRF token given (or none)."""
    status: int = page.evaluate(
        """([path, token]) => {
            const body = new URLSearchParams({reason: "not allowed"});
            if (token !== null) body.set("csrf_token", token);
            return fetch(path, {method: "POST", body, redirect: "manual"}).then(r => r.status);
        }""",
        [path, token],
    )
    return status


def test_writes_without_credentials_by_a_viewer_or_without_the_token_are_refused(
    app: Outbox, browser: Any, dashboard: str, operator: Any, viewer: Any
) -> None:
    """No credentials: 401 for pages and writes; a viewer's browser: no write forms, and its
    write (token and all) 403; an operator's browser without the page's token, or another: 403.
    Nothing is paused."""
    anonymous = _context(browser, dashboard, None)
    try:
        page_status = anonymous.request.get("/").status
        write_status = anonymous.request.post(
            "/handlers/mail/pause", form={"reason": "x"}, max_redirects=0
        ).status
    finally:
        anonymous.close()
    viewer.goto("/handlers/mail")
    viewer_forms = viewer.locator("#pause-form").count()
    viewer_token = viewer.get_attribute("meta[name=csrf-token]", "content")
    operator.goto("/handlers/mail")
    assert (401, 401, 0, 403, 403, 403, {}) == (
        page_status,
        write_status,
        viewer_forms,
        _post_from_page(viewer, "/handlers/mail/pause", viewer_token),
        _post_from_page(operator, "/handlers/mail/pause", None),
        _post_from_page(operator, "/handlers/mail/pause", "x" * 43),
        flow.paused(app),
    )


def test_the_pages_run_without_script_errors(operator: Any) -> None:
    """Every page loads its script and style under its Content-Security-Policy, with no error
    in the console, and refreshes its main part in place."""
    errors: list[str] = []
    operator.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    operator.on("pageerror", lambda e: errors.append(str(e)))
    for path in (
        "/",
        "/handlers/deliver",
        "/groups",
        "/dead",
        "/archive",
        "/search?q=deliver",
        "/history",
        "/workers",
        "/inboxes",
    ):
        operator.goto(path)
    # A refresh swaps the main part in: its first element is a new one.
    operator.evaluate("() => { window.before = document.querySelector('#main > *'); }")
    operator.wait_for_function("() => document.querySelector('#main > *') !== window.before")
    assert ([], True) == (
        errors,
        operator.evaluate("() => getComputedStyle(document.body).margin === '0px'"),
    )


@pytest.fixture(scope="module")
def many_dashboard(
    database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Outbox]]:
    """The console of an application serving two databases (the module's PostgreSQL one and
    a SQLite file), served by uvicorn; its base URL and the application."""
    sqlite = f"sqlite:///{tmp_path_factory.mktemp('many')}/south.sqlite3"
    reset_schema(sqlite)
    app = Outbox(databases={"north": database, "south": sqlite})
    app.handler(EmailEvent, name="mail")(lambda batch: None)
    try:
        with _served(app, "the console of several databases") as url:
            yield url, app
    finally:
        for name in ("north", "south"):
            app.on(name).engine.dispose()


def test_the_page_of_every_database_leads_into_each_console_and_back(
    browser: Any, many_dashboard: tuple[str, Outbox]
) -> None:
    """From the page of all databases, a database's name opens its console (its own pages,
    its script running without error); its header leads back."""
    base, _ = many_dashboard
    context = _context(browser, base, "vic")
    errors: list[str] = []
    try:
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto("/")
        names = page.eval_on_selector_all(
            "tr[data-database]", "rows => rows.map(r => r.dataset.database)"
        )
        with page.expect_navigation():
            page.click("tr[data-database=south] a")
        inside = (
            page.url,
            page.inner_text("header .database"),
            page.locator("tr[data-handler=mail]").count(),
        )
        with page.expect_navigation():
            page.click("header nav a:text('All databases')")
        back = page.url
    finally:
        context.close()
    assert (["north", "south", "*"], (f"{base}/databases/south/", "south", 1), f"{base}/", []) == (
        names,
        inside,
        back,
        errors,
    )
