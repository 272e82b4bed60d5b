"""The raw-SQL ceiling: a plain psycopg loop draining the buffer as fast as PostgreSQL allows.

    python -m benchmarks._raw_drain URL BATCH_SIZE [archive] [by-address]

Loops { claim up to BATCH_SIZE rows with the locking CTE and UPDATE ... RETURNING; delete the
group by group_id (or archive it as JSON and then delete it) } until a claim finds nothing.
The claim is the form the drain target names, the CTE joined back by id; ``by-address``:
outbox's form, the rows updated at the addresses the CTE locked (``CLAIM_BY_ADDRESS``), the
stricter ceiling.
"""

from __future__ import annotations

import sys
import uuid

import psycopg

CLAIM = """
WITH claimable AS (
    SELECT id FROM bench_events WHERE group_id IS NULL ORDER BY id LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE bench_events SET group_id = %s FROM claimable WHERE bench_events.id = claimable.id
RETURNING bench_events.id, bench_events.account_id, bench_events.kind
"""
CLAIM_BY_ADDRESS = """
WITH claimable AS (
    SELECT ctid FROM bench_events WHERE group_id IS NULL ORDER BY id LIMIT %s
    FOR UPDATE SKIP LOCKED
)
UPDATE bench_events SET group_id = %s WHERE ctid = ANY (ARRAY(SELECT ctid FROM claimable))
RETURNING bench_events.id, bench_events.account_id, bench_events.kind
"""
ARCHIVE = """
INSERT INTO outbox_archive (handler, buffer, event_id, group_id, status, attempts, payload,
                            created_at)
SELECT 'noop', 'bench_events', b.id, b.group_id, 'succeeded', 1, to_jsonb(b), b.created_at
FROM bench_events AS b WHERE b.group_id = %s
"""
DELETE = "DELETE FROM bench_events WHERE group_id = %s"


def main() -> None:
    url, batch_size, options = sys.argv[1], int(sys.argv[2]), set(sys.argv[3:])
    unknown = options - {"archive", "by-address"}
    if unknown:
        sys.exit(f"unknown options {sorted(unknown)}: the options are archive and by-address")
    archive = "archive" in options
    claim = CLAIM_BY_ADDRESS if "by-address" in options else CLAIM
    with psycopg.connect(url) as conn:
        while True:
            group = uuid.uuid4()
            with conn.transaction():
                rows = conn.execute(claim, (batch_size, group)).fetchall()
            if not rows:
                return
            with conn.transaction():
                if archive:
                    conn.execute(ARCHIVE, (group,))
                conn.execute(DELETE, (group,))


if __name__ == "__main__":
    main()
