"""Producers: application transactions that write events, some committed, some rolled back.

Each transaction writes its events (through ``outbox.add_events``, the library's write path)
and, in the same transaction, one ``fault_proof`` row per event. The proof table is the truth
about what committed: a transaction whose COMMIT failed because the database went away may or
may not have committed, and only the table can tell. Keys of transactions rolled back on
purpose, or that failed before their COMMIT was sent, are recorded in the :class:`Ledger`
only, never in the database: none of them may ever reach a handler.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, create_engine, insert
from sqlalchemy.exc import DBAPIError

from outbox import add_events, schema
from tests.faults.fault_app import Base, FaultEvent, FaultProof

ROLLBACK_RATIO = 0.1
MAX_TRANSACTION_EVENTS = 20
ERROR_BACKOFF_SECONDS = 0.2


def create_tables(url: str) -> None:
    """Create outbox's tables and the fault application's tables in an empty database."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            schema.metadata.create_all(conn)
            Base.metadata.create_all(conn)
    finally:
        engine.dispose()


@dataclass
class Ledger:
    """What the producers did, by event key; shared by producer threads."""

    committed: set[int] = field(default_factory=set)
    """Transactions whose COMMIT was acknowledged."""
    rolled_back: set[int] = field(default_factory=set)
    """Rolled back on purpose, or failed before COMMIT was sent: never committed."""
    indeterminate: set[int] = field(default_factory=set)
    """COMMIT sent, answer lost (the connection dropped): the proof table decides."""
    errors: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _keys: itertools.count[int] = field(default_factory=lambda: itertools.count(1), repr=False)

    def next_keys(self, count: int) -> list[int]:
        """Fresh event keys, unique across every producer."""
        with self._lock:
            return [next(self._keys) for _ in range(count)]

    def record(self, outcome: str, keys: list[int]) -> None:
        """File the keys of one transaction by its outcome.

        ``committed``, ``rolled_back``, ``failed`` (an error before COMMIT: rolled back too)
        or ``indeterminate`` (an error during COMMIT).
        """
        with self._lock:
            if outcome in ("failed", "indeterminate"):
                self.errors += 1
            target = {"failed": "rolled_back"}.get(outcome, outcome)
            getattr(self, target).update(keys)


def write_transaction(
    engine: Engine,
    ledger: Ledger,
    keys: list[int],
    producer: str,
    *,
    rollback: bool,
    event_model: type[Any] = FaultEvent,
    proof_model: type[Any] = FaultProof,
) -> str:
    """One application transaction: events plus their proof rows, committed or rolled back.

    Returns the outcome (see :meth:`Ledger.record`). Database errors are outcomes here, not
    exceptions: producers keep going through faults. ``event_model`` and ``proof_model`` are
    any models with the fault application's columns (``event_key``, ``producer``).
    """
    committing = False
    try:
        with engine.connect() as conn:
            transaction = conn.begin()
            add_events(conn, event_model, [{"event_key": k, "producer": producer} for k in keys])
            conn.execute(insert(proof_model), [{"event_key": k} for k in keys])
            if rollback:
                transaction.rollback()
                outcome = "rolled_back"
            else:
                committing = True
                transaction.commit()
                outcome = "committed"
    except DBAPIError:
        outcome = "indeterminate" if committing else "failed"
    ledger.record(outcome, keys)
    return outcome


def produce(
    engine: Engine,
    ledger: Ledger,
    events: int,
    *,
    rng: random.Random,
    producer: str = "producer-0",
    rollback_ratio: float = ROLLBACK_RATIO,
) -> None:
    """Write transactions until ``events`` events committed (and some more rolled back)."""
    while len(ledger.committed) < events:
        size = min(rng.randint(1, MAX_TRANSACTION_EVENTS), events - len(ledger.committed))
        rollback = rng.random() < rollback_ratio
        outcome = write_transaction(
            engine, ledger, ledger.next_keys(size), producer, rollback=rollback
        )
        if outcome in ("failed", "indeterminate"):
            time.sleep(ERROR_BACKOFF_SECONDS)


class Producer(threading.Thread):
    """A producer thread writing about ``rate`` events a second until told to stop.

    It stops by itself once the fleet of producers has written ``target`` committed events.
    """

    def __init__(
        self,
        url: str,
        ledger: Ledger,
        *,
        name: str,
        rate: float,
        target: int,
        seed: int,
        rollback_ratio: float = ROLLBACK_RATIO,
        event_model: type[Any] = FaultEvent,
        proof_model: type[Any] = FaultProof,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.event_model = event_model
        self.proof_model = proof_model
        self.engine = create_engine(url, pool_pre_ping=True, pool_size=1)
        self.ledger = ledger
        self.rate = rate
        self.target = target
        self.rng = random.Random(seed)
        self.rollback_ratio = rollback_ratio
        self.stopping = threading.Event()
        self.full_speed = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        written = 0
        try:
            while not self.stopping.is_set() and len(self.ledger.committed) < self.target:
                size = self.rng.randint(1, MAX_TRANSACTION_EVENTS)
                rollback = self.rng.random() < self.rollback_ratio
                keys = self.ledger.next_keys(size)
                outcome = write_transaction(
                    self.engine,
                    self.ledger,
                    keys,
                    self.name,
                    rollback=rollback,
                    event_model=self.event_model,
                    proof_model=self.proof_model,
                )
                written += size
                if outcome in ("failed", "indeterminate"):
                    self.stopping.wait(ERROR_BACKOFF_SECONDS)
                    continue
                if not self.full_speed.is_set():
                    # Pace: this thread's share of the events, spread over the run.
                    ahead = written / self.rate - (time.monotonic() - started)
                    if ahead > 0:
                        self.stopping.wait(ahead)
        finally:
            self.engine.dispose()
