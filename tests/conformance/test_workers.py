"""outbox_workers: registering workers, their heartbeats, pruning the dead, and the leader.

A worker is live while its heartbeat is fresher than the stale age. The leader, which runs
distribution, is the live worker that started first (ties broken by id).
"""

from __future__ import annotations

from outbox._db import queries
from tests.conformance._database import Database
from tests.conformance._factories import (
    add_worker,
    add_workers_started_together,
    worker,
    worker_ids,
)

STALE = 60.0


def test_insert_worker_registers_a_live_worker(db: Database) -> None:
    """The worker's row says who it is; it started and heartbeated now."""
    db.run(lambda conn: queries.insert_worker(conn, "w1", "host-a", 4321, 8))
    row = worker(db.engine, "w1")
    ages = [-db.seconds_from_now(row[name]) for name in ("started_at", "heartbeat_at")]
    actual = (row["hostname"], row["pid"], row["concurrency"], [0 <= age < 5 for age in ages])
    assert ("host-a", 4321, 8, [True, True]) == actual


def test_touch_worker_records_a_heartbeat_now(db: Database) -> None:
    """A heartbeat moves the worker's last heartbeat to the database's now."""
    add_worker(db.engine, "w1", heartbeat_ago=30.0)
    touched = db.run(lambda conn: queries.touch_worker(conn, "w1"))
    age = -db.seconds_from_now(worker(db.engine, "w1")["heartbeat_at"])
    assert (True, True) == (touched, 0 <= age < 5)


def test_touch_worker_of_a_forgotten_worker_says_so(db: Database) -> None:
    """A worker whose row was pruned is told: False."""
    add_worker(db.engine, "w2")
    assert False is db.run(lambda conn: queries.touch_worker(conn, "w1"))


def test_delete_worker_unregisters_only_that_worker(db: Database) -> None:
    """The worker's row goes; the others stay."""
    add_worker(db.engine, "w1")
    add_worker(db.engine, "w2")
    db.run(lambda conn: queries.delete_worker(conn, "w1"))
    assert ["w2"] == worker_ids(db.engine)


def test_delete_stale_workers_forgets_only_workers_without_a_fresh_heartbeat(
    db: Database,
) -> None:
    """Workers silent longer than the stale age go; the count says how many."""
    add_worker(db.engine, "dead", heartbeat_ago=STALE + 30)
    add_worker(db.engine, "live", started_ago=STALE + 30, heartbeat_ago=STALE - 30)
    deleted = db.run(lambda conn: queries.delete_stale_workers(conn, STALE, STALE))
    assert (1, ["live"]) == (deleted, worker_ids(db.engine))


def test_the_leader_is_the_live_worker_that_started_first(db: Database) -> None:
    """An older worker whose heartbeat went stale does not lead; the oldest live one does."""
    add_worker(db.engine, "a-stale", started_ago=300.0, heartbeat_ago=STALE + 30)
    add_worker(db.engine, "c-oldest-live", started_ago=200.0)
    add_worker(db.engine, "b-younger", started_ago=100.0)
    assert "c-oldest-live" == db.run(lambda conn: queries.leader_worker_id(conn, STALE))


def test_between_workers_started_together_the_lowest_id_leads(db: Database) -> None:
    """Two workers with the same start time: the one with the lower id leads."""
    add_workers_started_together(db.engine, ["w2", "w1", "w3"])
    assert "w1" == db.run(lambda conn: queries.leader_worker_id(conn, STALE))


def test_without_live_workers_there_is_no_leader(db: Database) -> None:
    """Only stale workers: nobody leads."""
    add_worker(db.engine, "w1", heartbeat_ago=STALE + 30)
    assert None is db.run(lambda conn: queries.leader_worker_id(conn, STALE))


def test_count_live_workers_counts_fresh_heartbeats_only(db: Database) -> None:
    """Workers whose heartbeat is fresher than the stale age are counted."""
    add_worker(db.engine, "w1")
    add_worker(db.engine, "w2", heartbeat_ago=STALE - 30)
    add_worker(db.engine, "w3", heartbeat_ago=STALE + 30)
    assert 2 == db.run(lambda conn: queries.count_live_workers(conn, STALE))


def test_an_older_release_worker_is_forgotten_only_past_its_own_age(db: Database) -> None:
    """A worker of a release before 0.2 (no generation) silent past the stale age stays while
    its silence is within the older releases' age; past it, it goes."""
    add_worker(db.engine, "older-live", heartbeat_ago=STALE + 30, older_release=True)
    add_worker(db.engine, "older-gone", heartbeat_ago=3 * STALE + 30, older_release=True)
    deleted = db.run(lambda conn: queries.delete_stale_workers(conn, STALE, 3 * STALE))
    assert (1, ["older-live"]) == (deleted, worker_ids(db.engine))


def test_a_run_once_caller_never_leads_however_long_it_runs(db: Database) -> None:
    """A run-once caller's row (its id begins with ``once:``) is passed over: the oldest live
    worker leads."""
    add_worker(db.engine, f"{queries.RUN_ONCE_PREFIX}host:1:ab", started_ago=300.0)
    add_worker(db.engine, "worker-younger", started_ago=100.0)
    assert "worker-younger" == db.run(lambda conn: queries.leader_worker_id(conn, STALE))


def test_with_only_run_once_callers_no_one_leads(db: Database) -> None:
    """No worker distributes as the leader while only run-once callers have rows."""
    add_worker(db.engine, f"{queries.RUN_ONCE_PREFIX}host:1:ab", started_ago=300.0)
    assert None is db.run(lambda conn: queries.leader_worker_id(conn, STALE))


def test_silent_run_once_callers_are_forgotten_and_nothing_else(db: Database) -> None:
    """A run-once caller silent past the age goes; a live one and a silent worker stay (a
    worker is judged by the rescue of a worker that may judge)."""
    killed = f"{queries.RUN_ONCE_PREFIX}host:1:killed"
    live = f"{queries.RUN_ONCE_PREFIX}host:2:live"
    add_worker(db.engine, killed, heartbeat_ago=STALE + 30)
    add_worker(db.engine, live)
    add_worker(db.engine, "silent-worker", heartbeat_ago=STALE + 30)
    deleted = db.run(lambda conn: queries.delete_silent_run_once_callers(conn, STALE))
    assert (1, sorted([live, "silent-worker"])) == (deleted, worker_ids(db.engine))
