"""outbox_archive: archiving a group's rows, reading archived rows back, and pruning.

Archiving copies rows with one ``INSERT ... SELECT``, the payload built by the database; the
payload, read back as JSON text, replays to the values the buffer stored. Archived rows are
read by filter with keyset pagination, counted by handler and status, deleted by id, and
pruned by age and status, a bounded number at a time from where the last chunk stopped; recent
dead letters are counted per handler for the alert.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from sqlalchemy import Connection, select

from outbox import BufferMixin, schema
from outbox._core.values import archived_payload, from_archived
from outbox._db import queries
from outbox._db.dialects import JSON_AS_TEXT_MARKER
from tests.conformance._database import Database
from tests.conformance._factories import (
    ACTIVITY,
    HANDLER,
    OTHER_HANDLER,
    TYPED,
    add_archived,
    add_events,
    add_typed_events,
    archive_ids,
    archived,
    date_back,
    empty,
    group_ids,
    typed_rows,
)

SUCCEEDED = schema.ArchiveStatus.SUCCEEDED
DEAD = schema.ArchiveStatus.DEAD
DISCARDED = schema.ArchiveStatus.DISCARDED


def _archive(
    conn: Connection,
    db: Database,
    group_id: uuid.UUID,
    table: Any = ACTIVITY,
    **options: Any,
) -> int:
    return queries.archive_group_rows(
        conn,
        db.dialect,
        table,
        handler=HANDLER,
        group_id=group_id,
        status=DEAD,
        attempts=3,
        error="gave up",
        **options,
    )


def test_archive_group_rows_archives_each_row_of_the_group(db: Database) -> None:
    """One archive row per row of the group, naming the handler, buffer, event, group, status,
    attempts and error; the count says how many."""
    group_id = uuid.uuid4()
    ids = add_events(db.engine, 2, group_id=group_id)
    add_events(db.engine, 1, group_id=uuid.uuid4())
    count = db.run(lambda conn: _archive(conn, db, group_id))
    columns = ("handler", "buffer", "event_id", "group_id", "status", "attempts", "error")
    rows = [tuple(row[name] for name in columns) for row in archived(db.engine)]
    expected = [(HANDLER, ACTIVITY.name, i, group_id, DEAD, 3, "gave up") for i in ids]
    assert (2, expected) == (count, rows)


def test_archive_group_rows_keeps_the_events_creation_time(db: Database) -> None:
    """An archived event keeps when it was written; when it was archived is the database's
    now."""
    group_id = uuid.uuid4()
    add_events(db.engine, 1, group_id=group_id, age=60.0)
    with db.engine.connect() as conn:
        created_at = conn.execute(select(ACTIVITY.c.created_at)).scalar_one()
    db.run(lambda conn: _archive(conn, db, group_id))
    (row,) = archived(db.engine)
    archived_ago = -db.seconds_from_now(row["archived_at"])
    assert (created_at, True) == (row["created_at"], 0 <= archived_ago < 5)


def test_archive_group_rows_leaves_the_buffers_rows(db: Database) -> None:
    """Archiving copies: deleting the rows is a step of its own."""
    group_id = uuid.uuid4()
    ids = add_events(db.engine, 2, group_id=group_id)
    db.run(lambda conn: _archive(conn, db, group_id))
    assert ids == group_ids(db.engine, group_id)


def test_archive_group_rows_archives_only_the_named_events(db: Database) -> None:
    """Given event ids, only those rows of the group are archived."""
    group_id = uuid.uuid4()
    ids = add_events(db.engine, 3, group_id=group_id)
    count = db.run(lambda conn: _archive(conn, db, group_id, event_ids=[ids[0], ids[2]]))
    assert (2, [ids[0], ids[2]]) == (count, [row["event_id"] for row in archived(db.engine)])


def test_archive_group_rows_archives_only_rows_older_than_the_age(db: Database) -> None:
    """Given an age, only the rows written longer ago than that are archived."""
    group_id = uuid.uuid4()
    old, _ = add_events(db.engine, 2, group_id=group_id)
    date_back(db.engine, [old], 120.0)
    count = db.run(lambda conn: _archive(conn, db, group_id, older_than=60.0))
    assert (1, [old]) == (count, [row["event_id"] for row in archived(db.engine)])


def test_archived_payload_holds_every_column_by_name(db: Database) -> None:
    """The payload is a JSON object of the row's columns, keyed by column name."""
    group_id = uuid.uuid4()
    (event_id,) = add_events(db.engine, 1, group_id=group_id)
    db.run(lambda conn: _archive(conn, db, group_id))
    (row,) = _select(db)
    payload = json.loads(row["payload"])
    expected = ({column.name for column in ACTIVITY.c}, event_id, 0, "viewed")
    actual = (set(payload), payload["id"], payload["activity_id"], payload["kind"])
    assert expected == actual


@pytest.mark.parametrize("lenient", [False, True], ids=["exact", "lenient"])
def test_archived_payload_replays_to_the_stored_values(
    typed_buffer: Database, lenient: bool
) -> None:
    """A row archived, read back and written again as stored reads exactly as the original:
    text, big integers, doubles, decimals, booleans, times, dates, bytes, UUIDs, JSON, a
    converting type and NULL; in the exact payload and in the lenient one (for values the
    exact one cannot hold)."""
    db = typed_buffer
    group_id = uuid.uuid4()
    add_typed_events(db.engine, 2, group_id=group_id)
    originals = typed_rows(db.engine)
    db.run(lambda conn: _archive(conn, db, group_id, table=TYPED, lenient=lenient))
    empty(db.engine, TYPED)
    payloads = [archived_payload(row["payload"]) for row in _select(db)]
    db.run(lambda conn: queries.insert_stored_rows(conn, TYPED, _as_stored(conn, payloads)))
    assert _own_values(originals) == _own_values(typed_rows(db.engine))


def _as_stored(conn: Connection, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Archived payloads turned back into the values the buffer stores, as replay does."""
    rows = []
    for payload in payloads:
        json_as_text = bool(payload.pop(JSON_AS_TEXT_MARKER, False))
        rows.append(
            {
                column.name: from_archived(
                    column, payload[column.name], conn.dialect, json_as_text=json_as_text
                )
                for column in TYPED.columns
                if column.name not in BufferMixin.OWN_COLUMNS
            }
        )
    return rows


def _own_values(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The application's columns of buffer rows (replayed rows get a new id and time)."""
    return [
        {name: value for name, value in row.items() if name not in BufferMixin.OWN_COLUMNS}
        for row in rows
    ]


def _select(db: Database, *, after_id: int = 0, limit: int = 100, **filters: Any) -> list[Any]:
    options: dict[str, Any] = {"handler": None, "statuses": None, "group_id": None, **filters}
    return db.run(
        lambda conn: queries.select_archived(conn, after_id=after_id, limit=limit, **options)
    )


def _selected_ids(db: Database, **options: Any) -> list[int]:
    return [int(row["id"]) for row in _select(db, **options)]


def test_select_archived_reads_the_payload_as_json_text(db: Database) -> None:
    """The payload comes back as text, for the caller to parse with exact numbers."""
    add_archived(db.engine)
    (row,) = _select(db)
    assert {"activity_id": 1, "kind": "viewed"} == json.loads(row["payload"])


def test_select_archived_of_one_handler(db: Database) -> None:
    """Filtered by handler, other handlers' rows are left out."""
    mine = add_archived(db.engine)
    add_archived(db.engine, handler=OTHER_HANDLER)
    assert [mine] == _selected_ids(db, handler=HANDLER)


def test_select_archived_of_one_status(db: Database) -> None:
    """Filtered by status, rows of other statuses are left out."""
    add_archived(db.engine)
    dead = add_archived(db.engine, status=DEAD)
    assert [dead] == _selected_ids(db, statuses={DEAD})


def test_select_archived_of_one_group(db: Database) -> None:
    """Filtered by group, other groups' rows are left out."""
    group_id = uuid.uuid4()
    mine = add_archived(db.engine, group_id=group_id)
    add_archived(db.engine)
    assert [mine] == _selected_ids(db, group_id=group_id)


def test_select_archived_pages_by_id(db: Database) -> None:
    """A page holds at most ``limit`` rows after ``after_id``, by id."""
    ids = [add_archived(db.engine) for _ in range(5)]
    assert ids[1:3] == _selected_ids(db, after_id=ids[0], limit=2)


def test_delete_archived_deletes_the_rows_named(db: Database) -> None:
    """Only the rows named go; the count says how many."""
    ids = [add_archived(db.engine) for _ in range(3)]
    deleted = db.run(lambda conn: queries.delete_archived(conn, [ids[0], ids[2]]))
    assert (2, [ids[1]]) == (deleted, archive_ids(db.engine))


def test_delete_archived_of_no_ids_deletes_nothing(db: Database) -> None:
    """No ids, no rows deleted."""
    ids = [add_archived(db.engine)]
    assert (0, ids) == (
        db.run(lambda conn: queries.delete_archived(conn, [])),
        archive_ids(db.engine),
    )


def _prune(db: Database, older_than: float, limit: int, *args: Any) -> int:
    return db.run(lambda conn: queries.delete_old_archived(conn, older_than, limit, *args)).deleted


def test_delete_old_archived_deletes_only_rows_archived_longer_ago(db: Database) -> None:
    """Rows archived more than the age ago go; younger ones stay."""
    add_archived(db.engine, age=3600.0)
    young = add_archived(db.engine, age=10.0)
    assert (1, [young]) == (_prune(db, 60.0, 100), archive_ids(db.engine))


def test_delete_old_archived_deletes_at_most_the_limit_oldest_first(db: Database) -> None:
    """No more than ``limit`` rows go at a time, the longest archived first."""
    ages = (7200.0, 3600.0, 10800.0, 5400.0)
    ids = [add_archived(db.engine, age=age) for age in ages]
    assert (2, [ids[1], ids[3]]) == (_prune(db, 60.0, 2), archive_ids(db.engine))


def test_delete_old_archived_deletes_only_the_statuses_named(db: Database) -> None:
    """Given statuses, old rows of other statuses stay."""
    add_archived(db.engine, age=3600.0)
    add_archived(db.engine, status=DISCARDED, age=3600.0)
    dead = add_archived(db.engine, status=DEAD, age=3600.0)
    assert (2, [dead]) == (_prune(db, 60.0, 100, {SUCCEEDED, DISCARDED}), archive_ids(db.engine))


def test_delete_old_archived_says_where_the_next_chunk_starts(db: Database) -> None:
    """The chunk says the latest ``archived_at`` it deleted; a pick from there leaves the rows
    archived before it, and the kept rows in between are not picked."""
    first = add_archived(db.engine, age=7200.0)
    kept = add_archived(db.engine, status=DEAD, age=5400.0)
    add_archived(db.engine, age=3600.0)
    ages = {row["id"]: row["archived_at"] for row in archived(db.engine)}
    chunk = db.run(lambda conn: queries.delete_old_archived(conn, 60.0, 1, {SUCCEEDED}))
    later = db.run(
        lambda conn: queries.delete_old_archived(
            conn, 60.0, 100, {SUCCEEDED}, from_archived_at=chunk.last_archived_at
        )
    )
    assert ((1, ages[first]), 1, [kept]) == (
        (chunk.deleted, chunk.last_archived_at),
        later.deleted,
        archive_ids(db.engine),
    )


def test_delete_old_archived_skips_rows_archived_before_the_start(db: Database) -> None:
    """Rows archived before ``from_archived_at`` stay, however old."""
    oldest = add_archived(db.engine, age=7200.0)
    add_archived(db.engine, age=3600.0)
    start = archived(db.engine)[1]["archived_at"]
    pruned = db.run(
        lambda conn: queries.delete_old_archived(conn, 60.0, 100, from_archived_at=start)
    )
    assert (1, [oldest]) == (pruned.deleted, archive_ids(db.engine))


def test_delete_old_archived_of_nothing_old_says_so(db: Database) -> None:
    """No row old enough: nothing deleted, and no place to start from."""
    add_archived(db.engine, age=10.0)
    pruned = db.run(lambda conn: queries.delete_old_archived(conn, 60.0, 100))
    assert queries.PrunedChunk(0, None) == pruned


def test_count_archived_counts_by_handler_and_status(db: Database) -> None:
    """Every row counted once, under its handler and status."""
    add_archived(db.engine)
    add_archived(db.engine, status=DEAD)
    add_archived(db.engine, status=DEAD)
    add_archived(db.engine, handler=OTHER_HANDLER, status=DISCARDED)
    expected = {(HANDLER, SUCCEEDED): 1, (HANDLER, DEAD): 2, (OTHER_HANDLER, DISCARDED): 1}
    assert expected == db.run(lambda conn: queries.count_archived(conn))


def test_count_archived_counts_only_the_rows_the_filters_take(db: Database) -> None:
    """Handler, statuses, group and age each narrow the count."""
    group_id = uuid.uuid4()
    add_archived(db.engine, status=DEAD, group_id=group_id, age=3600.0)
    add_archived(db.engine, status=DEAD, group_id=group_id)
    add_archived(db.engine, status=DEAD, age=3600.0)
    add_archived(db.engine, status=DISCARDED, group_id=group_id, age=3600.0)
    add_archived(db.engine, handler=OTHER_HANDLER, status=DEAD, group_id=group_id, age=3600.0)
    counted = db.run(
        lambda conn: queries.count_archived(
            conn, handler=HANDLER, statuses={DEAD}, group_id=group_id, older_than_seconds=60.0
        )
    )
    assert {(HANDLER, DEAD): 1} == counted


def test_count_archived_up_to_counts_the_rows_the_filters_take(db: Database) -> None:
    """Handler, statuses, groups and age each narrow the count, as a prune or a replay takes
    them."""
    group_id = uuid.uuid4()
    add_archived(db.engine, status=DEAD, group_id=group_id, age=3600.0)
    add_archived(db.engine, status=DEAD, group_id=group_id)
    add_archived(db.engine, status=DEAD, age=3600.0)
    add_archived(db.engine, status=DISCARDED, group_id=group_id, age=3600.0)
    add_archived(db.engine, handler=OTHER_HANDLER, status=DEAD, group_id=group_id, age=3600.0)
    counted = db.run(
        lambda conn: queries.count_archived_up_to(
            conn,
            100,
            handler=HANDLER,
            statuses={DEAD},
            group_ids=[group_id],
            older_than_seconds=60.0,
        )
    )
    assert 1 == counted


def test_count_archived_up_to_stops_at_the_cap(db: Database) -> None:
    """More rows than the cap: the count is the cap."""
    for _ in range(5):
        add_archived(db.engine)
    assert (3, 5) == (
        db.run(lambda conn: queries.count_archived_up_to(conn, 3)),
        db.run(lambda conn: queries.count_archived_up_to(conn, 10)),
    )


def test_recent_dead_letters_counts_each_handlers_dead_letters_in_the_window(
    db: Database,
) -> None:
    """Per handler, the dead letters archived within the window; older ones and other
    statuses are not counted, and a handler with none is left out."""
    add_archived(db.engine, status=DEAD, age=600.0, error="Timeout: old")
    add_archived(db.engine, status=DEAD, age=60.0, error="ConnectionError: refused\ntrace")
    add_archived(db.engine, status=DEAD, age=7200.0)
    add_archived(db.engine, status=DISCARDED, age=10.0)
    add_archived(db.engine, handler=OTHER_HANDLER, status=SUCCEEDED, age=10.0)
    (found,) = db.run(lambda conn: queries.recent_dead_letters(conn, 3600.0))
    assert (HANDLER, 3600.0, 2, "ConnectionError: refused\ntrace", True) == (
        found.handler,
        found.since,
        found.count,
        found.newest_error,
        50.0 <= found.newest_age < 120.0,
    )


def test_recent_dead_letters_of_an_older_archive_is_empty(db: Database) -> None:
    """Dead letters all older than the window: nothing to alert on."""
    add_archived(db.engine, status=DEAD, age=7200.0)
    assert [] == db.run(lambda conn: queries.recent_dead_letters(conn, 3600.0))
