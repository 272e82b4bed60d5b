"""The handlers of one database added up, and the databases of a fleet: what ``outbox status``
and the console show of an application serving several databases."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from outbox.ops.metrics import HandlerStatus


@dataclass(frozen=True, slots=True)
class DatabaseTotals:
    """The handlers of one database taken together, or the databases of a fleet: counts are
    summed, ages and staleness are the largest."""

    unclaimed: int = 0
    oldest_age: float | None = None
    staleness: float | None = None
    groups_in_flight: int = 0
    groups_retrying: int = 0
    groups_refused: int = 0
    dead: int = 0
    alerts: int = 0
    workers_alive: int | None = None
    """Live workers; None when they were not counted (of a fleet: by no database)."""
    at_least: bool = False
    """A count reached the cap it was counted to (``collect(count_cap=...)``)."""

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def database_totals(
    statuses: list[HandlerStatus], workers_alive: int | None = None
) -> DatabaseTotals:
    """The handler statuses of one database added up."""
    return DatabaseTotals(
        unclaimed=sum(s.unclaimed for s in statuses),
        oldest_age=_largest(s.oldest_age for s in statuses),
        staleness=_largest(s.staleness for s in statuses),
        groups_in_flight=sum(s.groups_in_flight for s in statuses),
        groups_retrying=sum(s.groups_retrying for s in statuses),
        groups_refused=sum(s.groups_refused for s in statuses),
        dead=sum(s.dead for s in statuses),
        alerts=sum(len(s.alerts) for s in statuses),
        workers_alive=workers_alive,
        at_least=any(_capped(s) for s in statuses),
    )


def fleet_totals(databases: Iterable[DatabaseTotals]) -> DatabaseTotals:
    """The totals of several databases added up: the fleet as a whole. Live workers are
    summed over the databases whose workers were counted."""
    listed = list(databases)
    workers = [d.workers_alive for d in listed if d.workers_alive is not None]
    return DatabaseTotals(
        unclaimed=sum(d.unclaimed for d in listed),
        oldest_age=_largest(d.oldest_age for d in listed),
        staleness=_largest(d.staleness for d in listed),
        groups_in_flight=sum(d.groups_in_flight for d in listed),
        groups_retrying=sum(d.groups_retrying for d in listed),
        groups_refused=sum(d.groups_refused for d in listed),
        dead=sum(d.dead for d in listed),
        alerts=sum(d.alerts for d in listed),
        workers_alive=sum(workers) if workers else None,
        at_least=any(d.at_least for d in listed),
    )


def _largest(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _capped(status: HandlerStatus) -> bool:
    cap = status.capped_at
    return cap is not None and (status.unclaimed >= cap or status.dead >= cap)
