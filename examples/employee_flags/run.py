"""Hire 500 employees, rename 300 of them while payroll fails its first two calls, then drain:
payroll holds every renamed employee's new name, no flag is left, and the employees nobody
renamed were never sent.

    python -m examples.employee_flags.run
"""

from __future__ import annotations

import sys

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from examples.employee_flags import app as example
from outbox import schema
from outbox.testing import drain

EMPLOYEES = 500
RENAMED = 300


def main(database_url: str | None = None) -> dict[str, int]:
    """Run the example on ``database_url`` (default: the app's, from ``OUTBOX_DATABASE_URL``
    or a SQLite file next to the example); what it did."""
    app = example.app
    if database_url is not None:
        app.use_database(database_url)
    schema.metadata.drop_all(app.engine)
    example.Base.metadata.drop_all(app.engine)
    schema.metadata.create_all(app.engine)
    example.Base.metadata.create_all(app.engine)
    example.payroll.clear()
    example.calls.clear()
    with Session(app.engine) as session:
        session.add_all(
            example.Employee(id=i, name=f"employee {i}") for i in range(1, EMPLOYEES + 1)
        )
        session.commit()
        for i in range(1, RENAMED + 1):
            example.rename(session, i, f"renamed {i}")
        session.commit()
    example.payroll_down["calls left"] = 2
    drain(app)
    with app.engine.connect() as conn:
        flagged = conn.execute(
            select(func.count()).select_from(example.Employee).where(example.Employee.needs_sync)
        ).scalar_one()
    app.engine.dispose()
    return {
        "employees": EMPLOYEES,
        "renamed": RENAMED,
        "payroll holds, with the new name": sum(
            example.payroll.get(i) == f"renamed {i}" for i in range(1, RENAMED + 1)
        ),
        "employees sent that nobody renamed": len(
            set(example.payroll) - set(range(1, RENAMED + 1))
        ),
        "successful calls": len(example.calls),
        "flags left": flagged,
    }


if __name__ == "__main__":
    for what, count in main(sys.argv[1] if len(sys.argv) > 1 else None).items():
        print(f"{what}: {count}")
