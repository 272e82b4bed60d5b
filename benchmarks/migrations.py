"""What ``outbox migrate`` costs on a loaded database: each revision from 0001 to head, and each
downgrade back to 0001, timed with 1,000,000 rows in ``outbox_archive``.

Per database (PostgreSQL, MariaDB) and run: a scratch database migrated to 0001, then
``--archive-rows`` archived events (a small JSON payload each) and ``--jobs`` jobs loaded, then
each revision applied alone and timed, then each undone alone and timed. The migrations run from
the code of ``--code`` (a git revision, checked out in a temporary worktree; default: this
working tree), in a process of their own, through ``outbox.ops.migrate.upgrade`` and alembic's
``downgrade`` (present in every version), so that an older outbox's migrations can be timed
beside the current ones; ``--label`` names the results file.

    python -m benchmarks.migrations --archive-rows 1000000 --jobs 10000 --runs 1 --label after
    python -m benchmarks.migrations --archive-rows 1000000 --jobs 10000 --runs 1 \\
        --code 40f2cfc --label before
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from benchmarks._common import REPOSITORY, command_line, machine, write

URLS = {
    "postgresql": os.environ.get(
        "OUTBOX_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1/test"
    ),
    "mariadb": os.environ.get("OUTBOX_BENCH_MARIADB_URL", "mysql+pymysql://root@127.0.0.1/test"),
}
DATABASE = "outbox_bench_migrations"

# Run with the code under test first on PYTHONPATH: one revision up or down, its seconds.
STEP = """
import json, sys, time
from alembic import command
from sqlalchemy import create_engine
from outbox.ops.migrate import alembic_config, upgrade
url, direction, revision = sys.argv[1:4]
engine = create_engine(url)
started = time.perf_counter()
if direction == "up":
    upgrade(engine, revision)
else:
    command.downgrade(alembic_config(engine), revision)
print(json.dumps(time.perf_counter() - started))
"""

LOAD_ARCHIVE = {
    "postgresql": (
        "INSERT INTO outbox_archive (handler, buffer, event_id, group_id, status, attempts,"
        " payload, created_at, archived_at) SELECT 'send_email', 'email_events', n,"
        " md5(n::text)::uuid, 'succeeded', 1, jsonb_build_object('id', n, 'to',"
        " 'user' || n || '@example.com'), now() - interval '1 day', now()"
        " FROM generate_series(1, :rows) AS n"
    ),
    "mariadb": (
        "INSERT INTO outbox_archive (handler, buffer, event_id, group_id, status, attempts,"
        " payload, created_at, archived_at) SELECT 'send_email', 'email_events', seq,"
        " UUID(), 'succeeded', 1, JSON_OBJECT('id', seq, 'to', CONCAT('user', seq,"
        " '@example.com')), UTC_TIMESTAMP() - INTERVAL 1 DAY, UTC_TIMESTAMP()"
        " FROM seq_1_to_{rows}"
    ),
}
LOAD_JOBS = {
    "postgresql": (
        "INSERT INTO outbox_jobs (kind, handler, group_id, priority, attempts)"
        " SELECT 'batch', 'send_email', md5(n::text)::uuid, 0, 0"
        " FROM generate_series(1, :rows) AS n"
    ),
    "mariadb": (
        "INSERT INTO outbox_jobs (kind, handler, group_id, priority, attempts)"
        " SELECT 'batch', 'send_email', UUID(), 0, 0 FROM seq_1_to_{rows}"
    ),
}


def scratch_database(kind: str, time_zone: str | None = None) -> str:
    """Drop and create the benchmark's database on the server of ``kind``; its URL, whose
    sessions are in ``time_zone`` when given (MariaDB)."""
    url = URLS[kind]
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        if kind == "postgresql":
            conn.execute(text(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)'))
            conn.execute(text(f'CREATE DATABASE "{DATABASE}"'))
        else:
            conn.execute(text(f"DROP DATABASE IF EXISTS {DATABASE}"))
            conn.execute(text(f"CREATE DATABASE {DATABASE} CHARACTER SET utf8mb4"))
    admin.dispose()
    scratch = make_url(url).set(database=DATABASE)
    if time_zone is not None:
        # Migration 0002 then converts the older release's local times to UTC: its cost.
        scratch = scratch.update_query_dict({"init_command": f"SET time_zone = '{time_zone}'"})
    return scratch.render_as_string(hide_password=False)


@contextmanager
def code_of(revision: str | None) -> Iterator[Path]:
    """The source tree of ``revision`` (a temporary git worktree), or this one."""
    if revision is None:
        yield REPOSITORY
        return
    with tempfile.TemporaryDirectory(prefix="outbox-bench-") as directory:
        tree = Path(directory) / "tree"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(tree), revision],
            cwd=REPOSITORY,
            check=True,
            capture_output=True,
        )
        try:
            yield tree
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(tree)], cwd=REPOSITORY, check=False
            )


def step(code: Path, url: str, direction: str, revision: str) -> float:
    """Seconds one migration step takes, run from the code at ``code``."""
    done = subprocess.run(
        [sys.executable, "-c", STEP, url, direction, revision],
        cwd=code,
        env={**os.environ, "PYTHONPATH": str(code)},
        capture_output=True,
        text=True,
        check=True,
    )
    return round(float(json.loads(done.stdout.strip().splitlines()[-1])), 2)


def revisions(code: Path) -> list[str]:
    """The revisions the code at ``code`` ships, oldest first."""
    return sorted(path.name[:4] for path in (code / "migrations" / "versions").glob("0*.py"))


def load(kind: str, url: str, archive_rows: int, jobs: int) -> None:
    """Fill the archive and the job table at revision 0001."""
    engine = create_engine(url)
    with engine.begin() as conn:
        for statement, rows in ((LOAD_ARCHIVE[kind], archive_rows), (LOAD_JOBS[kind], jobs)):
            if kind == "mariadb":
                conn.execute(text(statement.format(rows=rows)))
            else:
                conn.execute(text(statement), {"rows": rows})
    with engine.connect() as conn:
        conn.execute(text("ANALYZE outbox_archive" if kind == "postgresql" else "SELECT 1"))
    engine.dispose()


def run_once(
    kind: str, code: Path, archive_rows: int, jobs: int, time_zone: str | None
) -> dict[str, Any]:
    """One run on one database: seconds per revision up, then per revision down."""
    url = scratch_database(kind, time_zone)
    ships = revisions(code)
    step(code, url, "up", ships[0])
    load(kind, url, archive_rows, jobs)
    up = {revision: step(code, url, "up", revision) for revision in ships[1:]}
    down = {
        f"{revision}->{previous}": step(code, url, "down", previous)
        for previous, revision in reversed(list(pairwise(ships)))
    }
    return {"up": up, "down": down}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archive-rows", type=int, default=1_000_000)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--databases", default="postgresql,mariadb")
    parser.add_argument("--code", default=None, help="a git revision (default: this tree)")
    parser.add_argument("--label", default="after")
    parser.add_argument(
        "--time-zone", default=None, help="MariaDB: the sessions' time zone, e.g. -05:00"
    )
    args = parser.parse_args()
    if args.time_zone is not None and args.databases != "mariadb":
        parser.error("--time-zone applies to --databases mariadb alone")
    results: dict[str, Any] = {
        "benchmark": "migrations",
        "command": command_line("benchmarks.migrations", args),
        "machine": machine(),
        "label": args.label,
        "code": args.code or "working tree",
        "archive_rows": args.archive_rows,
        "jobs": args.jobs,
        "time_zone": args.time_zone,
        "databases": {},
    }
    with code_of(args.code) as code:
        for kind in args.databases.split(","):
            runs = [
                run_once(kind, code, args.archive_rows, args.jobs, args.time_zone)
                for _ in range(args.runs)
            ]
            results["databases"][kind] = runs
            print(kind, json.dumps(runs))
    print(f"results in {write(f'migrations_{args.label}', results)}")


if __name__ == "__main__":
    main()
