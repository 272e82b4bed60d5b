"""A test's empty tables, made quickly.

Creating the framework's tables and the test models costs about 0.7 s on MariaDB (InnoDB makes
a file per table and index), 0.3 s on a SQLite file (a sync per statement) and 0.15 s on
PostgreSQL, and more than a thousand tests start from empty tables. So a table made once is
emptied again rather than made again, as long as it is still the table that was made:

- PostgreSQL and MariaDB: the schema's tables, columns, indexes, triggers and partitions are
  read (a few catalogue queries, milliseconds) and compared with what they were right after
  the last creation; when nothing changed, their rows are deleted, their ids start at 1
  again (on PostgreSQL, every sequence of the schema starts again) and ``outbox_schema``'s
  row is written again, else they are dropped and made as before.
  A test that altered, dropped, partitioned or indexed a table is seen, and its tables made
  again.
- SQLite: a new file is a copy of one made once per schema.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Connection, Engine, MetaData, text
from sqlalchemy.engine import make_url

from outbox import schema

_PORTRAITS = {
    "postgresql": (
        "SELECT table_name, column_name, data_type, is_nullable, column_default"
        " FROM information_schema.columns WHERE table_schema = current_schema() ORDER BY 1, 2",
        "SELECT tablename, indexname, indexdef FROM pg_indexes"
        " WHERE schemaname = current_schema() ORDER BY 1, 2",
        "SELECT event_object_table, trigger_name, event_manipulation"
        " FROM information_schema.triggers WHERE trigger_schema = current_schema()"
        " ORDER BY 1, 2, 3",
        "SELECT c.relname, c.relkind, c.relispartition, coalesce(c.reloptions::text, '')"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') ORDER BY 1",
    ),
    "mysql": (
        "SELECT table_name, column_name, column_type, is_nullable, column_default, extra"
        " FROM information_schema.columns WHERE table_schema = DATABASE() ORDER BY 1, 2",
        "SELECT table_name, index_name, column_name, seq_in_index, non_unique"
        " FROM information_schema.statistics WHERE table_schema = DATABASE() ORDER BY 1, 2, 4",
        "SELECT event_object_table, trigger_name FROM information_schema.triggers"
        " WHERE trigger_schema = DATABASE() ORDER BY 1, 2",
        "SELECT table_name, partition_name FROM information_schema.partitions"
        " WHERE table_schema = DATABASE() AND partition_name IS NOT NULL ORDER BY 1, 2",
    ),
}
_made: dict[str, tuple[object, ...]] = {}
"""Per database URL, the tables declared and its portrait right after they were made."""
_templates: dict[tuple[object, ...], Path] = {}


def _declared(metadatas: tuple[MetaData, ...]) -> tuple[object, ...]:
    # A test module may declare a model after the tables were made: they are made again.
    return tuple((t.name, tuple(t.columns.keys())) for m in metadatas for t in m.sorted_tables)


def _portrait(conn: Connection) -> tuple[object, ...]:
    queries = _PORTRAITS.get(conn.dialect.name, ())
    return tuple(tuple(tuple(row) for row in conn.execute(text(q))) for q in queries)


def reset(url: str, metadatas: tuple[MetaData, ...], make: Callable[[Connection], None]) -> None:
    """Empty tables of ``metadatas`` at ``url``: emptied when still as made, else made again
    by ``make`` (which drops and creates them)."""
    path = _sqlite_file(url)
    if path is not None:
        _copy_template(path, metadatas, make)
        return
    engine = _engine(url)
    try:
        known = engine.dialect.name in _PORTRAITS
        if (
            known
            and _made.get(url, ())[:1] == (_declared(metadatas),)
            and _empty_again(engine, url, metadatas)
        ):
            return
        with engine.begin() as conn:
            make(conn)
            _made[url] = (_declared(metadatas), _portrait(conn))
    finally:
        engine.dispose()


def _empty_again(engine: Engine, url: str, metadatas: tuple[MetaData, ...]) -> bool:
    tables = [t for m in metadatas for t in m.sorted_tables]
    names = [t.name for t in tables]
    with engine.begin() as conn:
        if _portrait(conn) != _made[url][1]:
            return False
        # DELETE and the counters set back: TRUNCATE makes each table's files anew, as slow as
        # making the table on both servers.
        if conn.dialect.name == "postgresql":
            # One round trip: every table emptied, every sequence of the schema back at its
            # start (a statement each was most of a test's time on PostgreSQL).
            deletes = "".join(f"DELETE FROM {name}; " for name in reversed(names))
            conn.exec_driver_sql(
                deletes + "SELECT setval(s.seqrelid, s.seqstart, false) FROM pg_sequence s"
                " JOIN pg_class c ON c.oid = s.seqrelid"
                " WHERE c.relnamespace = current_schema()::regnamespace"
            )
        else:
            for name in reversed(names):
                conn.execute(text(f"DELETE FROM {name}"))
            counted = conn.execute(
                text(
                    "SELECT table_name FROM information_schema.tables"
                    " WHERE table_schema = DATABASE() AND auto_increment > 1"
                )
            ).scalars()
            for name in set(counted) & set(names):
                conn.execute(text(f"ALTER TABLE {name} AUTO_INCREMENT = 1"))
        conn.execute(schema.generation_row())
    return True


def _sqlite_file(url: str) -> Path | None:
    """The file of a SQLite URL that does not exist yet; None for any other URL."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    path = Path(parsed.database)
    return None if path.exists() or parsed.database == ":memory:" else path


def _copy_template(
    path: Path, metadatas: tuple[MetaData, ...], make: Callable[[Connection], None]
) -> None:
    key = _declared(metadatas)
    template = _templates.get(key)
    if template is None:
        template = Path(tempfile.mkdtemp(prefix="outbox-tables-")) / "template.sqlite3"
        engine = _engine(f"sqlite:///{template}")
        with engine.begin() as conn:
            make(conn)
        engine.dispose()
        _templates[key] = template
    shutil.copyfile(template, path)


def _engine(url: str) -> Engine:
    from sqlalchemy import create_engine

    return create_engine(url)
