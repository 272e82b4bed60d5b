"""What the benchmarks share: a scratch PostgreSQL database and fresh tables in it, a scratch
database on each server (and an SQLite file), percentiles, the command line."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, MetaData, create_engine, text
from sqlalchemy.engine import make_url

from outbox import schema

ADMIN_URL = os.environ.get(
    "OUTBOX_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1/test"
)
POSTGRES_URL = ADMIN_URL
MARIADB_URL = os.environ.get("OUTBOX_BENCH_MARIADB_URL", "mysql+pymysql://root@127.0.0.1:3306/test")
DATABASES = ("postgresql", "mariadb", "sqlite")
RESULTS = Path(__file__).parent / "results"
REPOSITORY = Path(__file__).resolve().parents[1]


def scratch_database(name: str) -> str:
    """Drop and create a database for one benchmark; returns its URL."""
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return make_url(ADMIN_URL).set(database=name).render_as_string(hide_password=False)


def drop_database(name: str) -> None:
    """Drop a benchmark's database (made by :func:`scratch_database`), at its end."""
    admin = create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def fresh_tables(url: str, buffers: MetaData) -> None:
    """Fresh framework tables and buffers (``buffers``: the benchmark's models' metadata) in
    the database of ``url``: dropped, then created."""
    engine = create_engine(url)
    with engine.begin() as conn:
        buffers.drop_all(conn)
        schema.metadata.drop_all(conn)
        schema.metadata.create_all(conn)
        buffers.create_all(conn)
    engine.dispose()


@contextlib.contextmanager
def scratch(database: str, prefix: str) -> Iterator[str]:
    """A database of the run's own on ``database``'s server (one of :data:`DATABASES`; a file
    for SQLite), named after ``prefix``; its URL, dropped at the end."""
    name = f"outbox_bench_{prefix}_{uuid.uuid4().hex[:8]}"
    if database == "sqlite":
        with tempfile.TemporaryDirectory(prefix=f"outbox-{prefix}-") as directory:
            yield f"sqlite:///{directory}/{name}.sqlite3"
        return
    admin_url = POSTGRES_URL if database == "postgresql" else MARIADB_URL
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    create = f'CREATE DATABASE "{name}"' if database == "postgresql" else f"CREATE DATABASE {name}"
    if database == "mariadb":
        create += " CHARACTER SET utf8mb4"
    drop = (
        f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
        if database == "postgresql"
        else f"DROP DATABASE IF EXISTS {name}"
    )
    with admin.connect() as conn:
        conn.execute(text(create))
    try:
        yield make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(drop))
        admin.dispose()


def reader_engine(url: str) -> Engine:
    """An engine for a benchmark's own reads beside the processes it measures: plain
    transactions, where outbox's SQLite engine takes the write lock up front."""
    if url.startswith("sqlite"):
        return create_engine(url, connect_args={"timeout": 30})
    return create_engine(url, pool_size=1)


def server_version(conn: Connection) -> str:
    """The database server's name and version (SQLite's library version)."""
    if conn.dialect.name == "sqlite":
        return "SQLite " + str(conn.execute(text("SELECT sqlite_version()")).scalar())
    return str(conn.execute(text("SELECT version()")).scalar()).split(" on ")[0]


def libpq_url(url: str) -> str:
    """A SQLAlchemy psycopg URL as a libpq connection string, for plain psycopg."""
    return url.replace("postgresql+psycopg://", "postgresql://")


def percentile(values: list[float], fraction: float) -> float:
    """The value below which ``fraction`` of ``values`` fall (nearest rank)."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(fraction * len(ordered)) - 1))
    return ordered[rank]


def summary(values: list[float]) -> dict[str, float]:
    """Median, p99 and spread of a list of seconds, in milliseconds."""
    return {
        "n": len(values),
        "p50_ms": round(1000 * percentile(values, 0.50), 1),
        "p99_ms": round(1000 * percentile(values, 0.99), 1),
        "max_ms": round(1000 * max(values), 1),
        "mean_ms": round(1000 * statistics.fmean(values), 1),
    }


class CpuMeter:
    """CPU seconds used by this process's finished children (the processes a benchmark ran)
    and by the PostgreSQL server's finished backends, between :meth:`start` and :meth:`stop`.

    The server's share is its postmaster's children times, readable when the server runs on
    this machine (Linux ``/proc``); otherwise it is None. Backends count once they have exited
    (when the measured processes closed their connections); the server's own background
    processes (WAL writer, checkpointer) are not counted.
    """

    def __init__(self, dsn: str) -> None:
        import psycopg

        with psycopg.connect(dsn) as conn:
            (backend,) = conn.execute("SELECT pg_backend_pid()").fetchone()  # type: ignore[misc]
            # Read while the backend lives: once the connection closes, it may be gone.
            self._postmaster = _parent_pid(int(backend))
        self._started: tuple[float, float | None] = (0.0, None)

    def _now(self) -> tuple[float, float | None]:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime, _children_cpu(self._postmaster)

    def start(self) -> None:
        """Start counting."""
        self._started = self._now()

    def stop(self) -> tuple[float, float | None]:
        """(client, server) CPU seconds since :meth:`start`; server None where unreadable."""
        time.sleep(0.3)  # the postmaster reaps the backends of the processes that just ended
        client, server = self._now()
        client_then, server_then = self._started
        return (
            round(client - client_then, 2),
            None if server is None or server_then is None else round(server - server_then, 2),
        )


def _proc_stat(pid: int | None) -> list[str] | None:
    if pid is None:
        return None
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _parent_pid(pid: int) -> int | None:
    fields = _proc_stat(pid)
    return None if fields is None else int(fields[1])


def _children_cpu(pid: int | None) -> float | None:
    fields = _proc_stat(pid)
    if fields is None:
        return None
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    server = subprocess.run(
        ["psql", "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "postgresql_client": server,
    }


def fraction(value: str) -> float:
    """argparse's type for a fraction from 0 up to (not including) 1."""
    number = float(value)
    if not 0 <= number < 1:
        raise argparse.ArgumentTypeError("a fraction from 0 up to (not including) 1")
    return number


def command_line(module: str, args: argparse.Namespace) -> str:
    """The command line that reproduces a run, stored with its results.

    Built from the parsed options rather than copied from ``sys.argv``, so that defaults are
    spelled out: the stored command still reproduces the run once a default has changed.
    Every option is ``--dest-with-dashes``; a flag appears only when set, an unset option
    (``None``) not at all, and a path inside the repository relative to its root (the
    benchmarks run from there).
    """
    words = ["python", "-m", module]
    for dest, value in vars(args).items():
        option = "--" + dest.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            words.append(option)
            continue
        if isinstance(value, Path) and value.is_absolute() and value.is_relative_to(REPOSITORY):
            value = value.relative_to(REPOSITORY)
        elif isinstance(value, float) and value.is_integer():
            value = int(value)
        words += [option, str(value)]
    return shlex.join(words)


def write(name: str, data: dict[str, Any]) -> Path:
    """Store a benchmark's results as JSON next to the benchmarks."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
