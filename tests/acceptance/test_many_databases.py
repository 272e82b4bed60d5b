"""One application, several databases (``Outbox(databases=...)``), through the real command:
``outbox migrate`` migrates each, ``outbox work`` runs a worker process for each and drains
every one of them, each event delivered once and from its own database; ``outbox status``
shows each apart; ``--database NAME`` works on one; and a command that needs one database is
refused, in one line, when none is named."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, insert, select, text

from tests._ports import free_ports
from tests._support import scratch_databases, wait_for
from tests.acceptance import many_app
from tests.acceptance._cli import Cli

APP = ("--app", "tests.acceptance.many_app:app")
COUNTS = {"alpha": 120, "beta": 7, "gamma": 45, "delta": 33}


@pytest.fixture
def databases(postgres_url: str, mariadb_url: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """Two PostgreSQL databases, a MariaDB and a SQLite one, each new and empty."""
    tag = uuid.uuid4().hex[:8]
    with scratch_databases() as create:
        yield {
            "alpha": create(postgres_url, f"many_{tag}_a"),
            "beta": create(postgres_url, f"many_{tag}_b"),
            "gamma": create(mariadb_url, f"many_{tag}_c"),
            "delta": f"sqlite:///{tmp_path / 'delta.sqlite3'}",
        }


def _write(databases: dict[str, str], counts: dict[str, int]) -> dict[str, set[int]]:
    """Each database's buffer made and ``counts[name]`` events written to it; their ids."""
    written: dict[str, set[int]] = {}
    table = many_app.TenantEvent.__table__
    for name, url in databases.items():
        engine = create_engine(url)
        many_app.Base.metadata.create_all(engine)
        with engine.begin() as conn:
            conn.execute(insert(table), [{"tenant": name}] * counts[name])
            written[name] = set(conn.execute(select(table.c.id)).scalars())
        engine.dispose()
    return written


def test_one_application_migrates_drains_and_shows_each_of_its_databases(
    cli: Cli, databases: dict[str, str], tmp_path: Path
) -> None:
    output = tmp_path / "delivered.log"
    env = {many_app.DATABASES_ENV: json.dumps(databases), many_app.OUTPUT_ENV: str(output)}

    migrated = cli.run(*APP, "migrate", env=env)
    assert 0 == migrated.code, migrated.stderr
    assert sorted(COUNTS) == sorted(
        line.split(":")[0].removeprefix("database ") for line in migrated.stdout.splitlines()
    )
    written = _write(databases, COUNTS)

    worked = cli.run(*APP, "work", "--burst", "--concurrency", "2", env=env, timeout=120)
    assert 0 == worked.code, worked.stderr

    lines = [line.split() for line in output.read_text().splitlines()]
    delivered = {name: {int(i) for t, i, _ in lines if t == name} for name in COUNTS}
    assert written == delivered
    assert 1 == max(Counter((t, i) for t, i, _ in lines).values())
    # One worker process a database: each process delivered one database's events.
    assert len(COUNTS) == len({pid for _, _, pid in lines})
    assert all(len({t for t, _, p in lines if p == pid}) == 1 for _, _, pid in lines)

    shown = cli.run(*APP, "status", "--json", env=env)
    assert 0 == shown.code, shown.stderr
    documents = json.loads(shown.stdout)["databases"]
    assert sorted(COUNTS) == sorted(documents)
    assert all(d["handlers"][0]["unclaimed"] == 0 for d in documents.values())
    one = cli.run(*APP, "--database", "beta", "status", env=env)
    assert 0 == one.code, one.stderr
    assert "deliver" in one.stdout


def test_a_command_that_needs_one_database_is_told_which_in_one_line(
    cli: Cli, databases: dict[str, str], tmp_path: Path
) -> None:
    env = {many_app.DATABASES_ENV: json.dumps(databases), many_app.OUTPUT_ENV: str(tmp_path)}
    unnamed = cli.run(*APP, "groups", env=env)
    unknown = cli.run(*APP, "--database", "epsilon", "status", env=env)
    url = cli.run(*APP, "--database-url", "sqlite:///x.db", "status", env=env)
    assert [2, 2, 2] == [unnamed.code, unknown.code, url.code], (unnamed, unknown, url)
    assert (
        "Error: this application serves several databases (alpha, beta, gamma, delta): name "
        "one, with app.on(name) or the command line's --database NAME"
    ) == unnamed.stderr.strip()
    assert (
        "Error: unknown database 'epsilon'; its databases: alpha, beta, gamma, delta"
        == unknown.stderr.strip()
    )
    assert "name one with --database" in url.stderr


def test_databases_added_to_the_registry_get_a_worker_and_removed_ones_lose_theirs(
    cli: Cli, databases: dict[str, str], tmp_path: Path
) -> None:
    """``outbox work`` reads a registry that is a function again while it runs
    (``--registry-every``): a database added to it is served without a restart, and the
    worker of one taken out of it stops."""
    listed = tmp_path / "registry.json"
    output = tmp_path / "delivered.log"
    env = {many_app.DATABASES_ENV: f"@{listed}", many_app.OUTPUT_ENV: str(output)}
    chosen = {name: databases[name] for name in ("alpha", "delta")}
    listed.write_text(json.dumps(chosen))
    assert 0 == cli.run(*APP, "migrate", env=env).code
    _write(chosen, dict.fromkeys(chosen, 30))
    listed.write_text(json.dumps({"alpha": chosen["alpha"]}))

    def delivered(name: str) -> int:
        lines = output.read_text().splitlines() if output.exists() else []
        return sum(1 for line in lines if line.split()[0] == name)

    def workers_on(name: str) -> int:
        engine = create_engine(chosen[name])
        with engine.connect() as conn:
            found = conn.execute(text("SELECT count(*) FROM outbox_workers")).scalar_one()
        engine.dispose()
        return int(found)

    running = cli.start(*APP, "work", "--registry-every", "0.5", "--poll-interval", "0.2", env=env)
    wait_for(lambda: delivered("alpha") == 30, "alpha to be drained", 30)
    assert 0 == delivered("delta")
    listed.write_text(json.dumps(chosen))
    wait_for(lambda: delivered("delta") == 30, "delta, added, to be drained", 30)
    listed.write_text(json.dumps({"delta": chosen["delta"]}))
    wait_for(lambda: workers_on("alpha") == 0, "alpha's worker, taken out, to stop", 30)
    running.send(signal.SIGTERM)
    assert 0 == running.wait(30), running.stderr()


def _scrape(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return None


def _handled(text: str | None, name: str) -> float | None:
    """``outbox_events_total`` of ``deliver`` succeeded on database ``name`` in a scrape."""
    for family in text_string_to_metric_families(text or ""):
        for sample in family.samples:
            if (sample.name, sample.labels.get("database"), sample.labels.get("outcome")) == (
                "outbox_events_total",
                name,
                "succeeded",
            ):
                return float(sample.value)
    return None


def test_one_port_serves_every_database_while_the_registry_changes(
    cli: Cli, databases: dict[str, str], tmp_path: Path
) -> None:
    """``outbox work --metrics-port P`` of an application of several databases: one port for
    all, every worker process's counters labelled with its database, summed across processes
    (two per database here), and a database the registry adds is counted on the same port."""
    listed = tmp_path / "registry.json"
    env = {many_app.DATABASES_ENV: f"@{listed}", many_app.OUTPUT_ENV: str(tmp_path / "out")}
    chosen = {name: databases[name] for name in ("alpha", "beta", "delta")}
    listed.write_text(json.dumps(chosen))
    assert 0 == cli.run(*APP, "migrate", env=env).code
    _write(chosen, COUNTS)
    listed.write_text(json.dumps({name: chosen[name] for name in ("alpha", "delta")}))
    port = free_ports()
    running = cli.start(
        *APP, "work", "--processes", "2", "--metrics-port", str(port), "--registry-every", "0.5",
        "--poll-interval", "0.2", env=env,
    )  # fmt: skip
    try:
        wait_for(
            lambda: [_handled(_scrape(port), n) for n in ("alpha", "delta")] == [120.0, 33.0],
            "alpha's and delta's events counted on the one port",
            60,
        )
        listed.write_text(json.dumps(chosen))
        text = wait_for(
            lambda: _handled(t := _scrape(port), "beta") == 7.0 and t,
            "beta, added to the registry, counted on the same port",
            60,
        )
    finally:
        running.send(signal.SIGTERM)
        code = running.wait(30)
    assert 0 == code, running.stderr()
    assert [120.0, 7.0, 33.0] == [_handled(text, n) for n in ("alpha", "beta", "delta")]
    unclaimed = 'outbox_unclaimed_events{band="HOUR",database="beta",handler="deliver"} 0.0'
    assert unclaimed in str(text)


def test_metrics_of_several_databases_need_to_choose_prometheus_mode_first(
    cli: Cli, databases: dict[str, str], tmp_path: Path
) -> None:
    """An application that imported prometheus_client itself is told, in one line, how to
    serve its databases' metrics from one port; nothing is started."""
    (tmp_path / "early_metrics_app.py").write_text(
        "import prometheus_client  # noqa: F401\nfrom tests.acceptance.many_app import app\n"
    )
    env = {
        many_app.DATABASES_ENV: json.dumps({"delta": databases["delta"]}),
        many_app.OUTPUT_ENV: str(tmp_path / "out"),
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    refused = cli.run(
        "--app", "early_metrics_app:app", "work", "--burst", "--metrics-port", "1", env=env
    )
    assert (2, [
        "Error: --metrics-port: the application imported prometheus_client before outbox could "
        "choose where its worker processes count: set PROMETHEUS_MULTIPROC_DIR to an empty "
        "directory"
    ]) == (refused.code, refused.stderr.strip().splitlines())  # fmt: skip


def test_status_shows_the_fleet_as_a_whole_and_a_database_that_is_down_apart(
    cli: Cli, databases: dict[str, str], tmp_path: Path
) -> None:
    """``outbox status`` of several databases ends with a line per database and the fleet's
    totals; a database that cannot be reached is said in one line, its row says ``error``,
    the others are shown, and the exit code is the unreachable one's."""
    chosen = {name: databases[name] for name in ("alpha", "delta")}
    env = {many_app.DATABASES_ENV: json.dumps(chosen), many_app.OUTPUT_ENV: str(tmp_path)}
    assert 0 == cli.run(*APP, "migrate", env=env).code
    _write(chosen, COUNTS)
    down = {**chosen, "omega": "postgresql+psycopg://postgres@127.0.0.1:1/gone"}
    env[many_app.DATABASES_ENV] = json.dumps(down)

    shown = cli.run(*APP, "status", env=env)
    as_json = cli.run(*APP, "status", "--json", env=env)

    totals = shown.stdout.split("\n\n")[-1].splitlines()
    assert [3, 3] == [shown.code, as_json.code], shown.stderr
    assert [
        ["database", "unclaimed"],
        ["alpha", "120"],
        ["delta", "33"],
        ["omega", "error"],
        ["(all)", "153"],
    ] == [line.split()[:2] for line in totals if not line.startswith("-")]
    assert "Error: database 'omega': " in shown.stderr
    document = json.loads(as_json.stdout)
    assert ["alpha", "delta", "omega"] == list(document["databases"])
    assert "error" in document["databases"]["omega"]
    assert (153, 0) == (document["total"]["unclaimed"], document["total"]["workers_alive"])


def test_the_counters_directory_is_removed_when_outbox_made_it_and_kept_when_the_user_did(
    cli: Cli, databases: dict[str, str], tmp_path: Path
) -> None:
    """``--metrics-port`` of several databases: the directory outbox made for its workers'
    counters is gone after a run, and after one that fails at start; a directory given in
    ``PROMETHEUS_MULTIPROC_DIR`` is the user's, kept with what it held."""
    listed = {"delta": databases["delta"]}
    env = {
        many_app.DATABASES_ENV: json.dumps(listed),
        many_app.OUTPUT_ENV: str(tmp_path / "out"),
        "TMPDIR": str(tmp_path),
    }
    assert 0 == cli.run(*APP, "migrate", env=env).code
    _write(listed, COUNTS)
    work = ("work", "--burst", "--metrics-port", str(free_ports()))
    ran = cli.run(*APP, *work, env=env)
    unreachable = {"omega": "postgresql+psycopg://postgres@127.0.0.1:1/gone"}
    failed = cli.run(*APP, *work, env={**env, many_app.DATABASES_ENV: json.dumps(unreachable)})
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("kept")
    _write(listed, COUNTS)
    kept = cli.run(*APP, *work, env={**env, "PROMETHEUS_MULTIPROC_DIR": str(mine)})
    assert [0, 3, 0] == [ran.code, failed.code, kept.code], (ran, failed, kept)
    assert [] == sorted(p.name for p in tmp_path.glob("outbox-metrics-*"))
    assert "kept" == (mine / "notes.txt").read_text()
    assert [] != list(mine.glob("counter_*.db"))


def test_status_of_several_says_a_database_whose_statements_fail_and_shows_the_others(
    cli: Cli, databases: dict[str, str], tmp_path: Path
) -> None:
    """A database whose outbox tables are not what outbox wrote (a column dropped by hand:
    PostgreSQL's "undefined column", no outage) is said in one line like an unreachable one,
    not a traceback that hides the rest."""
    chosen = {name: databases[name] for name in ("alpha", "beta", "delta")}
    env = {many_app.DATABASES_ENV: json.dumps(chosen), many_app.OUTPUT_ENV: str(tmp_path)}
    assert 0 == cli.run(*APP, "migrate", env=env).code
    _write(chosen, COUNTS)
    engine = create_engine(chosen["beta"])
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE outbox_jobs DROP COLUMN lease_owner"))
    engine.dispose()

    shown = cli.run(*APP, "status", env=env)

    rows = dict(line.split()[:2] for line in shown.stdout.split("\n\n")[-1].splitlines())
    assert (1, "error", "153") == (shown.code, rows["beta"], rows["(all)"]), shown
    assert ["Error: database 'beta': database error: "] == [
        line[:40] for line in shown.stderr.splitlines()
    ]
