"""Alembic environment for outbox's own tables (run through ``outbox migrate``).

``outbox migrate`` hands over a connection in a transaction it manages (its lock timeout set,
one revision per transaction); otherwise the engine's connection runs every revision in one.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, Engine, create_engine

from outbox import schema
from outbox._db.generation import record_migration
from outbox.ops.migrate import VERSION_TABLE

config = context.config


def _include(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    # Only outbox's tables: the application's tables belong to its own migrations.
    if type_ == "table":
        return name in schema.metadata.tables
    return True


def _run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=schema.metadata,
        version_table=VERSION_TABLE,
        include_object=_include,
        render_as_batch=connection.dialect.name == "sqlite",
        # outbox_schema follows every step, up or down: workers read what it needs there.
        on_version_apply=[record_migration],
    )
    with context.begin_transaction():
        context.run_migrations()


def run() -> None:
    connection: Connection | None = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    engine: Engine | None = config.attributes.get("engine")
    if engine is None:
        engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as connection:
        _run_on(connection)


run()
