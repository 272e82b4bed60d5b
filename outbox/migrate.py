"""Applying the framework's alembic migrations (``outbox migrate``).

The migrations keep their own version table, ``outbox_alembic_version``, so they never collide
with the application's own alembic history. The scripts ship inside the wheel.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

VERSION_TABLE = "outbox_alembic_version"


def migrations_dir() -> Path:
    """Where the migration scripts are: inside the installed package, or the source tree."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "_migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("outbox's migration scripts are missing from this installation")


def alembic_config(engine: Engine) -> Config:
    """An alembic Config that runs outbox's migrations on ``engine``."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.attributes["engine"] = engine
    return config


def head_revision(engine: Engine) -> str | None:
    """The newest migration outbox ships."""
    return ScriptDirectory.from_config(alembic_config(engine)).get_current_head()


def current_revision(engine: Engine) -> str | None:
    """The migration the database is at; None before the first ``outbox migrate``."""
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate the database to ``revision``; a no-op when it is there. Returns (before, after)."""
    before = current_revision(engine)
    command.upgrade(alembic_config(engine), revision)
    return before, current_revision(engine)
