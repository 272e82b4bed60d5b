"""The application the browser tests watch through the dashboard.

``outbox --app tests.web.console_app:app work`` handles its events in a worker process (the
database URL from the command line), while the test serves the dashboard of :func:`build` on
the same database. Its handlers:

- ``deliver`` (``ActivityEvent``, one attempt): fails a batch that holds an event of kind
  ``poison``, or of kind ``flaky`` while the file ``flaky`` exists in ``OUTBOX_TEST_OUTPUT_DIR``;
  otherwise records each event as a line ``<activity_id> <kind>`` in ``handled.log`` there.
- ``mail`` (``EmailEvent``): records nothing and succeeds.
- ``accounts`` (``SinkEvent``, ordered by ``account``, one attempt): fails a batch that holds
  an event whose note is ``poison``; otherwise succeeds.
"""

from __future__ import annotations

import os
from pathlib import Path

from outbox import Batch, Outbox, RetryPolicy, Settings
from tests.models import ActivityEvent, EmailEvent, SinkEvent

OUTPUT_DIR_ENV = "OUTBOX_TEST_OUTPUT_DIR"
HANDLED_LOG = "handled.log"
FLAKY_FLAG = "flaky"
SETTINGS = Settings(rescue_interval=0.5)


def build(url: str | None = None) -> Outbox:
    """The application, on ``url`` (None: the command line's)."""
    app = Outbox(url, settings=SETTINGS)

    @app.handler(ActivityEvent, batch_size=10, retry=RetryPolicy(max_attempts=1))
    def deliver(batch: Batch[ActivityEvent]) -> None:
        """Fail poison (and flaky, while flagged) batches; record the others' events."""
        directory = Path(os.environ.get(OUTPUT_DIR_ENV, "."))
        kinds = {event.kind for event in batch.events}
        if "poison" in kinds or ("flaky" in kinds and (directory / FLAKY_FLAG).exists()):
            raise RuntimeError(f"the downstream refused {', '.join(sorted(kinds))}")
        with (directory / HANDLED_LOG).open("a", encoding="utf-8") as log:
            log.writelines(f"{event.activity_id} {event.kind}\n" for event in batch.events)

    @app.handler(EmailEvent, batch_size=10)
    def mail(batch: Batch[EmailEvent]) -> None:
        """Succeed."""

    @app.handler(
        SinkEvent, batch_size=10, ordering_key="account", retry=RetryPolicy(max_attempts=1)
    )
    def accounts(batch: Batch[SinkEvent]) -> None:
        """Fail poison batches; succeed otherwise."""
        if any(event.note == "poison" for event in batch.events):
            raise RuntimeError("the downstream refused a poison note")

    return app


def handled(output_dir: Path) -> list[tuple[int, str]]:
    """The ``(activity_id, kind)`` of every event ``deliver`` handled, in order."""
    path = output_dir / HANDLED_LOG
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    return [(int(number), kind) for number, kind in (line.split() for line in lines)]


app = build()
