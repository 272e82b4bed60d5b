"""Everything runs through nox: ``nox -s lint typecheck tests``."""

from __future__ import annotations

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
