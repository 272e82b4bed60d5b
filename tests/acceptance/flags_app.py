"""Employees flagged for a payroll sync, for ``outbox flags`` and ``outbox status``: ``outbox
--app tests.acceptance.flags_app:app ...``. Its handler takes a distribution's worth of
flagged rows, 50, at a time (groups of one)."""

from __future__ import annotations

from typing import Any

from outbox import Batch, Outbox
from tests.models import ActivityEvent, Employee, EmployeeWork

app = Outbox()


@app.flagged(Employee, flag="needs_work_done", version="version", buffer=EmployeeWork,
             batch_size=1)  # fmt: skip
def sync_payroll(batch: Batch[Employee]) -> None:
    """The tests look at the tables, not at what it did."""


@app.handler(ActivityEvent, name="activity")
def activity(batch: Batch[Any]) -> None:
    """A handler of a buffer the application writes, beside the flag handler."""
