"""Upgrading from the previous release under load, on PostgreSQL and MariaDB in UTC.

The previous release (``_releases.PREVIOUS``) runs from a virtual environment of its own; this
checkout's ``outbox`` migrates the database while its workers run and producers write, and its
workers take over. The fault tier's checker counts what became of every event.
"""

from __future__ import annotations

import time
from pathlib import Path

import outbox
from outbox.migrate import head_revision
from tests.upgrade._harness import CURRENT, Upgrade


def test_an_upgrade_under_load_loses_and_duplicates_nothing(upgrade: Upgrade) -> None:
    """Old workers run through the migration and new ones take over: 0 lost, 0 duplicated."""
    size, old = upgrade.size, upgrade.release.name
    upgrade.prepare()
    upgrade.start_producers()
    upgrade.start_workers("old")
    upgrade.wait_groups(size.groups_before, "the old workers' groups", lambda d: d.release == old)
    migrated = upgrade.run("new", "migrate", "migrate")
    migrated_at = time.time()
    upgrade.wait_groups(
        size.groups_after,
        "the old workers' groups on the migrated schema",
        lambda d: d.release == old and d.started > migrated_at,
    )
    upgrade.start_workers("new")
    upgrade.wait_groups(
        size.groups_mixed, "the new workers' groups", lambda d: d.release == CURRENT
    )
    stopped_old = upgrade.stop_workers("old")
    upgrade.drain()
    stopped_new = upgrade.stop_workers("new")
    report = upgrade.check()
    assert (0, [0] * size.workers, [0] * size.workers, {}, 0) == (
        migrated.code,
        stopped_old,
        stopped_new,
        report.violations,
        report.duplicated,
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
