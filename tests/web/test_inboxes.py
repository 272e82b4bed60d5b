"""The inboxes in the console: the Inboxes page and ``GET /api/v1/inboxes`` show what
``outbox.ops.inboxes`` reads, each inbox declared or kept, to whoever may read."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from sqlalchemy import update

from outbox import Outbox, schema
from outbox._db.dialects import db_now_plus
from outbox.inbox import Inbox
from outbox.ops import inboxes
from outbox.web import create_app
from tests.web._site import AUTH, VIEWER, VIEWER_TOKEN, values

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
]
HOUR = 3600.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def outbox_app(database_url: str, make_app: Callable[[str], Outbox]) -> Outbox:
    """A declared inbox of 3 ids, one past its horizon; a declared one of none; 2 ids of an
    inbox the application does not declare."""
    app = make_app(database_url)
    orders = app.inbox("orders", horizon=HOUR)
    app.inbox("refunds")
    with app.engine.begin() as conn:
        orders.receive_many(conn, ["o-1", "o-2", "o-3"])
        Inbox("legacy", horizon=60).receive_many(conn, ["l-1", "l-2"])
        conn.execute(
            update(schema.inbox)
            .where(schema.inbox.c.message_id == "o-1")
            .values(expires_at=db_now_plus(-60))
        )
    return app


@pytest.fixture
async def client(outbox_app: Outbox) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(outbox_app, auth=AUTH))
    async with httpx.AsyncClient(transport=transport, base_url="http://console") as c:
        yield c


async def test_the_inboxes_page_shows_each_inbox_s_horizon_and_ids(
    client: httpx.AsyncClient,
) -> None:
    """Each inbox a row: its horizon (none for one not declared), the ids it keeps and those
    past their horizon; the navigation links to the page."""
    response = await client.get("/inboxes", headers=VIEWER)
    overview = (await client.get("/", headers=VIEWER)).text
    shown = {
        name: (row["horizon"], row["ids"], row["expired"])
        for name, row in values(response.text, "inbox").items()
    }
    rows = {
        "legacy": ("", "2", "0"),
        "orders": ("3600.0", "3", "1"),
        "refunds": ("604800.0", "0", "0"),
    }
    assert (200, rows, True, True) == (
        response.status_code,
        shown,
        "not declared" in response.text,
        'href="/inboxes"' in overview,
    )


async def test_the_api_answers_the_inboxes_as_the_operations_layer_reads_them(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """``GET /api/v1/inboxes``: a list of each inbox with every field of ``InboxStatus``, the
    counts and horizons those ``inboxes.inboxes`` reads."""
    response = await client.get(
        "/api/v1/inboxes", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"}
    )
    expected = inboxes.inboxes(outbox_app)

    def counted(item: dict[str, object]) -> tuple[object, ...]:
        return tuple(item[k] for k in ("name", "declared", "horizon", "ids", "expired"))

    answered = response.json()
    assert (
        200,
        [(i.name, i.declared, i.horizon, i.ids, i.expired) for i in expected],
        [set(inboxes.InboxStatus.__dataclass_fields__)] * 3,
    ) == (
        response.status_code,
        [counted(item) for item in answered],
        [set(item) for item in answered],
    )
