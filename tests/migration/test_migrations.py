"""The migrations create exactly the tables of outbox.schema, and re-running them is a no-op."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from outbox import schema
from outbox.migrate import VERSION_TABLE, current_revision, head_revision, upgrade


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
