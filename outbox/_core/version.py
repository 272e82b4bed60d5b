"""The version of outbox that runs here: what its workers record, what `outbox --version` shows."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "sqlalchemy-outbox"
UNKNOWN = "unknown"
"""The version of a copy of outbox that was not installed (a source tree on the path)."""


def _installed_version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return UNKNOWN


VERSION = _installed_version()
"""The installed distribution's version (``0.2.0``), or ``unknown``."""
