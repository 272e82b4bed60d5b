"""The database layer: the only code that speaks SQL.

``engine``: engines and short transactions (what ``from outbox import _db`` gives). ``queries``:
one function per statement, grouped by the table it touches. ``dialects``: the one interface
every database implements (``Database``, ``Supports``) and the registry of them; each database
is one package behind it (``postgresql``, ``sqlite``, ``mysql``: MariaDB and MySQL).
``migration``: what ``outbox migrate`` asks of the database. ``types``: the values handed back.
"""

from outbox._db.engine import (
    URL_FORM,
    JsonFunctions,
    buffer_table_missing,
    check_buffer_tables,
    check_connection,
    check_schema,
    create_outbox_engine,
    describe,
    json_functions,
    load_driver,
    missing_buffer_tables,
    parse_url,
    redact,
    run_in_transaction,
    sync_url,
)

__all__ = [
    "URL_FORM",
    "JsonFunctions",
    "buffer_table_missing",
    "check_buffer_tables",
    "check_connection",
    "check_schema",
    "create_outbox_engine",
    "describe",
    "json_functions",
    "load_driver",
    "missing_buffer_tables",
    "parse_url",
    "redact",
    "run_in_transaction",
    "sync_url",
]
