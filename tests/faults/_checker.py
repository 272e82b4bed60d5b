"""The checker: what became of every event, in Jepsen's vocabulary.

Run once the faults have stopped and the outbox has drained. It reads the truth from three
places: the proof table (which transactions committed), the handlers' delivery files (what
reached "downstream"), and outbox's own tables (archive, buffer, jobs). Then it counts:

- **lost**: committed (a proof row exists), yet never delivered and never archived in any
  terminal state;
- **phantom**: delivered, archived or still buffered without a proof row, or rolled back by its
  producer yet proven committed: the event's existence is not atomic with its transaction;
- **duplicated**: delivered more than once (allowed: delivery is at least once), with
  ``redeliveries`` the extra deliveries in all;
- **left claimed** / **left unclaimed**: buffer rows still in a group / still waiting;
- **jobs left**: rows still in ``outbox_jobs``;
- **concurrent commits**: events archived more than once, i.e. two completions of one group
  both committed although only one may hold its lease;
- **unterminated**: committed events with no archive row at all (every event must end in
  exactly one terminal state, and the fault application archives every outcome);
- **dead**: archived as dead letters (not a violation, but reported).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select

from outbox import schema
from tests.faults.fault_app import FaultEvent, FaultProof

VIOLATIONS = (
    "lost",
    "phantom",
    "left_claimed",
    "left_unclaimed",
    "jobs_left",
    "concurrent_commits",
    "unterminated",
)


@dataclass(frozen=True)
class Observations:
    """Everything the checker reads, gathered after the run."""

    proven: frozenset[int]
    """Keys with a proof row: their transaction committed."""
    rolled_back: frozenset[int]
    """Keys the producers rolled back, or whose transaction failed before COMMIT."""
    deliveries: Counter[int]
    """Key -> how many times a handler delivered it."""
    archived: Counter[int]
    """Key -> archive rows."""
    archived_dead: frozenset[int]
    buffered: Counter[int]
    """Key -> 1 for rows still in the buffer."""
    left_claimed: int
    left_unclaimed: int
    jobs_left: int


@dataclass(frozen=True)
class Report:
    """The checker's counts. ``ok`` when none of :data:`VIOLATIONS` is above zero."""

    committed: int
    rolled_back: int
    delivered: int
    lost: int
    phantom: int
    duplicated: int
    redeliveries: int
    left_claimed: int
    left_unclaimed: int
    jobs_left: int
    concurrent_commits: int
    unterminated: int
    dead: int

    @property
    def violations(self) -> dict[str, int]:
        """The invariant counts that are not zero."""
        counts = asdict(self)
        return {name: counts[name] for name in VIOLATIONS if counts[name]}

    @property
    def ok(self) -> bool:
        """True when no invariant is violated."""
        return not self.violations

    def summary(self) -> str:
        """One line of ``name=count`` pairs."""
        return " ".join(f"{name}={value}" for name, value in asdict(self).items())


def analyse(seen: Observations) -> Report:
    """Count what went wrong; pure, so that the checker itself can be tested."""
    delivered = set(seen.deliveries)
    archived = set(seen.archived)
    terminal = delivered | archived
    existed = terminal | set(seen.buffered)
    phantom = (existed - seen.proven) | (seen.rolled_back & seen.proven)
    return Report(
        committed=len(seen.proven),
        rolled_back=len(seen.rolled_back),
        delivered=len(delivered),
        lost=len(seen.proven - terminal),
        phantom=len(phantom),
        duplicated=sum(1 for n in seen.deliveries.values() if n > 1),
        redeliveries=sum(n - 1 for n in seen.deliveries.values() if n > 1),
        left_claimed=seen.left_claimed,
        left_unclaimed=seen.left_unclaimed,
        jobs_left=seen.jobs_left,
        concurrent_commits=sum(1 for n in seen.archived.values() if n > 1),
        unterminated=len(seen.proven - archived),
        dead=len(seen.archived_dead),
    )


def read_deliveries(handled_dir: Path) -> Counter[int]:
    """Key -> deliveries, from every worker's file; a torn last line (killed mid-write) is
    not a delivery."""
    deliveries: Counter[int] = Counter()
    for path in sorted(handled_dir.glob("handled-*.log")):
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = text.split("\n")
        for line in lines[:-1]:  # the part after the last newline is torn or empty
            if line:
                deliveries[int(line.split(" ", 1)[0])] += 1
    return deliveries


def observe(
    engine: Engine,
    handled_dir: Path,
    rolled_back: Iterable[int],
    *,
    event_model: type[Any] = FaultEvent,
    proof_model: type[Any] = FaultProof,
) -> Observations:
    """Gather the observations from the database and the delivery files.

    ``event_model`` and ``proof_model``: any models with the fault application's columns.
    """
    events = event_model.__table__
    archive = schema.archive
    key = archive.c.payload["event_key"].as_integer()
    with engine.connect() as conn:
        proven = frozenset(conn.execute(select(proof_model.event_key)).scalars())
        archived: Counter[int] = Counter()
        dead: set[int] = set()
        for event_key, status in conn.execute(select(key, archive.c.status)):
            archived[int(event_key)] += 1
            if status == "dead":
                dead.add(int(event_key))
        buffered = Counter(int(k) for k in conn.execute(select(events.c.event_key)).scalars())
        claimed = conn.execute(
            select(func.count()).where(events.c.group_id.is_not(None))
        ).scalar_one()
        unclaimed = conn.execute(
            select(func.count()).where(events.c.group_id.is_(None))
        ).scalar_one()
        jobs = conn.execute(select(func.count()).select_from(schema.jobs)).scalar_one()
    return Observations(
        proven=proven,
        rolled_back=frozenset(rolled_back),
        deliveries=read_deliveries(handled_dir),
        archived=archived,
        archived_dead=frozenset(dead),
        buffered=buffered,
        left_claimed=int(claimed),
        left_unclaimed=int(unclaimed),
        jobs_left=int(jobs),
    )


def check(
    engine: Engine,
    handled_dir: Path,
    rolled_back: Iterable[int],
    *,
    event_model: type[Any] = FaultEvent,
    proof_model: type[Any] = FaultProof,
) -> Report:
    """Observe and analyse in one go."""
    seen = observe(
        engine, handled_dir, rolled_back, event_model=event_model, proof_model=proof_model
    )
    return analyse(seen)
