"""A client of the database inside a host of its own (``tests.network._netns``): it waits on
the network as a worker's connections do, and says how long a cut link kept it waiting.

    python -m tests.network.bounded_client URL NETWORK_TIMEOUT MODE

``NETWORK_TIMEOUT``: ``Settings.network_timeout`` of its ``Outbox`` (``none``: unset).
``MODE``: ``reply``, a statement that runs three seconds, during which the link is cut (its
request was acknowledged, its reply never comes); ``send``, a statement sent once the link is
cut (its data go unacknowledged).

On standard output: ``ready`` once connected; then, after ``go`` on standard input, one JSON
line (``seconds`` waited, the ``error`` that ended the wait or None, whether SQLAlchemy saw the
connection as lost); then, after ``healed``, ``recovered`` once a statement worked again.
"""

from __future__ import annotations

import json
import sys
import time

from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from outbox import Outbox, Settings

RECOVERY_SECONDS = 30.0


def main() -> None:
    url, bound, mode = sys.argv[1:4]
    timeout = None if bound == "none" else float(bound)
    app = Outbox(url, settings=Settings(network_timeout=timeout))
    sleep = "SELECT pg_sleep(3)" if url.startswith("postgresql") else "SELECT SLEEP(3)"
    with app.engine.connect() as conn:
        conn.execute(text("SELECT 1"))
        conn.rollback()
        print("ready", flush=True)
        sys.stdin.readline()
        started = time.monotonic()
        error: str | None = None
        lost = False
        try:
            conn.execute(text(sleep if mode == "reply" else "SELECT 1"))
        except DBAPIError as caught:
            error = f"{type(caught).__name__}: {str(caught.orig).strip().splitlines()[0]}"
            lost = caught.connection_invalidated
        seconds = time.monotonic() - started
        print(json.dumps({"seconds": seconds, "error": error, "lost": lost}), flush=True)
    sys.stdin.readline()
    deadline = time.monotonic() + RECOVERY_SECONDS
    while True:
        try:
            with app.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except DBAPIError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
        else:
            print("recovered", flush=True)
            return


if __name__ == "__main__":
    main()
