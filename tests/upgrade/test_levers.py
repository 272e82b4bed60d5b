"""Upgrade scenarios of the levers a mixed fleet shares and of the way back:

- a non-UTC MariaDB session zone (``-05:00`` on every connection of both releases): the current
  ``outbox migrate`` refuses while the older release's workers are alive, naming them in one
  line, and succeeds once they are stopped; then nothing is lost, expired or delivered twice;
- ``outbox pause`` in the mixed period warns that older workers are alive;
- a long reader during the migration never freezes the fleet much longer than the lock timeout;
- a rollback: ``outbox migrate --to 0001 --yes`` with the new workers stopped, then the old
  workers drain what is left;
- new workers leave a live older worker in the fleet (its row, its leases), whose heartbeats
  come at its own release's pace.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

import pytest

from outbox.ops.migrate import head_revision
from outbox.settings import DEFAULT_RESCUE_INTERVAL_SECONDS, DEFAULT_WORKER_STALE_SECONDS
from tests.upgrade._harness import SIZE_ENV, LongReader, Upgrade, longest_gap

# How much longer than the lock timeout the fleet may go without starting a group while a
# migration waits behind a long reader: start-up of the statements queued behind it, a loaded
# machine. A freeze for the reader's whole time is longer still (the size keeps it so).
GAP_SLACK_SECONDS = 3.0
# The previous release heartbeats every third of its lease, whatever worker_stale_after says;
# the current one every third of the shorter of the two, and it takes a worker silent for
# worker_stale_after (20 s by default) for gone once its own heartbeats have been steady that
# long. With both defaults (a 60 s lease) an old worker's heartbeat is 20 s old just before the
# next one, and the full size caught new workers taking live old workers' leases there (27
# events delivered twice in 96,000); with a longer lease, shared by both releases as an
# application's setting is, the first rescue that judges takes the old workers for gone: it
# frees the jobs they hold and deletes their rows.
LONG_LEASE_SECONDS = 300
JUDGING_SECONDS = DEFAULT_WORKER_STALE_SECONDS + 2 * DEFAULT_RESCUE_INTERVAL_SECONDS * 1.25
"""Long enough for the new workers to judge others gone (their own heartbeats steady for a
stale age), then rescue twice (the rescue interval with its jitter)."""


full_size_only = pytest.mark.skipif(
    os.environ.get(SIZE_ENV, "small") != "full", reason="the full size only: nox -s upgrade"
)


def test_the_migration_refuses_while_old_workers_write_local_time(zoned_upgrade: Upgrade) -> None:
    """In a non-UTC zone, migrating beside the older release's workers is refused in one line
    naming each of them."""
    upgrade = zoned_upgrade
    upgrade.prepare()
    upgrade.start_workers("old")
    upgrade.start_producers()
    upgrade.wait_groups(
        upgrade.size.groups_before, "the old workers' groups", upgrade.old_deliveries()
    )
    refused = upgrade.run("new", "migrate", "migrate")
    lines = refused.stderr.strip().splitlines()
    named = [f":{pid}" in refused.stderr for pid in sorted(upgrade.pids("old"))]
    assert (1, 1, [True] * upgrade.size.workers) == (refused.code, len(lines), named), (
        refused.output
    )


def test_an_upgrade_in_a_non_utc_zone_loses_expires_and_duplicates_nothing(
    zoned_upgrade: Upgrade,
) -> None:
    """In a non-UTC zone: old workers stopped, migrated, buffers made UTC, new workers: every
    committed event delivered once, none expired."""
    upgrade = zoned_upgrade
    upgrade.prepare()
    upgrade.start_producers()
    upgrade.start_workers("old")
    upgrade.wait_groups(
        upgrade.size.groups_before, "the old workers' groups", upgrade.old_deliveries()
    )
    stopped_old = upgrade.stop_workers("old")
    migrated = upgrade.run("new", "migrate", "migrate")
    buffers = upgrade.run("new", "migrate-buffers", "migrate-buffers")
    upgrade.start_workers("new")
    upgrade.wait_groups(
        upgrade.size.groups_mixed, "the new workers' groups", upgrade.new_deliveries()
    )
    upgrade.drain()
    stopped_new = upgrade.stop_workers("new")
    report = upgrade.check()
    workers = upgrade.size.workers
    assert ([0] * workers, 0, 0, [0] * workers, {}, 0, report.committed) == (
        stopped_old,
        migrated.code,
        buffers.code,
        stopped_new,
        report.violations,
        report.duplicated,
        report.delivered,
    ), (report.summary(), migrated.output, buffers.output)


def test_pause_warns_that_older_workers_are_alive(upgrade: Upgrade) -> None:
    """``outbox pause`` beside workers of the older release says they will not honour it."""
    upgrade.prepare()
    upgrade.start_workers("old")
    upgrade.start_producers()
    upgrade.wait_groups(1, "the old workers' first group", upgrade.old_deliveries())
    upgrade.run("new", "migrate", "migrate")
    paused = upgrade.run("new", "pause", "pause", "deliver")
    warned = re.fullmatch(
        r"warning: \d+ live workers? records? no version \(older than outbox 0\.2\): workers "
        r"older than schema 0003 ignore pauses; stop or upgrade (it|them)\n",
        paused.stderr,
    )
    assert (0, True) == (paused.code, warned is not None), paused.output


# The full size only (nox -s upgrade), as the two below: the migration's lock timeout is checked
# on every run by tests/migration/test_lock_timeout.py, and its downgrades by tests/migration.
@full_size_only
def test_a_long_reader_never_freezes_the_fleet_beyond_the_lock_timeout(upgrade: Upgrade) -> None:
    """A transaction left open on outbox_jobs during the migration holds the fleet back no
    longer than about the migration's lock timeout; the upgrade then completes, nothing lost."""
    size = upgrade.size
    upgrade.prepare()
    upgrade.start_producers()
    upgrade.start_workers("old")
    upgrade.wait_groups(size.groups_before, "the old workers' groups", upgrade.old_deliveries())
    reader = LongReader(upgrade.engine, size.reader_seconds)
    reader.start()
    reader.reading.wait(timeout=10.0)
    started = time.time()
    first = upgrade.run(
        "new", "migrate", "migrate", "--lock-timeout", str(size.lock_timeout)
    )  # waits for the reader, or gives up on it in one line
    ended = time.time()
    reader.close()
    # Once the reader is gone, a migration that gave up on it goes through.
    second = upgrade.run("new", "migrate-again", "migrate")
    starts = [d.started for d in upgrade.log.read()]
    gap = longest_gap(starts, started, min(ended, started + size.reader_seconds))
    upgrade.start_workers("new")
    upgrade.wait_groups(size.groups_mixed, "the new workers' groups", upgrade.new_deliveries())
    upgrade.stop_workers("old")
    upgrade.drain()
    upgrade.stop_workers("new")
    report = upgrade.check()
    head = head_revision(upgrade.engine)
    assert (True, True, False, 0, True, {}, 0) == (
        gap <= size.lock_timeout + GAP_SLACK_SECONDS,
        first.code in (0, 1),  # through, or given up in one line; not refused as usage
        "Traceback" in first.output,
        second.code,
        f"revision {head}" in second.stdout or f"to {head}" in second.stdout,
        report.violations,
        report.duplicated,
    ), (gap, first.output, second.output, report.summary())


@full_size_only
def test_a_rollback_lets_the_old_workers_drain_what_is_left(upgrade: Upgrade) -> None:
    """Back to 0001 with the new workers stopped: the old workers drain the rest, none lost."""
    size = upgrade.size
    upgrade.mixed_period()
    stopped_old = upgrade.stop_workers("old")
    stopped_new = upgrade.stop_workers("new")
    down = upgrade.run("new", "migrate-down", "migrate", "--to", "0001", "--yes")
    rolled_back_at = time.time()
    upgrade.start_workers("old")
    upgrade.wait_groups(
        size.groups_after,
        "the old workers' groups on the schema rolled back",
        upgrade.old_deliveries(rolled_back_at),
    )
    upgrade.drain()
    stopped_again = upgrade.stop_workers("old")
    report = upgrade.check()
    workers = size.workers
    assert ([0] * workers, [0] * workers, 0, [0] * workers, {}, 0, report.committed) == (
        stopped_old,
        stopped_new,
        down.code,
        stopped_again,
        report.violations,
        report.duplicated,
        report.delivered,
    ), (report.summary(), down.output)


# About 40 s of an older worker's long heartbeat gaps: the full size's (nox -s upgrade); the
# rule itself is checked on every run by the conformance tier (test_jobs_gone_workers.py,
# test_workers.py).
@full_size_only
def test_new_workers_leave_a_live_older_worker_in_the_fleet(
    start_upgrade: Callable[..., Upgrade],
) -> None:
    """New workers do not take a live older worker for gone for want of heartbeats its release
    never sent that often: it stays in the fleet, loses no lease, delivers nothing twice."""
    upgrade = start_upgrade("postgresql")  # the rescue is one statement on every database
    lease = ("--lease", str(LONG_LEASE_SECONDS))
    upgrade.prepare()
    upgrade.start_producers()
    upgrade.start_workers("old", *lease)
    upgrade.run("new", "migrate", "migrate")
    upgrade.start_workers("new", *lease)
    new_started = time.time()
    upgrade.wait_groups(
        1,
        "the old workers' groups once the new ones judge others",
        upgrade.old_deliveries(new_started + JUDGING_SECONDS),
    )
    forgotten = upgrade.pids("old") - upgrade.registered_pids()
    stopped_old = upgrade.stop_workers("old")
    upgrade.drain()
    upgrade.stop_workers("new")
    report = upgrade.check()
    workers = upgrade.size.workers
    assert (set(), [0] * workers, [0] * workers, {}, 0) == (
        forgotten,
        stopped_old,
        upgrade.leases_lost("old"),
        report.violations,
        report.duplicated,
    ), report.summary()
