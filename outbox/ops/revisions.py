"""Which migration revisions this outbox ships, and whether the database is at one of them: the
check every command makes before it works on the tables, without importing alembic.

Alembic reads a revision's identity by importing its script (and alembic's own modules, and
every dialect's DDL support): some 80 ms before a worker's first claim. The check needs only the
``revision = "..."`` line of each script and the version table's rows, which this module reads
as text and with one query. ``outbox migrate`` (:mod:`outbox.ops.migrate`) still goes through
alembic, and a test holds the two readings of the scripts equal.
"""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy import Engine

from outbox._db import migration
from outbox.exceptions import OutboxError

VERSION_TABLE = "outbox_alembic_version"

# A script's own revision and the one it revises, as alembic's template writes them (an
# annotation allowed); a script written otherwise sends the check to alembic.
_REVISION = re.compile(r"""^revision(?:\s*:[^=]+)?\s*=\s*["']([^"']+)["']\s*$""", re.MULTILINE)
_REVISES = re.compile(
    r"""^down_revision(?:\s*:[^=]+)?\s*=\s*(?:None|["']([^"']+)["'])\s*$""", re.MULTILINE
)


class NewerSchemaError(OutboxError):
    """The database is at a revision this outbox does not ship: a newer outbox migrated it."""

    def __init__(self, revision: str, newest: str | None) -> None:
        self.revision = revision
        self.newest = newest
        super().__init__(
            f"this database's outbox tables are at revision {revision}, newer than this outbox "
            f"knows (newest {newest}): upgrade outbox, or downgrade the tables with the newer "
            f"outbox's `outbox migrate --to {newest}`"
        )


def migrations_dir() -> Path:
    """Where the migration scripts are: inside the installed package, or the source tree."""
    package = Path(__file__).resolve().parents[1]  # the outbox package
    for candidate in (package / "_migrations", package.parent / "migrations"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("outbox's migration scripts are missing from this installation")


def shipped_revisions() -> list[str] | None:
    """The revisions outbox ships, oldest first, read from the scripts' text; None when a
    script does not say its revision as alembic's template writes it, or the history is not
    one line (then only alembic can tell)."""
    revises: dict[str, str | None] = {}
    for script in (migrations_dir() / "versions").glob("*.py"):
        text = script.read_text(encoding="utf-8")
        own, parent = _REVISION.findall(text), _REVISES.findall(text)
        if len(own) != 1 or len(parent) != 1:
            return None
        revises[own[0]] = parent[0] or None
    ordered: list[str] = []
    following = {parent: child for child, parent in revises.items()}
    if len(following) != len(revises):
        return None  # two scripts revise the same one: branches
    at = following.get(None)
    while at is not None:
        ordered.append(at)
        at = following.get(at)
    return ordered if len(ordered) == len(revises) else None


def _alembic_revisions() -> list[str]:
    """The revisions outbox ships, oldest first, as alembic reads them (importing them)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    scripts = ScriptDirectory.from_config(config)
    return [script.revision for script in reversed(list(scripts.walk_revisions()))]


def check_revision(engine: Engine) -> None:
    """Raise NewerSchemaError when the database is at a revision this outbox does not ship."""
    known = shipped_revisions()
    if known is None:
        known = _alembic_revisions()
    with engine.connect() as conn:
        recorded = migration.recorded_revisions(conn, VERSION_TABLE)
    for revision in recorded:
        if revision not in known:
            raise NewerSchemaError(revision, known[-1] if known else None)
