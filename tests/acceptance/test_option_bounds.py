"""Options out of range: refused before anything runs, exit 2, the message naming the option."""

from __future__ import annotations

import pytest

from tests.acceptance._cli import APP, Cli


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--distribute-every", "0"),
        ("--distribute-every", "-1"),
        ("--distribute-every", "nan"),
        ("--distribute-every", "inf"),
        ("--poll-interval", "inf"),
        ("--poll-interval", "0"),
        ("--lease", "inf"),
        ("--lease", "1e-9"),
        ("--shutdown-grace-period", "-1"),
        ("--shutdown-grace-period", "nan"),
    ],
)
def test_seconds_option_out_of_range_is_a_usage_error_naming_it_and_the_range(
    cli: Cli, option: str, value: str
) -> None:
    """NaN, infinity and values outside an option's range exit 2 naming option and range."""
    result = cli.run("--app", APP, "work", "--burst", option, value)

    assert (2, True, True) == (
        result.code,
        f"Invalid value for '{option}'" in result.stderr,
        "86400 seconds" in result.stderr,
    )


def test_lease_longer_than_a_day_is_refused_before_reaching_the_database(cli: Cli) -> None:
    """``--lease 1e10`` exits 2 naming ``--lease``, with no database to reach at all."""
    result = cli.run("--app", APP, "work", "--burst", "--lease", "1e10")

    assert (2, True) == (result.code, "Invalid value for '--lease'" in result.stderr)


@pytest.mark.parametrize(
    ("option", "value", "name"),
    [
        ("-c", "100000", "'--concurrency' / '-c'"),
        ("-c", "0", "'--concurrency' / '-c'"),
        ("-p", "1000", "'--processes' / '-p'"),
        ("-p", "0", "'--processes' / '-p'"),
    ],
)
def test_concurrency_and_processes_beyond_their_bounds_are_usage_errors(
    cli: Cli, option: str, value: str, name: str
) -> None:
    """``-c`` above 1,000 and ``-p`` above 256 (or below 1) exit 2 naming the option."""
    result = cli.run("--app", APP, "work", "--burst", option, value)

    assert (2, True) == (result.code, f"Invalid value for {name}" in result.stderr)


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_unknown_handler_with_several_processes_is_reported_once(
    cli: Cli, database_url: str
) -> None:
    """``work -p 2 --handler nosuch`` exits 2 with one error line: it is checked before forking."""
    result = cli.run(
        "--app", APP, "--database-url", database_url, "work", "-p", "2", "--burst",
        "--handler", "nosuch",
    )  # fmt: skip

    assert (2, 1) == (result.code, result.stderr.count("unknown handler 'nosuch'"))


def test_prune_chunk_too_large_is_a_usage_error_naming_it(cli: Cli, sqlite_url: str) -> None:
    """``prune --chunk 99999999999999999999`` exits 2 naming ``--chunk``."""
    result = cli.run(
        "--database-url", sqlite_url, "prune", "--older-than", "1d",
        "--chunk", "99999999999999999999",
    )  # fmt: skip

    assert (2, True) == (result.code, "Invalid value for '--chunk'" in result.stderr)


@pytest.mark.parametrize("value", ["-1", "soon", "99999999d"])
def test_prune_bad_duration_is_a_usage_error_naming_older_than(
    cli: Cli, sqlite_url: str, value: str
) -> None:
    """A negative, unreadable or absurdly long ``--older-than`` exits 2 naming the option."""
    result = cli.run("--database-url", sqlite_url, "prune", "--older-than", value)

    assert (2, True) == (result.code, "Invalid value for '--older-than'" in result.stderr)
