"""Upgrading from the previous release under load, on PostgreSQL and MariaDB in UTC.

The previous release (``_releases.PREVIOUS``) runs from a virtual environment of its own; this
checkout's ``outbox`` migrates the database while its workers run and producers write, and its
workers take over. The fault tier's checker counts what became of every event.
"""

from __future__ import annotations

import time
from pathlib import Path

import outbox
from outbox.ops.migrate import head_revision
from outbox.worker import FLOW_STATE_REFRESH_SECONDS
from tests._support import wait_for
from tests.upgrade._harness import CURRENT, Upgrade

# A worker reads the handlers' pauses every FLOW_STATE_REFRESH_SECONDS; this much more allows
# for a loaded machine.
PAUSE_MARGIN_SECONDS = 1.0
# How long, in the producers' events at their rate, the pause is watched once the old workers
# are gone.
HELD_SECONDS = 2.0


def test_an_upgrade_under_load_loses_and_duplicates_nothing(upgrade: Upgrade) -> None:
    """Old workers run through the migration and new ones take over: 0 lost, 0 duplicated."""
    upgrade.mixed_period()
    stopped_old = upgrade.stop_workers("old")
    upgrade.drain()
    stopped_new = upgrade.stop_workers("new")
    report = upgrade.check()
    workers = upgrade.size.workers
    assert ([0] * workers, [0] * workers, {}, 0, report.committed) == (
        stopped_old,
        stopped_new,
        report.violations,
        report.duplicated,
        report.delivered,
    ), report.summary()


def test_no_new_worker_handles_a_paused_handler_during_the_upgrade(upgrade: Upgrade) -> None:
    """Paused in the mixed period: once the pause is seen, no new worker starts a group of it,
    and once the old workers (which ignore it) stop, nobody does."""
    upgrade.mixed_period()
    paused = upgrade.run("new", "pause", "pause", "deliver")
    seen = time.time() + FLOW_STATE_REFRESH_SECONDS + PAUSE_MARGIN_SECONDS
    stopped_old = upgrade.stop_workers("old")
    old_stopped_at = time.time()
    committed = len(upgrade.ledger.committed)
    wait_for(
        lambda: len(upgrade.ledger.committed) >= committed + upgrade.size.rate * HELD_SECONDS,
        "the producers to write while the handler is paused",
    )
    late = (
        upgrade.log.groups(upgrade.new_deliveries(seen)),
        upgrade.log.groups(lambda d: d.started > max(seen, old_stopped_at)),
    )
    resumed = upgrade.run("new", "resume", "resume", "deliver")
    upgrade.drain()
    upgrade.stop_workers("new")
    report = upgrade.check()
    assert (0, [0] * upgrade.size.workers, (set(), set()), 0, {}) == (
        paused.code,
        stopped_old,
        late,
        resumed.code,
        report.violations,
    ), report.summary()


def test_the_previous_release_runs_its_own_code(upgrade: Upgrade) -> None:
    """The older release's commands import outbox from its venv, the current ones from here."""
    upgrade.prepare()
    upgrade.run("new", "migrate", "migrate")
    files = upgrade.outbox_files()
    assert (True, {outbox.__file__}) == (
        all(Path(f).is_relative_to(upgrade.release.venv) for f in files[upgrade.release.name]),
        files[CURRENT],
    )


def test_the_upgrade_migrates_the_previous_release_s_schema_to_head(upgrade: Upgrade) -> None:
    """The current ``outbox migrate`` takes the previous release's database to the head."""
    upgrade.prepare()
    migrated = upgrade.run("new", "migrate", "migrate")
    head = head_revision(upgrade.engine)
    assert (0, f"outbox tables migrated from 0001 to {head}") == (
        migrated.code,
        migrated.stdout.split(" in ")[0],
    )


def test_a_second_migrate_does_nothing(upgrade: Upgrade) -> None:
    """A second ``outbox migrate`` after the upgrade says the tables are up to date."""
    upgrade.prepare()
    upgrade.run("new", "migrate", "migrate")
    again = upgrade.run("new", "migrate-again", "migrate")
    head = head_revision(upgrade.engine)
    assert (0, f"outbox tables are up to date (revision {head})") == (
        again.code,
        again.stdout.split(" in ")[0],
    )


def test_the_previous_release_s_migrate_fails_on_a_newer_schema(upgrade: Upgrade) -> None:
    """A rolled-back deploy's first step, the older ``outbox migrate``, fails on the newer schema.

    A known limitation of the previous release, which cannot be changed any more: its alembic
    does not know the newer revision and the command ends with a raw traceback ("Can't locate
    revision identified by '0004'"). Only its exit code is part of what it promised; releases
    from now on name the version needed in one line (see the tier's scenarios that need them).
    """
    upgrade.prepare()
    upgrade.run("new", "migrate", "migrate")
    old_migrate = upgrade.run("old", "migrate-old-again", "migrate")
    assert 1 == old_migrate.code
