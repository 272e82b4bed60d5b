"""What a sink's start check says, without a server: the one line that refuses a worker
(``lifecycle.refusals``), and the stop that follows it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from outbox import Batch, ConfigurationError, Outbox, lifecycle
from tests.conftest import reset_schema
from tests.models import SinkEvent


class _Checked:
    """A handler object whose start check raises ``refusal`` (None: passes)."""

    def __init__(self, refusal: Exception | None) -> None:
        self.refusal = refusal
        self.stops = 0

    def __call__(self, batch: Batch[Any]) -> None:
        pass

    def outbox_start(self, app: Outbox, handler: Any) -> None:
        if self.refusal is not None:
            raise self.refusal

    def outbox_stop(self) -> None:
        self.stops += 1


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        (None, None),
        (ConfigurationError("window too short"), "handler 'h': window too short"),
        (ConfigurationError("handler 'h': named\nalready"), "handler 'h': named already"),
        (RuntimeError("boom"), "handler 'h': RuntimeError: boom"),
    ],
)
def test_the_start_check_says_in_one_line_why_a_worker_would_refuse_and_closes(
    sqlite_url: str,
    make_app: Callable[..., Outbox],
    raised: Exception | None,
    said: str | None,
) -> None:
    """``lifecycle.refusals`` runs each object's start check: None when it passes, else one
    line naming the handler; the object is stopped after, either way."""
    reset_schema(sqlite_url)
    app = make_app(sqlite_url)
    checked = _Checked(raised)
    app.handler(SinkEvent, name="h")(checked)

    found = lifecycle.refusals(app, app.select_handlers(()))

    assert ({"h": said}, 1) == (found, checked.stops)
