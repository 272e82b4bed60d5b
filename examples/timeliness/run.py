"""Run the timeliness example: ``python examples/timeliness/run.py``.

1. write a backlog of analytics events (DAY) and start a worker with two slots;
2. while the backlog drains, commit fraud alerts (REALTIME) one by one;
3. print `outbox status` in the middle of it, and how fast the alerts were handled.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from click.testing import CliRunner
from sqlalchemy.orm import Session

from examples.timeliness.app import (
    AnalyticsEvent,
    Base,
    FraudAlertEvent,
    alert_ages,
    app,
    exported,
)
from outbox import add_events, schema
from outbox.cli import main as outbox_cli
from outbox.worker import Worker

BACKLOG = 20_000
ALERTS = 40


def main(database_url: str | None = None) -> dict[str, float | str]:
    """Drain a DAY backlog while REALTIME alerts arrive; returns what happened."""
    if database_url is not None:
        app.use_database(database_url)
    app.with_settings(poll_interval=0.05)
    alert_ages.clear()
    exported.clear()
    with app.engine.begin() as conn:
        Base.metadata.drop_all(conn)
        schema.metadata.create_all(conn)
        Base.metadata.create_all(conn)
    with Session(app.engine) as session:
        add_events(session, AnalyticsEvent, [{"page": f"/p/{n % 50}"} for n in range(BACKLOG)])
        session.commit()

    worker = Worker(app, concurrency=2, distribute_every=0.05)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    status = ""
    for n in range(ALERTS):
        with Session(app.engine) as session:
            session.add(FraudAlertEvent(payment_id=n))
            session.commit()
        time.sleep(0.05)
        if n == ALERTS // 2:
            status = _status()
    deadline = time.monotonic() + 120
    while (len(alert_ages) < ALERTS or sum(exported) < BACKLOG) and time.monotonic() < deadline:
        time.sleep(0.05)
    worker.stop()
    thread.join(30)
    return {
        "alerts": len(alert_ages),
        "alert_p50_seconds": round(statistics.median(alert_ages), 3) if alert_ages else -1.0,
        "alert_max_seconds": round(max(alert_ages), 3) if alert_ages else -1.0,
        "analytics_exported": sum(exported),
        "status_mid_run": status,
    }


def _status() -> str:
    url = app.url.render_as_string(hide_password=False)
    result = CliRunner().invoke(
        outbox_cli,
        ["--app", "examples.timeliness.app:app", "--database-url", url, "status"],
    )
    return result.output


if __name__ == "__main__":
    figures = main()
    print(figures.pop("status_mid_run"))
    for key, value in figures.items():
        print(f"{key:22} {value}")
