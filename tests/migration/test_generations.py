"""The schema generation the migrations record in outbox_schema, up and down.

Each revision from 0005 on declares ``generation`` and ``workers_from``; each step of a run
records those of the revision it ends at, so the row always describes the schema the database
is at, after a downgrade too.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, inspect

from outbox import schema
from outbox._core.version import VERSION
from outbox._db import queries
from outbox.ops.migrate import VERSION_TABLE, alembic_config, migrations_dir, upgrade

# A revision after the newest, as a release to come would write one: it needs new workers.
NEXT_REVISION = """\
revision = "{revision}"
down_revision = "{down}"
branch_labels = None
depends_on = None

generation = {generation}
workers_from = {generation}


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
"""


def _empty_database(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        schema.metadata.drop_all(conn)
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {VERSION_TABLE}")
    engine.dispose()


def _recorded(url: str) -> tuple[int, int, str | None] | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            state = queries.schema_generation(conn)
    finally:
        engine.dispose()
    return None if state is None else (state.generation, state.workers_from, state.migrated_by)


def _config_with_next_revision(engine: Engine, directory: Path) -> Config:
    """An alembic Config on a copy of outbox's migrations with one revision more."""
    scripts = directory / "migrations"
    shutil.copytree(migrations_dir(), scripts, ignore=shutil.ignore_patterns("__pycache__"))
    head = ScriptDirectory(str(scripts)).get_current_head()
    assert head is not None
    following = int(head) + 1
    (scripts / "versions" / f"{following:04d}_next.py").write_text(
        NEXT_REVISION.format(revision=f"{following:04d}", down=head, generation=following)
    )
    config = alembic_config(engine)
    config.set_main_option("script_location", str(scripts))
    return config


def test_the_newest_migration_declares_the_generation_of_schema_py() -> None:
    """The head revision's number, its generation and workers_from are schema.py's."""
    engine = create_engine("sqlite://")
    head = ScriptDirectory.from_config(alembic_config(engine)).get_revision("head")
    assert head is not None
    expected = (schema.GENERATION, schema.GENERATION, schema.WORKERS_FROM)
    assert expected == (int(head.revision), head.module.generation, head.module.workers_from)


def test_upgrade_records_the_generation_it_brings(database_url: str) -> None:
    """After `outbox migrate`, outbox_schema says generation 5, workers from 1, by this
    outbox."""
    _empty_database(database_url)
    engine = create_engine(database_url)
    upgrade(engine)
    engine.dispose()
    assert (schema.GENERATION, schema.WORKERS_FROM, VERSION) == _recorded(database_url)


def test_create_all_records_the_same_generation_as_the_migrations(database_url: str) -> None:
    """Tables made by metadata.create_all (as `outbox schema sql` prints them) have the row."""
    assert (schema.GENERATION, schema.WORKERS_FROM, VERSION) == _recorded(database_url)


def test_downgrade_below_generations_drops_the_table(database_url: str) -> None:
    """Down to 0004, outbox_schema and the workers' version columns are gone."""
    _empty_database(database_url)
    engine = create_engine(database_url)
    upgrade(engine)
    command.downgrade(alembic_config(engine), "0004")
    inspector = inspect(engine)
    columns = {c["name"] for c in inspector.get_columns("outbox_workers")}
    tables = set(inspector.get_table_names())
    engine.dispose()
    assert (False, set()) == ("outbox_schema" in tables, {"version", "generation"} & columns)


@pytest.mark.parametrize("database_url", ["sqlite", "postgresql"], indirect=True)
def test_a_newer_revision_is_recorded_and_its_downgrade_records_the_previous_one(
    database_url: str, tmp_path: Path
) -> None:
    """Up to a revision after 0005 it records that one's generation; down again, 0005's."""
    _empty_database(database_url)
    engine = create_engine(database_url)
    config = _config_with_next_revision(engine, tmp_path)
    command.upgrade(config, "head")
    up = _recorded(database_url)
    command.downgrade(config, "-1")
    down = _recorded(database_url)
    engine.dispose()
    following = schema.GENERATION + 1
    expected = [(following, following, VERSION), (schema.GENERATION, schema.WORKERS_FROM, VERSION)]
    assert expected == [up, down]
