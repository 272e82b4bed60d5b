"""Fan-outs in the console: a fan-out's handler page links to its consumers' pages, a
consumer's page to the fan-out's, and ``GET /api/v1/fanouts`` answers what
``outbox.ops.fanout`` reads, to whoever may read."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from decimal import Decimal

import httpx
import pytest

from outbox import Outbox, add_events
from outbox.ops import fanout, flow
from outbox.testing import drain
from outbox.web import create_app
from tests.models import ShipmentAnalytics, ShipmentEvent, ShipmentPartner, ShipmentSearch
from tests.web._site import AUTH, VIEWER, VIEWER_TOKEN

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
]
FANOUT = "test_shipment_events.fanout"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def outbox_app(database_url: str, make_app: Callable[[str], Outbox]) -> Outbox:
    """Shipments fanned out to search (handler ``index``, paused: 3 copies wait in its buffer)
    and to analytics (no handler here), archived; 2 more events wait in the source; a handler
    of its own on the partner buffer."""
    app = make_app(database_url)
    app.fanout(ShipmentEvent, to=[ShipmentSearch, ShipmentAnalytics], archive=True)
    app.handler(ShipmentSearch, name="index")(lambda batch: None)
    app.handler(ShipmentPartner, name="partner")(lambda batch: None)
    flow.pause(app, "index", actor="test")
    rows = [{"shipment_id": n, "amount": Decimal("1.50"), "data": None} for n in range(3)]
    with app.engine.begin() as conn:
        add_events(conn, ShipmentEvent, rows)
    drain(app)
    with app.engine.begin() as conn:
        add_events(conn, ShipmentEvent, rows[:2])
    return app


@pytest.fixture
async def client(outbox_app: Outbox) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(outbox_app, auth=AUTH))
    async with httpx.AsyncClient(transport=transport, base_url="http://console") as c:
        yield c


def _field(page: str, name: str) -> str:
    """The text of the page's ``data-field`` ``name``, its markup kept; empty when absent."""
    found = re.search(rf'<dd data-field="{name}">(.*?)</dd>', page, re.DOTALL)
    return found.group(1) if found else ""


async def test_a_fanouts_page_links_to_each_consumers_handler_and_says_it_archives(
    client: httpx.AsyncClient,
) -> None:
    """ "copies into": the search consumer's handler page, the analytics buffer with no
    handler here; archived for a consumer added later."""
    response = await client.get(f"/handlers/{FANOUT}", headers=VIEWER)
    copies = _field(response.text, "copies_into")
    assert (
        200,
        ['href="/handlers/index"'],
        True,
        True,
        "",
    ) == (
        response.status_code,
        re.findall(r'href="[^"]*"', copies),
        "<code>test_shipment_analytics</code> (no handler here)" in copies,
        "archived, for a consumer added later to start from" in copies,
        _field(response.text, "copy_of"),
    )


async def test_a_consumers_page_links_to_its_fanout_and_another_handler_to_neither(
    client: httpx.AsyncClient,
) -> None:
    """ "copy of" on the consumer's handler page, linking the fan-out's; nothing of either on
    a handler of a buffer the application writes."""
    consumer = (await client.get("/handlers/index", headers=VIEWER)).text
    other = (await client.get("/handlers/partner", headers=VIEWER)).text
    assert (f'<a href="/handlers/{FANOUT}">{FANOUT}</a>', "", "", "") == (
        _field(consumer, "copy_of"),
        _field(consumer, "copies_into"),
        _field(other, "copy_of"),
        _field(other, "copies_into"),
    )


async def test_the_api_answers_the_fanouts_as_the_operations_layer_reads_them(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """``GET /api/v1/fanouts``: each fan-out with every field of ``FanoutStatus``, and each
    consumer with every field of ``ConsumerStatus``, the counts those ``fanouts`` reads."""
    response = await client.get(
        "/api/v1/fanouts", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"}
    )
    [expected] = fanout.fanouts(outbox_app)
    [answered] = response.json()
    assert (
        200,
        set(fanout.FanoutStatus.__dataclass_fields__),
        [set(fanout.ConsumerStatus.__dataclass_fields__)] * 2,
        (FANOUT, "test_shipment_events", True, 2, fanout.COUNT_CAP),
        [("test_shipment_search", "index", 3), ("test_shipment_analytics", None, 3)],
    ) == (
        response.status_code,
        set(answered),
        [set(c) for c in answered["consumers"]],
        tuple(answered[k] for k in ("name", "source", "archives", "events", "capped_at")),
        [(c["table"], c["handler"], c["events"]) for c in answered["consumers"]],
    )
    assert expected.events == answered["events"]


async def test_the_api_asks_who_reads_the_fanouts(client: httpx.AsyncClient) -> None:
    """No credentials, no answer."""
    assert 401 == (await client.get("/api/v1/fanouts")).status_code
