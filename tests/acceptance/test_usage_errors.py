"""Bad input: each mistake gets a clear message and its own exit code (2 usage, 3 unreachable)."""

from __future__ import annotations

import pytest

from tests.acceptance._cli import APP, Cli

UNREACHABLE_URL = "postgresql+psycopg://postgres:s3cret-canary@127.0.0.1:1/nodb"


def test_app_module_that_does_not_exist_is_a_usage_error_naming_it(cli: Cli) -> None:
    """``--app nosuch:app`` exits 2 and the message names the module."""
    result = cli.run("--app", "nosuch:app", "status")

    assert (2, True) == (result.code, "'nosuch'" in result.stderr)


def test_app_attribute_that_does_not_exist_is_a_usage_error_naming_it(cli: Cli) -> None:
    """``--app tests.acceptance.cli_app:nope`` exits 2 and the message names the attribute."""
    result = cli.run("--app", "tests.acceptance.cli_app:nope", "status")

    assert (2, True) == (result.code, "'nope'" in result.stderr)


def test_status_without_an_app_is_a_usage_error_mentioning_outbox_app(cli: Cli) -> None:
    """``outbox status`` with neither --app nor OUTBOX_APP exits 2 and mentions OUTBOX_APP."""
    result = cli.run("status")

    assert (2, True) == (result.code, "OUTBOX_APP" in result.stderr)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("command", ["distribute", "work", "status"])
def test_unknown_handler_is_a_usage_error_listing_the_known_ones(
    cli: Cli, database_url: str, command: str
) -> None:
    """``--handler nope`` exits 2 with a message listing the application's handlers."""
    result = cli.run("--app", APP, "--database-url", database_url, command, "--handler", "nope")

    assert (2, True) == (
        result.code,
        "'nope'" in result.stderr and "record_activity, record_email" in result.stderr,
    )


def test_unreachable_database_exits_3_naming_host_and_database(cli: Cli) -> None:
    """An unreachable database exits 3; the message names its host and database."""
    result = cli.run("--app", APP, "--database-url", UNREACHABLE_URL, "status")

    assert (3, True, True) == (result.code, "127.0.0.1" in result.stderr, "'nodb'" in result.stderr)


def test_unreachable_database_message_never_shows_the_password(cli: Cli) -> None:
    """Whatever the command prints about an unreachable database, the password is not in it."""
    result = cli.run("--app", APP, "--database-url", UNREACHABLE_URL, "work", "--burst")

    assert (3, False) == (result.code, "s3cret-canary" in result.output)


def test_tables_not_migrated_exits_1_telling_to_run_outbox_migrate(
    cli: Cli, sqlite_url: str
) -> None:
    """Without outbox's tables, a command exits 1 and says to run ``outbox migrate``."""
    result = cli.run("--app", APP, "--database-url", sqlite_url, "status")

    assert (1, True) == (result.code, "outbox migrate" in result.stderr)
