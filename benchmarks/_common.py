"""What the benchmarks share: a scratch PostgreSQL database, percentiles, the command line."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

ADMIN_URL = os.environ.get(
    "OUTBOX_BENCH_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1/test"
)
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
