"""The migrations create exactly the tables of outbox.schema, and re-running them is a no-op."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, event, inspect

from outbox import schema
from outbox.ops.migrate import (
    VERSION_TABLE,
    current_revision,
    head_revision,
    known_revisions,
    migrate,
    upgrade,
)


def _only_outbox_tables(obj: object, name: str | None, type_: str, *args: object) -> bool:
    return type_ != "table" or name in schema.metadata.tables


def _empty_database(url: str) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        schema.metadata.drop_all(conn)
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {VERSION_TABLE}")
    engine.dispose()


def test_migrations_produce_exactly_the_schema(database_url: str) -> None:
    """After `upgrade`, alembic finds no difference between the database and schema.py."""
    _empty_database(database_url)
    engine = create_engine(database_url)
    upgrade(engine)
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"include_object": _only_outbox_tables, "compare_type": True}
        )
        diff = compare_metadata(context, schema.metadata)
    engine.dispose()
    assert [] == diff


def test_migrate_twice_is_a_no_op(database_url: str) -> None:
    """A second upgrade changes nothing and the database stays at the head revision."""
    _empty_database(database_url)
    engine = create_engine(database_url)
    first = upgrade(engine)
    second = upgrade(engine)
    engine.dispose()
    assert (None, head_revision(engine)) == first
    assert (head_revision(engine), head_revision(engine)) == second


def test_migrations_keep_their_own_version_table(database_url: str) -> None:
    """Outbox's revision lives in outbox_alembic_version, never in the app's alembic_version."""
    _empty_database(database_url)
    engine = create_engine(database_url)
    upgrade(engine)
    tables = set(inspect(engine).get_table_names())
    revision = current_revision(engine)
    engine.dispose()
    assert (True, False) == (VERSION_TABLE in tables, "alembic_version" in tables)
    assert head_revision(engine) == revision


def test_migrations_ship_in_the_wheel(tmp_path: Path) -> None:
    """A built wheel carries the migration scripts inside the package, where migrate finds them."""
    root = Path(__file__).parents[2]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(tmp_path), str(root)],
        check=True,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("sqlalchemy_outbox-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {"outbox/_migrations/env.py", "outbox/_migrations/versions/0001_outbox_tables.py"}
    assert expected == expected & names


def _schema_of(engine: Engine) -> dict[str, Any]:
    """Outbox's tables as the database describes them: columns, indexes, primary keys."""
    inspector = inspect(engine)
    tables = sorted(name for name in inspector.get_table_names() if name in schema.metadata.tables)
    return {
        table: (
            [
                (c["name"], str(c["type"]), c["nullable"], str(c.get("default")))
                for c in inspector.get_columns(table)
            ],
            sorted(
                (i["name"], tuple(i["column_names"]), bool(i["unique"]))
                for i in inspector.get_indexes(table)
            ),
            inspector.get_pk_constraint(table)["constrained_columns"],
        )
        for table in tables
    }


def _kind(url: str) -> str:
    """The kind of database a URL names (sqlite, postgresql, mariadb)."""
    return {"sqlite": "sqlite", "postgresql": "postgresql", "mysql": "mariadb"}[
        url.split(":")[0].split("+")[0]
    ]


def _diff_from_schema(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        context = MigrationContext.configure(
            conn, opts={"include_object": _only_outbox_tables, "compare_type": True}
        )
        return list(compare_metadata(context, schema.metadata))


@pytest.mark.parametrize("revision", [*known_revisions()[:-1], "base"])
def test_downgrade_gives_the_schema_an_upgrade_gives(
    revision: str,
    empty_url: str,
    make_empty_database: Callable[[str], str],
    engine_on: Callable[[str], Engine],
) -> None:
    """Down from head to a revision: the same tables, columns and indexes as up to it."""
    upgraded = engine_on(make_empty_database(_kind(empty_url)))
    downgraded = engine_on(empty_url)
    migrate(upgraded, revision)
    migrate(downgraded)
    migrate(downgraded, revision, accept_losses=True)
    assert _schema_of(upgraded) == _schema_of(downgraded)


def test_up_down_up_produces_exactly_the_schema(
    empty_url: str, engine_on: Callable[[str], Engine]
) -> None:
    """Up to head, down to base, up again: alembic finds no difference from schema.py."""
    engine = engine_on(empty_url)
    migrate(engine)
    migrate(engine, "base", accept_losses=True)
    migrate(engine)
    assert [] == _diff_from_schema(engine)


def test_mariadb_timestamps_migration_alters_each_table_once(
    make_empty_database: Callable[[str], str], engine_on: Callable[[str], Engine]
) -> None:
    """On MariaDB, 0001 -> 0002 issues one ALTER per table: each table is copied once."""
    engine = engine_on(make_empty_database("mariadb"))
    migrate(engine, "0001")
    altered: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("ALTER TABLE"):
            altered.append(statement.split()[2])

    migrate(engine, "0002")
    assert ["outbox_archive", "outbox_jobs", "outbox_workers"] == sorted(altered)
