"""Enqueue and drain no-op jobs with a peer queue library, in the peers' own virtualenv.

Run by ``benchmarks.peers`` with the interpreter of ``.bench-venv`` (pgqueuer and procrastinate
are never installed into the project's environment)::

    python -m benchmarks._peer_drain pgqueuer setup|enqueue|drain|remaining DSN [N] [OPTIONS]
    python -m benchmarks._peer_drain procrastinate setup|enqueue|drain|remaining DSN [N] [OPTIONS]

``setup`` installs the peer's schema; ``enqueue`` empties the queue and enqueues N no-op jobs in
bulk; ``drain`` runs the peer's worker until no job is left (``--consumers`` workers in this
process, ``--batch-size`` jobs per dequeue for pgqueuer, ``--concurrency`` sub-workers each);
``remaining`` prints how many jobs are still waiting or running; ``version`` the peer's version.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from datetime import timedelta
from typing import Any

ENTRYPOINT = "noop"
CHUNK = 5000


async def pgqueuer_main(args: argparse.Namespace) -> None:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job
    from pgqueuer.qm import QueueManager
    from pgqueuer.queries import Queries
    from pgqueuer.types import QueueExecutionMode

    async def queries() -> Queries:
        return Queries(AsyncpgDriver(await asyncpg.connect(dsn=args.dsn)))

    if args.action == "setup":
        await (await queries()).install()
    elif args.action == "enqueue":
        admin = await queries()
        await admin.clear_queue()
        await admin.clear_statistics_log()
        await admin.clear_queue_log()
        for start in range(0, args.jobs, CHUNK):
            size = min(CHUNK, args.jobs - start)
            await admin.enqueue([ENTRYPOINT] * size, [None] * size, [0] * size)
    elif args.action == "remaining":
        print(sum(row.count for row in await (await queries()).queue_size()))
    else:
        managers = [QueueManager(await queries()) for _ in range(args.consumers)]
        for manager in managers:

            @manager.entrypoint(ENTRYPOINT)
            async def noop(job: Job) -> None:
                """Accept the job."""

        await asyncio.gather(
            *(
                manager.run(
                    batch_size=args.batch_size,
                    mode=QueueExecutionMode.drain,
                    dequeue_timeout=timedelta(seconds=1),
                )
                for manager in managers
            )
        )


async def procrastinate_main(args: argparse.Namespace) -> None:
    import procrastinate

    # It warns that the app lives in ``__main__``; harmless here.
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    # One pooled connection per sub-worker, plus each worker's own and the listener's.
    size = args.consumers * (args.concurrency + 1) + 1
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=args.dsn, min_size=1, max_size=size)
    )

    @app.task(name=ENTRYPOINT)
    async def noop() -> None:
        """Accept the job."""

    async with app.open_async():
        connector: Any = app.connector
        if args.action == "setup":
            await app.schema_manager.apply_schema_async()
        elif args.action == "enqueue":
            await connector.execute_query_async("TRUNCATE procrastinate_jobs CASCADE")
            for start in range(0, args.jobs, CHUNK):
                await noop.batch_defer_async(*({} for _ in range(min(CHUNK, args.jobs - start))))
        elif args.action == "remaining":
            row = await connector.execute_query_one_async(
                "SELECT count(*) AS n FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
            )
            print(row["n"])
        else:
            await asyncio.gather(
                *(
                    app.run_worker_async(
                        concurrency=args.concurrency,
                        wait=False,
                        install_signal_handlers=False,
                        name=f"bench-{n}",
                    )
                    for n in range(args.consumers)
                )
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peer", choices=["pgqueuer", "procrastinate"])
    parser.add_argument("action", choices=["setup", "enqueue", "drain", "remaining", "version"])
    parser.add_argument("dsn")
    parser.add_argument("jobs", type=int, nargs="?", default=0)
    parser.add_argument("--consumers", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
    if args.action == "version":
        from importlib.metadata import version

        print(version(args.peer))
        return
    run = pgqueuer_main if args.peer == "pgqueuer" else procrastinate_main
    if args.peer == "pgqueuer":
        import uvloop

        uvloop.run(run(args))
    else:
        asyncio.run(run(args))


if __name__ == "__main__":
    main()
