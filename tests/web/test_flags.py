"""Flag handlers in the console: a flag handler's page says which table and flag it works on, with
the rows flagged and those not taken into its buffer yet, and ``GET /api/v1/flags`` answers
what ``outbox.ops.flags`` reads, to whoever may read."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from sqlalchemy.orm import Session

from outbox import Outbox, distribute_once
from outbox.ops import flags
from outbox.web import create_app
from tests.integration.test_flag_ops import Contractor
from tests.models import ActivityEvent, Employee, EmployeeChanges, EmployeeWork
from tests.web._site import AUTH, VIEWER, VIEWER_TOKEN

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.parametrize("database_url", ["sqlite"], indirect=True),
]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def outbox_app(database_url: str, make_app: Callable[[str], Outbox]) -> Outbox:
    """Employees flagged for ``payroll`` (groups of one: a distribution takes 50): 55 flagged
    of 57, 50 of them taken into its buffer; a handler of its own on the activity buffer."""
    app = make_app(database_url)
    app.flagged(Employee, flag="needs_work_done", version="version", buffer=EmployeeWork,
                name="payroll", batch_size=1)(lambda batch: None)  # fmt: skip
    app.handler(ActivityEvent, name="activity")(lambda batch: None)
    with Session(app.engine) as session, session.begin():
        session.add_all(Employee(id=n, name=f"e{n}", needs_work_done=n <= 55) for n in range(1, 58))
    distribute_once(app)
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


def _value(page: str, name: str) -> str | None:
    """The ``data-value`` of the page's element ``data-field`` ``name``."""
    found = re.search(rf'data-field="{name}" data-value="([^"]*)"', page)
    return found.group(1) if found else None


async def test_a_flag_handlers_page_says_its_flag_and_the_rows_flagged_and_not_taken(
    client: httpx.AsyncClient,
) -> None:
    """ "flags on": the table and flag, the version column, 55 flagged and 5 not taken yet;
    nothing of it on a handler of a buffer the application writes."""
    page = (await client.get("/handlers/payroll", headers=VIEWER)).text
    other = (await client.get("/handlers/activity", headers=VIEWER)).text
    text = re.sub(r"<[^>]+>", "", _field(page, "flags"))
    assert (
        "test_employees.needs_work_done (version version): 55 flagged, 5 not taken into the "
        "buffer yet",
        ("55", "5"),
        "",
    ) == (
        text,
        (_value(page, "flagged"), _value(page, "not_taken")),
        _field(other, "flags"),
    )


async def test_a_page_says_why_a_flag_handlers_tables_could_not_be_read(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """A flag handler whose business table was not created (its buffer was): its page names
    the flag and the database's error, without counts."""
    app = make_app(database_url)
    app.flagged(Contractor, flag="needs_work_done", version="version", buffer=EmployeeChanges,
                name="contractors")(lambda batch: None)  # fmt: skip
    transport = httpx.ASGITransport(app=create_app(app, auth=AUTH))
    async with httpx.AsyncClient(transport=transport, base_url="http://console") as client:
        page = (await client.get("/handlers/contractors", headers=VIEWER)).text
    text = re.sub(r"<[^>]+>", "", _field(page, "flags"))
    assert (True, True, None) == (
        text.startswith(
            "test_contractors_not_created.needs_work_done (version version): its tables could "
            "not be read: "
        ),
        "test_contractors_not_created" in text.split("could not be read: ")[1],
        _value(page, "flagged"),
    )


async def test_the_api_answers_the_flag_handlers_as_the_operations_layer_reads_them(
    client: httpx.AsyncClient, outbox_app: Outbox
) -> None:
    """``GET /api/v1/flags``: each flag handler with every field of ``FlagStatus``, the counts
    ``flag_tables`` reads."""
    response = await client.get(
        "/api/v1/flags", headers={"Authorization": f"Bearer {VIEWER_TOKEN}"}
    )
    [expected] = flags.flag_tables(outbox_app)
    [answered] = response.json()
    assert (200, expected.as_dict(), (55, 5, 50, 50)) == (
        response.status_code,
        answered,
        tuple(answered[k] for k in ("flagged", "waiting", "taken", "keys")),
    )


async def test_the_api_asks_who_reads_the_flag_handlers(client: httpx.AsyncClient) -> None:
    """No credentials, no answer."""
    assert 401 == (await client.get("/api/v1/flags")).status_code
