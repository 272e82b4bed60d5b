"""Outbox: handler registration, lookup, settings and where the database URL comes from."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import String
from sqlalchemy.orm import Mapped, mapped_column

from outbox import Batch, ConfigurationError, Outbox, OutboxError, RetryPolicy, Settings, Urgency
from outbox.app import DATABASE_URL_ENV, DEFAULT_BATCH_SIZE
from outbox.handler import MAX_BATCH_SIZE, Handler
from tests.models import ActivityEvent, EmailEvent, Order


def noop(batch: Batch[ActivityEvent]) -> None:
    """A handler that accepts every event."""


@pytest.fixture
def app() -> Outbox:
    """An application that never connects: registration needs no database."""
    return Outbox("sqlite:///never-opened.sqlite3")


def test_handler_registers_under_the_function_name(app: Outbox) -> None:
    """@app.handler registers the function under its own name."""
    app.handler(ActivityEvent)(noop)
    assert ["noop"] == list(app.handlers)


def test_handler_defaults(app: Outbox) -> None:
    """A bare registration gets the documented defaults."""
    app.handler(ActivityEvent)(noop)
    handler = app.get_handler("noop")
    expected = (DEFAULT_BATCH_SIZE, Urgency.HOUR, RetryPolicy(), False)
    assert expected == (handler.batch_size, handler.urgency, handler.retry, handler.archive)


def test_handler_exposes_the_buffer_table(app: Outbox) -> None:
    """A handler drains the table of its model."""
    app.handler(ActivityEvent)(noop)
    assert "test_activity_events" == app.get_handler("noop").table.name


def test_handler_decorator_returns_the_function(app: Outbox) -> None:
    """Decorating leaves the function callable as before."""
    assert noop is app.handler(ActivityEvent)(noop)


def test_model_without_buffer_mixin_is_refused(app: Outbox) -> None:
    """A model that does not inherit BufferMixin cannot get a handler."""
    with pytest.raises(ConfigurationError, match=r"'Order' is not a buffer model.*BufferMixin"):
        app.handler(Order)(noop)  # type: ignore[type-var]


def test_plain_class_is_refused(app: Outbox) -> None:
    """Something that is not a class at all is refused with the same message."""
    with pytest.raises(ConfigurationError, match="not a buffer model"):
        app.handler("ActivityEvent")(noop)  # type: ignore[type-var]


def test_second_handler_for_one_buffer_is_refused(app: Outbox) -> None:
    """One buffer has exactly one handler."""
    app.handler(ActivityEvent, name="first")(noop)
    with pytest.raises(
        ConfigurationError, match=r"'test_activity_events' already has handler 'first'"
    ):
        app.handler(ActivityEvent, name="second")(noop)


def test_duplicate_handler_name_is_refused(app: Outbox) -> None:
    """Two handlers may not share a name, even on different buffers."""
    app.handler(ActivityEvent, name="sync")(noop)
    with pytest.raises(ConfigurationError, match="'sync' is already registered"):
        app.handler(EmailEvent, name="sync")(noop)


def test_refused_registration_leaves_registry_unchanged(app: Outbox) -> None:
    """A refused handler is not half-registered."""
    app.handler(ActivityEvent, name="sync")(noop)
    with pytest.raises(ConfigurationError):
        app.handler(ActivityEvent, name="other")(noop)
    assert ["sync"] == list(app.handlers)


@pytest.mark.parametrize("batch_size", [0, -1, MAX_BATCH_SIZE + 1])
def test_out_of_range_batch_size_is_refused(app: Outbox, batch_size: int) -> None:
    """batch_size must lie in 1..MAX_BATCH_SIZE; the error names the field."""
    with pytest.raises(ConfigurationError, match=rf"batch_size must be 1\.\.{MAX_BATCH_SIZE}"):
        app.handler(ActivityEvent, batch_size=batch_size)(noop)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("batch_size", True),
        ("batch_size", "10"),
        ("max_batches", 2.0),
        ("urgency", "hour"),
        ("delivery", "at_most_once"),
        ("retry", 3),
        ("archive", "yes"),
        ("bisect", "yes"),
        ("bisect", 1),
        ("concurrency", "2"),
        ("max_batch_bytes", 1.5),
        ("max_batch_bytes", True),
        ("timeout", "30"),
        ("expires_after", True),
        ("max_wait", "1m"),
        ("circuit_breaker", 5),
        ("rate_limit", 10),
        ("rate_limit", {"calls_per_second": 1}),
        ("group_by", ActivityEvent.activity_id),
        ("ordering_key", 1),
    ],
)
def test_a_wrong_kind_of_option_is_refused_at_registration(
    app: Outbox, option: str, value: object
) -> None:
    """A value of the wrong kind fails at registration, naming the option and what it must be,
    not later in every group the handler is given."""
    with pytest.raises(ConfigurationError, match=rf"handler 'noop': {option} must be \w+"):
        app.add_handler(Handler(**{**_noop_handler(), option: value}))


def _noop_handler() -> dict[str, Any]:
    """What a handler built by hand takes (``Outbox.add_handler``), with the defaults."""
    return {
        "name": "noop",
        "model": ActivityEvent,
        "func": noop,
        "batch_size": DEFAULT_BATCH_SIZE,
        "urgency": Urgency.HOUR,
        "retry": RetryPolicy(),
        "archive": False,
        "max_batches": 4,
    }


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("timeout", 0),
        ("timeout", float("inf")),
        ("timeout", 400 * 86_400),
        ("expires_after", -1),
        ("expires_after", float("nan")),
        ("max_wait", float("nan")),
        ("max_wait", -0.5),
    ],
)
def test_a_wait_out_of_bounds_is_refused_at_registration(
    app: Outbox, option: str, value: float
) -> None:
    """A handler's waits are seconds, above 0 (``max_wait``: 0 or more) and at most a year."""
    with pytest.raises(ConfigurationError, match=rf"{option} must be >=? 0 seconds"):
        app.handler(ActivityEvent, **{option: value})(noop)


def test_out_of_range_max_batches_is_refused(app: Outbox) -> None:
    """max_batches must be at least 1; the error names the field."""
    with pytest.raises(ConfigurationError, match="max_batches must be"):
        app.handler(ActivityEvent, max_batches=0)(noop)


@pytest.mark.parametrize("name", ["1starts-with-digit", "has space", "x" * 201])
def test_invalid_handler_name_is_refused(app: Outbox, name: str) -> None:
    """Handler names are identifiers the CLI and the tables can carry."""
    with pytest.raises(ConfigurationError, match=r"handler name .* is not valid"):
        app.handler(ActivityEvent, name=name)(noop)


def test_unknown_handler_error_lists_the_known_ones(app: Outbox) -> None:
    """Asking for a handler that does not exist names the ones that do."""
    app.handler(ActivityEvent, name="sync_marketing")(noop)
    app.handler(EmailEvent, name="send_email")(noop)
    with pytest.raises(
        ConfigurationError,
        match="unknown handler 'nope'; known handlers: send_email, sync_marketing",
    ):
        app.get_handler("nope")


def test_unknown_handler_error_says_when_none_are_registered(app: Outbox) -> None:
    """With no handlers at all, the error says so."""
    with pytest.raises(ConfigurationError, match="none registered"):
        app.get_handler("nope")


def test_select_handlers_keeps_registration_order(app: Outbox) -> None:
    """Without names, every handler is selected, in registration order."""
    app.handler(EmailEvent, name="b")(noop)
    app.handler(ActivityEvent, name="a")(noop)
    assert ["b", "a"] == [h.name for h in app.select_handlers()]


def test_select_handlers_refuses_unknown_names(app: Outbox) -> None:
    """Selecting by an unknown name fails like get_handler."""
    with pytest.raises(ConfigurationError, match="unknown handler 'nope'"):
        app.select_handlers(["nope"])


def test_handlers_mapping_is_a_copy(app: Outbox) -> None:
    """Changing the returned mapping does not register anything."""
    app.handlers["x"] = None  # type: ignore[index]
    assert {} == dict(app.handlers)


def test_missing_url_error_names_the_environment_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no URL, no engine and no OUTBOX_DATABASE_URL, the error says how to give one."""
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    with pytest.raises(ConfigurationError, match="OUTBOX_DATABASE_URL"):
        _ = Outbox().url


def test_url_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a URL argument, OUTBOX_DATABASE_URL is used."""
    monkeypatch.setenv(DATABASE_URL_ENV, "sqlite:///from-env.sqlite3")
    assert "from-env.sqlite3" == Outbox().url.database


def test_url_argument_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """An explicit URL takes precedence over OUTBOX_DATABASE_URL."""
    monkeypatch.setenv(DATABASE_URL_ENV, "sqlite:///from-env.sqlite3")
    assert "explicit.sqlite3" == Outbox("sqlite:///explicit.sqlite3").url.database


def test_url_and_engine_together_are_refused() -> None:
    """Outbox takes a URL or an engine, not both."""
    from sqlalchemy import create_engine

    engine = create_engine("sqlite://")
    with pytest.raises(ConfigurationError, match="not both"):
        Outbox("sqlite://", engine=engine)


def test_unsupported_engine_is_refused() -> None:
    """An engine of a dialect outbox does not run on is refused at construction."""
    from sqlalchemy import create_mock_engine

    from outbox import UnsupportedDatabaseError

    engine = create_mock_engine("mssql+pyodbc://", executor=lambda *a, **k: None)
    with pytest.raises(UnsupportedDatabaseError, match="'mssql'"):
        Outbox(engine=engine)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field", ["lease_seconds", "poll_interval", "rescue_interval", "worker_stale_after"]
)
def test_invalid_setting_error_names_the_field(field: str) -> None:
    """Settings are validated at construction; the error names the field."""
    with pytest.raises(ConfigurationError, match=rf"Settings\.{field} must be > 0"):
        Settings(**{field: 0.0})


@pytest.mark.parametrize("days", [0, 36501, 1.5, True, "7"])
def test_archive_retention_days_are_whole_days_from_1(days: object) -> None:
    """The archive's retention is whole days, 1 to 36,500; the error names the field."""
    with pytest.raises(ConfigurationError, match=r"Settings\.archive_retention_days"):
        Settings(archive_retention_days=days)  # type: ignore[arg-type]


@pytest.mark.parametrize("seconds", [0, 0.5, 3601, True, "30", float("nan")])
def test_network_timeout_is_seconds_from_1_to_an_hour(seconds: object) -> None:
    """The network timeout is 1 to 3,600 seconds, or None; the error names the field."""
    with pytest.raises(ConfigurationError, match=r"Settings\.network_timeout"):
        Settings(network_timeout=seconds)  # type: ignore[arg-type]
    assert None is Settings(network_timeout=None).network_timeout


def test_with_settings_validates_the_change(app: Outbox) -> None:
    """Replacing a setting goes through the same validation."""
    with pytest.raises(ConfigurationError, match=r"Settings\.lease_seconds"):
        app.with_settings(lease_seconds=-1.0)


def test_configuration_error_is_an_outbox_error_and_a_value_error() -> None:
    """ConfigurationError sits under the one root and is also a ValueError."""
    assert (True, True) == (
        issubclass(ConfigurationError, OutboxError),
        issubclass(ConfigurationError, ValueError),
    )


def test_model_without_table_is_refused(app: Outbox) -> None:
    """A BufferMixin subclass that is not mapped has no table to drain."""
    from outbox import BufferMixin

    class Unmapped(BufferMixin):
        address: Mapped[str] = mapped_column(String(10))

    with pytest.raises(ConfigurationError, match="Unmapped is not a mapped model"):
        app.handler(Unmapped)(noop)  # type: ignore[arg-type]


def test_a_handler_named_as_text_where_names_go_is_refused_naming_it(app: Outbox) -> None:
    """``handlers="mails"`` (to a worker, run-once, a distribution) is refused where it is
    passed, rather than taken letter by letter as handlers ``m``, ``a``..."""
    app.handler(EmailEvent, name="m")(lambda batch: None)
    with pytest.raises(ConfigurationError, match="expected a list of names, got the text 'm'"):
        app.select_handlers("m")  # type: ignore[arg-type]


# --- several databases ------------------------------------------------------------------------


def test_an_application_of_several_databases_is_each_of_them_on_demand(tmp_path: Path) -> None:
    """``Outbox(databases=...)``: ``on(name)`` is the application on that database, with the
    same handlers and settings; asked for its own engine, it names its databases."""
    listed = {"eu": f"sqlite:///{tmp_path / 'eu.db'}", "us": f"sqlite:///{tmp_path / 'us.db'}"}
    app = Outbox(databases=lambda: listed)

    @app.handler(ActivityEvent)
    def sync(batch: Batch[ActivityEvent]) -> None: ...

    eu = app.on("eu")
    assert ("eu", str(tmp_path / "eu.db")) == (eu.database_name, eu.url.database)
    assert ["sync"] == list(eu.handlers)
    assert eu is app.on("eu")
    app.with_settings(lease_seconds=7.0)
    assert 7.0 == eu.settings.lease_seconds
    with pytest.raises(ConfigurationError, match=r"serves several databases \(eu, us\)"):
        _ = app.engine
    with pytest.raises(ConfigurationError, match=r"unknown database 'asia'; its databases: eu, us"):
        app.on("asia")
    listed["eu"] = f"sqlite:///{tmp_path / 'moved.db'}"
    assert str(tmp_path / "moved.db") == app.on("eu").url.database


def test_a_database_taken_out_of_the_registry_has_its_connections_closed(tmp_path: Path) -> None:
    """A database the registry no longer lists loses its engine's pool at the next reading,
    rather than keep its connections open for the life of the process."""
    listed = {"eu": f"sqlite:///{tmp_path / 'eu.db'}", "us": f"sqlite:///{tmp_path / 'us.db'}"}
    app = Outbox(databases=lambda: listed)
    us = app.on("us")
    with us.engine.connect():
        pass
    pooled = us.engine.pool.checkedin()
    del listed["us"]
    app.databases()
    assert (1, 0) == (pooled, us.engine.pool.checkedin())
    listed["us"] = f"sqlite:///{tmp_path / 'us.db'}"
    assert us is not app.on("us")


@pytest.mark.parametrize(
    ("databases", "error"),
    [
        (["sqlite://"], "takes a mapping of names to database URLs"),
        ({"bad name": "sqlite://"}, "database name 'bad name'"),
        ({"eu": "not a url"}, "database 'eu': cannot parse its URL"),
        (lambda: ["sqlite://"], "function must return a mapping"),
        (lambda: 1 / 0, "function raised ZeroDivisionError: division by zero"),
    ],
)
def test_databases_that_cannot_be_used_are_refused_naming_them(
    databases: object, error: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(error)):
        Outbox(databases=databases).databases()  # type: ignore[arg-type]


def test_databases_go_alone() -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        Outbox("sqlite://", databases={"eu": "sqlite://"})
    with pytest.raises(ConfigurationError, match="one database, not several"):
        Outbox("sqlite://").on("eu")
