"""What the benchmarks share: a scratch PostgreSQL database and percentiles."""

from __future__ import annotations

import json
import os
import platform
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


def write(name: str, data: dict[str, Any]) -> Path:
    """Store a benchmark's results as JSON next to the benchmarks."""
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path
