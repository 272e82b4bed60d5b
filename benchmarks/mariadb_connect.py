"""What a new connection to MariaDB costs the client, with PyMySQL's TLS attempt and without.

PyMySQL 1.2 tries TLS when the URL says nothing of it: each connection builds a TLS context
(the system's certificates loaded) before the server says whether it has TLS. Against the MariaDB
server at ``--url`` (default: this machine's), ``--connects`` connections are opened and closed
through SQLAlchemy's engine (a fresh ``NullPool`` connection each, as every ``outbox`` command and
every connection a pool opens), with the URL as given and with ``ssl_disabled=true``, taking turns
run by run: wall and CPU milliseconds per connection, and their ratio.

    python -m benchmarks.mariadb_connect --connects 200 --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import pymysql
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from benchmarks._common import command_line, machine, write

DEFAULT_URL = "mysql+pymysql://root@127.0.0.1:3306/test"
VARIANTS = {"as given": {}, "ssl_disabled=true": {"ssl_disabled": "true"}}


def per_connection(url: str, connects: int) -> dict[str, float]:
    """Milliseconds of wall and of this process's CPU per connection opened, used and closed."""
    engine = create_engine(url, poolclass=NullPool)
    with engine.connect() as conn:  # the dialect's first connection, outside the timing
        conn.execute(text("SELECT 1"))
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(connects):
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    engine.dispose()
    return {"wall_ms": round(1000 * wall / connects, 3), "cpu_ms": round(1000 * cpu / connects, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--url", default=DEFAULT_URL)
    parser.add_argument("--connects", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.connects < 1 or args.runs < 1:
        parser.error("--connects ≥ 1, --runs ≥ 1")
    base = make_url(args.url)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in VARIANTS}
    for _ in range(args.runs):
        for name, query in VARIANTS.items():
            url = base.update_query_dict(query).render_as_string(hide_password=False)
            runs[name].append(per_connection(url, args.connects))
    medians: dict[str, Any] = {
        name: {key: round(statistics.median(r[key] for r in found), 3) for key in found[0]}
        for name, found in runs.items()
    }
    plain, tls = medians["ssl_disabled=true"], medians["as given"]
    result = {
        "command": command_line("benchmarks.mariadb_connect", args),
        "machine": {**machine(), "pymysql": pymysql.__version__},
        "connects": args.connects,
        "runs": runs,
        "median": medians,
        "cpu_ratio_as_given_over_disabled": round(tls["cpu_ms"] / plain["cpu_ms"], 1),
    }
    path = write("mariadb_connect", result)
    for name, found in medians.items():
        print(f"{name}: {found['wall_ms']} ms wall, {found['cpu_ms']} ms CPU per connection")
    print(f"written to {path}")


if __name__ == "__main__":
    main()
