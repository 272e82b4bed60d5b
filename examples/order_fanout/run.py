"""Ship 300 orders with the partner's consumer paused, then resume it while its API fails
twice: the search index and analytics hold all 300 before the partner gets any, the partner
gets each once in the end, and every buffer is empty.

    python -m examples.order_fanout.run
"""

from __future__ import annotations

import sys
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from examples.order_fanout import app as example
from outbox import Outbox, schema
from outbox.ops import flow
from outbox.testing import drain

ORDERS = 300


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
    for held in (example.search_index, example.partner_orders, example.analytics_rows):
        held.clear()
    with Session(app.engine) as session:
        session.add_all(example.Order(id=i) for i in range(ORDERS))
        session.commit()
        for i in range(ORDERS):
            example.ship(session, i, carrier=("post", "courier")[i % 2])
            session.commit()
    flow.pause(app, "send_to_partner", actor="example")
    drain(app)
    before_partner = {
        "search index entries": len(example.search_index),
        "analytics rows": len(example.analytics_rows),
        "partner orders while paused": len(example.partner_orders),
        "copies waiting for the partner": _count(app, example.PartnerCopy),
    }
    example.partner_down["calls left"] = 2
    flow.resume(app, "send_to_partner", actor="example")
    drain(app)
    summary = {
        "orders shipped": ORDERS,
        **before_partner,
        "partner orders": len(example.partner_orders),
        "distinct partner orders": len(set(example.partner_orders)),
        "rows left in every buffer": sum(
            _count(app, model)
            for model in (
                example.OrderShipped,
                example.SearchCopy,
                example.PartnerCopy,
                example.AnalyticsCopy,
            )
        ),
    }
    app.engine.dispose()
    return summary


def _count(app: Outbox, model: type[Any]) -> int:
    with app.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())


if __name__ == "__main__":
    for what, count in main(sys.argv[1] if len(sys.argv) > 1 else None).items():
        print(f"{what}: {count}")
