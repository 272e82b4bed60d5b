"""Bad input: each mistake gets a clear message and its own exit code (2 usage, 3 unreachable)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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


MISSING_DRIVER_URL = "postgresql+psycopg2://postgres:s3cret-canary@127.0.0.1/nodb"
BAD_PORT_URL = "postgresql+psycopg://postgres:s3cret-canary@127.0.0.1:notaport/nodb"


@pytest.mark.parametrize(
    ("database_url", "says"),
    [
        ("notaurl", "cannot parse 'notaurl'"),
        ("foo://bar", "no dialect 'foo'"),
        ("postgresql+nodriver://u@h/x", "no dialect 'postgresql+nodriver'"),
        (BAD_PORT_URL, "port is not a number"),
    ],
)
def test_malformed_database_url_is_a_usage_error_naming_the_option(
    cli: Cli, database_url: str, says: str
) -> None:
    """A URL that cannot be parsed or has no dialect exits 2 with one line naming the option."""
    result = cli.run("--app", APP, "--database-url", database_url, "status")

    assert (2, 1, True, True) == (
        result.code,
        len(result.stderr.splitlines()),
        result.stderr.startswith("Error: --database-url: "),
        says in result.stderr,
    )


def test_database_url_whose_driver_is_not_installed_is_a_usage_error_naming_it(
    cli: Cli,
) -> None:
    """A URL whose driver is missing exits 2 naming the driver, with the password hidden."""
    if importlib.util.find_spec("psycopg2") is not None:
        pytest.skip("psycopg2 is installed here")
    result = cli.run("--app", APP, "--database-url", MISSING_DRIVER_URL, "status")

    assert (2, True, False) == (
        result.code,
        "--database-url: the driver psycopg2 is not installed" in result.stderr,
        "s3cret-canary" in result.output,
    )


def test_malformed_database_url_never_shows_the_password(cli: Cli) -> None:
    """The message about a URL that cannot be parsed hides its password."""
    result = cli.run("--app", APP, "--database-url", BAD_PORT_URL, "status")

    assert (2, False, True) == (
        result.code,
        "s3cret-canary" in result.output,
        "postgres:***@127.0.0.1" in result.stderr,
    )


@pytest.mark.parametrize(
    "command",
    [
        ["migrate"],
        ["schema", "sql"],
        ["distribute"],
        ["work", "--burst"],
        ["status"],
        ["check"],
        ["replay"],
        ["prune", "--older-than", "1d"],
        ["reindex"],
        ["notify", "sql"],
        ["notify", "install"],
        ["notify", "remove"],
    ],
    ids=" ".join,
)
def test_every_command_reports_a_malformed_database_url_as_a_usage_error(
    cli: Cli, command: list[str]
) -> None:
    """Each command exits 2 on a URL it cannot parse, without a traceback."""
    result = cli.run("--app", APP, "--database-url", "notaurl", *command)

    assert (2, True, False) == (
        result.code,
        "--database-url: cannot parse 'notaurl'" in result.stderr,
        "Traceback" in result.stderr,
    )


def test_malformed_database_url_from_the_environment_names_the_variable(cli: Cli) -> None:
    """A bad ``OUTBOX_DATABASE_URL`` is reported under that name, not as ``--database-url``."""
    result = cli.run("migrate", env={"OUTBOX_DATABASE_URL": "notaurl"})

    assert (2, True) == (
        result.code,
        "Error: OUTBOX_DATABASE_URL: cannot parse 'notaurl'" in result.stderr,
    )


def test_malformed_url_of_the_application_names_the_application(cli: Cli, tmp_path: Path) -> None:
    """A bad URL given to ``Outbox(...)`` exits 2 naming the application, password hidden."""
    (tmp_path / "bad_url_app.py").write_text(
        f"from outbox import Outbox\napp = Outbox({BAD_PORT_URL!r})\n", encoding="utf-8"
    )
    result = cli.run("--app", "bad_url_app:app", "status", cwd=tmp_path)

    assert (2, True, False) == (
        result.code,
        "the database URL of --app bad_url_app:app: cannot parse it: its port is not a number"
        in result.stderr,
        "s3cret-canary" in result.output,
    )


@pytest.mark.parametrize(
    "command", [["migrate"], ["status"], ["prune", "--older-than", "1d"]], ids=" ".join
)
def test_file_that_is_not_a_database_exits_3_saying_so(
    cli: Cli, tmp_path: Path, command: list[str]
) -> None:
    """A SQLite URL naming a text file exits 3 (database unusable) with one clear line."""
    text_file = tmp_path / "notes.txt"
    text_file.write_text("not a database\n", encoding="utf-8")
    result = cli.run("--app", APP, "--database-url", f"sqlite:///{text_file}", *command)

    assert (3, ["file is not a database"]) == (
        result.code,
        [line.rpartition(": ")[2] for line in result.stderr.splitlines()],
    )


def test_demo_on_an_unreachable_database_exits_3_without_the_password(cli: Cli) -> None:
    """``outbox demo --database-url`` on a server that is down exits 3; no password is shown."""
    result = cli.run("demo", "--database-url", UNREACHABLE_URL)

    assert (3, False, True) == (
        result.code,
        "s3cret-canary" in result.output,
        "postgres:***@127.0.0.1:1/nodb" in result.stdout,
    )


def test_app_module_that_exits_when_imported_is_a_usage_error_saying_so(
    cli: Cli, tmp_path: Path
) -> None:
    """A module calling ``sys.exit(5)`` at import exits 2 and says so, not silently 5."""
    (tmp_path / "exiting.py").write_text("import sys\nsys.exit(5)\n", encoding="utf-8")
    result = cli.run("--app", "exiting:app", "status", cwd=tmp_path)

    assert (2, True) == (
        result.code,
        "--app exiting:app: importing 'exiting' exited (SystemExit 5)" in result.stderr,
    )


def test_app_attribute_that_is_not_an_outbox_says_what_it_is(cli: Cli, tmp_path: Path) -> None:
    """``--app myapp:Base`` (a class) exits 2 saying an Outbox instance was expected."""
    (tmp_path / "myapp.py").write_text(
        "from sqlalchemy.orm import DeclarativeBase\n\n\nclass Base(DeclarativeBase):\n    pass\n",
        encoding="utf-8",
    )
    result = cli.run("--app", "myapp:Base", "status", cwd=tmp_path)

    assert (2, True) == (
        result.code,
        "expected an outbox.Outbox instance (app = Outbox(...)), found the class myapp.Base"
        in result.stderr,
    )


def test_app_from_the_environment_is_named_outbox_app_in_errors(cli: Cli) -> None:
    """A bad ``OUTBOX_APP`` is reported under that name, not as ``--app``."""
    result = cli.run("status", env={"OUTBOX_APP": "nosuch:app"})

    assert (2, True) == (
        result.code,
        "Error: OUTBOX_APP nosuch:app: cannot import" in result.stderr,
    )
