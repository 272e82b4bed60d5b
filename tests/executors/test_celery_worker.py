"""outbox on Celery, in real ``celery worker`` (prefork, two children) and ``celery beat``
processes on real brokers and databases: every event of a backlog delivered in full groups, a
message delivered twice run once, a paused handler left alone, a SIGTERM's leases given back
and taken again at once, each child a worker of ``outbox status``."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox import schema
from outbox.ops import flow
from tests._support import wait_for
from tests.conftest import FULL_RUN_ENV, reset_schema
from tests.executors import _processes, celery_app
from tests.executors._processes import BROKERS

BACKLOG = 1000
EVENTS = 10
# Long enough for a backlog to drain through worker and beat processes that start first.
DRAIN_SECONDS = 60.0
CLI_TIMEOUT_SECONDS = 60.0


# (database, broker): one pair by default (the proofs run RabbitMQ and MariaDB in every run);
# every pair in the full run.
BACKENDS = [("postgresql", "redis")]
FULL_RUN_BACKENDS = [
    ("mariadb", "rabbitmq"),
    ("postgresql", "rabbitmq"),
    ("mariadb", "redis"),
    ("sqlite", "redis"),
]


@pytest.fixture(
    params=BACKENDS + (FULL_RUN_BACKENDS if os.environ.get(FULL_RUN_ENV) == "1" else []),
    ids="-".join,
)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[_processes.Celery]:
    """A database (reset) and a broker, and the test's processes on them, not started yet."""
    database, broker = request.param
    if database == "sqlite":
        url = f"sqlite:///{tmp_path}/outbox.sqlite3"
    else:
        url = request.getfixturevalue(f"{database.replace('postgresql', 'postgres')}_url")
    reset_schema(url)
    running = _processes.new(tmp_path, url, BROKERS[broker])
    yield running
    running.stop()


def _skipped(processes: _processes.Celery, job_id: int) -> list[str]:
    """The worker's debug lines saying a message for ``job_id`` found nothing to do."""
    pattern = re.compile(rf"DEBUG/.*outbox\.executor\.skipped job_id={job_id}\b")
    return [line for line in processes.output().splitlines() if pattern.search(line)]


def test_a_backlog_is_delivered_in_full_groups(backend: _processes.Celery) -> None:
    """1,000 waiting events, a beat and a prefork worker of two children: each event delivered,
    in ten groups of 100, the groups ``outbox work`` makes."""
    url = backend.database_url
    _processes.prepare(url, BACKLOG)
    backend.worker()
    backend.beat()
    wait_for(lambda: _processes.waiting(url) == 0, "the backlog to drain", DRAIN_SECONDS)
    delivered = wait_for(
        lambda: len(found := _processes.archived(url)) == BACKLOG and found, "every event archived"
    )
    backend.stop()
    assert list(range(1, BACKLOG + 1)) == delivered
    assert [celery_app.BATCH_SIZE] * (BACKLOG // celery_app.BATCH_SIZE) == backend.call_sizes()


def test_a_handlers_fleet_wide_cap_holds_across_worker_processes(
    processes: _processes.Celery,
) -> None:
    """A handler capped at one group at a time, three groups waiting, two children: the groups
    run one after the other, never two at once, and all of them run."""
    _processes.prepare(processes.database_url, 0)
    _processes.prepare_capped(processes.database_url, 3 * celery_app.BATCH_SIZE)
    processes.worker()
    processes.beat()
    wait_for(lambda: _processes.waiting_capped(processes.database_url) == 0, "the groups to run")
    calls = [line.split() for line in processes.calls.read_text().splitlines()]
    assert [[str(celery_app.BATCH_SIZE), "capped", "ok"]] * 3 == calls


def test_a_message_delivered_twice_runs_its_job_once(processes: _processes.Celery) -> None:
    """The same job's message published twice: the job runs once, the other delivery finds it
    leased or gone and says so at debug."""
    _processes.prepare(processes.database_url, EVENTS)
    job_id = _processes.claim_job(processes.database_url)
    processes.worker()
    _processes.send(processes, job_id, times=2)
    wait_for(lambda: _skipped(processes, job_id), "the second delivery to be skipped")
    wait_for(lambda: _processes.waiting(processes.database_url) == 0, "the events to be delivered")
    assert [EVENTS] == processes.call_sizes()
    assert 1 == len(_skipped(processes, job_id))


def test_a_paused_handlers_job_is_not_run(processes: _processes.Celery) -> None:
    """A message for a paused handler's job: the handler is not called, the events wait."""
    _processes.prepare(processes.database_url, EVENTS)
    job_id = _processes.claim_job(processes.database_url)
    app = _processes.app(processes.database_url)
    flow.pause(app, "deliver", actor="test")
    app.engine.dispose()
    processes.worker()
    _processes.send(processes, job_id)
    wait_for(lambda: _skipped(processes, job_id), "the message to be skipped")
    assert [] == processes.call_sizes()
    assert EVENTS == _processes.waiting(processes.database_url)


def test_a_failed_group_is_retried_when_its_backoff_ends(processes: _processes.Celery) -> None:
    """A group whose first attempt fails is due again 6 s later: its message comes with that
    countdown, and the second attempt succeeds, long before a sweep (30 s) would find it."""
    _processes.prepare(processes.database_url, EVENTS)
    job_id = _processes.claim_job(processes.database_url)
    processes.worker(**{celery_app.FAIL_FIRST_ENV: "1"})
    _processes.send(processes, job_id)
    wait_for(lambda: _processes.waiting(processes.database_url) == 0, "the retry to succeed")
    assert [EVENTS, EVENTS] == processes.call_sizes()
    assert "attempt=2 outcome=succeeded" in processes.output()


def _leased_batch_job(url: str) -> dict[str, object] | None:
    batch = [j for j in _processes.jobs(url) if j["kind"] == schema.JobKind.BATCH]
    return batch[0] if batch and batch[0]["lease_owner"] else None


def test_a_sigterm_gives_back_the_leases_of_a_worker_process(
    processes: _processes.Celery,
) -> None:
    """A child stopped by SIGTERM mid-handler gives back its group's lease, and another child
    runs the group at once: long before a lease (or a silent heartbeat) of 120 s would free it."""
    _processes.prepare(processes.database_url, EVENTS)
    job_id = _processes.claim_job(processes.database_url)
    processes.worker(**{celery_app.SLOW_ENV: "300"})
    _processes.send(processes, job_id)
    leased = wait_for(lambda: _leased_batch_job(processes.database_url), "a group to be held")
    owner = str(leased["lease_owner"])
    pid = int(owner.split(":")[1])
    # Mid-handler: the lease is taken a moment before the handler is called.
    wait_for(lambda: [str(pid)] == _callers(processes, pid), "the handler to be called")
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: _processes.waiting(processes.database_url) == 0, "the group to be run again")
    calls = [line.split() for line in processes.calls.read_text().splitlines()]
    assert [str(EVENTS), str(EVENTS)] == [size for size, _, _ in calls]
    assert str(pid) == calls[0][2]
    assert str(pid) != calls[1][2]
    assert "outbox.jobs.given_back" in processes.output()


def test_a_killed_processs_group_is_taken_again_once_its_heartbeat_is_silent(
    processes: _processes.Celery,
) -> None:
    """``kill -9`` of the child mid-handler: its heartbeat stops, and after the stale age (3 s)
    another child's rescue frees its group and runs it, long before its lease (120 s) ends."""
    _processes.prepare(processes.database_url, EVENTS)
    job_id = _processes.claim_job(processes.database_url)
    processes.worker(**{celery_app.SLOW_ENV: "300", celery_app.STALE_ENV: "3"})
    processes.beat()
    _processes.send(processes, job_id)
    leased = wait_for(lambda: _leased_batch_job(processes.database_url), "a group to be held")
    pid = int(str(leased["lease_owner"]).split(":")[1])
    # Mid-handler: the lease is taken a moment before the handler is called.
    wait_for(lambda: [str(pid)] == _callers(processes, pid), "the handler to be called")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: _processes.waiting(processes.database_url) == 0, "the group to be run again")
    assert [str(pid)] == _callers(processes, pid)
    assert "holder_gone=1" in processes.output()


def _callers(processes: _processes.Celery, pid: int) -> list[str]:
    """The handler calls process ``pid`` made, as the calls file records them."""
    if not processes.calls.exists():
        return []
    calls = [line.split() for line in processes.calls.read_text().splitlines()]
    return [p for _, _, p in calls if p == str(pid)]


def test_a_cold_shutdown_gives_back_the_leases_of_its_processes(
    processes: _processes.Celery,
) -> None:
    """Celery's cold shutdown (SIGQUIT) after its soft shutdown's second: the worker's children,
    stopped mid-handler, give back their group, and a second worker runs it at once."""
    _processes.prepare(processes.database_url, EVENTS)
    job_id = _processes.claim_job(processes.database_url)
    first = processes.worker(
        name="w1", **{celery_app.SLOW_ENV: "300", celery_app.SOFT_SHUTDOWN_ENV: "1"}
    )
    _processes.send(processes, job_id)
    leased = wait_for(lambda: _leased_batch_job(processes.database_url), "a group to be held")
    pid = int(str(leased["lease_owner"]).split(":")[1])
    wait_for(lambda: [str(pid)] == _callers(processes, pid), "the handler to be called")
    processes.worker(name="w2")
    first.stop(signal.SIGQUIT)
    wait_for(lambda: _processes.waiting(processes.database_url) == 0, "the group to be run again")
    assert "outbox.jobs.given_back" in first.output()
    assert [str(EVENTS), str(EVENTS)] == [
        line.split()[0] for line in processes.calls.read_text().splitlines()
    ]


def _cli(processes: _processes.Celery, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    env.update(processes.env())
    done = subprocess.run(
        [sys.executable, "-m", "outbox", "--app", "tests.executors.celery_app:outbox", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_SECONDS,
        check=True,
    )
    return done.stdout


def test_each_worker_process_is_a_worker_of_outbox_status(processes: _processes.Celery) -> None:
    """A prefork worker of two children: two live workers in ``outbox workers list`` and
    ``outbox status``, named for the Celery node."""
    _processes.prepare(processes.database_url, 0)
    processes.worker(concurrency=2)

    def alive() -> list[dict[str, object]]:
        found = json.loads(_cli(processes, "workers", "list", "--json"))
        return [w for w in found if w["alive"]] if len(found) == 2 else []

    workers = wait_for(alive, "two live workers")
    node = f"w1-{processes.queue}@"
    assert [True, True] == [str(w["id"]).startswith(node) for w in workers]
    assert re.search(r"\b2\s*$", _cli(processes, "status"), re.MULTILINE)


def test_an_operators_drain_shuts_the_celery_worker_down(processes: _processes.Celery) -> None:
    """``outbox workers drain`` of one of its processes: the Celery worker shuts down warm,
    and its processes leave the fleet. (A stale age of 3 s: a heartbeat, which reads the
    request, every second.)"""
    _processes.prepare(processes.database_url, 0)
    worker = processes.worker(concurrency=2, **{celery_app.STALE_ENV: "3"})

    def workers() -> list[dict[str, object]]:
        found = json.loads(_cli(processes, "workers", "list", "--json"))
        return found if len(found) == 2 else []

    first = str(wait_for(workers, "two live workers")[0]["id"])
    _cli(processes, "workers", "drain", first)
    wait_for(lambda: worker.popen.poll() is not None, "the worker to exit")
    assert [] == json.loads(_cli(processes, "workers", "list", "--json"))
    assert "outbox.worker.asked" in worker.output()
