"""The fleet's versions: which outbox the live workers run, and which levers some ignore.

Workers of outbox 0.2 and newer record their version and the schema generation they understand
in their heartbeat row; older ones record neither. A lever the fleet shares through the database
(a pause, a circuit breaker, ordering keys, rate limits) is ignored by workers older than the
schema generation that brought it: they do not read the table or column it lives in. ``outbox
pause`` and ``resume`` warn while such workers are alive, and ``outbox check`` reports them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from outbox._core.durations import duration
from outbox._db import queries, run_in_transaction
from outbox._db.generation import GENERATION
from outbox._db.queries import WorkerRow as Worker
from outbox._services.heartbeat import heartbeat_interval, older_release_stale_after
from outbox.app import Outbox
from outbox.exceptions import ConfigurationError, OutboxError
from outbox.handler import Handler
from outbox.ops import operators
from outbox.schema import OperationAction, WorkerRequest

PAUSES = "pauses"
CIRCUIT_BREAKERS = "circuit breakers"
RETRY_AFTER_PAUSES = "Retry-After pauses"
ORDERING_KEYS = "ordering keys"
EXACT_RATE_LIMITS = "exact rate limits"
WORKER_REQUESTS = "requests to drain or stop"

LEVERS: dict[str, int] = {
    PAUSES: 3,
    CIRCUIT_BREAKERS: 3,
    RETRY_AFTER_PAUSES: 3,
    ORDERING_KEYS: 3,
    EXACT_RATE_LIMITS: 4,
    WORKER_REQUESTS: 7,
}
"""Each lever the fleet shares, and the schema generation that brought it: workers older than
that ignore it."""

NO_VERSION = "older than 0.2 (no version recorded)"
"""Workers that record no version: outbox 0.1, of schema generation 4 or older."""


@dataclass(frozen=True, slots=True)
class WorkerVersions:
    """The live workers of one outbox version and schema generation."""

    version: str | None
    """None: they record none (older than outbox 0.2)."""
    generation: int | None
    """The schema generation they understand; None: they record none (4 or older)."""
    live: int

    def text(self) -> str:
        """Which outbox, in words."""
        return NO_VERSION if self.version is None else self.version

    def ignores(self, since: int) -> bool:
        """Whether these workers may ignore what schema generation ``since`` brought."""
        return self.generation is None or self.generation < since

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for ``outbox status --json``)."""
        return {
            "version": self.version,
            "generation": self.generation,
            "live": self.live,
            "text": self.text(),
        }


@dataclass(frozen=True, slots=True)
class Fleet:
    """The database's schema generation and the live workers by version."""

    generation: int | None
    """The schema generation the database is at; None when it records none."""
    workers_from: int | None
    """The oldest worker generation that may work on it."""
    migrated_by: str | None
    """The outbox version that migrated it."""
    workers: list[WorkerVersions]
    """Live workers by version, oldest generation first (those that record none first)."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for ``outbox status --json``)."""
        return {
            "generation": self.generation,
            "workers_from": self.workers_from,
            "migrated_by": self.migrated_by,
            "workers": [w.as_dict() for w in self.workers],
        }


def fleet(app: Outbox) -> Fleet:
    """The schema generation and the live workers by version, read on one connection."""
    with app.engine.connect() as conn:
        state = queries.schema_generation(conn)
        versions = queries.live_worker_versions(
            conn, app.settings.worker_stale_after, older_release_stale_after(app.settings)
        )
    return Fleet(
        generation=None if state is None else state.generation,
        workers_from=None if state is None else state.workers_from,
        migrated_by=None if state is None else state.migrated_by,
        workers=[WorkerVersions(v.version, v.generation, v.live) for v in versions],
    )


def workers(app: Outbox) -> list[Worker]:
    """Every worker with a row, the longest running first (a gone one until its row is
    cleaned up): what the dashboard's workers page shows."""
    stale = app.settings.worker_stale_after
    with app.engine.connect() as conn:
        rows = queries.worker_rows(conn, stale)
        leader = queries.leader_worker_id(conn, stale)
    return [dataclasses.replace(row, leader=row.id == leader) for row in rows]


@dataclass(frozen=True, slots=True)
class Asked:
    """A request left for one worker (:func:`ask`)."""

    worker: Worker
    """The worker as it was found."""
    request: WorkerRequest
    acts_within: float
    """Seconds within which it reads the request: its heartbeat interval."""

    def text(self) -> str:
        """What was asked, in words."""
        w = self.worker
        return (
            f"asked worker {w.id} ({w.hostname}, pid {w.pid}) to {self.request.value}: it acts "
            f"at its next heartbeat, within {duration(self.acts_within)}"
        )


def ask(
    app: Outbox, worker_id: str, request: WorkerRequest | str, *, actor: str | None = None
) -> Asked:
    """Ask one live worker to ``drain`` (finish the groups it holds, however long they take,
    take no more, exit) or to ``stop`` (as SIGTERM: what it holds finishes within its grace
    period). Workers run on other hosts: the request is left in the worker's row, which it
    reads at its next heartbeat, and recorded in ``outbox_operations`` as ``actor`` did it
    (None: this process's ``user@host``), in one transaction. What was asked of which
    worker, and within how long it acts.

    Refused, with nothing written: a request other than those two, a worker with no row or
    one gone silent (ConfigurationError), and a worker of an outbox older than schema
    generation 7, which never reads the request (OutboxError: stop it with a signal on its
    host)."""
    try:
        asked = WorkerRequest(request)
    except ValueError:
        choices = ", ".join(r.value for r in WorkerRequest)
        raise ConfigurationError(f"request: expected one of {choices}, got {request!r}") from None
    who = operators.checked_actor(actor)
    found = {w.id: w for w in workers(app)}
    worker = found.get(worker_id)
    if worker is None:
        raise ConfigurationError(f"worker {worker_id!r}: no such worker (outbox workers list)")
    if not worker.alive:
        raise ConfigurationError(
            f"worker {worker_id!r} is gone (last heartbeat {duration(worker.heartbeat_age)} ago): "
            "there is nothing to ask"
        )
    since = LEVERS[WORKER_REQUESTS]
    if worker.generation is None or worker.generation < since:
        runs = NO_VERSION if worker.version is None else f"outbox {worker.version}"
        raise OutboxError(
            f"worker {worker_id!r} runs {runs}, older than schema {since:04d}: it never reads "
            f"requests to drain or stop; send its process SIGTERM on {worker.hostname}"
        )

    def work(conn: Connection) -> None:
        if not queries.ask_worker(conn, worker_id, asked.value, who):
            raise ConfigurationError(f"worker {worker_id!r} stopped meanwhile: nothing to ask")
        action = OperationAction(asked.value)
        where = f"{worker.hostname} pid {worker.pid}"
        operators.record_in(conn, action, who, {"worker": worker_id}, detail=where)

    run_in_transaction(app.engine, work)
    return Asked(worker, asked, heartbeat_interval(app.settings))


def lever_warnings(app: Outbox, lever: str) -> list[str]:
    """One line per group of live workers that ignore ``lever`` (one of :data:`LEVERS`)."""
    since = LEVERS[lever]
    return [
        f"{_who(w)}: workers older than schema {since:04d} ignore {lever}; "
        f"stop or upgrade {_them(w)}"
        for w in fleet(app).workers
        if w.ignores(since)
    ]


def old_worker_warnings(app: Outbox) -> list[str]:
    """One line per group of live workers older than the schema (or this outbox), saying what
    they ignore."""
    found = fleet(app)
    newest = max(found.generation or GENERATION, GENERATION)
    lines = []
    for w in found.workers:
        if not w.ignores(newest):
            continue
        levers = _ignored_levers(w)
        they = "it" if w.live == 1 else "they"
        what = f"{they} may ignore {levers}" if levers else f"older than schema {newest:04d}"
        lines.append(f"{_who(w)}: {what}; stop or upgrade {_them(w)}")
    return lines


def _ignored_levers(workers: WorkerVersions) -> str:
    """The levers these workers may ignore, with the schema that brought them: ``pauses,
    ordering keys (since schema 0003) and exact rate limits (since schema 0004)``."""
    by_since: dict[int, list[str]] = {}
    for lever, since in LEVERS.items():
        if workers.ignores(since):
            by_since.setdefault(since, []).append(lever)
    parts = [
        f"{', '.join(levers)} (since schema {since:04d})"
        for since, levers in sorted(by_since.items())
    ]
    return " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)


def _who(workers: WorkerVersions) -> str:
    one = workers.live == 1
    count = f"{workers.live} live worker{'' if one else 's'}"
    if workers.version is None:
        return f"{count} record{'s' if one else ''} no version (older than outbox 0.2)"
    runs = "runs" if one else "run"
    return f"{count} {runs} outbox {workers.version} (generation {workers.generation})"


def _them(workers: WorkerVersions) -> str:
    return "it" if workers.live == 1 else "them"


def levers_of(handlers: Iterable[Handler[Any]]) -> list[str]:
    """The shared levers these handlers' options ask the whole fleet to keep (pauses and
    Retry-After pauses every handler has; these are set in code)."""
    handlers = list(handlers)
    used = {
        CIRCUIT_BREAKERS: any(h.circuit_breaker is not None for h in handlers),
        ORDERING_KEYS: any(h.ordering_key is not None for h in handlers),
        EXACT_RATE_LIMITS: any(h.rate_limits for h in handlers),
    }
    return [lever for lever, wanted in used.items() if wanted]


def start_warnings(app: Outbox, handlers: Iterable[Handler[Any]]) -> list[str]:
    """For a worker that starts: one line per lever its handlers use that live older workers
    ignore (a rate limit the older workers do not count, a breaker they do not open)."""
    levers = levers_of(handlers)
    if not levers:
        return []
    workers = fleet(app).workers
    return [
        f"{_who(w)}: workers older than schema {LEVERS[lever]:04d} ignore {lever}, which "
        f"handlers of this worker use; stop or upgrade {_them(w)}"
        for lever in levers
        for w in workers
        if w.ignores(LEVERS[lever])
    ]
