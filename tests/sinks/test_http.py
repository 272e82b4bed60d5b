"""The bulk HTTP sink against a recording API: every answer becomes its outcome, a body too big
is split, hosts are allowed or refused, secrets never show, an outage opens the breaker and
loses nothing."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from structlog.testing import capture_logs

from outbox import CircuitBreaker, ConfigurationError, Outbox, RetryPolicy, Settings, schema
from outbox.ops import metrics
from outbox.results import BatchResult, FailureCause, Outcome
from outbox.sinks.encoding import json_default
from outbox.sinks.http import (
    AsyncBulkHTTPSink,
    BulkHTTPSink,
    ErrorsById,
    StatusList,
    records_body,
)
from outbox.sinks.secrets import MASK
from outbox.worker import Worker
from tests._support import wait_for
from tests.conftest import reset_schema
from tests.models import SinkEvent
from tests.sinks._contract import SECRET, commit_events, event_rows
from tests.sinks.kinds.http import REASON, RecordingAPI

ONCE = RetryPolicy(max_attempts=1)
SOON = RetryPolicy(max_attempts=30, scale=0.0, base_delay=0.1, jitter=0.0)
DEFERRED, RETRYING, SUCCEEDED = Outcome.DEFERRED, Outcome.RETRYING, Outcome.SUCCEEDED
DATA, DOWNSTREAM = FailureCause.DATA, FailureCause.DOWNSTREAM
# The outage's length: a minute in the full size (``nox -s sinks``), a few seconds here.
OUTAGE_SECONDS = 60.0 if os.environ.get("OUTBOX_SINK_KILLS") == "full" else 3.0


@pytest.fixture
def app(sqlite_url: str, make_app: Callable[..., Outbox]) -> Outbox:
    """An application on a fresh SQLite database (the mapping is the same on every one)."""
    reset_schema(sqlite_url)
    return make_app(sqlite_url, Settings(poll_interval=0.05, min_retry_after=0.0))


def sink_of(sync: bool, url: str, **options: Any) -> Any:
    return (BulkHTTPSink if sync else AsyncBulkHTTPSink)(url, **options)


def run_once(app: Outbox, sink: Any, events: int = 5, **options: Any) -> BatchResult:
    """Register ``sink``, commit ``events`` and run their one group: what became of it."""
    app.handler(SinkEvent, name="to_api", retry=options.pop("retry", ONCE), **options)(sink)
    commit_events(app.engine, event_rows(events))
    results: list[BatchResult] = []
    worker = Worker(app, burst=True, on_result=results.append)
    worker.run()
    return results[0]


# Whole-call answers: status, headers -> outcome, cause, the wait asked (deferrals).
WHOLE_CALL = [
    pytest.param(200, {}, SUCCEEDED, None, None, id="200"),
    pytest.param(429, {"Retry-After": "7"}, DEFERRED, None, 7.0, id="429-retry-after"),
    pytest.param(429, {}, DEFERRED, None, 30.0, id="429-no-header"),
    pytest.param(503, {"Retry-After": "4"}, DEFERRED, None, 4.0, id="503-retry-after"),
    pytest.param(503, {}, RETRYING, DOWNSTREAM, None, id="503"),
    pytest.param(500, {}, RETRYING, DOWNSTREAM, None, id="500"),
    pytest.param(502, {}, RETRYING, DOWNSTREAM, None, id="502"),
    pytest.param(400, {}, RETRYING, DATA, None, id="400"),
    pytest.param(413, {}, RETRYING, DATA, None, id="413"),
    pytest.param(422, {}, RETRYING, DATA, None, id="422"),
    pytest.param(401, {}, RETRYING, DOWNSTREAM, None, id="401"),
    pytest.param(403, {}, RETRYING, DOWNSTREAM, None, id="403"),
    pytest.param(404, {}, RETRYING, DOWNSTREAM, None, id="404"),
    pytest.param(302, {"Location": "http://127.0.0.1:1/x"}, RETRYING, DOWNSTREAM, None, id="302"),
]


@pytest.mark.parametrize(("status", "headers", "outcome", "cause", "wait"), WHOLE_CALL)
def test_each_whole_call_answer_becomes_its_outcome(
    app: Outbox,
    recording_api: RecordingAPI,
    sync: bool,
    status: int,
    headers: dict[str, str],
    outcome: Outcome,
    cause: FailureCause | None,
    wait: float | None,
) -> None:
    """429 and 503 with Retry-After defer, 400/413/422 are the data's, the rest the
    downstream's; a 2xx is taken."""
    if status != 200:
        recording_api.answer_next(status, {"error": "no"}, headers)
    retry = RetryPolicy(max_attempts=2, base_delay=60)

    result = run_once(app, sink_of(sync, recording_api.url), retry=retry)

    assert (outcome, cause) == (result.outcome, result.cause)
    if wait is not None:
        assert result.retry_after is not None
        assert wait == pytest.approx(result.retry_after, abs=1.0)
    assert [status] == recording_api.statuses  # a redirect is not followed


def test_per_record_statuses_retry_defer_and_discard_each_record(
    app: Outbox, recording_api: RecordingAPI, sync: bool
) -> None:
    """A 2xx listing each record's status: 4xx discarded with the reason, 429 deferred, 5xx
    retried, the rest taken."""
    results = [
        {"status": 200},
        {"status": 422, "reason": "missing email"},
        {"status": 429, "retry_after": 5},
        {"status": 500},
        {"status": 201},
    ]
    recording_api.answer_next(200, {"results": results})

    result = run_once(
        app, sink_of(sync, recording_api.url, result=StatusList()), retry=RetryPolicy(base_delay=60)
    )

    assert (SUCCEEDED, 2, 1, 1, 1) == (
        result.outcome,
        result.succeeded,
        result.discarded,
        result.retried,
        result.deferred,
    )
    with app.engine.connect() as conn:
        errors = conn.execute(select(schema.archive.c.error)).scalars().all()
    assert ["missing email"] == errors


def test_errors_by_id_discard_only_the_named_records(
    app: Outbox, recording_api: RecordingAPI, sync: bool
) -> None:
    """Errors listed by the records' ids: those are discarded, the others taken."""
    app_events = event_rows(4)
    refs = [str(row["ref"]) for row in app_events]
    errors = [{"ref": refs[1], "message": "bad plan"}, {"ref": refs[3], "message": "closed"}]
    recording_api.answer_next(200, {"failed": errors})
    mapper = ErrorsById(items="failed", id="ref", reason="message", record_id=lambda e: e.ref)
    app.handler(SinkEvent, name="to_api", retry=ONCE)(
        sink_of(sync, recording_api.url, result=mapper)
    )
    commit_events(app.engine, app_events)
    results: list[BatchResult] = []

    Worker(app, burst=True, on_result=results.append).run()

    assert (SUCCEEDED, 2, 2) == (results[0].outcome, results[0].succeeded, results[0].discarded)
    with app.engine.connect() as conn:
        errors_kept = set(conn.execute(select(schema.archive.c.error)).scalars())
    assert {"bad plan", "closed"} == errors_kept


def test_an_answer_that_names_a_record_not_sent_fails_the_attempt(
    app: Outbox, recording_api: RecordingAPI
) -> None:
    """A result list that does not match the request is the downstream's failure, not a
    success."""
    recording_api.answer_next(200, {"results": [{"status": 200}]})

    result = run_once(app, sink_of(True, recording_api.url, result=StatusList()))

    assert (Outcome.DEAD, DOWNSTREAM) == (result.outcome, result.cause)
    assert "1 results for the 5 records" in (result.error or "")


def test_a_body_too_big_is_split_into_parts_each_with_its_own_key(
    app: Outbox, recording_api: RecordingAPI, sync: bool
) -> None:
    """Over max_body_bytes, the group goes in halves until each part fits, keyed
    ``<group>.<n>-of-<parts>``; an event too big alone is discarded with the reason."""
    rows = event_rows(8)
    rows[5]["note"] = "x" * 199
    ids = commit_events(app.engine, rows)
    with Session(app.engine) as session:
        events = session.scalars(select(SinkEvent).order_by(SinkEvent.id)).all()
        sizes = [len(json.dumps(records_body([e]), default=json_default)) for e in events]
    cap = max(size for n, size in enumerate(sizes) if n != 5) + 10  # one record a part
    assert sizes[5] > cap
    app.handler(SinkEvent, name="to_api", retry=ONCE)(
        sink_of(sync, recording_api.url, max_body_bytes=cap)
    )
    results: list[BatchResult] = []

    Worker(app, burst=True, on_result=results.append).run()

    group = str(results[0].group_id)
    assert [f"{group}.{n}-of-7" for n in range(1, 8)] == recording_api.keys
    assert sorted(i for n, i in enumerate(ids) if n != 5) == sorted(
        r["id"] for r in recording_api.records
    )
    with app.engine.connect() as conn:
        archived = conn.execute(select(schema.archive.c.status, schema.archive.c.error)).one()
    assert "discarded" == archived.status
    assert f"more than max_body_bytes {cap}" in archived.error


def test_a_host_not_allowed_is_never_called(
    app: Outbox, recording_api: RecordingAPI, sync: bool
) -> None:
    """A url function that names a host outside allowed_hosts fails the attempt, calling
    nothing."""
    sink = sink_of(
        sync, lambda events: "http://169.254.169.254/latest", allowed_hosts=["127.0.0.1"]
    )

    result = run_once(app, sink)

    assert Outcome.DEAD == result.outcome
    assert "http://169.254.169.254/latest is not an allowed host" in (result.error or "")
    assert [] == recording_api.statuses


@pytest.mark.parametrize(
    ("url", "options", "refusal"),
    [
        (lambda events: "http://x/", {}, "needs allowed_hosts"),
        ("ftp://host/x", {}, r"must be http\(s\)://host/"),
        ("http://host/x", {"max_body_bytes": 0}, "max_body_bytes must be an int > 0"),
        ("http://host/x", {"max_body_bytes": True}, "max_body_bytes must be an int > 0"),
        ("http://host/x", {"timeout": "abc"}, "timeout must be seconds > 0"),
        ("http://host/x", {"timeout": 0}, "timeout must be seconds > 0"),
    ],
)
def test_a_wrong_argument_is_refused_where_it_is_passed(
    sync: bool, url: Any, options: dict[str, Any], refusal: str
) -> None:
    """The sink refuses a wrong url or size when it is made, in one line."""
    with pytest.raises(ConfigurationError, match=refusal):
        sink_of(sync, url, **options)


@pytest.mark.parametrize("how", ["headers", "auth"])
def test_secrets_never_show_in_a_failure(
    app: Outbox, recording_api: RecordingAPI, sync: bool, how: str
) -> None:
    """A 500 whose body echoes the credentials and a url's api key: the recorded error masks
    them, whether given as a header or by an httpx.Auth."""
    if how == "headers":
        options: dict[str, Any] = {"headers": {"Authorization": f"Bearer {SECRET}"}}
        credentials = f"Bearer {SECRET}"
    else:
        options = {"auth": httpx.BasicAuth("app", SECRET)}
        credentials = httpx.BasicAuth("app", SECRET)._auth_header
    recording_api.answer_next(500, {"error": f"bad credentials {credentials} for key {SECRET}"})
    url = f"{recording_api.url}?api_key={SECRET}"

    result = run_once(app, sink_of(sync, url, **options))

    with app.engine.connect() as conn:
        dead = conn.execute(select(schema.archive.c.error).distinct()).scalar_one()
    shown = (SECRET in dead, credentials in dead, SECRET in str(result), credentials in str(result))
    assert (Outcome.DEAD, False, False, False, False) == (result.outcome, *shown)
    assert "500 Internal Server Error" in dead


@pytest.mark.parametrize("how", ["headers", "auth"])
def test_credentials_go_by_headers_or_an_httpx_auth(
    app: Outbox, recording_api: RecordingAPI, sync: bool, how: str
) -> None:
    """A token in ``headers`` or an ``httpx.Auth`` reaches the API on every request."""
    if how == "headers":
        options: dict[str, Any] = {"headers": {"Authorization": f"Bearer {SECRET}"}}
        expected = f"Bearer {SECRET}"
    else:
        options = {"auth": httpx.BasicAuth("app", SECRET)}
        expected = httpx.BasicAuth("app", SECRET)._auth_header

    result = run_once(app, sink_of(sync, recording_api.url, **options))

    assert (SUCCEEDED, [expected]) == (result.outcome, recording_api.authorizations)


def test_a_timeout_is_the_downstreams_failure(
    app: Outbox, recording_api: RecordingAPI, sync: bool
) -> None:
    """An API slower than the sink's timeout: the attempt fails, counted for the breaker."""
    recording_api.delay = 1.0

    result = run_once(app, sink_of(sync, recording_api.url, timeout=0.2))

    assert (Outcome.DEAD, DOWNSTREAM) == (result.outcome, result.cause)
    assert "ReadTimeout" in (result.error or "")


def test_an_outage_opens_the_breaker_and_loses_nothing(
    app: Outbox, recording_api: RecordingAPI, sync: bool
) -> None:
    """503s without Retry-After for a while (a minute in the full size): the breaker opens,
    then closes once the API is back; every event is taken exactly once, none reported done
    before it was."""
    app.settings = Settings(poll_interval=0.05, min_retry_after=0.0, rescue_interval=0.2)
    breaker = CircuitBreaker(failures=2, probe_after=0.5, max_probe_after=1.0)
    app.handler(SinkEvent, name="to_api", batch_size=10, retry=SOON, circuit_breaker=breaker)(
        sink_of(sync, recording_api.url)
    )
    ids = commit_events(app.engine, event_rows(100))
    recording_api.answer_for(OUTAGE_SECONDS, 503, {"error": "maintenance"})
    worker = Worker(app, concurrency=2)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: _trips(app) > 0, "the breaker to open")
        assert [] == recording_api.records  # nothing taken while the API is down
        wait_for(lambda: len(recording_api.records) == len(ids), "every event", OUTAGE_SECONDS + 30)
        wait_for(lambda: _breaker_closed(app), "the breaker to close")
    finally:
        worker.stop()
        thread.join(10)
    assert sorted(ids) == sorted(r["id"] for r in recording_api.records)
    with app.engine.connect() as conn:
        left = conn.execute(select(func.count()).select_from(SinkEvent)).scalar_one()
    assert 0 == left


def _trips(app: Outbox) -> int:
    with app.engine.connect() as conn:
        trips = conn.execute(select(schema.handlers.c.trips)).scalar()
    return int(trips or 0)


def _breaker_closed(app: Outbox) -> bool:
    return metrics.collect(app)[0].breaker == "closed"


BASIC = httpx.BasicAuth("app", SECRET)._auth_header
"""The header basic auth sends: ``Basic <base64 of app:password>``."""
# What the API echoes of each kind of credentials, without a space (it goes in headers
# too): the token alone, without "Bearer "; basic auth's base64, user:password and password.
ECHOES = {
    "bearer": SECRET,
    "basic": f"{BASIC.split()[1]}/app:{SECRET}/{SECRET}",
}
QUERY_KEY = "k3y-in-the-query"
"""An api key the sink's url carries in its query (httpx logs the url it calls)."""
# The parts of each that must never show.
PARTS = {"bearer": [SECRET, QUERY_KEY], "basic": [SECRET, BASIC.split()[1], QUERY_KEY]}


def _credentials(how: str) -> dict[str, Any]:
    if how == "bearer":
        return {"headers": {"Authorization": f"Bearer {SECRET}"}}
    return {"auth": httpx.BasicAuth("app", SECRET)}


# Every answer the sink quotes something of: (status, body, headers, result mapper) for an
# API that echoes ``echo``.
QUOTING_ANSWERS: dict[str, Callable[[str], tuple[int, Any, dict[str, str], Any]]] = {
    "2xx-not-json": lambda echo: (
        200, f"<html>denied: {echo}</html>".encode(), {"Content-Type": "text/html"}, StatusList()
    ),
    "2xx-json-without-the-list": lambda echo: (200, {"message": f"token {echo}"}, {}, StatusList()),
    "3xx-location": lambda echo: (
        302, {}, {"Location": f"http://127.0.0.1:1/login?token={echo}"}, None
    ),
    "5xx-body": lambda echo: (500, {"error": f"invalid token {echo}"}, {}, None),
    "4xx-data-body": lambda echo: (422, {"error": f"invalid token {echo}"}, {}, None),
    "4xx-body": lambda echo: (401, {"error": f"invalid token {echo}"}, {}, None),
    "reason-phrase": lambda echo: (500, {}, {REASON: f"Bad token {echo}"}, None),
    "429-retry-after": lambda echo: (429, {}, {"Retry-After": echo}, None),
    "503-retry-after": lambda echo: (503, {}, {"Retry-After": echo}, None),
    "a-result-not-an-object": lambda echo: (
        200, {"results": [f"token {echo}"] * 5}, {}, StatusList()
    ),
    "a-status-not-a-number": lambda echo: (
        200, {"results": [{"status": echo}] * 5}, {}, StatusList()
    ),
    "a-record-reason": lambda echo: (
        200, {"results": [{"status": 422, "reason": f"token {echo}"}] * 5}, {}, StatusList()
    ),
    "a-record-retry-reason": lambda echo: (
        200, {"results": [{"status": 500, "reason": f"token {echo}"}] * 5}, {}, StatusList()
    ),
    "a-record-retry-after": lambda echo: (
        200, {"results": [{"status": 429, "retry_after": echo}] * 5}, {}, StatusList()
    ),
    "an-error-naming-a-record-not-sent": lambda echo: (
        200, {"errors": [{"id": echo}]}, {}, ErrorsById()
    ),
}  # fmt: skip


@pytest.mark.parametrize("how", ["bearer", "basic"])
@pytest.mark.parametrize("answer", list(QUOTING_ANSWERS))
def test_no_part_of_a_secret_shows_whatever_the_api_answers(
    app: Outbox,
    recording_api: RecordingAPI,
    sync: bool,
    how: str,
    answer: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An API that echoes the credentials (the token alone, basic auth's parts) in any answer
    the sink quotes: no part of them, nor the url's api key, shows in the archive, the
    attempts, the error raised or the logs (httpx's and httpcore's included)."""
    status, body, headers, result = QUOTING_ANSWERS[answer](ECHOES[how])
    recording_api.answer_next(status, body, headers)
    options = _credentials(how) | ({} if result is None else {"result": result})
    caplog.set_level(logging.DEBUG)

    with capture_logs() as logs:
        outcome = run_once(app, sink_of(sync, f"{recording_api.url}?key={QUERY_KEY}", **options))

    with app.engine.connect() as conn:
        archived = conn.execute(select(schema.archive.c.error)).scalars().all()
        attempts = conn.execute(select(schema.attempts.c.error)).scalars().all()
    places = {
        "archive": " ".join(e or "" for e in archived),
        "attempts": " ".join(e or "" for e in attempts),
        "error raised": f"{outcome.error} {outcome}",
        "logs": f"{logs} {caplog.text}",
    }
    shown = {where: part for where, text in places.items() for part in PARTS[how] if part in text}
    quoted_masked = MASK in " ".join(places.values())
    assert ([status], {}, True) == (recording_api.statuses, shown, quoted_masked)
