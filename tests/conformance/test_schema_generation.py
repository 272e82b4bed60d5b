"""outbox_schema and the versions workers record: what a fleet knows of its versions.

The database records the schema generation it is at and the oldest worker generation that may
work on it, in one row; each worker records its outbox version and the generation it
understands; the live workers are counted by both.
"""

from __future__ import annotations

from outbox import schema
from outbox._core.version import VERSION
from outbox._db import queries
from tests.conformance._database import Database
from tests.conformance._factories import add_worker, worker

STALE = 60.0


def test_insert_worker_records_its_version_and_generation(db: Database) -> None:
    """A worker's row says which outbox it runs and the schema generation it understands."""
    db.run(lambda conn: queries.insert_worker(conn, "w1", "host-a", 4321, 8))
    row = worker(db.engine, "w1")
    assert (VERSION, schema.GENERATION) == (row["version"], row["generation"])


def test_schema_generation_reads_the_recorded_generation(db: Database) -> None:
    """What record_schema_generation wrote comes back, with the version that wrote it."""
    db.run(lambda conn: queries.record_schema_generation(conn, 7, 6))
    state = db.run(queries.schema_generation)
    assert state is not None
    age = -db.seconds_from_now(state.migrated_at)
    assert (7, 6, VERSION, True) == (
        state.generation,
        state.workers_from,
        state.migrated_by,
        0 <= age < 5,
    )


def test_record_schema_generation_replaces_the_row(db: Database) -> None:
    """Recording twice leaves one row: the second."""
    db.run(lambda conn: queries.record_schema_generation(conn, 7, 6))
    db.run(lambda conn: queries.record_schema_generation(conn, 5, 1))
    state = db.run(queries.schema_generation)
    assert (5, 1) == (None if state is None else (state.generation, state.workers_from))


def test_schema_generation_without_its_row_is_none(db: Database) -> None:
    """A table without its row records nothing."""
    assert None is db.run(queries.schema_generation)


def test_live_worker_versions_counts_live_workers_by_version_oldest_first(db: Database) -> None:
    """Live workers by version and generation, those that record none first; the gone ones
    are not counted."""
    add_worker(db.engine, "old-1", older_release=True)
    add_worker(db.engine, "old-2", older_release=True)
    add_worker(db.engine, "new-1", version="0.2.0", generation=5)
    add_worker(db.engine, "newer-1", version="0.3.0", generation=6)
    add_worker(db.engine, "newer-2", version="0.3.0", generation=6)
    add_worker(db.engine, "gone", version="0.2.0", generation=5, heartbeat_ago=STALE + 30)
    versions = db.run(lambda conn: queries.live_worker_versions(conn, STALE, STALE))
    expected = [(None, None, 2), ("0.2.0", 5, 1), ("0.3.0", 6, 2)]
    assert expected == [(v.version, v.generation, v.live) for v in versions]
