"""The flag handlers' Prometheus gauge: the rows flagged on each business table, waiting to be
taken into the handler's buffer or taken, read at each scrape as ``outbox.ops.flags`` reads
them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.orm import Session

from outbox import Outbox, distribute_once
from outbox.prometheus import OutboxCollector, register
from tests.integration.test_flag_ops import Contractor
from tests.models import ActivityEvent, Employee, EmployeeChanges, EmployeeWork


def _employees(app: Outbox) -> None:
    """A flag handler ``payroll`` in groups of one: a distribution takes 50 rows."""
    app.flagged(Employee, flag="needs_work_done", version="version", buffer=EmployeeWork,
                name="payroll", batch_size=1)(lambda batch: None)  # fmt: skip


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_flagged_rows_are_a_series_per_handler_and_state(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """60 rows flagged, 50 taken by a distribution: 10 waiting and 50 taken; a flag handler
    whose business table was not created (its buffer was) has no series, and the scrape does
    not fail."""
    app = make_app(database_url)
    _employees(app)
    app.flagged(Contractor, flag="needs_work_done", version="version", buffer=EmployeeChanges,
                name="contractors")(lambda batch: None)  # fmt: skip
    with Session(app.engine) as session, session.begin():
        session.add_all(Employee(id=n, name=f"e{n}", needs_work_done=True) for n in range(1, 61))
    distribute_once(app, handlers=["payroll"])
    registry = CollectorRegistry()
    register(app, registry)

    def sample(handler: str, state: str) -> float | None:
        return registry.get_sample_value(
            "outbox_flagged_rows", {"handler": handler, "state": state}
        )

    assert ((10.0, 50.0), (None, None), 0.0) == (
        (sample("payroll", "waiting"), sample("payroll", "taken")),
        (sample("contractors", "waiting"), sample("contractors", "taken")),
        registry.get_sample_value("outbox_scrape_error"),
    )


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_collector_of_named_handlers_has_only_their_flagged_rows(
    database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """A collector of another handler has no flagged rows series; of the flag handler, its
    rows, all waiting before any distribution."""
    app = make_app(database_url)
    _employees(app)
    app.handler(ActivityEvent, name="activity")(lambda batch: None)
    with Session(app.engine) as session, session.begin():
        session.add_all(Employee(id=n, name=f"e{n}", needs_work_done=True) for n in range(1, 4))
    others, mine = CollectorRegistry(), CollectorRegistry()
    others.register(OutboxCollector(app, ["activity"]))
    mine.register(OutboxCollector(app, ["payroll"]))
    labels = {"handler": "payroll", "state": "waiting"}
    assert (None, 3.0) == (
        others.get_sample_value("outbox_flagged_rows", labels),
        mine.get_sample_value("outbox_flagged_rows", labels),
    )
