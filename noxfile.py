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
