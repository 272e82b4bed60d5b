"""Screenshots of the dashboard's pages for the docs: ``docs/images/console-<page>.png``.

    python docs/images/make_screenshots.py [DATABASE_URL]

Builds a small shop on a fresh SQLite file (or on the empty database given): e-mails sent and
waiting, payments of which one account's are declined (dead, its ordering key held), a search
index behind its promise, webhooks paused by an operator, a CRM that said to come back later;
an edit, a replay and a discard in the history; two workers. Then serves the console with
uvicorn on 127.0.0.1 and takes each page, 1280x800, with Debian's chromium
(``/usr/bin/chromium``) through Playwright, which downloads no browser.
"""

from __future__ import annotations

import datetime as dt
import math
import sys
import tempfile
import threading
from decimal import Decimal
from pathlib import Path
from typing import Any

import uvicorn
from playwright.sync_api import sync_playwright
from sqlalchemy import JSON, Numeric, String, update
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from outbox import (
    Batch,
    BufferMixin,
    CircuitBreaker,
    Outbox,
    RateLimit,
    RetryAfter,
    RetryPolicy,
    Urgency,
    add_events,
    schema,
)
from outbox._db import queries  # the past hour of throughput, as workers write it
from outbox._db.dialects import db_now_plus  # backdating events, as the tests do
from outbox.ops import edit, flow, group_operations, groups
from outbox.ops.selection import Selection
from outbox.testing import drain
from outbox.web import Auth, Role, create_app
from outbox.worker import Worker

HERE = Path(__file__).resolve().parent
CHROMIUM = "/usr/bin/chromium"
SIZE = {"width": 1280, "height": 800}
DECLINED = "acct-4242"


class Base(DeclarativeBase):
    pass


class OrderEmail(BufferMixin, Base):
    __tablename__ = "shop_order_emails"
    address: Mapped[str] = mapped_column(String(200))
    template: Mapped[str] = mapped_column(String(40))


class Payment(BufferMixin, Base):
    __tablename__ = "shop_payments"
    account: Mapped[str] = mapped_column(String(40))
    amount: Mapped[Decimal] = mapped_column(Numeric(12, 2))


class SearchDocument(BufferMixin, Base):
    __tablename__ = "shop_search_documents"
    document_id: Mapped[int]
    action: Mapped[str] = mapped_column(String(10))


class Webhook(BufferMixin, Base):
    __tablename__ = "shop_webhooks"
    url: Mapped[str] = mapped_column(String(200))
    body: Mapped[dict[str, Any]] = mapped_column(JSON)


class WarehouseNotice(BufferMixin, Base):
    __tablename__ = "shop_warehouse_notices"
    order_id: Mapped[int]
    sku: Mapped[str] = mapped_column(String(40))


class CrmContact(BufferMixin, Base):
    __tablename__ = "shop_crm_contacts"
    email: Mapped[str] = mapped_column(String(200))


def build(url: str) -> Outbox:
    """The shop's outbox and its handlers."""
    app = Outbox(url)

    @app.handler(OrderEmail, urgency=Urgency.MINUTES, batch_size=50)
    def send_email(batch: Batch[OrderEmail]) -> None:
        """Sent."""

    @app.handler(
        Payment,
        urgency=Urgency.REALTIME,
        batch_size=5,
        retry=RetryPolicy(max_attempts=1),
        ordering_key="account",
        rate_limit=RateLimit(calls_per_second=20),
    )
    def charge_payment(batch: Batch[Payment]) -> None:
        """Declined for one account."""
        if any(p.account == DECLINED for p in batch.events):
            raise RuntimeError(f"card declined by the bank for {DECLINED} (HTTP 402)")

    @app.handler(SearchDocument, urgency=Urgency.HOUR, batch_size=500)
    def index_search(batch: Batch[SearchDocument]) -> None:
        """Indexed."""

    @app.handler(Webhook, urgency=Urgency.MINUTES, circuit_breaker=CircuitBreaker(failures=5))
    def post_webhooks(batch: Batch[Webhook]) -> None:
        """Posted."""

    @app.handler(
        WarehouseNotice, urgency=Urgency.MINUTES, batch_size=2, retry=RetryPolicy(max_attempts=1)
    )
    def notify_warehouse(batch: Batch[WarehouseNotice]) -> None:
        """The warehouse no longer knows the legacy SKU."""
        for notice in batch.events:
            if notice.sku == "SKU-LEGACY":
                raise ValueError(f"warehouse API: unknown sku {notice.sku!r} (HTTP 422)")

    @app.handler(CrmContact, urgency=Urgency.DAY)
    def sync_crm(batch: Batch[CrmContact]) -> None:
        """The CRM's rate limit: come back later."""
        raise RetryAfter(900, "CRM API rate limit (HTTP 429)")

    return app


def _write(app: Outbox, model: type[Any], rows: list[dict[str, Any]], age: float = 0.0) -> None:
    with app.engine.begin() as conn:
        add_events(conn, model, rows)
        if age:
            table = model.__table__
            conn.execute(
                update(table).where(table.c.group_id.is_(None)).values(created_at=db_now_plus(-age))
            )


def scene(app: Outbox) -> dict[str, str]:
    """Events, dead letters, a pause, a deferral and operators' records; the paths to take."""
    engine = app.engine
    with engine.begin() as conn:
        Base.metadata.create_all(conn)
        schema.metadata.create_all(conn)
    emails = [{"address": f"c{n}@example.com", "template": "receipt"} for n in range(40)]
    _write(app, OrderEmail, emails)
    accounts = ["acct-1001", "acct-1002", DECLINED, "acct-1003", "acct-1004"]
    _write(
        app,
        Payment,
        [{"account": accounts[n % 5], "amount": Decimal(f"{10 + n}.50")} for n in range(30)],
    )
    _write(app, CrmContact, [{"email": f"lead{n}@example.com"} for n in range(6)])
    _write(
        app,
        WarehouseNotice,
        [{"order_id": 500 + n, "sku": "SKU-LEGACY" if n % 2 else f"SKU-{n:04}"} for n in range(12)],
    )
    drain(app, handlers=["send_email", "charge_payment", "notify_warehouse", "sync_crm"])
    emails = [{"address": f"d{n}@example.com", "template": "shipped"} for n in range(12)]
    _write(app, OrderEmail, emails, age=95)
    documents = [{"document_id": n, "action": "upsert"} for n in range(2400)]
    _write(app, SearchDocument, documents, age=2600)
    hooks = [{"url": "https://partner.example.com/hooks", "body": {"order": n}} for n in range(25)]
    _write(app, Webhook, hooks, age=420)
    flow.pause(app, "post_webhooks", reason="partner API maintenance until 14:00")
    warehouse = Selection(handlers=("notify_warehouse",), statuses=("dead",))
    dead = groups.find(app, warehouse).groups
    detail = groups.show(app, dead[0].group_id)
    legacy = [e for e in detail.events if e.values["sku"] == "SKU-LEGACY"]
    edit.edit(app, dead[0].group_id, legacy[0].id, {"sku": "SKU-0501"}, actor="ann")
    group_operations.discard(
        app, Selection(group_ids=(dead[1].group_id,)), actor="ann", reason="order cancelled"
    )
    group_operations.replay(app, Selection(group_ids=(dead[2].group_id,)), actor="ben")
    _past_hour(app)
    [held] = groups.find(app, Selection(statuses=("held",))).groups
    shown = held.group_id
    return {
        "overview": "/",
        "handler": "/handlers/charge_payment",
        "groups": "/groups?handler=notify_warehouse",
        "group": f"/groups/{shown}",
        "dead": "/dead",
        "history": "/history",
        "workers": "/workers",
    }


# Events a minute each handler delivered over the past hour, for the overview's charts: the
# shop's workers ran before this scene (a wave of e-mails after a campaign, payments by day).
PAST_HOUR = {"send_email": (40, 25), "charge_payment": (12, 4), "index_search": (300, 0)}


def _past_hour(app: Outbox) -> None:
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    rows = []
    for handler, (level, swing) in PAST_HOUR.items():
        for ago in range(1, 60):
            wave = math.sin(ago / 7) * swing
            rows.append(
                {
                    "handler": handler,
                    "minute": now - dt.timedelta(minutes=ago),
                    "succeeded": max(int(level + wave), 0),
                    "dead": 0,
                    "failed": 0,
                }
            )
    with app.engine.begin() as conn:
        queries.add_throughput(conn, app.dialect, rows)


def main(url: str | None) -> None:
    with tempfile.TemporaryDirectory() as directory:
        app = build(url or f"sqlite:///{directory}/shop.sqlite3")
        paths = scene(app)
        workers = [Worker(app, handlers=["send_email"]) for _ in range(2)]
        threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
        for thread in threads:
            thread.start()
        auth = Auth(users={"ann": ("ann-password", Role.OPERATOR)})
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(app, auth=auth, title="shop outbox"),
                host="127.0.0.1",
                port=0,
                log_level="warning",
            )
        )
        serving = threading.Thread(target=server.run, daemon=True)
        serving.start()
        for _ in range(200):
            if server.started:
                break
            threading.Event().wait(0.05)
        else:
            raise SystemExit("the console did not start listening within 10 s")
        port = server.servers[0].sockets[0].getsockname()[1]
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
                context = browser.new_context(
                    base_url=f"http://127.0.0.1:{port}",
                    viewport=SIZE,
                    http_credentials={"username": "ann", "password": "ann-password"},
                )
                page = context.new_page()
                for name, path in paths.items():
                    page.goto(path)
                    page.screenshot(path=str(HERE / f"console-{name}.png"))
                    print(f"docs/images/console-{name}.png: {path}")
                browser.close()
        finally:
            server.should_exit = True
            serving.join(timeout=10)
            for worker in workers:
                worker.stop()
            for thread in threads:
                thread.join(timeout=30)
            app.engine.dispose()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
