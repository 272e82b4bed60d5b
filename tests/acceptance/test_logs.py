"""What the worker writes: JSON lines when stderr is not a terminal; no payloads, no passwords."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from tests.acceptance._cli import APP, Cli, Result
from tests.models import ActivityEvent, EmailEvent

pytestmark = pytest.mark.postgres

PAYLOAD_CANARY = "payload-canary-5d1e"
PASSWORD_CANARY = "password-canary-9b4c"


def _burst_with_password(
    cli: Cli, url: str, engine: Engine, commit_events: Any, *options: str
) -> Result:
    """Commit events carrying the payload canary, then drain them on a URL with a password."""
    commit_events(engine, 12, ActivityEvent, kind=PAYLOAD_CANARY)
    commit_events(engine, 3, EmailEvent, address=f"{PAYLOAD_CANARY}@example.com")
    # The test server trusts local connections, so any password is accepted (and must not leak).
    with_password = make_url(url).set(password=PASSWORD_CANARY)
    return cli.run(
        *options,
        "--app", APP,
        "--database-url", with_password.render_as_string(hide_password=False),
        "work", "--burst", "--poll-interval", "0.2",
    )  # fmt: skip


def test_worker_stderr_is_json_lines_when_not_a_terminal(
    cli: Cli, postgres_database: str, connect: Callable[[str], Engine], commit_events: Any
) -> None:
    """With stderr redirected, every line the worker writes there is a JSON object."""
    result = _burst_with_password(cli, postgres_database, connect(postgres_database), commit_events)

    not_json = []
    for line in result.stderr.splitlines():
        try:
            json.loads(line)
        except ValueError:
            not_json.append(line)
    assert (0, []) == (result.code, not_json)


def test_worker_logs_one_batch_handled_event_per_batch(
    cli: Cli, postgres_database: str, connect: Callable[[str], Engine], commit_events: Any
) -> None:
    """The JSON log has one ``outbox.batch.handled`` line per group: 2 activity, 1 email."""
    result = _burst_with_password(cli, postgres_database, connect(postgres_database), commit_events)

    # Only the JSON lines: the plain-text summary after them is a known defect (test above).
    records = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    handled = sorted(
        (r["handler"], r["size"]) for r in records if r["event"] == "outbox.batch.handled"
    )
    assert [("record_activity", 2), ("record_activity", 10), ("record_email", 3)] == handled


def test_worker_output_has_no_payload_and_no_password(
    cli: Cli, postgres_database: str, connect: Callable[[str], Engine], commit_events: Any
) -> None:
    """Even at debug level, neither an event's column values nor the password are printed."""
    result = _burst_with_password(
        cli, postgres_database, connect(postgres_database), commit_events, "--log-level", "debug"
    )

    assert (0, False, False) == (
        result.code,
        PAYLOAD_CANARY in result.output,
        PASSWORD_CANARY in result.output,
    )
