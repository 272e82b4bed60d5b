"""Employee sync: the application flags the employees that changed, and outbox hands them to
the payroll system in bulk ("Using your database as a queue", approach 1, without its limits).

``rename`` changes an ``Employee``: its name, ``needs_sync = True`` and ``version + 1``, in the
caller's transaction, and nothing else: no event table to write. ``sync_payroll`` is a flag
handler (``app.flagged``): outbox takes the keys of flagged employees into ``EmployeeSync`` (a
buffer the application creates and never writes), claims them in groups across any number of
workers, retries a failed group with backoff, and clears ``needs_sync`` when the handler
succeeds, only for employees whose version did not move meanwhile.

Run it with ``python -m examples.employee_flags.run``.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Index, String, text
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from outbox import Batch, FlaggedRowsMixin, Outbox, RetryPolicy

HERE = Path(__file__).resolve().parent
DEFAULT_DATABASE_URL = f"sqlite:///{HERE / 'employee_flags.sqlite3'}"


class Base(DeclarativeBase):
    """The application's declarative base."""


class Employee(Base):
    """The business table, with its flag and its version."""

    __tablename__ = "flag_employees"
    # The distribution looks for flagged rows: a partial index keeps that look small.
    __table_args__ = (
        Index(
            "ix_flag_employees_needs_sync",
            "id",
            postgresql_where=text("needs_sync"),
            sqlite_where=text("needs_sync"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    needs_sync: Mapped[bool] = mapped_column(default=False)
    version: Mapped[int] = mapped_column(default=1)


class EmployeeSync(FlaggedRowsMixin, Base):
    """The flag handler's buffer: outbox writes it, the application never does."""

    __tablename__ = "flag_employee_sync"


app = Outbox(os.environ.get("OUTBOX_DATABASE_URL", DEFAULT_DATABASE_URL))

# The payroll system: employee id -> the name it holds, and each bulk call's size.
payroll: dict[int, str] = {}
calls: list[int] = []
payroll_down = {"calls left": 0}


def rename(session: Session, employee_id: int, name: str) -> None:
    """The application's write path: the change, its flag and its version, in one update."""
    employee = session.get_one(Employee, employee_id)
    employee.name = name
    employee.needs_sync = True
    employee.version += 1


@app.flagged(
    Employee,
    flag="needs_sync",
    version="version",
    buffer=EmployeeSync,
    batch_size=100,
    retry=RetryPolicy(scale=0.0, base_delay=0.0, jitter=0.0),
)
def sync_payroll(batch: Batch[Employee]) -> None:
    """One bulk call per group of up to 100 employees, in their current state."""
    if payroll_down["calls left"] > 0:
        payroll_down["calls left"] -= 1
        raise ConnectionError("payroll API unreachable")
    calls.append(len(batch))
    for employee in batch.events:
        payroll[employee.id] = employee.name
