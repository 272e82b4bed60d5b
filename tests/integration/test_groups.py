"""The operations layer's groups (``outbox.ops.groups``, ``outbox.ops.group_operations``): where
each group stands, one group in full, discard and replay by a selection, the attempts recorded,
on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import itertools
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, func, insert, select, update

from outbox import Batch, Outbox, RetryAfter, RetryPolicy, schema
from outbox._db.dialects import db_now_plus
from outbox.exceptions import ConfigurationError, GroupNotFoundError, ReplayError
from outbox.ops import archive, edit, flow, group_operations, groups, operators, replay
from outbox.ops.selection import Selection
from outbox.schema import GroupStatus
from outbox.testing import drain
from tests.models import ActivityEvent, EmailEvent

ONE_SHOT = RetryPolicy(max_attempts=1)
TWO_SHOTS = RetryPolicy(max_attempts=2, base_delay=0.0, max_delay=0.0)


def _always_fail(batch: Batch[Any]) -> None:
    raise ValueError("the downstream said no")


def _succeed(batch: Batch[Any]) -> None:
    return None


# --- Where a group stands: generated against a model of the documented precedence ----------


def _modelled_status(
    leased: bool, expires: bool, attempts: int, deferrals: int, paused: bool
) -> str:
    """GroupStatus's documented rule: refused, in flight, paused, retrying, deferred, waiting."""
    if leased and not expires:
        return GroupStatus.REFUSED
    if leased:
        return GroupStatus.IN_FLIGHT
    if paused:
        return GroupStatus.PAUSED
    if attempts:
        return GroupStatus.RETRYING
    if deferrals:
        return GroupStatus.DEFERRED
    return GroupStatus.WAITING


def _job_cases() -> list[tuple[bool, bool, int, int, bool]]:
    lease_states = [(False, False), (True, True), (True, False)]
    return [
        (leased, expires, attempts, deferrals, paused)
        for (leased, expires), attempts, deferrals, paused in itertools.product(
            lease_states, (0, 2), (0, 1), (False, True)
        )
    ]


def _add_job(engine: Engine, handler: str, case: tuple[bool, bool, int, int, bool]) -> uuid.UUID:
    leased, expires, attempts, deferrals, _ = case
    group_id = uuid.uuid4()
    with engine.begin() as conn:
        conn.execute(
            insert(schema.jobs).values(
                kind=schema.JobKind.BATCH,
                handler=handler,
                group_id=group_id,
                priority=0,
                attempts=attempts,
                deferrals=deferrals,
                lease_owner="w1" if leased else None,
                lease_token=uuid.uuid4() if leased else None,
                lease_expires_at=db_now_plus(60) if expires else None,
                last_error="boom" if attempts else None,
            )
        )
    return group_id


def _two_handlers(app: Outbox) -> None:
    app.handler(ActivityEvent, name="running")(_succeed)
    app.handler(EmailEvent, name="stopped")(_succeed)


def test_each_group_stands_where_the_model_says(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Every combination of lease, expiry, attempts, deferrals and a paused handler lists with
    the status the documented precedence gives, and the counts agree."""
    app = make_app(database_url)
    _two_handlers(app)
    flow.pause(app, "stopped")
    expected = {}
    for case in _job_cases():
        handler = "stopped" if case[4] else "running"
        expected[_add_job(app.engine, handler, case)] = _modelled_status(*case)
    listing = groups.find(app, limit=100)
    assert (expected, dict(Counter(expected.values())), None) == (
        {g.group_id: g.status for g in listing.groups},
        {s.value: n for s, n in listing.counts.items()},
        listing.next,
    )


def test_a_status_filter_lists_exactly_the_groups_of_that_status(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """For each status, ``statuses=(s,)`` lists the model's groups of s and no other."""
    app = make_app(database_url)
    _two_handlers(app)
    flow.pause(app, "stopped")
    expected: dict[str, set[uuid.UUID]] = {}
    for case in _job_cases():
        handler = "stopped" if case[4] else "running"
        expected.setdefault(_modelled_status(*case), set()).add(_add_job(app.engine, handler, case))
    found = {
        status.value: {g.group_id for g in groups.find(app, Selection(statuses=(status,))).groups}
        for status in GroupStatus
    }
    assert {s.value: expected.get(s.value, set()) for s in GroupStatus} == found


def test_pages_cover_every_group_once(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """Pages of 2, live groups then dead ones, follow each other with no group twice or lost."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=1, retry=ONE_SHOT, name="fails")(_always_fail)
    commit_events(app.engine, 3)
    drain(app)
    waiting = {_add_job(app.engine, "fails", (False, False, 0, 0, False)) for _ in range(2)}
    seen: list[uuid.UUID] = []
    after = None
    while True:
        listing = groups.find(app, limit=2, after=after)
        seen += [g.group_id for g in listing.groups]
        if listing.next is None:
            break
        after = listing.next
    dead = {row.group_id for row in _archived(app.engine)}
    assert (5, waiting | dead) == (len(seen), set(seen))


def test_counts_stop_at_the_cap_and_say_so(
    database_url: str, make_app: Callable[[str], Outbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past COUNT_CAP groups the count stops there and the listing says it is capped."""
    monkeypatch.setattr(groups, "COUNT_CAP", 3)
    app = make_app(database_url)
    _two_handlers(app)
    for _ in range(5):
        _add_job(app.engine, "running", (False, False, 0, 0, False))
    listing = groups.find(app, limit=1)
    assert (3, True, 1) == (listing.total, listing.capped, len(listing.groups))


# --- Filters --------------------------------------------------------------------------------


def _dead_groups(app: Outbox, commit_events: Any, count: int, **columns: Any) -> list[uuid.UUID]:
    commit_events(app.engine, count, **columns)
    drain(app)
    return sorted({row.group_id for row in _archived(app.engine) if row.status == "dead"}, key=str)


def _archived(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(schema.archive).order_by(schema.archive.c.id)))


def test_filters_narrow_by_handler_error_age_and_group(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """handler, error text (any case), age and group ids each narrow the listing."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=1, retry=ONE_SHOT, name="fails")(_always_fail)
    app.handler(EmailEvent, name="emails")(_succeed)
    dead = _dead_groups(app, commit_events, 2)
    waiting = _add_job(app.engine, "emails", (False, False, 0, 0, False))

    def found(**given: Any) -> set[uuid.UUID]:
        return {g.group_id for g in groups.find(app, Selection(**given)).groups}

    assert (
        set(dead),
        {waiting},
        set(dead),
        set(),
        {dead[0]},
        set(),
    ) == (
        found(handlers=("fails",)),
        found(handlers=("emails",)),
        found(error="DOWNSTREAM SAID"),
        found(error="no such text"),
        found(group_ids=(dead[0],)),
        found(older_than=3600.0),
    )


def test_a_payload_filter_finds_dead_groups_by_their_events_values(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """``payload`` matches text in a dead event's values, and never a live group."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=1, retry=ONE_SHOT, name="fails")(_always_fail)
    commit_events(app.engine, 1, kind="needle-kind")
    commit_events(app.engine, 1, kind="hay")
    drain(app)
    _add_job(app.engine, "fails", (False, False, 0, 0, False))
    listing = groups.find(app, Selection(payload="NEEDLE"))
    dead = [row for row in _archived(app.engine) if "needle" in str(row.payload)]
    assert ([dead[0].group_id], {GroupStatus.DEAD: 1}) == (
        [g.group_id for g in listing.groups],
        listing.counts,
    )


def test_a_key_filter_finds_the_groups_of_an_ordering_key(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """``key`` lists the dead group holding that key (held), not the other keys' groups."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=1, retry=ONE_SHOT, ordering_key="kind", name="ordered")(
        _always_fail
    )
    commit_events(app.engine, 1, kind="alpha")
    commit_events(app.engine, 1, kind="beta")
    drain(app)
    listing = groups.find(app, Selection(key="alpha"))
    alpha = [row.group_id for row in _archived(app.engine) if "alpha" in str(row.payload)]
    assert ([(alpha[0], GroupStatus.HELD)]) == [(g.group_id, g.status) for g in listing.groups]


FINITE_AGE = "older_than: expected a finite number of seconds >= 0"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"statuses": ("deadd",)}, "statuses: 'deadd' is not a group status"),
        ({"older_than": -1}, f"{FINITE_AGE}, got -1"),
        ({"older_than": float("inf")}, f"{FINITE_AGE}, got inf"),
        ({"older_than": float("nan")}, f"{FINITE_AGE}, got nan"),
        ({"error": ""}, "error: expected some text, got ''"),
        ({"handlers": "fails"}, "handlers: expected a tuple of handler names"),
        ({"group_ids": ("not-a-uuid",)}, "group_ids: expected UUIDs"),
    ],
    ids=["status", "age", "infinite-age", "nan-age", "error", "handlers", "groups"],
)
def test_a_bad_selection_is_refused_where_it_is_made(
    database_url: str, given: dict[str, Any], message: str
) -> None:
    """A Selection checks each field as it is made, in one line naming it."""
    with pytest.raises(ConfigurationError) as raised:
        Selection(**given)
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_key_filter_needs_an_ordered_handler(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """``key`` on handlers without an ordering_key: refused, naming them."""
    app = make_app(database_url)
    app.handler(ActivityEvent, name="plain")(_succeed)
    with pytest.raises(ConfigurationError) as raised:
        groups.find(app, Selection(key="a"))
    assert "key: no handler selected has an ordering_key to match it against (plain)" == str(
        raised.value
    )


# --- One group in full, and the attempts recorded ------------------------------------------


def test_show_tells_a_dead_group_s_events_and_each_failed_attempt(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """A group dead after two attempts: its events' values, two attempts recorded (failed,
    then dead) with the worker and the traceback, and the archive's counts."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=5, retry=TWO_SHOTS, name="fails")(_always_fail)
    commit_events(app.engine, 2)
    drain(app)
    drain(app)
    [group_id] = _dead_groups(app, commit_events, 0)
    detail = groups.show(app, group_id)
    assert (
        GroupStatus.DEAD,
        [0, 1],
        [(1, "failed"), (2, "dead")],
        [True, True],
        {"dead": 2},
    ) == (
        detail.group.status,
        sorted(e.values["activity_id"] for e in detail.events),
        [(a.attempt, a.outcome.value) for a in detail.attempts],
        [bool(a.worker) and "Traceback" in (a.error or "") for a in detail.attempts],
        detail.archived,
    )


def test_show_tells_a_live_group_s_lease_and_next_run(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """A group retrying: its events in the buffer, its next run ahead, no lease; the attempt
    that failed recorded."""
    app = make_app(database_url)
    slow = RetryPolicy(max_attempts=3, base_delay=600.0, max_delay=600.0)
    app.handler(ActivityEvent, batch_size=5, retry=slow, name="fails")(_always_fail)
    commit_events(app.engine, 3)
    drain(app)
    [group] = groups.find(app).groups
    detail = groups.show(app, group.group_id)
    assert (GroupStatus.RETRYING, 3, 3, True, None, ["failed"]) == (
        detail.group.status,
        detail.group.events,
        len(detail.events),
        detail.group.due_in is not None and detail.group.due_in > 500,
        detail.lease,
        [a.outcome.value for a in detail.attempts],
    )


def test_a_deferral_and_a_rescue_are_recorded_as_attempts(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """A RetryAfter is recorded as deferred (the group then waits with its handler, paused
    until the downstream's time); a lease that ran out, as lease_expired."""
    app = make_app(database_url)

    def defer(batch: Batch[Any]) -> None:
        raise RetryAfter(600)

    app.handler(ActivityEvent, batch_size=5, name="later")(defer)
    commit_events(app.engine, 1)
    drain(app)
    [group] = groups.find(app).groups
    with app.engine.begin() as conn:
        conn.execute(
            update(schema.jobs).values(
                lease_owner="gone", lease_token=uuid.uuid4(), lease_expires_at=db_now_plus(-1)
            )
        )
    from outbox._db import queries, run_in_transaction

    run_in_transaction(app.engine, lambda conn: queries.rescue_expired_jobs(conn, app.dialect))
    detail = groups.show(app, group.group_id)
    assert (GroupStatus.PAUSED, ["deferred", "lease_expired"]) == (
        group.status,
        [a.outcome.value for a in detail.attempts],
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_show_of_an_unknown_group_says_so(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """A group outbox has no trace of: GroupNotFoundError naming it."""
    app = make_app(database_url)
    group_id = uuid.uuid4()
    with pytest.raises(GroupNotFoundError) as raised:
        groups.show(app, group_id)
    assert f"no group {group_id}: no job, event or attempt of it is known" == str(raised.value)


def test_show_of_a_group_done_gives_its_archived_status(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """A group that succeeded after a failed attempt: shown as succeeded, with the attempt."""
    app = make_app(database_url)
    calls = []

    def fail_once(batch: Batch[Any]) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("once")

    app.handler(ActivityEvent, batch_size=5, retry=TWO_SHOTS, name="flaky", archive=True)(fail_once)
    commit_events(app.engine, 2)
    drain(app)
    drain(app)
    [group_id] = {row.group_id for row in _archived(app.engine)}
    detail = groups.show(app, group_id)
    assert (schema.ArchiveStatus.SUCCEEDED, {"succeeded": 2}, ["failed"]) == (
        detail.group.status,
        detail.archived,
        [a.outcome.value for a in detail.attempts],
    )


# --- Discard --------------------------------------------------------------------------------


def test_discard_gives_up_dead_and_waiting_groups_and_leaves_one_in_flight(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """Dead rows are marked discarded, a waiting group's events archived as discarded and its
    job gone, a group in flight left and named; one operation records it all."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=1, retry=ONE_SHOT, name="fails")(_always_fail)
    dead = _dead_groups(app, commit_events, 1)
    commit_events(app.engine, 2)
    with app.engine.begin() as conn:
        ids = list(
            conn.execute(select(ActivityEvent.id).where(ActivityEvent.group_id.is_(None))).scalars()
        )
    waiting = _add_job(app.engine, "fails", (False, False, 0, 0, False))
    flying = _add_job(app.engine, "fails", (True, True, 1, 0, False))
    with app.engine.begin() as conn:
        conn.execute(
            update(ActivityEvent.__table__)
            .where(ActivityEvent.id == ids[0])
            .values(group_id=waiting)
        )
        conn.execute(
            update(ActivityEvent.__table__)
            .where(ActivityEvent.id == ids[1])
            .values(group_id=flying)
        )
    result = group_operations.discard(
        app, Selection(handlers=("fails",)), actor="ops", reason="bad"
    )
    statuses = Counter(row.status for row in _archived(app.engine))
    [operation] = operators.history(app)
    assert (
        {dead[0], waiting},
        [flying],
        {"discarded": 2},
        [flying],
        ("discard", "ops", 2, 2, "bad"),
    ) == (
        {g.group_id for g in result.groups},
        [g.group_id for g, _ in result.skipped],
        dict(statuses),
        [row.group_id for row in _jobs(app.engine)],
        (operation.action, operation.actor, operation.groups, operation.events, operation.detail),
    )


def _jobs(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(schema.jobs).where(schema.jobs.c.kind == "batch")))


def test_discard_of_a_held_group_releases_its_keys(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """A dead ordered group discarded: its keys are released, so the later events of its key
    are handled."""
    app = make_app(database_url)
    failing = [True]

    def fail_while_told(batch: Batch[Any]) -> None:
        if failing[0]:
            raise ValueError("no")

    app.handler(ActivityEvent, batch_size=1, retry=ONE_SHOT, ordering_key="kind", name="ordered")(
        fail_while_told
    )
    commit_events(app.engine, 1, kind="k")
    drain(app)
    commit_events(app.engine, 1, kind="k")
    failing[0] = False
    drain(app)
    held_before = len(groups.find(app, Selection(statuses=("held",))).groups)
    group_operations.discard(app, Selection(statuses=("held",)))
    drain(app)
    with app.engine.connect() as conn:
        left = conn.execute(select(func.count()).select_from(ActivityEvent)).scalar_one()
    assert (1, 0, {"discarded": 1}) == (
        held_before,
        left,
        dict(Counter(row.status for row in _archived(app.engine))),
    )


def test_a_dry_run_discard_counts_every_page_and_changes_nothing(
    database_url: str, make_app: Callable[[str], Outbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    """More groups than a page: the dry run names them all and writes nothing."""
    monkeypatch.setattr(group_operations, "DISCARD_PAGE", 2)
    app = make_app(database_url)
    _two_handlers(app)
    added = {_add_job(app.engine, "running", (False, False, 0, 0, False)) for _ in range(5)}
    result = group_operations.discard(app, Selection(handlers=("running",)), dry_run=True)
    assert (added, 5, [], None) == (
        {g.group_id for g in result.groups},
        len(_jobs(app.engine)),
        operators.history(app),
        result.operation_id,
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_discard_refuses_an_empty_selection(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Discarding every group takes a filter: an empty selection is refused."""
    app = make_app(database_url)
    with pytest.raises(ConfigurationError) as raised:
        group_operations.discard(app, Selection())
    assert str(raised.value).startswith("discard needs a selection")


# --- Retry now ------------------------------------------------------------------------------


def _due_later(engine: Engine, group_id: uuid.UUID, seconds: float = 3600) -> None:
    with engine.begin() as conn:
        conn.execute(
            update(schema.jobs)
            .where(schema.jobs.c.group_id == group_id)
            .values(run_at=db_now_plus(seconds))
        )


def test_retry_runs_retrying_and_deferred_groups_now_and_names_those_it_leaves(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """A retrying group due in an hour and a deferred one are made due and handled by the next
    drain; one in flight and a dead one are left, each with why; one operation records it."""
    app = make_app(database_url)
    failures = [1]

    def fail_once(batch: Batch[Any]) -> None:
        if failures[0]:
            failures[0] -= 1
            raise ValueError("not yet")

    slow = RetryPolicy(max_attempts=3, base_delay=3600.0, max_delay=3600.0)
    app.handler(ActivityEvent, batch_size=5, retry=slow, name="flaky")(fail_once)
    app.handler(EmailEvent, batch_size=1, retry=ONE_SHOT, name="fails")(_always_fail)
    commit_events(app.engine, 2)
    drain(app)
    [retrying] = groups.find(app, Selection(handlers=("flaky",))).groups
    deferred = _add_job(app.engine, "flaky", (False, False, 0, 1, False))
    _due_later(app.engine, deferred)
    flying = _add_job(app.engine, "flaky", (True, True, 1, 0, False))
    with app.engine.begin() as conn:
        conn.execute(insert(schema.archive).values(
            handler="fails", buffer="email_events", event_id=1, group_id=(dead := uuid.uuid4()),
            status="dead", attempts=1, error="no", payload={"id": 1},
        ))  # fmt: skip
    chosen = (retrying.group_id, deferred, flying, dead)
    result = group_operations.retry(app, Selection(group_ids=chosen), actor="ops")
    drain(app)
    [operation] = operators.history(app)
    left = {g.group_id for g in groups.find(app, Selection(group_ids=chosen)).groups}
    assert (
        {retrying.group_id: GroupStatus.RETRYING, deferred: GroupStatus.DEFERRED},
        {flying: "in flight: a worker holds it", dead: "dead: replay it"},
        {flying, dead},
        ("retry", "ops", 2, 2),
    ) == (
        {g.group_id: g.status for g in result.groups},
        {g.group_id: why for g, why in result.skipped},
        left,
        (operation.action, operation.actor, operation.groups, operation.events),
    )


def test_a_dry_run_retry_names_the_groups_and_changes_nothing(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """The dry run names the groups it would make due; none is due, nothing is recorded."""
    app = make_app(database_url)
    _two_handlers(app)
    added = {_add_job(app.engine, "running", (False, False, 2, 0, False)) for _ in range(3)}
    for group_id in added:
        _due_later(app.engine, group_id)
    result = group_operations.retry(app, Selection(handlers=("running",)), dry_run=True)
    due = [g.due_in for g in groups.find(app).groups if g.due_in is not None and g.due_in <= 0]
    assert (added, True, [], [], None) == (
        {g.group_id for g in result.groups},
        result.dry_run,
        due,
        operators.history(app),
        result.operation_id,
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_retry_refuses_an_empty_selection(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Retrying every group takes a filter: an empty selection is refused."""
    app = make_app(database_url)
    with pytest.raises(ConfigurationError) as raised:
        group_operations.retry(app, Selection())
    assert str(raised.value).startswith("retry needs a selection")


# --- Replay by selection, and with edit ------------------------------------------------------


def test_replay_by_error_text_takes_only_the_matching_dead_groups(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """``group_operations.replay`` with an error filter replays the groups whose error holds it."""
    app = make_app(database_url)

    def fail_by_kind(batch: Batch[Any]) -> None:
        raise ValueError(f"rejected {batch.events[0].kind}")

    app.handler(ActivityEvent, batch_size=1, retry=ONE_SHOT, name="fails")(fail_by_kind)
    commit_events(app.engine, 1, kind="red")
    commit_events(app.engine, 1, kind="blue")
    drain(app)
    result = group_operations.replay(app, Selection(error="rejected red"), actor="ops")
    with app.engine.connect() as conn:
        back = list(conn.execute(select(ActivityEvent.kind)).scalars())
    [operation] = operators.history(app)
    assert (["red"], 1, Counter({"replayed": 1, "dead": 1}), ("replay", "ops", 1, 1)) == (
        back,
        result.events,
        Counter(row.status for row in _archived(app.engine)),
        (operation.action, operation.actor, operation.groups, operation.events),
    )


def test_edit_replays_one_dead_event_with_its_values_changed(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """The edited event goes back with the new value and the others kept; its archive row is
    marked replayed and points at it; the record names the columns, not the values."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=2, retry=ONE_SHOT, name="fails")(_always_fail)
    commit_events(app.engine, 2, kind="broken")
    drain(app)
    dead = _archived(app.engine)
    group_id, event_id = dead[0].group_id, int(dead[0].event_id)
    result = edit.edit(app, group_id, event_id, {"kind": "fixed", "activity_id": "41"})
    with app.engine.connect() as conn:
        back = [
            tuple(r)
            for r in conn.execute(
                select(ActivityEvent.id, ActivityEvent.activity_id, ActivityEvent.kind)
            )
        ]
    marked = [(r.status, r.replay_event_id) for r in _archived(app.engine)]
    [operation] = operators.history(app)
    assert (
        [(result.new_event_id, 41, "fixed")],
        [("replayed", result.new_event_id), ("dead", None)],
        ("activity_id", "kind"),
        ("edit", f"event {event_id} of group {group_id}: activity_id, kind changed"),
    ) == (back, marked, result.changed, (operation.action, operation.detail))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"nope": 1}, "'nope' is not a column of buffer test_activity_events; its columns:"),
        ({"group_id": None}, "'group_id' is outbox's own column of buffer test_activity_events"),
        ({"activity_id": "many"}, "activity_id: 'many' is not a valid int"),
        ({"activity_id": None}, "activity_id: NULL is not allowed (the column is NOT NULL)"),
        ({"kind": 5}, "kind: expected str, got int"),
    ],
    ids=["unknown", "own", "unparsable", "null", "type"],
)
def test_edit_refuses_values_its_columns_do_not_take_and_writes_nothing(
    database_url: str,
    make_app: Callable[[str], Outbox],
    commit_events: Any,
    changes: dict[str, Any],
    message: str,
) -> None:
    """A name that is not the buffer's, outbox's own column, or a value the column does not
    take: one line naming it; the event stays dead and nothing is recorded."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=2, retry=ONE_SHOT, name="fails")(_always_fail)
    commit_events(app.engine, 1)
    drain(app)
    [row] = _archived(app.engine)
    with pytest.raises(ConfigurationError) as raised:
        edit.edit(app, row.group_id, int(row.event_id), changes)
    assert (True, ["dead"], []) == (
        str(raised.value).startswith(message),
        [r.status for r in _archived(app.engine)],
        operators.history(app),
    ), str(raised.value)


def test_prune_forgets_the_attempts_of_groups_gone_and_keeps_a_dead_group_s(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """After a prune, the attempts of a group that is gone are deleted; a dead group keeps its
    history as long as it is dead."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=1, retry=ONE_SHOT, name="fails")(_always_fail)
    [dead] = _dead_groups(app, commit_events, 1)
    gone = uuid.uuid4()
    with app.engine.begin() as conn:
        conn.execute(
            insert(schema.attempts).values(
                handler="fails", group_id=gone, attempt=1, outcome="failed", worker=None,
                error=None, finished_at=db_now_plus(-7200),
            )
        )  # fmt: skip
        conn.execute(update(schema.attempts).values(finished_at=db_now_plus(-7200)))
    archive.prune(app, older_than=3600)
    with app.engine.connect() as conn:
        kept = list(conn.execute(select(schema.attempts.c.group_id)).scalars())
    assert [dead] == kept


# --- Status counts that stop at a cap -------------------------------------------------------


def test_a_capped_status_counts_no_further_than_its_cap(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """``count_cap``: unclaimed, claimed and archived counts stop there and say so; without
    it they are exact."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=2, retry=ONE_SHOT, name="fails")(_always_fail)
    app.handler(EmailEvent, name="emails")(_succeed)
    commit_events(app.engine, 5)
    drain(app)
    ids = commit_events(app.engine, 4)
    with app.engine.begin() as conn:
        conn.execute(
            update(ActivityEvent.__table__)
            .where(ActivityEvent.id.in_(ids[2:]))
            .values(group_id=uuid.uuid4())
        )
    from outbox.ops import metrics

    [capped] = [s for s in metrics.collect(app, count_cap=1) if s.handler == "fails"]
    [exact] = [s for s in metrics.collect(app) if s.handler == "fails"]
    assert ((1, 1, 1, 1), (2, 2, 5, None)) == (
        (capped.unclaimed, capped.claimed, capped.dead, capped.capped_at),
        (exact.unclaimed, exact.claimed, exact.dead, exact.capped_at),
    )


def test_pauses_resumes_and_releases_are_recorded_with_who_made_them(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Each lever an operator pulls leaves a record: action, actor, what it took."""
    from outbox.ops import holds

    app = make_app(database_url)
    _two_handlers(app)
    flow.pause(app, "running", until=600, reason="maintenance", actor="ops@host")
    flow.resume(app, "running", actor="ops@host")
    holds.release_keys(app, "running", actor="ann")
    holds.release_refused(app, actor="ann")
    found = [
        (o.action.value, o.actor, o.selection, o.detail) for o in reversed(operators.history(app))
    ]
    assert [
        ("pause", "ops@host", {"handlers": ["running"], "seconds": 600.0}, "maintenance"),
        ("resume", "ops@host", {"handlers": ["running"]}, None),
        ("release", "ann", {"handlers": ["running"]}, "0 held keys released"),
        ("release", "ann", {}, "0 refused groups released"),
    ] == found


def test_what_workers_handle_is_counted_minute_by_minute(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """A drain records each handler's delivered and dead events, and failed groups, in the
    current minute."""
    from outbox.ops import metrics

    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=2, retry=ONE_SHOT, name="fails")(_always_fail)
    app.handler(EmailEvent, name="emails")(_succeed)
    commit_events(app.engine, 3)
    commit_events(app.engine, 4, EmailEvent)
    drain(app)
    # Summed over the handler's minutes: a drain may straddle the turn of a minute.
    found = {
        name: tuple(sum(getattr(r, c) for r in rows) for c in ("succeeded", "dead", "failed"))
        for name, rows in metrics.throughput(app).items()
    }
    assert {"fails": (0, 3, 2), "emails": (4, 0, 0)} == found


# --- The archive, browsed ----------------------------------------------------------------------


def test_the_archive_is_browsed_newest_first_by_status_payload_and_page(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """Dead events, a replayed one pointing at the event it became, a payload search, and
    pages that follow each other."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=1, retry=ONE_SHOT, name="fails")(_always_fail)
    commit_events(app.engine, 1, kind="needle")
    commit_events(app.engine, 2, kind="hay")
    drain(app)
    [needle] = [r for r in _archived(app.engine) if "needle" in str(r.payload)]
    done = replay.replay(app, group_id=needle.group_id)
    everything = archive.browse(app)
    dead = archive.browse(app, status="dead")
    found = archive.browse(app, payload="NEEDLE")
    first = archive.browse(app, limit=2)
    second = archive.browse(app, limit=2, before=first.next)
    [replayed] = found.events
    assert (
        [3, 2, 1],
        ["dead", "dead"],
        ("replayed", done.operation_id, True, "needle"),
        ([3, 2], [1], None),
    ) == (
        [e.id for e in everything.events],
        [e.status.value for e in dead.events],
        (
            replayed.status.value,
            replayed.operation_id,
            replayed.replay_event_id is not None,
            replayed.values["kind"],
        ),
        ([e.id for e in first.events], [e.id for e in second.events], second.next),
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"status": "deadd"}, "status: 'deadd' is not an archive status"),
        ({"payload": " "}, "payload: expected some text"),
        ({"limit": 0}, "limit: expected 1 to 1000 events"),
        ({"before": -1}, "before: expected an archive row's id"),
        ({"handler": "nope"}, "unknown handler 'nope'"),
    ],
    ids=["status", "payload", "limit", "before", "handler"],
)
def test_a_bad_archive_question_is_refused_where_it_is_asked(
    database_url: str, make_app: Callable[[str], Outbox], given: dict[str, Any], message: str
) -> None:
    """Each bad argument of browse: one line naming it."""
    app = make_app(database_url)
    app.handler(ActivityEvent, name="fails")(_always_fail)
    with pytest.raises(ConfigurationError) as raised:
        archive.browse(app, **given)
    assert str(raised.value).startswith(message), str(raised.value)


def test_how_close_a_handler_runs_to_its_rate_limits(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """Each fleet-wide window says what it spent: three calls of two events each, against
    100 calls and 1,000 events an hour; a per-key limit is not summed."""
    from outbox import RateLimit

    app = make_app(database_url)
    hourly = RateLimit(calls=100, events=1000, per=3600, burst=100)
    limits = [hourly, RateLimit(calls=50, key="kind", burst=50)]
    app.handler(ActivityEvent, batch_size=2, name="limited", rate_limit=limits)(_succeed)
    commit_events(app.engine, 6)
    drain(app)
    found = [(u.unit, u.used, u.capacity, u.period) for u in flow.limit_use(app, "limited")]
    assert [("calls", 3, 100, 3600.0), ("events", 6, 1000, 3600.0)] == found


# --- Replay keeps each event's identity -----------------------------------------------------


def _buffered_ids(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return sorted(conn.execute(select(ActivityEvent.id)).scalars())


def test_replay_puts_each_event_back_under_its_own_id(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """Replayed events keep their ids (so the message ids sinks derive), an event written
    after they died gets an id of its own, and each archive row points at the same id."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=5, retry=ONE_SHOT, name="fails")(_always_fail)
    died = commit_events(app.engine, 3)
    drain(app)
    [later] = commit_events(app.engine, 1)
    replay.replay(app, status="dead")
    assert ([*died, later], True, [(d, d) for d in died]) == (
        _buffered_ids(app.engine),
        later not in died,
        [(int(r.event_id), r.replay_event_id) for r in _archived(app.engine)],
    )


def test_an_event_replayed_twice_keeps_its_id_both_times(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """An event dead, replayed, dead again and replayed again is the same event each time."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=5, retry=ONE_SHOT, name="fails")(_always_fail)
    [event_id] = commit_events(app.engine, 1)
    drain(app)
    replay.replay(app, status="dead")
    drain(app)
    replay.replay(app, status="dead")
    assert ([event_id], [(event_id, "replayed", event_id)] * 2) == (
        _buffered_ids(app.engine),
        [(int(r.event_id), r.status, r.replay_event_id) for r in _archived(app.engine)],
    )


def test_an_event_whose_id_is_taken_stays_archived_unless_new_ids_are_chosen(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """A dead event whose id another row of its buffer holds is not replayed under a new id
    unasked: it stays dead, named in the error, the others go back; ``new_ids=True`` replays
    it as a new event, the operator's stated choice."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=5, retry=ONE_SHOT, name="fails")(_always_fail)
    taken, free = commit_events(app.engine, 2)
    drain(app)
    with app.engine.begin() as conn:
        conn.execute(insert(ActivityEvent.__table__).values(id=taken, activity_id=99))
    with pytest.raises(ReplayError) as raised:
        replay.replay(app, status="dead")
    kept = [(int(r.event_id), r.status) for r in _archived(app.engine)]
    result = replay.replay(app, status="dead", new_ids=True)
    [renewed] = [r.replay_event_id for r in _archived(app.engine) if int(r.event_id) == taken]
    assert (
        True,
        [(taken, "dead"), (free, "replayed")],
        1,
        sorted([taken, free, renewed]),
        True,
    ) == (
        f"event {taken}: id taken by another row of test_activity_events" in str(raised.value),
        kept,
        result.events,
        _buffered_ids(app.engine),
        renewed not in (taken, free),
    )


def test_edit_keeps_the_event_s_id(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """An edited event goes back under its own id: the same event, with values changed."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=5, retry=ONE_SHOT, name="fails")(_always_fail)
    [event_id] = commit_events(app.engine, 1)
    drain(app)
    [row] = _archived(app.engine)
    result = edit.edit(app, row.group_id, event_id, {"kind": "fixed"})
    assert (event_id, [event_id]) == (result.new_event_id, _buffered_ids(app.engine))


def test_edit_replays_a_discarded_event_as_it_does_a_dead_one(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """An event the downstream refused for good (discarded) is fixed and replayed, with the
    same record as a dead one's edit."""
    app = make_app(database_url)

    def refuse(batch: Batch[Any]) -> None:
        batch.discard(batch.events, "422 amount: not a number")

    app.handler(ActivityEvent, batch_size=5, retry=ONE_SHOT, name="refuses")(refuse)
    [event_id] = commit_events(app.engine, 1, kind="broken")
    drain(app)
    [row] = _archived(app.engine)
    edit.edit(app, row.group_id, event_id, {"kind": "fixed"})
    with app.engine.connect() as conn:
        back = [tuple(r) for r in conn.execute(select(ActivityEvent.id, ActivityEvent.kind))]
    [operation] = operators.history(app)
    assert (
        "discarded",
        [(event_id, "fixed")],
        [("replayed", event_id)],
        ("edit", f"event {event_id} of group {row.group_id}: kind changed"),
    ) == (
        row.status,
        back,
        [(r.status, r.replay_event_id) for r in _archived(app.engine)],
        (operation.action, operation.detail),
    )


def test_replay_group_replays_a_discarded_group_s_discarded_events_under_their_ids(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """A group the downstream refused for good (discarded) is replayed whole, each event under
    its own id, recorded as a replay by its actor, as a dead group's replay is."""
    app = make_app(database_url)

    def refuse(batch: Batch[Any]) -> None:
        batch.discard(batch.events, "422 amount: not a number")

    app.handler(ActivityEvent, batch_size=5, retry=ONE_SHOT, name="refuses")(refuse)
    event_ids = commit_events(app.engine, 2, kind="broken")
    drain(app)
    [group_id] = {row.group_id for row in _archived(app.engine)}
    dry = group_operations.replay_group(app, group_id, actor="olga", dry_run=True)
    result = group_operations.replay_group(app, group_id, actor="olga")
    [operation] = operators.history(app)
    assert (
        (2, True, None),
        ([group_id], 2, operation.id),
        sorted(event_ids),
        [("replayed", e) for e in sorted(event_ids)],
        ("replay", "olga"),
    ) == (
        (dry.events, dry.dry_run, dry.operation_id),
        ([g.group_id for g in result.groups], result.events, result.operation_id),
        _buffered_ids(app.engine),
        sorted((r.status, r.replay_event_id) for r in _archived(app.engine)),
        (operation.action, operation.actor),
    )


def test_replay_group_leaves_a_group_neither_dead_nor_discarded(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """A group waiting for its worker is named as left, and nothing is recorded."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=5, retry=ONE_SHOT, name="waits")(_succeed)
    group_id = _add_job(app.engine, "waits", (False, False, 0, 0, False))
    result = group_operations.replay_group(app, group_id, actor="olga")
    assert ([], [(group_id, "waiting: not dead or discarded")], []) == (
        result.groups,
        [(g.group_id, why) for g, why in result.skipped],
        operators.history(app),
    )


# --- A group done, as far as it is known ----------------------------------------------------


def test_show_of_a_group_delivered_unarchived_after_a_failure_says_so(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """A handler that does not archive, a group that failed once and then succeeded: shown as
    succeeded (nothing archived), its handler's name, its attempt, its age that attempt's."""
    app = make_app(database_url)
    calls = []

    def fail_once(batch: Batch[Any]) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("once")

    app.handler(ActivityEvent, batch_size=5, retry=TWO_SHOTS, name="flaky")(fail_once)
    commit_events(app.engine, 2)
    drain(app)
    drain(app)
    with app.engine.begin() as conn:
        conn.execute(update(schema.attempts).values(finished_at=db_now_plus(-7200)))
        [group_id] = conn.execute(select(schema.attempts.c.group_id)).scalars()
    detail = groups.show(app, group_id)
    assert (schema.ArchiveStatus.SUCCEEDED, "flaky", {}, ["failed"], None, True) == (
        detail.group.status,
        detail.group.handler,
        detail.archived,
        [a.outcome.value for a in detail.attempts],
        detail.group.worker,
        detail.group.age >= 7200,
    )


def test_a_group_done_is_as_old_as_its_archiving(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """A group done and archived an hour ago is an hour old, not 0 s."""
    app = make_app(database_url)
    app.handler(ActivityEvent, batch_size=5, name="archives", archive=True)(_succeed)
    commit_events(app.engine, 2)
    drain(app)
    with app.engine.begin() as conn:
        conn.execute(update(schema.archive).values(archived_at=db_now_plus(-3600)))
    [group_id] = {row.group_id for row in _archived(app.engine)}
    detail = groups.show(app, group_id)
    assert (schema.ArchiveStatus.SUCCEEDED, True) == (
        detail.group.status,
        3600 <= detail.group.age < 7200,
    )
