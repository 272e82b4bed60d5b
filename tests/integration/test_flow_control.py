"""Flow control: RetryAfter defers a group without using an attempt and pauses its handler;
pauses hold a handler's work across the fleet; partial deferrals with ``batch.retry(after=)``.
On SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import structlog
from sqlalchemy import func, select, update

from outbox import Batch, ConfigurationError, Outbox, RetryAfter, RetryPolicy, schema
from outbox._db import queries
from outbox.ops import flow
from outbox.retry import DEFAULT_RETRY_AFTER_SECONDS
from outbox.testing import drain
from outbox.worker import Worker
from tests._support import JULIANDAY_ERROR, NO_RETRY_AFTER_FLOOR, wait_for
from tests.models import ActivityEvent

NO_WAIT = RetryPolicy(max_attempts=2, scale=0.0, base_delay=0.0, jitter=0.0)

Commit = Callable[..., list[int]]


def _jobs(app: Outbox) -> list[dict[str, Any]]:
    """Every job, with its ``run_at`` as seconds from the database's now."""
    with app.engine.connect() as conn:
        now = queries.database_now(conn)
        rows = conn.execute(select(schema.jobs).order_by(schema.jobs.c.id)).mappings().all()
    return [{**row, "due_in": _seconds(row["run_at"], now)} for row in rows]


def _seconds(moment: dt.datetime, now: dt.datetime) -> float:
    return (_utc(moment) - _utc(now)).total_seconds()


def _utc(moment: dt.datetime) -> dt.datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.UTC)


def _buffered(app: Outbox) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(ActivityEvent)).scalar_one())


def _archived(app: Outbox) -> list[tuple[str, str | None]]:
    with app.engine.connect() as conn:
        rows = conn.execute(select(schema.archive.c.status, schema.archive.c.error))
        return [(status, error) for status, error in rows]


def test_retry_after_defers_the_group_without_using_an_attempt(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """The group waits at least the Retry-After (and at most a tenth more), its attempt is
    not counted but its deferral is, and the handler is paused fleet-wide until then."""
    app = make_app(database_url)

    @app.handler(ActivityEvent, batch_size=10, retry=NO_WAIT)
    def limited(batch: Batch[ActivityEvent]) -> None:
        raise RetryAfter("30", reason="429 Too Many Requests")

    commit_events(app.engine, 3)
    stats = drain(app).stats
    (job,) = _jobs(app)
    pause = flow.paused(app)["limited"]
    assert (stats.groups_deferred, job["attempts"], job["deferrals"]) == (1, 0, 1)
    assert 29 < job["due_in"] <= 33.1
    assert job["last_error"].startswith("RetryAfter: retry after 30 s: 429 Too Many Requests")
    assert (
        pause.cause,
        pause.seconds_left is not None and 29 < pause.seconds_left <= 30 + JULIANDAY_ERROR,
    ) == (
        flow.PauseCause.RETRY_AFTER,
        True,
    )
    assert 3 == _buffered(app)


def test_a_deferred_group_is_handled_once_its_wait_is_over(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """After the wait, the group comes back as attempt 1: the deferral used no attempt."""
    app = make_app(database_url)
    attempts: list[int] = []

    @app.handler(ActivityEvent, batch_size=10, retry=NO_WAIT)
    def limited(batch: Batch[ActivityEvent]) -> None:
        attempts.append(batch.attempt)
        if len(attempts) == 1:
            raise RetryAfter(0.3)

    commit_events(app.engine, 3)
    drain(app)
    wait_for(lambda: not flow.paused(app) and drain(app).stats.groups_succeeded, "the retry")
    assert ([1, 1], 0) == (attempts, _buffered(app))


@pytest.mark.parametrize("how", ["raise", "retry"])
def test_deferrals_past_max_deferrals_count_as_failed_attempts(
    how: str, database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """A group cannot be deferred forever, whether the handler defers it whole (``raise
    RetryAfter``) or event by event (``batch.retry(after=)``): past ``max_deferrals`` each
    deferral is a failed attempt, and the group ends dead once its attempts are spent."""
    app = make_app(database_url, NO_RETRY_AFTER_FLOOR)
    calls: list[int] = []
    policy = RetryPolicy(max_attempts=2, scale=0.0, base_delay=0.0, jitter=0.0, max_deferrals=2)

    @app.handler(ActivityEvent, batch_size=10, retry=policy)
    def limited(batch: Batch[ActivityEvent]) -> None:
        calls.append(batch.attempt)
        if how == "raise":
            raise RetryAfter(0)
        batch.retry(batch.events, "rate limited", after=0)

    commit_events(app.engine, 2)
    drain(app)
    (status, error), *_ = _archived(app)
    # Two deferrals (attempt 1 twice, uncounted), then attempts 1 and 2 counted.
    assert ([1, 1, 1, 2], "dead", 0) == (calls, status, _buffered(app))
    assert "its 2 deferrals are spent" in (error or "")


def test_a_paused_handlers_jobs_are_not_leased_until_it_is_resumed(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    app = make_app(database_url)
    handled: list[int] = []

    @app.handler(ActivityEvent, batch_size=10)
    def sink(batch: Batch[ActivityEvent]) -> None:
        handled.extend(batch.ids)

    flow.pause(app, "sink", reason="maintenance window")
    ids = commit_events(app.engine, 4)
    first = drain(app)
    paused = flow.paused(app)["sink"]
    assert ([], 4) == (handled, _buffered(app))
    assert (paused.cause, paused.reason, paused.seconds_left) == (
        flow.PauseCause.OPERATOR,
        "maintenance window",
        None,
    )
    assert first.stats.groups_succeeded == 0
    assert flow.resume(app, "sink") is True
    drain(app)
    assert (ids, 0, {}) == (handled, _buffered(app), flow.paused(app))


def test_a_pause_with_an_end_ends_by_itself(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    app = make_app(database_url)
    handled: list[int] = []

    @app.handler(ActivityEvent, batch_size=10)
    def sink(batch: Batch[ActivityEvent]) -> None:
        handled.extend(batch.ids)

    flow.pause(app, "sink", until=dt.timedelta(seconds=0.5))
    commit_events(app.engine, 2)
    drain(app)
    assert [] == handled
    wait_for(lambda: drain(app).stats.groups_succeeded, "the pause to end")
    assert (2, {}) == (len(handled), flow.paused(app))


def test_a_retry_after_never_shortens_an_operators_pause(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    app = make_app(database_url)
    app.handler(ActivityEvent, name="sink")(lambda batch: None)
    flow.pause(app, "sink", reason="by hand")
    with app.engine.begin() as conn:
        written = queries.pause_handler(
            conn,
            app.dialect,
            "sink",
            seconds=5,
            cause=schema.PauseCause.RETRY_AFTER,
            reason="429",
            only_to_extend=True,
        )
    pause = flow.paused(app)["sink"]
    assert (False, flow.PauseCause.OPERATOR, None) == (written, pause.cause, pause.seconds_left)


def test_a_later_retry_after_extends_an_automatic_pause_an_earlier_one_does_not(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    app = make_app(database_url)
    app.handler(ActivityEvent, name="sink")(lambda batch: None)

    def retry_after(seconds: float) -> bool:
        with app.engine.begin() as conn:
            return queries.pause_handler(
                conn,
                app.dialect,
                "sink",
                seconds=seconds,
                cause=schema.PauseCause.RETRY_AFTER,
                reason=f"{seconds}",
                only_to_extend=True,
            )

    assert (True, False, True) == (retry_after(60), retry_after(10), retry_after(120))
    left = flow.paused(app)["sink"].seconds_left
    assert 110 < (left or 0) <= 120 + JULIANDAY_ERROR  # see tests/_support.py


def test_a_group_claimed_for_a_paused_handler_goes_back_unattempted(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """A worker that claims a group of a handler paused meanwhile (a direct claim, or a claim
    job leased before the pause) hands it to no handler: the job goes back, uncounted."""
    app = make_app(database_url)
    handled: list[int] = []

    @app.handler(ActivityEvent, batch_size=10)
    def sink(batch: Batch[ActivityEvent]) -> None:
        handled.extend(batch.ids)

    commit_events(app.engine, 3)
    flow.pause(app, "sink")
    worker = Worker(app, concurrency=1)
    worker._flow.refresh()
    worker._claim_directly("sink")
    (job,) = _jobs(app)
    assert ([], 0, None, schema.JobKind.BATCH) == (
        handled,
        job["attempts"],
        job["lease_token"],
        job["kind"],
    )


def test_retry_with_after_defers_those_events_and_retries_the_others(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """``batch.retry(events, reason, after=)``: those events wait at least ``after`` in a group
    of their own, uncounted; events retried without it follow the backoff, counted."""
    app = make_app(database_url)
    policy = RetryPolicy(max_attempts=5, scale=0.0, base_delay=1.0, jitter=0.0)

    @app.handler(ActivityEvent, batch_size=10, retry=policy)
    def partial(batch: Batch[ActivityEvent]) -> None:
        first, second, *_ = batch.events
        batch.retry([first], "429 for this account", after=40)
        batch.retry([second], "500")

    ids = commit_events(app.engine, 4)
    stats = drain(app).stats
    jobs = sorted(_jobs(app), key=lambda job: job["due_in"])
    with app.engine.connect() as conn:
        rows = conn.execute(select(ActivityEvent.group_id, ActivityEvent.id)).all()
    groups: dict[uuid.UUID, list[int]] = {}
    for group_id, event_id in rows:
        groups.setdefault(group_id, []).append(event_id)
    retried, deferred = jobs
    assert (stats.events_succeeded, stats.events_retried, stats.events_deferred) == (2, 1, 1)
    assert (retried["attempts"], retried["deferrals"], groups[retried["group_id"]]) == (
        1,
        0,
        [ids[1]],
    )
    assert (deferred["attempts"], deferred["deferrals"], groups[deferred["group_id"]]) == (
        0,
        1,
        [ids[0]],
    )
    # Read a moment after the drain: on a loaded machine, up to half a second later.
    assert (True, True) == (0.5 < retried["due_in"] <= 1.1, 38.5 < deferred["due_in"] <= 44.1)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (7, 7.0),
        (2.5, 2.5),
        ("7", 7.0),
        (" 120 ", 120.0),
        (dt.timedelta(minutes=2), 120.0),
        (-3, 0.0),
        (0, 0.0),
        ("0", 0.0),
        (dt.timedelta(0), 0.0),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
    ],
)
def test_retry_after_takes_seconds_a_timedelta_or_the_header(value: Any, expected: float) -> None:
    """What the downstream asked; zero, negative and past values ask for nothing, and the
    worker's floor applies (``Settings.min_retry_after``)."""
    assert expected == RetryAfter(value).seconds


@pytest.mark.parametrize("zone", ["GMT", "+0000", "-0000"])
def test_retry_after_takes_an_http_date_and_an_aware_datetime(zone: str) -> None:
    """An HTTP date is in GMT, whichever way it says so (``-0000``: no zone given)."""
    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=90)
    header = later.strftime(f"%a, %d %b %Y %H:%M:%S {zone}")
    assert 85 < RetryAfter(header).seconds <= 90
    assert 85 < RetryAfter(later).seconds <= 90


@pytest.mark.parametrize(
    "value", [1e12, dt.timedelta(days=400), dt.datetime(9999, 12, 31, tzinfo=dt.UTC)]
)
def test_retry_after_refuses_more_than_a_year(value: Any) -> None:
    """Past a year a wait is a typo, and past the year 9999 no database can keep its end:
    raised in a handler, the refusal fails the attempt with this message."""
    with pytest.raises(ValueError, match=r"RetryAfter: after: .*more than outbox waits for"):
        RetryAfter(value)


@pytest.mark.parametrize(
    "header", ["soon", "", "12 s", "Fri, 31 Dec 9999 23:59:59 GMT", "40000000", "nan", "inf"]
)
def test_an_unreadable_retry_after_header_waits_the_default_with_a_warning(header: str) -> None:
    """A downstream's broken header is not the handler's error: the deferral waits the stated
    default, and a warning names the value."""
    with structlog.testing.capture_logs() as logs:
        assert RetryAfter(header).seconds == DEFAULT_RETRY_AFTER_SECONDS == 30.0
    assert [(e["event"], e["value"]) for e in logs] == [("outbox.retry_after.unreadable", header)]


def test_a_pause_longer_than_a_year_is_refused(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Asked of the database, a pause into the year 33658 would be stored without an end on
    SQLite and refused by the others: it is refused before, the same everywhere."""
    app = make_app(database_url)
    app.handler(ActivityEvent, name="sink")(lambda batch: None)
    for until in (1e12, dt.datetime(9999, 12, 31, tzinfo=dt.UTC)):
        with pytest.raises(ConfigurationError, match="more than outbox waits"):
            flow.pause(app, "sink", until=until)
    assert {} == flow.paused(app)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (dt.datetime(2030, 1, 1), ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (None, TypeError),
        (True, TypeError),
        ({"retry_after": 5}, TypeError),
        (b"5", TypeError),
    ],
)
def test_retry_after_refuses_what_is_not_a_time(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"RetryAfter: after"):
        RetryAfter(value)


@pytest.mark.parametrize("reason", [{"code": 429}, 429, b"busy"])
def test_retry_after_refuses_a_reason_that_is_not_text(reason: Any) -> None:
    with pytest.raises(TypeError, match="RetryAfter: reason must be a str or None, got"):
        RetryAfter(5, reason=reason)


def test_pause_and_resume_refuse_an_unknown_handler(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    app = make_app(database_url)
    app.handler(ActivityEvent, name="sink")(lambda batch: None)
    with pytest.raises(Exception, match="unknown handler 'nope'; known handlers: sink"):
        flow.pause(app, "nope")
    with pytest.raises(Exception, match="unknown handler 'nope'"):
        flow.resume(app, "nope")
    assert flow.resume(app, "sink") is False


def test_resume_of_a_handler_never_paused_writes_nothing_it_needs(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    app = make_app(database_url)
    app.handler(ActivityEvent, name="sink")(lambda batch: None)
    assert (False, {}) == (flow.resume(app, "sink"), flow.paused(app))


# --- bisection ---------------------------------------------------------------------------------


def test_bisect_isolates_a_poison_event_and_delivers_the_rest(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """A group of 16 with one event the downstream refuses whole calls for: halved on each
    failed attempt (16, 8, 4, 2, 1), the 15 others are delivered and the poison event ends dead
    alone once its attempts are spent."""
    app = make_app(database_url)
    delivered: list[int] = []
    policy = RetryPolicy(max_attempts=6, scale=0.0, base_delay=0.0, jitter=0.0)

    @app.handler(ActivityEvent, batch_size=16, retry=policy, bisect=True)
    def picky(batch: Batch[ActivityEvent]) -> None:
        if any(event.kind == "poison" for event in batch.events):
            raise RuntimeError("400: a record of this call could not be read")
        delivered.extend(batch.ids)

    ids = commit_events(app.engine, 16)
    poison = ids[5]
    with app.engine.begin() as conn:
        conn.execute(update(ActivityEvent).where(ActivityEvent.id == poison).values(kind="poison"))
    drain(app)
    with app.engine.connect() as conn:
        dead = (
            conn.execute(select(schema.archive.c.event_id).where(schema.archive.c.status == "dead"))
            .scalars()
            .all()
        )
    assert (sorted(set(ids) - {poison}), [poison], 0) == (sorted(delivered), dead, _buffered(app))


def test_without_bisect_a_poison_event_takes_its_group_down(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    app = make_app(database_url)
    policy = RetryPolicy(max_attempts=2, scale=0.0, base_delay=0.0, jitter=0.0)

    @app.handler(ActivityEvent, batch_size=16, retry=policy)
    def picky(batch: Batch[ActivityEvent]) -> None:
        if any(event.kind == "poison" for event in batch.events):
            raise RuntimeError("400")

    ids = commit_events(app.engine, 4)
    with app.engine.begin() as conn:
        conn.execute(update(ActivityEvent).where(ActivityEvent.id == ids[0]).values(kind="poison"))
    drain(app)
    assert [("dead", None)] * 4 == [(status, None) for status, _ in _archived(app)]


# --- groups closed by their size in bytes ------------------------------------------------------


def _group_sizes(app: Outbox, name: str, **columns: Any) -> list[int]:
    sizes: list[int] = []

    @app.handler(ActivityEvent, name=name, batch_size=50, **columns)
    def sized(batch: Batch[ActivityEvent]) -> None:
        sizes.append(len(batch))

    drain(app)
    return sizes


def test_max_batch_bytes_closes_a_group_before_it_passes_the_size(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    """Events of 31 bytes (a one-digit activity id, a kind of 15 two-byte characters), at most
    100 bytes a group: three per group, counted in bytes, not characters."""
    app = make_app(database_url)
    commit_events(app.engine, 10, kind="é" * 15)
    assert [3, 3, 3, 1] == _group_sizes(app, "sized", max_batch_bytes=100)


def test_an_event_larger_than_max_batch_bytes_goes_alone(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    app = make_app(database_url)
    commit_events(app.engine, 3, kind="x" * 32)
    assert [1, 1, 1] == _group_sizes(app, "sized", max_batch_bytes=10)


def test_max_batch_bytes_refuses_a_size_below_one() -> None:
    app = Outbox("sqlite://")
    with pytest.raises(ConfigurationError, match="max_batch_bytes must be >= 1"):
        app.handler(ActivityEvent, name="sized", max_batch_bytes=0)(lambda batch: None)


def test_an_async_handlers_retry_after_defers_and_pauses_as_a_sync_ones_does(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Commit
) -> None:
    app = make_app(database_url)

    @app.handler(ActivityEvent, batch_size=10, retry=NO_WAIT)
    async def limited(batch: Batch[ActivityEvent]) -> None:
        raise RetryAfter(30, reason="429")

    commit_events(app.engine, 2)
    stats = drain(app).stats
    (job,) = _jobs(app)
    assert (1, 0, 1, ["limited"]) == (
        stats.groups_deferred,
        job["attempts"],
        job["deferrals"],
        list(flow.paused(app)),
    )
