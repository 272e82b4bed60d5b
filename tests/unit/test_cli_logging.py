"""The `outbox` command writes each log line whole: processes sharing stderr keep them apart."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
import structlog

from outbox._core import log as _log
from outbox.cli import configure_logging


class RecordingStream(io.StringIO):
    """A stream that remembers each write it was given."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return super().write(text)


@pytest.fixture
def restored_logging() -> Iterator[None]:
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)


def test_each_log_line_is_written_whole_in_one_write(
    restored_logging: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workers of `outbox work --processes N` share stderr: a line written in two parts
    (the text, then its newline) could end up with another process's line inside it."""
    # Set here, not in a fixture: pytest's capture swaps sys.stderr again when the test starts.
    stderr = RecordingStream()
    monkeypatch.setattr("sys.stderr", stderr)
    configure_logging("info", "json")
    log = _log.get_logger("test")
    log.info(_log.WORKER_STARTED, worker="w1")
    log.info(_log.WORKER_STOPPED, worker="w1")

    events = [json.loads(write)["event"] for write in stderr.writes]
    assert ([_log.WORKER_STARTED, _log.WORKER_STOPPED], True) == (
        events,
        all(write.endswith("\n") and write.count("\n") == 1 for write in stderr.writes),
    )
