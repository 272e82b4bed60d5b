"""Status numbers per handler: backlog, age, staleness, groups by state, dead letters."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import Connection

from outbox import _sql, schema
from outbox.app import Outbox


@dataclass(frozen=True, slots=True)
class HandlerStatus:
    """Where one handler stands. Ages are float seconds, by the database clock."""

    handler: str
    buffer: str
    urgency: str
    promise: float
    unclaimed: int
    """Events written and not yet claimed."""
    claimed: int
    """Events in groups waiting, running or retrying."""
    oldest_age: float | None
    """Age of the oldest event still in the buffer; None when it is empty."""
    staleness: float | None
    """``oldest_age / promise``: above 1, the handler is behind its promise."""
    claims_pending: int
    groups_waiting: int
    groups_in_flight: int
    groups_retrying: int
    max_attempt: int
    """The highest attempt count among the handler's pending groups (0: none pending)."""
    archived: dict[str, int] = field(default_factory=dict)
    """Archived events by status: succeeded, dead, expired, discarded."""

    @property
    def dead(self) -> int:
        """Events dead-lettered into the archive."""
        return self.archived.get("dead", 0)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (for ``outbox status --json``)."""
        data = asdict(self)
        data["dead"] = self.dead
        return data


def collect(app: Outbox, handlers: tuple[str, ...] | list[str] = ()) -> list[HandlerStatus]:
    """The status of every handler (or the named ones), read in one transaction."""
    selected = app.select_handlers(handlers)

    def read(conn: Connection) -> list[HandlerStatus]:
        jobs = _sql.job_counts(conn)
        archived = _sql.archive_counts(conn)
        attempts = _sql.max_batch_attempts(conn)
        result = []
        for h in selected:
            age = _sql.oldest_event_age(conn, h.table)

            def n(kind: str, state: str, name: str = h.name) -> int:
                return jobs.get((name, kind, state), 0)

            result.append(
                HandlerStatus(
                    handler=h.name,
                    buffer=h.table.name,
                    urgency=h.urgency.name,
                    promise=h.urgency.promise,
                    unclaimed=_sql.count_buffer_rows(conn, h.table, unclaimed=True),
                    claimed=_sql.count_buffer_rows(conn, h.table, unclaimed=False),
                    oldest_age=age,
                    staleness=None if age is None else age / h.urgency.promise,
                    claims_pending=sum(
                        n(schema.JOB_KIND_CLAIM, s) for s in ("waiting", "retrying", "running")
                    ),
                    groups_waiting=n(schema.JOB_KIND_BATCH, "waiting"),
                    groups_in_flight=n(schema.JOB_KIND_BATCH, "running"),
                    groups_retrying=n(schema.JOB_KIND_BATCH, "retrying"),
                    max_attempt=attempts.get(h.name, 0),
                    archived={
                        status: archived[(h.name, status)]
                        for status in schema.ARCHIVE_STATUSES
                        if (h.name, status) in archived
                    },
                )
            )
        return result

    with app.engine.connect() as conn:
        return read(conn)
