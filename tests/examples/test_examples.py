"""The examples run end to end on SQLite and PostgreSQL and do what their READMEs promise.

Each example's ``main()`` runs once per database (a module-scoped fixture: a run takes seconds,
a retry after a 429 waits for its backoff); the tests then read that run's outcome from the
fake API, the fake mailer and the database itself.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from examples.contact_sync import run as contact_sync_run
from examples.employee_flags import run as employee_flags_run
from examples.marketing_sync import run as marketing_run
from examples.marketing_sync.app import (
    API_CALLS_PER_SECOND,
    HANDLER_NAME,
    Contact,
    ContactActivity,
)
from examples.marketing_sync.fake_api import Call, FakeMarketingAPI
from examples.order_fanout import run as order_fanout_run
from examples.signup_email import app as signup_app
from examples.signup_email import run as signup_run
from examples.signup_email.app import EmailConfirmationEvent, User, send_confirmation_emails
from examples.signup_email.mailer import Message
from outbox import schema
from tests.conftest import reset_schema

REPOSITORY = Path(__file__).resolve().parents[2]
MARKETING_EVENTS = 1200
SIGNUPS = 600
SUBPROCESS_TIMEOUT_SECONDS = 120


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def example_database(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> str:
    """An empty database of each kind: a fresh SQLite file, or the session's PostgreSQL reset.

    Module-scoped, so the session-scoped ``postgres_url`` (what ``postgres_database`` resets
    per test) is reset here once; the examples create their own tables in it.
    """
    if request.param == "postgresql":
        url: str = request.getfixturevalue("postgres_url")
        reset_schema(url)
        return url
    return f"sqlite:///{tmp_path_factory.mktemp('example')}/example.sqlite3"


def _archived(url: str, handler: str) -> list[dict[str, Any]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(schema.archive).where(schema.archive.c.handler == handler))
            return [dict(row._mapping) for row in rows]
    finally:
        engine.dispose()


# --- marketing sync ----------------------------------------------------------------------------


@dataclass(frozen=True)
class MarketingRun:
    """One run of the marketing example and what the API and the database saw."""

    rate_limit: int | None
    summary: dict[str, int | float]
    calls: list[Call]
    received: Counter[str]
    committed: set[str]
    """Ids of the activities the database holds: those whose transaction committed."""
    without_email: set[str]
    """Committed activities of contacts with no email: the API rejects them."""
    archived: list[dict[str, Any]]


@pytest.fixture(scope="module")
def marketing(example_database: str) -> MarketingRun:
    """Run the marketing example once; on SQLite against an API allowing one call per second,
    stricter than the limit the handler keeps to.

    Two groups of 1,000 sent by four workers: the second call is rate limited, and its group
    waits for the API's Retry-After (a second) without using an attempt.
    """
    rate_limit = 1 if example_database.startswith("sqlite") else None
    with FakeMarketingAPI(rate_limit=rate_limit) as api:
        summary = marketing_run.main(example_database, events=MARKETING_EVENTS, api=api)
    engine = create_engine(example_database)
    try:
        with Session(engine) as session:
            rows = session.execute(
                select(ContactActivity.id, Contact.email).join(
                    Contact, Contact.id == ContactActivity.contact_id
                )
            ).all()
    finally:
        engine.dispose()
    return MarketingRun(
        rate_limit=rate_limit,
        summary=summary,
        calls=api.calls,
        received=api.received,
        committed={str(activity_id) for activity_id, _ in rows},
        without_email={str(activity_id) for activity_id, email in rows if email is None},
        archived=_archived(example_database, HANDLER_NAME),
    )


def test_marketing_every_deliverable_activity_reaches_the_api(marketing: MarketingRun) -> None:
    """Every committed activity of a contact with an email was received by the API."""
    assert marketing.committed - marketing.without_email == set(marketing.received)


def test_marketing_no_activity_is_received_twice(marketing: MarketingRun) -> None:
    """No record was taken twice, retries after a 429 included."""
    assert [] == [i for i, n in marketing.received.items() if n != 1]


def test_marketing_rolled_back_activities_never_reach_the_api(marketing: MarketingRun) -> None:
    """Transactions rolled back, and none of their events reached the API."""
    assert marketing.summary["events_rolled_back"] > 0
    assert set() == set(marketing.received) - marketing.committed
    assert MARKETING_EVENTS == marketing.summary["events_written"] == len(marketing.committed)


def test_marketing_calls_are_bulk(marketing: MarketingRun) -> None:
    """At most 1,000 records per call, and one call per 1,000 events, plus a few retries."""
    assert max(call.records for call in marketing.calls) <= 1000
    assert {200, 429} >= {call.status for call in marketing.calls}
    accepted_calls = [call for call in marketing.calls if call.status == 200]
    assert math.ceil(MARKETING_EVENTS / 1000) == len(accepted_calls)
    assert len(marketing.calls) < MARKETING_EVENTS / 100


def test_marketing_rate_limited_groups_are_retried(marketing: MarketingRun) -> None:
    """Calls refused with 429 happen only under the API's stricter limit, their groups still
    arrive, and no 429 cost a group an attempt or a dead letter."""
    assert (marketing.rate_limit is not None) == (marketing.summary["api_calls_rate_limited"] > 0)
    assert (0, 0) == (marketing.summary["events_pending"], marketing.summary["dead"])


def test_marketing_keeps_to_the_platforms_documented_limit(marketing: MarketingRun) -> None:
    """The handler's RateLimit: no second saw more calls than the platform allows."""
    assert marketing.summary["most_calls_in_a_second"] <= API_CALLS_PER_SECOND


def test_marketing_rejected_records_are_archived_as_discarded(marketing: MarketingRun) -> None:
    """Activities of contacts without an email end in the archive as discarded, with the reason."""
    # SQLite keeps a UUID as 32 hex digits, PostgreSQL's JSON with dashes: compare as UUIDs.
    archived = {str(uuid.UUID(row["payload"]["activity_id"])): row for row in marketing.archived}
    outcomes = {(row["status"], row["error"]) for row in archived.values()}
    assert marketing.without_email  # the run has some, or this test proves nothing
    assert marketing.without_email == set(archived)
    assert {("discarded", "missing email")} == outcomes
    assert len(archived) == marketing.summary["discarded"]


def test_marketing_run_py_runs_as_a_script(tmp_path: Path) -> None:
    """``python examples/marketing_sync/run.py`` exits 0 and prints its summary."""
    env = {**os.environ, "OUTBOX_DATABASE_URL": f"sqlite:///{tmp_path}/marketing.sqlite3"}
    completed = subprocess.run(
        [sys.executable, "examples/marketing_sync/run.py", "--events", "1000"],
        cwd=REPOSITORY,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_SECONDS,
        check=False,
    )
    assert 0 == completed.returncode, completed.stderr
    assert "records_received" in completed.stdout


# --- signup email ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SignupRun:
    """One run of the signup example and what the mailer and the database saw."""

    summary: dict[str, int | float]
    batches: list[list[Message]]
    users: dict[str, tuple[str, str]]
    """Email address -> (name, confirmation token) of every user in the database."""
    archived: list[dict[str, Any]]


@pytest.fixture(scope="module")
def signup(example_database: str) -> SignupRun:
    """Run the signup example once."""
    summary = signup_run.main(example_database, signups=SIGNUPS)
    batches = signup_app.mailer.batches
    engine = create_engine(example_database)
    try:
        with Session(engine) as session:
            users = {
                user.email: (user.name, user.confirmation_token)
                for user in session.scalars(select(User))
            }
    finally:
        engine.dispose()
    return SignupRun(
        summary=summary,
        batches=batches,
        users=users,
        archived=_archived(example_database, send_confirmation_emails.__name__),
    )


def test_signup_every_user_gets_one_confirmation_email(signup: SignupRun) -> None:
    """One email per user, to their address, carrying their own token."""
    sent = [message for batch in signup.batches for message in batch]
    assert sorted(signup.users) == sorted(message.to for message in sent)
    for message in sent:
        assert f"token={signup.users[message.to][1]}" in message.body


def test_signup_failed_signups_leave_no_user_and_no_event(signup: SignupRun) -> None:
    """A signup that failed on a taken address left no user row and no email event."""
    summary = signup.summary
    assert summary["signups_failed"] > 0
    assert SIGNUPS == summary["users_created"] + summary["signups_failed"]
    assert summary["users_created"] == summary["users_in_database"] == len(signup.users)
    assert summary["users_created"] == summary["events_buffered"]
    # A taken address still belongs to the earlier signup, not to the one that failed.
    first = signup_run.DUPLICATE_EVERY - 1
    assert f"User {first}" == signup.users[f"user{first}@example.com"][0]


def test_signup_emails_go_out_in_bulk(signup: SignupRun) -> None:
    """The emails took one provider call per 500, not one per email."""
    assert [min(500, len(signup.users) - i) for i in range(0, len(signup.users), 500)] == [
        len(batch) for batch in signup.batches
    ]


def test_signup_buffer_is_drained(signup: SignupRun) -> None:
    """Nothing is left in the buffer and nothing was archived (no failure, no discard)."""
    assert 0 == signup.summary["events_pending"]
    assert [] == signup.archived


def test_signup_duplicate_email_writes_neither_row(example_database: str) -> None:
    """A duplicate signup's COMMIT fails, and neither its user nor its event is written."""
    signup_app.app.use_database(example_database)
    try:
        signup_run.reset_tables()
        with Session(signup_app.app.engine) as session, session.begin():
            signup_app.sign_up(session, "taken@example.com", "First")
        with (
            pytest.raises(IntegrityError),
            Session(signup_app.app.engine) as session,
            session.begin(),
        ):
            signup_app.sign_up(session, "taken@example.com", "Second")
        with Session(signup_app.app.engine) as session:
            names = session.scalars(select(User.name)).all()
            events = session.scalar(select(func.count()).select_from(EmailConfirmationEvent))
    finally:
        signup_app.app.engine.dispose()
    assert (["First"], 1) == (names, events)


# --- the fake API the marketing tests rely on ---------------------------------------------------


def test_fake_api_counts_a_record_taken_twice() -> None:
    """A record sent again under a new key counts twice, so a duplicate delivery would show."""
    record = {"id": "a1", "email": "a@example.com"}
    with FakeMarketingAPI() as api:
        for key in ("g:1", "g:1", "g:2"):
            api.handle_bulk(key, [record])
        assert Counter({"a1": 2}) == api.received


def test_fake_api_refuses_more_than_max_records() -> None:
    """A call over the record limit is refused whole with 413."""
    records = [{"id": str(n), "email": "e@example.com"} for n in range(1001)]
    with FakeMarketingAPI() as api:
        assert 413 == api.handle_bulk("k", records)[0]
        assert Counter() == api.received


def test_fake_api_answers_an_account_over_its_limit_record_by_record() -> None:
    """Per account: the records of an account with no room left are answered 429 one by one
    with the seconds until it has room, the others are taken; a call counts against the
    accounts it had room for; an account on a smaller plan has its own limit."""
    records = [
        {"id": "a1", "account_id": 1, "email": "a@example.com"},
        {"id": "b1", "account_id": 2, "email": "b@example.com"},
        {"id": "b2", "account_id": 2, "email": None},
    ]
    with FakeMarketingAPI(account_limit=2, account_limits={"2": 1}) as api:
        api.handle_bulk("k1", records[:1])
        api.handle_bulk("k2", records[1:2])
        status, body, _ = api.handle_bulk("k3", records)
        calls = api.calls
        results = {result["id"]: result for result in body["results"]}
        assert (200, 1) == (status, body["accepted"])
        assert {"id": "a1", "status": 200} == results["a1"]
        assert {"id": "b1", "status": 429, "retry_after": 1} == results["b1"]
        assert (429, []) == (results["b2"]["status"], body["rejected"])
        assert (("a1",), ("b1", "b2"), ("1",)) == (
            calls[-1].taken,
            calls[-1].throttled,
            calls[-1].accounts,
        )
        assert (2, 1, 2) == (
            api.most_calls_in_a_second("1"),
            api.most_calls_in_a_second("2"),
            api.limit_of("1"),
        )


def test_fake_api_rejects_invalid_records_with_422() -> None:
    """A record without an email is rejected for good: 422 with the reason, in results and in
    rejected; the call is 200."""
    records = [{"id": "a1", "email": "a@example.com"}, {"id": "a2", "email": None}]
    with FakeMarketingAPI() as api:
        status, body, _ = api.handle_bulk("k", records)
        assert (200, {"a2": "missing email"}) == (status, api.rejected)
        assert [{"id": "a2", "reason": "missing email"}] == body["rejected"]
        assert {"id": "a2", "status": 422, "reason": "missing email"} == body["results"][1]


def test_fake_api_answers_503_with_retry_after_during_an_outage() -> None:
    """During an outage every call is 503 with Retry-After in whole seconds, nothing taken."""
    with FakeMarketingAPI() as api:
        api.outage(1.5)
        status, _, headers = api.handle_bulk("k", [{"id": "a1", "email": "a@example.com"}])
        assert (503, {"Retry-After": "2"}, Counter()) == (status, headers, api.received)


# --- contact sync ------------------------------------------------------------------------------


def test_contact_sync_sends_each_contact_once_in_its_latest_state(example_database: str) -> None:
    """1,000 renames of 50 contacts, drained at once: one call of 50 records, each contact's
    last name, and the 950 older states archived as superseded."""
    summary = contact_sync_run.main(example_database)
    assert {
        "changes": 1000,
        "records sent": 50,
        "calls": 1,
        "superseded": 950,
        "contacts the CRM holds in their latest state": 50,
    } == summary


def test_order_fanout_hands_every_order_to_each_consumer_and_no_pause_holds_the_others(
    example_database: str,
) -> None:
    """300 orders shipped with the partner's consumer paused: the search index and analytics
    hold all 300 while the partner holds none; resumed through two failed calls, the partner
    gets each order once, and every buffer is empty."""
    assert {
        "orders shipped": 300,
        "search index entries": 300,
        "analytics rows": 300,
        "partner orders while paused": 0,
        "copies waiting for the partner": 300,
        "partner orders": 300,
        "distinct partner orders": 300,
        "rows left in every buffer": 0,
    } == order_fanout_run.main(example_database)


def test_employee_flags_sends_each_renamed_employee_and_leaves_no_flag(
    example_database: str,
) -> None:
    """300 of 500 employees renamed, payroll failing twice: the 300 new names reach payroll
    in 3 calls of 100, the others are never sent, and no flag is left."""
    assert {
        "employees": 500,
        "renamed": 300,
        "payroll holds, with the new name": 300,
        "employees sent that nobody renamed": 0,
        "successful calls": 3,
        "flags left": 0,
    } == employee_flags_run.main(example_database)
