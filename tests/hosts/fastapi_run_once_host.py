"""A FastAPI application that runs the shop's outbox from its lifespan: a background task
calls ``outbox.run_once`` in a thread, on a schedule, while the application serves requests;
at shutdown the run under way finishes before the application exits.

Each process records every result, one JSON line each, in ``runs-<pid>.jsonl`` under
``SHOP_RUNS_DIR``; ``SHOP_RUN_EVERY`` is the schedule's tick in seconds, ``SHOP_RUN_PAUSE``
the wait between two runs (shorter than the tick: several runs of several processes fall on
each tick).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import FastAPI

import outbox
from outbox import jsonable
from tests.hosts import shop

RUNS_DIR_ENV = "SHOP_RUNS_DIR"
EVERY = float(os.environ.get("SHOP_RUN_EVERY", "2"))
PAUSE = float(os.environ.get("SHOP_RUN_PAUSE", "0.25"))
BUDGET_SECONDS = 10.0


def _record(result: outbox.RunResult) -> None:
    path = Path(os.environ[RUNS_DIR_ENV]) / f"runs-{os.getpid()}.jsonl"
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(jsonable(result)) + "\n")


async def run_outbox(stop: asyncio.Event) -> None:
    """Run the outbox once per pause until stopped; a failed run is logged, not fatal."""
    while not stop.is_set():
        try:
            result = await asyncio.to_thread(
                outbox.run_once, shop.outbox, every=EVERY, budget_seconds=BUDGET_SECONDS
            )
            _record(result)
        except Exception:
            shop.log.exception("outbox run failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=PAUSE)


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the outbox task with the application; at shutdown, let its run finish."""
    stop = asyncio.Event()
    task = asyncio.create_task(run_outbox(stop))
    yield
    stop.set()
    await task


app = FastAPI(lifespan=lifespan)


@app.get("/healthz")
def healthz() -> dict[str, bool]:
    """Serving."""
    return {"ok": True}
