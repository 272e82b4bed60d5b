"""What the databases' packages share about URLs: where a database on a server is."""

from __future__ import annotations

from sqlalchemy.engine import URL


def on_server(url: URL) -> str:
    """Where a URL of a database on a server points, without its password: ``database 'app'
    on db.internal:5432``."""
    host = url.host or "localhost"
    port = f":{url.port}" if url.port else ""
    return f"database {url.database!r} on {host}{port}"
