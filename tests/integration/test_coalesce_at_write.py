"""Coalescing at write time (``add_events(..., coalesce_on=column)``): a key's waiting event is
written over until a claim takes it, so a hot key is one row, not one per change; a claim
under way is waited for and never written into. On SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

import os
import random
import threading
import uuid
from collections import defaultdict
from collections.abc import Callable

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from outbox import Batch, Outbox, Settings, add_events
from outbox.worker import Worker
from tests._support import wait_for
from tests.conftest import FULL_RUN_ENV, reset_schema
from tests.models import ContactChange, EmailEvent


def _rows(engine: Engine) -> list[tuple[int, int, bool]]:
    """(contact_id, version, claimed) of every row, by id."""
    with engine.connect() as conn:
        found = conn.execute(
            select(
                ContactChange.contact_id, ContactChange.version, ContactChange.group_id
            ).order_by(ContactChange.id)
        ).all()
    return [(key, version, group is not None) for key, version, group in found]


def _change(engine: Engine, key: int, version: int) -> None:
    with Session(engine) as session, session.begin():
        add_events(session, ContactChange, [{"contact_id": key, "version": version}],
                   coalesce_on="contact_id")  # fmt: skip


def test_a_waiting_event_is_written_over_keeping_its_place(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Ten changes of each of three keys: three rows, each with its key's last state, and the
    id and creation time of the key's first change (how long the key has waited)."""
    app = make_app(database_url)
    _change(app.engine, 1, 0)
    with app.engine.connect() as conn:
        first = conn.execute(select(ContactChange.id, ContactChange.created_at)).one()
    for version in range(1, 10):
        for key in (1, 2, 3):
            _change(app.engine, key, version)
    with app.engine.begin() as conn:  # one call with the same key twice: the last one stays
        rows = [{"contact_id": 4, "version": 1}, {"contact_id": 4, "version": 2}]
        assert 2 == add_events(conn, ContactChange, rows, coalesce_on="contact_id")
    assert [(1, 9, False), (2, 9, False), (3, 9, False), (4, 2, False)] == _rows(app.engine)
    with app.engine.connect() as conn:
        assert (
            first
            == conn.execute(
                select(ContactChange.id, ContactChange.created_at).where(
                    ContactChange.contact_id == 1
                )
            ).one()
        )


def test_a_claim_under_way_is_waited_for_and_never_written_into(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """A claim's transaction holds the key's row: the write waits for it, finds the row
    claimed, and writes a new row: the group under way keeps the state it was claimed with."""
    app = make_app(database_url)
    _change(app.engine, 1, 1)
    done = threading.Event()
    with app.engine.connect() as claim:
        claim.begin()
        claim.execute(update(ContactChange.__table__).values(group_id=uuid.uuid4()))
        writer = threading.Thread(target=lambda: (_change(app.engine, 1, 2), done.set()))
        writer.start()
        assert not done.wait(0.5)  # waiting for the claim's transaction
        claim.commit()
    writer.join(30)
    assert [(1, 1, True), (1, 2, False)] == _rows(app.engine)


def test_bad_input_is_refused_before_anything_is_written(sqlite_url: str) -> None:
    reset_schema(sqlite_url)
    app = Outbox(sqlite_url)
    with app.engine.begin() as conn:
        with pytest.raises(TypeError, match=r"coalesce_on='nope' is not a payload column"):
            add_events(conn, ContactChange, [{"contact_id": 1, "version": 1}], coalesce_on="nope")
        with pytest.raises(TypeError, match=r"coalesce_on='group_id' is not a payload column"):
            add_events(
                conn, ContactChange, [{"contact_id": 1, "version": 1}], coalesce_on="group_id"
            )
        rows = [{"contact_id": 1, "version": 1}, {"contact_id": None, "version": 2}]
        with pytest.raises(TypeError, match=r"rows\[1\] gives no value for 'contact_id'"):
            add_events(conn, ContactChange, rows, coalesce_on="contact_id")
        with pytest.raises(TypeError, match=r"coalesce_on='data' is a JSON column"):
            add_events(conn, EmailEvent, [{"address": "a@b", "data": {}}], coalesce_on="data")
    assert [] == _rows(app.engine)
    app.engine.dispose()


# The proof, 100,000 changes of 1,000 keys, in the full run (nox -s full).
CHANGES, KEYS = (100_000, 1_000) if os.environ.get(FULL_RUN_ENV) == "1" else (2_000, 40)


def test_writers_and_a_coalescing_worker_never_hand_over_an_older_state(
    database_url: str, make_app: Callable[..., Outbox]
) -> None:
    """Four writers change 40 keys 2,000 times (1,000 keys 100,000 times in the full run)
    while a worker drains them: the handler sees each key's versions rising, ends with every
    key's last one, and is handed far fewer rows than there were changes (printed)."""
    app = make_app(database_url, Settings(poll_interval=0.02, rescue_interval=0.05))
    seen: dict[int, list[int]] = defaultdict(list)
    handed = [0]

    @app.handler(ContactChange, batch_size=50, ordering_key="contact_id", coalesce=True)
    def sync(batch: Batch[ContactChange]) -> None:
        handed[0] += len(batch.events)
        for event in batch.events:
            seen[event.contact_id].append(event.version)

    keys = list(range(KEYS))
    last: dict[int, int] = {}

    def write(mine: list[int], seed: int) -> None:
        chooser = random.Random(seed)
        for version in range(1, CHANGES // 4 + 1):
            key = chooser.choice(mine)
            _change(app.engine, key, version)
            last[key] = version

    worker = Worker(app, concurrency=2)
    runner = threading.Thread(target=worker.run)
    runner.start()
    writers = [threading.Thread(target=write, args=(keys[n::4], n)) for n in range(4)]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join(3600)
    try:
        wait_for(
            lambda: all(seen[k][-1:] == [v] for k, v in last.items()),
            "every key's last version handed over",
            timeout=60,
        )
    finally:
        worker.stop()
        runner.join(30)
    assert {k: sorted(v) for k, v in seen.items()} == dict(seen)  # never older after newer
    print(f"{database_url.split(':')[0]}: {CHANGES} changes, {handed[0]} rows handed over")
    assert handed[0] < CHANGES
