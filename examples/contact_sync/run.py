"""Rename 50 contacts 1,000 times in all while the CRM sync is stopped, then drain: one bulk
call of 50 records reaches the CRM, each contact's last name, and the 950 older states are
archived as superseded.

    python -m examples.contact_sync.run
"""

from __future__ import annotations

import random
import sys

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from examples.contact_sync import app as example
from outbox import schema
from outbox.testing import drain

CONTACTS = 50
RENAMES = 20


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
    example.crm.clear()
    example.calls.clear()
    rng = random.Random(7)
    last: dict[int, str] = {}
    with Session(app.engine) as session:
        session.add_all(example.Contact(id=i, name=f"contact {i}") for i in range(CONTACTS))
        session.commit()
        for n in range(CONTACTS * RENAMES):
            contact_id = rng.randrange(CONTACTS)
            last[contact_id] = f"name {n}"
            example.rename(session, contact_id, last[contact_id])
            session.commit()
    drain(app)
    with app.engine.connect() as conn:
        superseded = conn.execute(
            select(func.count())
            .select_from(schema.archive)
            .where(schema.archive.c.status == schema.ArchiveStatus.SUPERSEDED)
        ).scalar_one()
    app.engine.dispose()
    return {
        "changes": CONTACTS * RENAMES,
        "records sent": sum(example.calls),
        "calls": len(example.calls),
        "superseded": superseded,
        "contacts the CRM holds in their latest state": sum(
            example.crm.get(i) == name for i, name in last.items()
        ),
    }


if __name__ == "__main__":
    for what, count in main(sys.argv[1] if len(sys.argv) > 1 else None).items():
        print(f"{what}: {count}")
