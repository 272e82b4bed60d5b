"""Leasing due jobs for a worker (or ``outbox.testing.drain``) to run: the most urgent first,
capped handlers apart."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence

from outbox._core import log as _log
from outbox._db import queries, run_in_transaction
from outbox.app import Outbox

log = _log.get_logger(__name__)

# Leases that took this share of their length or more to come back may be lost by the time a
# handler gets going: jobs acquired so are given back unrun, and so is a claim's group
# (outbox._engine.runner).
YOUNG_LEASE_SHARE = 0.5


def acquire(
    app: Outbox,
    *,
    worker_id: str,
    serving: Sequence[str],
    handlers: Sequence[str],
    cap: Callable[[str], int | None],
    probing: Callable[[str], bool],
    limit: int,
) -> list[queries.JobRow]:
    """Lease up to ``limit`` due jobs of the handlers ``serving`` (of ``handlers``, all those
    the caller runs) to ``worker_id``.

    Handlers with a fleet-wide cap (``cap(name)``: see :meth:`outbox._engine.runner.Runner.cap`)
    are served first, each in a short transaction of its own; their cap keeps them from taking
    more than their share, and serving them first keeps an uncapped backlog from starving them.
    ``probing(name)``: the handler's circuit breaker probes, with a group never attempted if any.
    """
    token = uuid.uuid4()
    lease_seconds = app.settings.lease_seconds
    started = time.monotonic()
    jobs: list[queries.JobRow] = []
    caps = {name: c for name in serving if (c := cap(name)) is not None}
    for name, c in caps.items():
        if len(jobs) < limit:
            jobs += _acquire_capped(app, name, c, worker_id, token, limit - len(jobs), probing)
    uncapped = [name for name in handlers if name not in caps]
    room = limit - len(jobs)
    if room > 0 and serving:
        jobs += run_in_transaction(
            app.engine,
            lambda conn: queries.acquire_jobs(
                conn,
                app.dialect,
                handlers=serving,
                batch_handlers=uncapped if caps else None,
                worker_id=worker_id,
                token=token,
                limit=room,
                lease_seconds=lease_seconds,
            ),
        )
    if jobs and time.monotonic() - started >= lease_seconds * YOUNG_LEASE_SHARE:
        # Came back late (a slow link, a stalled process): the leases may be lost by now.
        # Given back unattempted, by writes fenced by them; none is run here.
        log.warning(
            _log.LEASE_TOO_OLD,
            jobs=len(jobs),
            claim_seconds=round(time.monotonic() - started, 3),
            lease_seconds=lease_seconds,
            heard_recently=True,
        )
        run_in_transaction(
            app.engine,
            lambda conn: [queries.return_job(conn, job.id, token) for job in jobs],
        )
        return []
    return jobs


def _acquire_capped(
    app: Outbox,
    name: str,
    cap: int,
    worker_id: str,
    token: uuid.UUID,
    limit: int,
    probing: Callable[[str], bool],
) -> list[queries.JobRow]:
    return run_in_transaction(
        app.engine,
        lambda conn: queries.acquire_capped_batch_jobs(
            conn,
            app.dialect,
            handler=name,
            cap=cap,
            worker_id=worker_id,
            token=token,
            limit=limit,
            lease_seconds=app.settings.lease_seconds,
            # A probe is a group not known to be poison: one never attempted, if any.
            fresh_first=probing(name),
        ),
    )
