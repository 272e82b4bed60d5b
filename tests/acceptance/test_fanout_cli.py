"""``outbox fanout list``, ``outbox fanout backfill`` and the fan-outs in ``outbox status``:
what the operator runs to see a fan-out's buffers and to start a consumer added later from the
events the archive keeps."""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal

import pytest
from sqlalchemy import Engine, select

from outbox import Outbox, add_events
from outbox.testing import drain
from tests.acceptance._cli import Cli
from tests.acceptance.fanout_app import shipments
from tests.models import ShipmentEvent, ShipmentPartner, ShipmentSearch

APP = "tests.acceptance.fanout_app:app"
FANOUT = "test_shipment_events.fanout"
PARTNER = "test_shipment_partner"
pytestmark = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)


def _write(engine: Engine, count: int) -> None:
    rows = [{"shipment_id": n, "amount": Decimal("2.50"), "data": {"n": n}} for n in range(count)]
    with engine.begin() as conn:
        add_events(conn, ShipmentEvent, rows)


def _fanned_out_before_the_partner(make_app: Callable[[str], Outbox], url: str, count: int) -> None:
    """``count`` events fanned out and archived by the application before the partner was
    added."""
    before = shipments(make_app(url), ShipmentSearch)
    _write(before.engine, count)
    drain(before)


def _partner_ids(engine: Engine) -> list[int]:
    with engine.connect() as conn:
        return list(conn.execute(select(ShipmentPartner.id).order_by(ShipmentPartner.id)).scalars())


def test_fanout_list_shows_the_source_and_each_consumer(
    cli: Cli, database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """Two events waiting in the source: the JSON has the fan-out with its consumers and their
    handlers, the table a row per buffer and a line saying it archives."""
    _write(make_app(database_url).engine, 2)
    given = ("--app", APP, "--database-url", database_url, "fanout", "list")

    listed = cli.run(*given, "--json")
    table = cli.run(*given)

    [found] = json.loads(listed.stdout)
    rows = [line.split()[:5] for line in table.stdout.splitlines()]
    assert (
        0,
        (FANOUT, "test_shipment_events", True, 2),
        [("test_shipment_search", "search", 0), (PARTNER, "partner", 0)],
        0,
        [
            ["fan-out", "role", "buffer", "handler", "events"],
            [FANOUT, "source", "test_shipment_events", "-", "2"],
            [FANOUT, "consumer", "test_shipment_search", "search", "0"],
            [FANOUT, "consumer", PARTNER, "partner", "0"],
            [f"{FANOUT}:", "archives", "its", "events:", "a"],
            ["1", "fan-out"],
        ],
    ) == (
        listed.code,
        tuple(found[k] for k in ("name", "source", "archives", "events")),
        [(c["table"], c["handler"], c["events"]) for c in found["consumers"]],
        table.code,
        rows,
    )


def test_backfill_copies_what_the_archive_keeps_once_the_consumer_is_paused(
    cli: Cli, database_url: str, connect: Callable[[str], Engine], make_app: Callable[[str], Outbox]
) -> None:
    """Refused while the partner runs; paused, without --yes it says what it would copy and
    copies nothing; with --yes it copies the 6 kept events under their ids and says to resume
    the partner; a dry run then finds them all held."""
    _fanned_out_before_the_partner(make_app, database_url, 6)
    engine = connect(database_url)
    given = ("--app", APP, "--database-url", database_url)

    running = cli.run(*given, "fanout", "backfill", "partner")
    paused = cli.run(*given, "pause", "partner")
    asked = cli.run(*given, "fanout", "backfill", "partner")
    nothing = _partner_ids(engine)
    done = cli.run(*given, "fanout", "backfill", "partner", "--yes")
    again = cli.run(*given, "fanout", "backfill", PARTNER, "--dry-run")

    refused = "Error: handler 'partner' of test_shipment_partner is not paused: pause it"
    assert (1, True, 0, 2, []) == (
        running.code,
        running.stderr.strip().startswith(refused),
        paused.code,
        asked.code,
        nothing,
    )
    assert asked.stderr.strip().startswith(
        f"Error: a backfill would copy into {PARTNER} the 6 events the archive of {FANOUT} keeps,"
    )
    lines = done.stdout.splitlines()
    assert (0, 2, "resume partner to hand them over: outbox resume partner") == (
        done.code,
        len(lines),
        lines[-1],
    )
    assert lines[0].startswith(
        f"copied 6 events into {PARTNER} from the archive of {FANOUT}; 0 held already (operation "
    )
    assert (
        0,
        f"would copy 0 events into {PARTNER} from the archive of {FANOUT}; 6 held already",
        6,
    ) == (again.code, again.stdout.strip(), len(_partner_ids(engine)))


def test_backfill_of_an_unknown_consumer_names_the_consumers(cli: Cli, database_url: str) -> None:
    """Exit 2, one line listing the consumers by handler and table."""
    result = cli.run("--app", APP, "--database-url", database_url, "fanout", "backfill", "nope")
    assert (
        2,
        "Error: no consumer 'nope' of a fan-out; the consumers, by handler or table: search "
        "(test_shipment_search), partner (test_shipment_partner)",
    ) == (result.code, result.stderr.strip())


def test_status_says_where_each_fanout_copies_to(
    cli: Cli, database_url: str, make_app: Callable[[str], Outbox]
) -> None:
    """A line per fan-out naming its consumers and that it archives; the JSON has a
    ``fanouts`` list as ``fanout list --json``."""
    _write(make_app(database_url).engine, 3)
    given = ("--app", APP, "--database-url", database_url, "status")

    text = cli.run(*given)
    document = cli.run(*given, "--json")

    [line] = [line for line in text.stdout.splitlines() if line.startswith("fanout ")]
    [found] = json.loads(document.stdout)["fanouts"]
    assert (
        0,
        f"fanout {FANOUT}: test_shipment_events into test_shipment_search (search), "
        f"{PARTNER} (partner); archives its events: a consumer added later starts from those "
        "kept",
        0,
        (FANOUT, 3),
    ) == (text.code, line, document.code, (found["name"], found["events"]))
