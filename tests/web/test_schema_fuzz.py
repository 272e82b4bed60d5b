"""The API against its own OpenAPI document, fuzzed by schemathesis: no request the document
allows makes a server error, and every answer's status, content type and body are the
document's."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from outbox import Batch, Outbox, RetryPolicy
from outbox.web import Auth, Principal, Role, create_app
from tests.models import ActivityEvent, SinkEvent

TOKEN = "fuzzing-admin-token-0123456789"
EXAMPLES = int(os.environ.get("OUTBOX_FUZZ_EXAMPLES", "15"))
"""Requests generated per operation: 15 in the default run; ``OUTBOX_FUZZ_EXAMPLES`` for more."""


def _ok(batch: Batch[Any]) -> None:
    return None


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_api_keeps_to_its_document(
    database_url: str, make_app: Callable[[str], Outbox], commit_events: Any
) -> None:
    """For every operation of the document, requests it allows: no 5xx, and each answer's
    status code, content type and body are the document's."""
    app = make_app(database_url)
    app.handler(
        ActivityEvent, name="fails", ordering_key="kind", retry=RetryPolicy(max_attempts=1)
    )(_ok)
    # Both ordered, so that any key the document allows is one a handler can match.
    app.handler(SinkEvent, name="accounts", ordering_key="account")(_ok)
    commit_events(app.engine, 3)
    console = create_app(app, auth=Auth(tokens={TOKEN: Principal("fuzz", Role.ADMIN)}))
    schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", console)
    operations = [result.ok() for result in schema.get_all_operations()]

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
        def keeps_to_the_document(case: Any) -> None:
            case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"})

        keeps_to_the_document()
    # Every operation was fuzzed: the generic ones and each handler's two ingest paths.
    assert 23 - 2 + 2 * 2 == len(operations)
