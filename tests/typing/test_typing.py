"""The public API type-checks under `mypy --strict` as an application would use it."""

from __future__ import annotations

from pathlib import Path

from mypy import api


def test_public_api_passes_mypy_strict() -> None:
    """mypy --strict accepts a module written against the public API."""
    usage = Path(__file__).with_name("public_api_usage.py")
    stdout, stderr, status = api.run(["--strict", "--no-incremental", str(usage)])
    assert (0, "") == (status, stderr), stdout
