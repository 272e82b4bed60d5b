"""outbox as a library: its events go to the standard library's logging, unless the process
configured structlog (the ``outbox`` command does; an application may), whose configuration
then decides. outbox never configures either."""

from __future__ import annotations

import ast
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

import outbox
from outbox._core import log as _log
from outbox.cli._logging import configure_logging

LEVELS = {"debug", "info", "warning", "error", "exception"}


@pytest.fixture
def structlog_unconfigured() -> Iterator[None]:
    """structlog as a process that never configured it has it."""
    saved, was_configured = structlog.get_config(), structlog.is_configured()
    structlog.reset_defaults()
    yield
    if was_configured:
        structlog.configure(**saved)
    else:
        structlog.reset_defaults()


def _emit() -> None:
    log = _log.get_logger("outbox.worker")
    log.debug(_log.GROUP_CLAIMED, handler="welcome", size=2)
    log.info(_log.WORKER_STARTED, worker="w1", burst=True)
    log.warning(_log.OLDER_WORKERS, worker="w1", detail="2 workers of 0.9 ignore rate limits")


def test_events_reach_logging_at_their_level_under_the_module_name(
    structlog_unconfigured: None,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """INFO and WARNING records of the logger `outbox.worker`, the event and its fields in
    the message (key=value) and on the record; DEBUG filtered by the logger's level; the
    record names the line that logged; nothing printed."""
    caplog.set_level(logging.INFO, logger="outbox")
    _emit()

    records = [r for r in caplog.records if r.name.startswith("outbox")]
    assert [
        (
            "outbox.worker",
            logging.INFO,
            "outbox.worker.started worker=w1 burst=true",
            "outbox.worker.started",
            "w1",
        ),
        (
            "outbox.worker",
            logging.WARNING,
            'outbox.worker.older_workers worker=w1 detail="2 workers of 0.9 ignore rate limits"',
            "outbox.worker.older_workers",
            "w1",
        ),
    ] == [
        (r.name, r.levelno, r.getMessage(), r.__dict__["event"], r.__dict__["worker"])
        for r in records
    ]
    assert ({"test_library_logging"}, {"_emit"}) == (
        {r.module for r in records},
        {r.funcName for r in records},
    )
    assert ("", "") == capsys.readouterr()


def test_debug_is_there_when_the_application_turns_it_on(
    structlog_unconfigured: None, caplog: pytest.LogCaptureFixture
) -> None:
    """`logging.getLogger("outbox").setLevel(logging.DEBUG)` and outbox's debug is logged."""
    caplog.set_level(logging.DEBUG, logger="outbox")
    _emit()

    assert (logging.DEBUG, "outbox.group.claimed handler=welcome size=2") == (
        caplog.records[0].levelno,
        caplog.records[0].getMessage(),
    )


def test_exception_carries_the_traceback(
    structlog_unconfigured: None, caplog: pytest.LogCaptureFixture
) -> None:
    """`log.exception` is an ERROR record with the exception, for the host's formatter."""
    caplog.set_level(logging.INFO, logger="outbox")
    try:
        raise ValueError("boom")
    except ValueError:
        _log.get_logger("outbox.worker").exception(_log.WORKER_LOOP_ERROR, error="boom")

    [record] = caplog.records
    assert (logging.ERROR, ValueError) == (
        record.levelno,
        record.exc_info[0] if record.exc_info else None,
    )


def test_json_lines_through_structlogs_formatter(structlog_unconfigured: None) -> None:
    """docs/logging.md's JSON recipe: structlog's ProcessorFormatter on the application's
    handler turns an outbox record into the JSON line the `outbox` command writes."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                structlog.stdlib.ExtraAdder(),
            ],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.JSONRenderer(),
            ],
        )
    )
    logger = logging.getLogger("outbox")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        _emit()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)

    assert [
        {
            "event": "outbox.worker.started",
            "level": "info",
            "logger": "outbox.worker",
            "worker": "w1",
            "burst": True,
        },
        {
            "event": "outbox.worker.older_workers",
            "level": "warning",
            "logger": "outbox.worker",
            "worker": "w1",
            "detail": "2 workers of 0.9 ignore rate limits",
        },
    ] == [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_process_that_configured_structlog_keeps_its_configuration(
    structlog_unconfigured: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Configured structlog (here: capturing) receives the events, with their levels and
    fields; the standard library sees none of them."""
    caplog.set_level(logging.DEBUG, logger="outbox")
    with capture_logs() as logs:
        _emit()

    assert [
        ("debug", _log.GROUP_CLAIMED),
        ("info", _log.WORKER_STARTED),
        ("warning", _log.OLDER_WORKERS),
    ] == [(e["log_level"], e["event"]) for e in logs]
    assert [] == [r for r in caplog.records if r.name.startswith("outbox")]


def test_a_process_that_configures_structlog_after_the_command_gets_every_event(
    structlog_unconfigured: None,
) -> None:
    """The command's level (here: warning) skips building events below it, for as long as its
    configuration is the process's: structlog configured again afterwards (an application's,
    a test's) receives the debug and info events as well."""
    configure_logging("warning", "json")
    structlog.reset_defaults()
    structlog.configure(processors=[])
    with capture_logs() as logs:
        _emit()
    assert ["debug", "info", "warning"] == [e["log_level"] for e in logs]


def test_no_event_field_is_named_like_a_log_records_attribute() -> None:
    """An application that routes structlog into `logging` with `render_to_log_kwargs` passes
    an event's fields as `extra`, and `logging` raises on one named like a record's own
    attribute (`message`, `name`, `args`...): the call that logged it would fail."""
    reserved = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
    clashes = []
    for path in sorted(Path(outbox.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "log"
                and node.func.attr in LEVELS
            ):
                clashes += [
                    f"{path.name}:{node.lineno} {k.arg}" for k in node.keywords if k.arg in reserved
                ]
    assert [] == clashes


def test_structlog_routed_into_logging_by_the_application(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """structlog's own set-up for `logging` (its LoggerFactory, `filter_by_level`,
    `render_to_log_kwargs`): outbox's events are records of `outbox.<module>` at their levels,
    filtered by the logger's level."""
    saved = structlog.get_config()
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, structlog.stdlib.render_to_log_kwargs],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    caplog.set_level(logging.INFO, logger="outbox")
    try:
        log = _log.get_logger("outbox.worker")
        log.debug(_log.GROUP_CLAIMED, handler="welcome", size=2)
        log.info(_log.WORKER_STARTED, worker="w1")
        log.warning(_log.OLDER_WORKERS, worker="w1", detail="2 workers of 0.9")
    finally:
        structlog.configure(**saved)

    assert [
        ("outbox.worker", logging.INFO, "outbox.worker.started"),
        ("outbox.worker", logging.WARNING, "outbox.worker.older_workers"),
    ] == [(r.name, r.levelno, r.getMessage()) for r in caplog.records]


def test_every_released_event_name_is_still_emitted() -> None:
    """Event names are stable (dashboards and alerts match on them): every name of a released
    catalogue (``released_log_events.txt``) is still one; moving a module renames none."""
    released = (Path(__file__).parent / "released_log_events.txt").read_text().split()
    names = {
        value for name, value in vars(_log).items() if name.isupper() and isinstance(value, str)
    }
    assert [] == sorted(set(released) - names)
