"""The console of the bench application, served by uvicorn for ``benchmarks.ingest_http``:
``python -m benchmarks._ingest_server PORT`` with ``BENCH_DATABASE_URL`` and
``OUTBOX_WEB_TOKENS`` set."""

from __future__ import annotations

import os
import sys

import uvicorn

from benchmarks.bench_app import BenchEvent
from outbox import Outbox
from outbox.web import Auth, create_app

app = Outbox(os.environ["BENCH_DATABASE_URL"])
app.handler(BenchEvent, name="bench")(lambda batch: None)

if __name__ == "__main__":
    console = create_app(app, auth=Auth.from_env())
    uvicorn.run(
        console, host="127.0.0.1", port=int(sys.argv[1]), log_level="error", access_log=False
    )
