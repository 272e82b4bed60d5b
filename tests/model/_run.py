"""Running a case on a real database with a real worker, and reading where it left the events."""

from __future__ import annotations

import datetime as dt
import time
from collections import defaultdict
from typing import Any

from sqlalchemy import Engine, select

from outbox import Outbox, add_events, schema
from outbox._db import queries
from outbox._engine import distributor
from outbox.worker import Worker
from tests.model._behaviour import HANDLER, Case, Script, register
from tests.model._model import Archived, Checker, Final, Record
from tests.model._tables import ModelEvent, reset

IDLE_POLL_SECONDS = 0.05
SETTLE_GRACE_SECONDS = 0.3


def commit_events(engine: Engine, case: Case) -> tuple[dict[int, float], dict[int, Any]]:
    """Write the case's events in one transaction; their creation time (wall) and key by id."""
    s = case.setup
    with engine.begin() as conn:
        rows = [{"n": n, "account": (n % s.keys) if s.keys else None} for n in range(s.events)]
        add_events(conn, ModelEvent, rows)
        found = conn.execute(select(ModelEvent.id, ModelEvent.account).order_by(ModelEvent.id))
        keys = {int(i): account for i, account in found}
    now = time.time()
    return dict.fromkeys(keys, now), keys


def run_case(
    url: str, case: Case, *, budget: float, admin_url: str | None = None, window_slack: int = 0
) -> tuple[list[Record], Checker, Final]:
    """Play ``case`` with a one-thread worker (``outbox.testing.drain``'s loop, polling until
    nothing more is due or ``budget`` seconds passed); the checker and the final state.

    ``admin_url``: where to reset the tables (the database itself, behind a pooler).
    ``window_slack``: calls a rate-limit window may hold over the limit."""
    reset(admin_url or url)
    loop_errors: list[str] = []
    app = Outbox(url)
    try:
        script = Script(case.calls)
        register(app, case, script)
        created, keys = commit_events(app.engine, case)
        worker = Worker(app, concurrency=1)
        deadline = time.monotonic() + budget
        quiet_since: float | None = None
        while time.monotonic() < deadline:
            try:
                ran = worker.run_once()
            except Exception as error:  # a worker's loop logs it and goes on: so does this one
                loop_errors.append(f"{type(error).__name__}: {error}")
                ran = 1
            if ran:
                quiet_since = None
                continue
            worker.rescue()
            if distributor.enqueued(distributor.run_once(app, [HANDLER])):
                quiet_since = None
                continue
            if _nothing_due_before(app, deadline):
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > SETTLE_GRACE_SECONDS:
                    break
            time.sleep(IDLE_POLL_SECONDS)
        settled = time.monotonic() < deadline
        final = read_final(app.engine, settled=settled)
        options = case.options(window_slack=window_slack)
        checker = Checker(options, script.records, created, keys)
        checker.loop_errors = loop_errors
        return script.records, checker, final
    finally:
        app.engine.dispose()


def _nothing_due_before(app: Outbox, deadline: float) -> bool:
    """True when no job will be due before ``deadline`` and no unclaimed event can be claimed
    (an ordered key held by a dead event keeps its later events in the buffer)."""
    jobs = schema.jobs
    with app.engine.connect() as conn:
        now = queries.database_now(conn)
        due = conn.execute(select(jobs.c.run_at, jobs.c.kind)).all()
        held = {k for (k,) in conn.execute(select(schema.held_keys.c.key))}
        free = conn.execute(
            select(ModelEvent.account).where(ModelEvent.group_id.is_(None))
        ).scalars()
        claimable = [a for a in free if a is None or str(a) not in held]
    left = deadline - time.monotonic()
    if claimable:
        return False
    return all(_seconds(run_at, now) > left for run_at, _ in due)


def _seconds(moment: dt.datetime, now: dt.datetime) -> float:
    def utc(m: dt.datetime) -> dt.datetime:
        return m if m.tzinfo else m.replace(tzinfo=dt.UTC)

    return (utc(moment) - utc(now)).total_seconds()


def read_final(engine: Engine, *, settled: bool) -> Final:
    """Where the events are: buffered (with when their group is due), archived, held."""
    jobs, archive = schema.jobs, schema.archive
    with engine.connect() as conn:
        now = queries.database_now(conn)
        buffered = conn.execute(select(ModelEvent.id, ModelEvent.group_id)).all()
        due = {g: r for g, r in conn.execute(select(jobs.c.group_id, jobs.c.run_at)) if g}
        rows = conn.execute(
            select(
                archive.c.event_id,
                archive.c.status,
                archive.c.error,
                archive.c.attempts,
                archive.c.created_at,
                archive.c.archived_at,
            )
        ).all()
        held = {str(k) for (k,) in conn.execute(select(schema.held_keys.c.key))}
    archived: dict[int, list[Archived]] = defaultdict(list)
    for event_id, status, error, attempts, created_at, archived_at in rows:
        age = _seconds(archived_at, created_at) if created_at is not None else 0.0
        archived[int(event_id)].append(Archived(str(status), error, int(attempts), age))
    due_in = {int(i): _seconds(due[g], now) for i, g in buffered if g is not None and g in due}
    return Final(
        buffered={int(i) for i, _ in buffered},
        archived=dict(archived),
        held_keys=held,
        due_in=due_in,
        ended_at_wall=time.time(),
        settled=settled,
    )
