"""The raw-SQL ceiling: a plain psycopg loop draining the buffer as fast as PostgreSQL allows.

    python -m benchmarks._raw_drain URL BATCH_SIZE [archive] [by-address] [typed | json]

Loops { claim up to BATCH_SIZE rows with the locking CTE and UPDATE ... RETURNING every column
of the buffer (what a handler is given); delete the group by group_id (or archive it as JSON and
then delete it) } until a claim finds nothing.
The claim is the form the drain target names, the CTE joined back by id; ``by-address``:
outbox's form, the rows updated at the addresses the CTE locked (``CLAIM_BY_ADDRESS``), the
stricter ceiling. ``typed``: the typed buffer (``bench_typed_events``), every column returned
as psycopg types it (JSON parsed, Decimal, an aware datetime; the enum as its label), and every
value read as the bench app's typed handler reads them, from the tuples, before the delete.
``json``: the JSON buffer (``bench_json_events``), every column returned, each document parsed
by psycopg and one value of it read, as the bench app's JSON handler reads them.
"""

from __future__ import annotations

import sys
import uuid
from decimal import Decimal
from typing import Any

import psycopg

CLAIM = """
WITH claimable AS (
    SELECT id FROM bench_events WHERE group_id IS NULL ORDER BY id LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE bench_events SET group_id = %s FROM claimable WHERE bench_events.id = claimable.id
RETURNING bench_events.account_id, bench_events.kind, bench_events.id, bench_events.group_id,
          bench_events.created_at
"""
CLAIM_BY_ADDRESS = """
WITH claimable AS (
    SELECT ctid FROM bench_events WHERE group_id IS NULL ORDER BY id LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE bench_events SET group_id = %s WHERE ctid = ANY (ARRAY(SELECT ctid FROM claimable))
RETURNING bench_events.account_id, bench_events.kind, bench_events.id, bench_events.group_id,
          bench_events.created_at
"""
ARCHIVE = """
INSERT INTO outbox_archive (handler, buffer, event_id, group_id, status, attempts, payload,
                            created_at)
SELECT 'noop', 'bench_events', b.id, b.group_id, 'succeeded', 1, to_jsonb(b), b.created_at
FROM bench_events AS b WHERE b.group_id = %s
"""
DELETE = "DELETE FROM bench_events WHERE group_id = %s"
TYPED_COLUMNS = ", ".join(
    f"bench_events.{name}"
    for name in ("id", "group_id", "created_at", "channel", "payload", "occurred_at", "amount",
                 "account")
)  # fmt: skip


def typed(statement: str) -> str:
    """A statement of the plain buffer turned to the typed one, returning all its columns."""
    if "RETURNING" in statement:
        statement = statement[: statement.index("RETURNING")] + f"RETURNING {TYPED_COLUMNS}\n"
    return statement.replace("'noop'", "'typed'").replace("bench_events", "bench_typed_events")


def as_json(statement: str) -> str:
    """A statement of the plain buffer turned to the JSON one, returning all its columns."""
    if "RETURNING" in statement:
        columns = ", ".join(
            f"bench_events.{name}" for name in ("id", "group_id", "created_at", "payload")
        )
        statement = statement[: statement.index("RETURNING")] + f"RETURNING {columns}\n"
    return statement.replace("'noop'", "'pages'").replace("bench_events", "bench_json_events")


def bulk_body(rows: list[tuple[Any, ...]]) -> tuple[list[tuple[Any, ...]], Decimal]:
    """The typed handler's work (``benchmarks.bench_app.bulk_body``), on psycopg's tuples."""
    body = []
    total = Decimal(0)
    for id_, _group, _created, channel, payload, occurred_at, amount, account in rows:
        body.append((id_, channel, payload["page"], occurred_at.isoformat(), account))
        total += amount
    return body, total


def main() -> None:
    url, batch_size, options = sys.argv[1], int(sys.argv[2]), set(sys.argv[3:])
    unknown = options - {"archive", "by-address", "typed", "json"}
    if unknown:
        sys.exit(
            f"unknown options {sorted(unknown)}: the options are archive, by-address, typed, json"
        )
    archive = "archive" in options
    claim = CLAIM_BY_ADDRESS if "by-address" in options else CLAIM
    archive_statement, delete = ARCHIVE, DELETE
    if "typed" in options:
        claim, archive_statement, delete = typed(claim), typed(ARCHIVE), typed(DELETE)
    if "json" in options:
        claim, archive_statement, delete = as_json(claim), as_json(ARCHIVE), as_json(DELETE)
    with psycopg.connect(url) as conn:
        # As outbox's own connections do: psycopg reads timestamptz values fastest in UTC by
        # that name (``outbox._db.postgresql.connection.name_utc_plainly``).
        conn.execute("SET TimeZone TO 'UTC'")
        conn.commit()
        while True:
            group = uuid.uuid4()
            with conn.transaction():
                rows = conn.execute(claim, (batch_size, group)).fetchall()
            if not rows:
                return
            if "typed" in options:
                bulk_body(rows)
            if "json" in options:
                [(id_, payload["page"]) for id_, _group, _created, payload in rows]
            with conn.transaction():
                if archive:
                    conn.execute(archive_statement, (group,))
                conn.execute(delete, (group,))


if __name__ == "__main__":
    main()
