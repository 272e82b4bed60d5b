"""Everything runs through nox: ``nox -s lint typecheck tests``."""

from __future__ import annotations

from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

PYTHON = "3.11"


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff: lint and formatting."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the library, and the typing test that uses the public API."""
    session.install("-e", ".[dev]")
    session.run("mypy")
    session.run("mypy", "--strict", "tests/typing")


@nox.session(python=PYTHON)
def tests(session: nox.Session) -> None:
    """The whole test suite against the real PostgreSQL and SQLite."""
    session.install("-e", ".[dev]")
    session.run("python", "-m", "pytest", *session.posargs)


# The long chaos tier (docs/reliability.md): 10 minutes of faults, 120,000 events, about 50
# worker kills, 20 cut connections, 6 database restarts and 10 zombie pauses. A random seed
# unless one is given: `nox -s chaos -- --seed 7` replays a schedule; later options win.
CHAOS_ARGS = ("--duration", "600", "--events", "120000", "--drain-timeout", "300")


@nox.session(python=PYTHON)
def chaos(session: nox.Session) -> None:
    """The long fault-injection run: producers, workers, kills, restarts; then the checker."""
    session.install("-e", ".[dev]")
    session.run("python", "-m", "tests.faults.chaos", *CHAOS_ARGS, *session.posargs)


@nox.session(python=PYTHON)
def model(session: nox.Session) -> None:
    """The long run of the model tier (docs/reliability.md): 200 generated cases per profile and
    database (20 with killed processes), shrinking any failing case. A random seed, printed in
    the header; `OUTBOX_MODEL_SEED=7 nox -s model` replays one, and pytest options go after --."""
    session.install("-e", ".[dev]")
    env = {"OUTBOX_MODEL_EXAMPLES": "200", "OUTBOX_MODEL_SHRINK": "1"}
    session.run(
        "python", "-m", "pytest", "tests/model", "-p", "no:logging", *session.posargs, env=env
    )


@nox.session(python=PYTHON)
def upgrade(session: nox.Session) -> None:
    """The upgrade tier in full (docs/reliability.md): the previous release's workers and
    producers upgraded under load to this checkout, on PostgreSQL and MariaDB, with more events
    and longer mixed periods than the test run's small size; pytest options go after --."""
    session.install("-e", ".[dev]")
    env = {"OUTBOX_UPGRADE_SIZE": "full"}
    session.run("python", "-m", "pytest", "tests/upgrade", *session.posargs, env=env)


# The tests that read and write the archive, run again on an archive partitioned by day.
ARCHIVE_TESTS = (
    "tests/conformance/test_archive.py",
    "tests/integration/test_operations.py",
    "tests/integration/test_groups.py",
    "tests/integration/test_ordered_keys.py",
    "tests/web/test_api.py",
)


@nox.session(python=PYTHON)
def archive_by_day(session: nox.Session) -> None:
    """The archive's tests on PostgreSQL and MariaDB with the archive partitioned by day, as
    migration 0010 leaves it (tests/conftest.py: ``OUTBOX_TEST_ARCHIVE_BY_DAY``); pytest
    options go after --."""
    session.install("-e", ".[dev]")
    env = {"OUTBOX_TEST_ARCHIVE_BY_DAY": "1"}
    tests = session.posargs or [*ARCHIVE_TESTS, "-k", "not sqlite"]
    session.run("python", "-m", "pytest", *tests, env=env)


@nox.session(python=PYTHON)
def network(session: nox.Session) -> None:
    """The network tier on PostgreSQL and MariaDB: hosts made of network namespaces, their
    links cut, slowed, their processes killed, their clocks put wrong (needs root, iproute2
    and a C compiler; docs/reliability.md); pytest options go after --."""
    session.install("-e", ".[dev]")
    tests = session.posargs or ["tests/network"]
    session.run("python", "-m", "pytest", *tests, env={"OUTBOX_FULL_RUN": "1"})


@nox.session(python=PYTHON)
def full(session: nox.Session) -> None:
    """Every test, on every database: what the default run leaves out to keep within its time
    (tests/conftest.py: the upgrade and model tiers, the sinks' kill test, the bulk API soak,
    the end-to-end tiers on SQLite and MariaDB, each sink's sync class in its own tests), in
    their small sizes; pytest options go after --."""
    session.install("-e", ".[dev]")
    session.run("python", "-m", "pytest", *session.posargs, env={"OUTBOX_FULL_RUN": "1"})


@nox.session(python=PYTHON)
def sinks(session: nox.Session) -> None:
    """The sinks' kill test in full (docs/sinks.md): 10,000 events and 100 random SIGKILLs of
    the workers per sink, on SQLite, PostgreSQL and MariaDB, against the real brokers; and the
    bulk API's outage for a minute. pytest options go after --."""
    session.install("-e", ".[dev]")
    env = {"OUTBOX_SINK_KILLS": "full"}
    tests = (
        "tests/sinks/test_kills.py",
        "tests/sinks/test_http.py::test_an_outage_opens_the_breaker_and_loses_nothing",
    )
    session.run("python", "-m", "pytest", "-s", *tests, *session.posargs, env=env)


# The benchmarks (benchmarks/README.md): figures for the docs, never timing assertions in tests.
DRAIN = ("benchmarks.drain_throughput", "--events", "200000", "--processes", "1,2", "--runs", "3")
# The fan-out's proof on each database, and on PostgreSQL without the kills (a control).
FANOUT = ("benchmarks.fanout", "--events", "200000", "--rate", "1000", "--pause", "60",
          "--limited-calls", "0.5", "--lease", "20")  # fmt: skip
BENCHMARKS = (
    ("benchmarks.wakeup_latency", "--rate", "200", "--seconds", "20", "--runs", "3"),
    ("benchmarks.wakeup_latency", "--rate", "1000", "--producers", "8", "--plain-producers",
     "--seconds", "20", "--runs", "3"),
    ("benchmarks.enqueue_cost", "--transactions", "2000", "--runs", "3"),
    ("benchmarks.scale", "--sizes", "10000,1000000", "--repeat", "21"),
    ("benchmarks.claim_floor", "--events", "1000000", "--repeat", "21", "--in-flight", "64"),
    ("benchmarks.claim_contention", "--held", "0,1000,3000,7000,15000,35000", "--repeat", "21"),
    ("benchmarks.gc_settle", "--events", "200000", "--exits", "5"),
    ("benchmarks.memory_bloat", "--events", "1000000", "--runs", "3"),
    (*DRAIN, "--batch-sizes", "100,1000,5000"),
    (*DRAIN, "--batch-sizes", "1000", "--archive"),
    (*DRAIN, "--batch-sizes", "1000", "--separate-commands"),
    (*DRAIN, "--batch-sizes", "1000", "--raw-by-address"),
    (*DRAIN, "--batch-sizes", "1000", "--separate-commands", "--without-distribute", "--typed",
     "events"),
    (*DRAIN, "--batch-sizes", "1000", "--separate-commands", "--without-distribute", "--typed",
     "rows"),
    (*DRAIN, "--batch-sizes", "1000", "--separate-commands", "--typed", "events"),
    ("benchmarks.drain_mariadb", "--events", "200000", "--batch-size", "1000", "--processes",
     "1,2", "--runs", "3"),
    ("benchmarks.peers", "--jobs", "200000", "--procrastinate-jobs", "5000", "--runs", "3"),
    ("benchmarks.peers", "--jobs", "50000", "--procrastinate-jobs", "5000", "--runs", "3"),
    ("benchmarks.autovacuum", "--seconds", "180", "--runs", "3"),
    ("benchmarks.console_big_tables", "--buffer-rows", "10000000", "--archived-rows", "1000000"),
    ("benchmarks.ingest_http", "--events", "200000", "--batch", "500", "--producers", "8",
     "--runs", "3"),
    ("benchmarks.startup", "--repeat", "11"),
    # Needs RabbitMQ (OUTBOX_BENCH_RABBITMQ_URL) and MariaDB beside PostgreSQL.
    ("benchmarks.inbox", "--deliveries", "1000000", "--repeat-fraction", "0.2", "--consumers",
     "4", "--kills", "20"),
    *((*FANOUT, "--database", database, "--kills", "10")
      for database in ("postgresql", "mariadb", "sqlite")),
    (*FANOUT, "--database", "postgresql", "--kills", "0", "--suffix", "_without_kills"),
)  # fmt: skip


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Every benchmark, one after the other, then the report (RESULTS.md and the chart).

    `nox -s bench -- benchmarks.scale` runs one benchmark, then the report. The peers and
    matplotlib are installed in this session's environment only, never the project's.
    """
    session.install("-e", ".[dev]", "pgqueuer", "procrastinate", "asyncpg", "matplotlib")
    peer_python = str(Path(session.bin) / "python")
    chosen = [b for b in BENCHMARKS if not session.posargs or b[0] in session.posargs]
    for module, *arguments in chosen:
        if module == "benchmarks.peers":
            arguments += ["--peer-python", peer_python]
        session.run("python", "-m", module, *arguments)
    session.run("python", "-m", "benchmarks.report")
