"""The flags proof: the ``employee`` example of "Using your database as a queue" run by several
``outbox work`` processes killed at random, and every flag cleared by a success on the state it
cleared, with retries later than the polling period.

The article's first approach flags rows that need work (``employee.needs_work_done``) and has
one worker poll them with ``SELECT ... FOR UPDATE SKIP LOCKED``; its two cons are that one worker
works at a time and that a failed row is tried again at the next poll. Here the flag handler of
``benchmarks/flags_app.py`` (``Outbox.flagged``) is run on one database (``--database``: a scratch
database of its own, or an SQLite file, dropped at the end):

- ``--employees`` rows, all flagged (version 1), are handled by ``--workers`` separate
  ``outbox work`` commands of ``--concurrency`` threads each, batch ``--batch-size``; each call
  takes ``--call-seconds`` and ``--fail-fraction`` of the calls raise, retried after
  ``--retry-seconds`` (±10%), longer than the workers' ``--poll-interval``;
- meanwhile a writer (a process) changes employees for ``--seconds``, ``--changes-per-second``
  transactions of one UPDATE each (a new name, the flag set, the version + 1; up to
  ``--rows-per-change`` employees), ``--aimed-fraction`` of them on employees outbox holds in a
  claimed group (being handled, or waiting for their retry);
- ``--kills`` SIGKILLs land on a worker chosen at random, spread over the writer's time, and a
  new worker is started in its place each time.

The handler records each call, and each employee (id, version, name) it was handed, committed
before it returns or raises; a trigger on ``employee`` logs every flag cleared with the row's
version and name. Once the writer has stopped and nothing is flagged (or only dead-lettered
rows, held), the workers are stopped and the database checked:

(a) every employee is unflagged; (b) those still flagged, counted apart from dead-lettered ones;
(c) every flag cleared (each of the trigger's records, and each unflagged employee's final
state) has a recorded success of its handler on that very (id, version, name): no flag was
cleared without its handler's success on the state that cleared it; (d) the handler's calls
overlapping in time across processes, the (id, version) handed again after a success
(at-least-once), wall time, kills, rows/s; and the waits between a failed call and the next
attempt of its group, against the retry policy's shortest wait and the poll interval (a failure
whose process was killed before that attempt is counted apart: its group came back when the
dead worker's jobs were rescued, not by the policy).

    python -m benchmarks.flags --database postgresql --employees 50000 --seconds 120 --kills 10

Each run writes ``results/flags_<database>.json``. Workers, writer and database share the
machine's CPUs: the rates are those of all of them together.
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    exists,
    func,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.exc import DBAPIError

from benchmarks._common import (
    DATABASES,
    REPOSITORY,
    command_line,
    fraction,
    machine,
    percentile,
    reader_engine,
    scratch,
    server_version,
    write,
)
from benchmarks.flags_app import (
    HANDLER,
    Base,
    Employee,
    EmployeeWork,
    HandlerConfig,
    calls,
    handed,
)
from outbox import Outbox, schema
from outbox.inbox import is_retryable
from outbox.ops import holds

OUTBOX = Path(sys.executable).parent / "outbox"
APP = "benchmarks.flags_app:app"
HIRE_CHUNK = 10_000  # employees inserted per statement
TRANSIENT_RETRIES = 10  # a writer's transaction tried again after a deadlock or a lock timeout
AIM_SAMPLE = 200  # claimed rows an aimed change picks its employees from
CHECK_EVERY = 0.5  # seconds between two looks at what is left, once the writer is done
KILL_SPAN = (0.05, 0.95)  # the kills land within this part of the writer's time
STOP_SECONDS = 60.0  # a worker's graceful stop

observer = MetaData()

clears = Table(
    "bench_flags_clears",
    observer,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("employee_id", Integer, nullable=False),
    Column("version", Integer, nullable=False),
    Column("name", String(100), nullable=False),
)

# Every flag cleared, logged by the database as it happens, with the state it was cleared on.
_CLEAR_LOG = {
    "postgresql": [
        "CREATE FUNCTION bench_flags_log_clear() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "INSERT INTO bench_flags_clears (employee_id, version, name) "
        "VALUES (NEW.id, NEW.version, NEW.name); RETURN NULL; END $$",
        "CREATE TRIGGER bench_flags_clear AFTER UPDATE OF needs_work_done ON employee "
        "FOR EACH ROW WHEN (OLD.needs_work_done AND NOT NEW.needs_work_done) "
        "EXECUTE FUNCTION bench_flags_log_clear()",
    ],
    "mysql": [
        "CREATE TRIGGER bench_flags_clear AFTER UPDATE ON employee FOR EACH ROW "
        "INSERT INTO bench_flags_clears (employee_id, version, name) "
        "SELECT NEW.id, NEW.version, NEW.name FROM DUAL "
        "WHERE OLD.needs_work_done AND NOT NEW.needs_work_done",
    ],
    "sqlite": [
        "CREATE TRIGGER bench_flags_clear AFTER UPDATE OF needs_work_done ON employee "
        "FOR EACH ROW WHEN OLD.needs_work_done AND NOT NEW.needs_work_done BEGIN "
        "INSERT INTO bench_flags_clears (employee_id, version, name) "
        "VALUES (NEW.id, NEW.version, NEW.name); END",
    ],
}


@dataclass
class Options:
    """One proof's sizes, load and faults; the handler's and workers' in ``handler``."""

    employees: int = 50_000
    workers: int = 4
    concurrency: int = 2
    seconds: float = 120.0
    changes_per_second: float = 100.0
    rows_per_change: int = 3
    aimed_fraction: float = 0.3
    kills: int = 10
    seed: int = 0
    timeout: float = 900.0
    handler: HandlerConfig = field(default_factory=HandlerConfig)


@dataclass
class Kill:
    """One SIGKILL: the worker's slot and process, and when it landed (seconds into the run,
    and ``time.time()``)."""

    slot: int
    pid: int
    seconds: float
    at: float


@dataclass
class Proof:
    """What one database's run measured."""

    database: str
    server: str
    employees: dict[str, int] = field(default_factory=dict)
    clears: dict[str, int] = field(default_factory=dict)
    calls: dict[str, Any] = field(default_factory=dict)
    handed: dict[str, int] = field(default_factory=dict)
    overlap: dict[str, Any] = field(default_factory=dict)
    retries: dict[str, Any] = field(default_factory=dict)
    writer: dict[str, Any] = field(default_factory=dict)
    kills: list[Kill] = field(default_factory=list)
    seconds: float = 0.0
    drain_after_writer_seconds: float = 0.0
    rows_per_second: float = 0.0
    load_average: dict[str, float] = field(default_factory=dict)

    @property
    def violations(self) -> int:
        """Flags cleared without a success on their state, and rows left flagged but not
        dead-lettered."""
        return (
            self.clears["without_success"]
            + self.employees["unflagged_without_success"]
            + self.employees["flagged_not_dead"]
        )


class Call(NamedTuple):
    """One call of the handler, as it recorded itself."""

    id: str
    pid: int
    group_id: str
    attempt: int
    rows: int
    started_at: float
    ended_at: float
    succeeded: bool


# --- the writer (a process of its own) --------------------------------------------------------


def writer_main(config: dict[str, Any]) -> None:
    """The application's changes: each transaction one UPDATE of up to ``rows_per_change``
    employees (a new name, the flag set, the version + 1), paced at ``changes_per_second``
    for ``seconds``; a summary written to ``config["summary"]``."""
    app = Outbox(config["url"])
    rng = random.Random(f"{config['seed']}:writer")
    pace, seconds = 1 / config["changes_per_second"], config["seconds"]
    totals = dict.fromkeys(("changes", "rows", "aimed", "rows_being_handled", "retries"), 0)
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        n = totals["changes"] + 1
        count = rng.randint(1, config["rows_per_change"])
        aimed = rng.random() < config["aimed_fraction"]
        for retries in range(TRANSIENT_RETRIES + 1):
            try:
                with app.engine.begin() as conn:
                    ids = _chosen(conn, rng, aimed, count, config["employees"])
                    conn.execute(
                        update(Employee)
                        .where(Employee.id.in_(ids))
                        .values(
                            name=f"change {n}", needs_work_done=True, version=Employee.version + 1
                        )
                    )
                    being_handled = conn.execute(
                        select(func.count()).where(
                            EmployeeWork.row_id.in_(ids), EmployeeWork.group_id.is_not(None)
                        )
                    ).scalar_one()
                break
            except DBAPIError as error:
                if retries == TRANSIENT_RETRIES or not is_retryable(error):
                    raise
                totals["retries"] += 1
        totals["changes"] = n
        totals["rows"] += len(ids)
        totals["aimed"] += aimed
        totals["rows_being_handled"] += int(being_handled)
        wait = started + n * pace - time.monotonic()
        if wait > 0:
            time.sleep(wait)
    app.engine.dispose()
    summary = {**totals, "seconds": round(time.monotonic() - started, 2)}
    Path(config["summary"]).write_text(json.dumps(summary))


def _chosen(
    conn: Connection, rng: random.Random, aimed: bool, count: int, employees: int
) -> list[int]:
    """Employees to change: when ``aimed``, among those outbox holds in a claimed group (at
    random among the first few hundred); otherwise, or when none is, at random."""
    if aimed:
        claimed = list(
            conn.execute(
                select(EmployeeWork.row_id)
                .where(EmployeeWork.group_id.is_not(None))
                .limit(AIM_SAMPLE)
            ).scalars()
        )
        if claimed:
            return sorted(rng.sample(claimed, min(count, len(claimed))))
    return sorted(rng.sample(range(1, employees + 1), count))


# --- the supervisor ---------------------------------------------------------------------------


def prove(url: str, options: Options, log: Callable[[str], None] = print) -> Proof:
    """Run the proof on the (existing) database of ``url``: outbox's tables are created if
    missing, the benchmark's created afresh, and dropped at the end."""
    reader = reader_engine(url)
    with reader.begin() as conn:
        _drop(conn)
        schema.metadata.create_all(conn)
        Base.metadata.create_all(conn)
        observer.create_all(conn)
        for statement in _CLEAR_LOG[conn.dialect.name]:
            conn.execute(text(statement))
        server = server_version(conn)
    database = reader.dialect.name
    proof = Proof(database="mariadb" if database == "mysql" else database, server=server)
    try:
        _hire(reader, options.employees)
        with tempfile.TemporaryDirectory(prefix="outbox-flags-proof-") as directory:
            started = _run(url, options, reader, Path(directory), proof, log)
        _check(url, reader, options, proof, started)
    finally:
        with reader.begin() as conn:
            _drop(conn)
        reader.dispose()
    return proof


def _drop(conn: Connection) -> None:
    observer.drop_all(conn)
    Base.metadata.drop_all(conn)  # the trigger goes with its table
    if conn.dialect.name == "postgresql":
        conn.execute(text("DROP FUNCTION IF EXISTS bench_flags_log_clear()"))


def _hire(engine: Engine, count: int) -> None:
    """``count`` employees, every one flagged at version 1: the work the workers start with."""
    with engine.begin() as conn:
        for start in range(1, count + 1, HIRE_CHUNK):
            conn.execute(
                insert(Employee),
                [
                    {"id": n, "name": f"employee {n}", "needs_work_done": True, "version": 1}
                    for n in range(start, min(start + HIRE_CHUNK, count + 1))
                ],
            )


def _writer(config: dict[str, Any], log: Path) -> subprocess.Popen[bytes]:
    """The writer, a process of its own (:func:`writer_main`)."""
    return subprocess.Popen(
        [sys.executable, "-m", "benchmarks.flags", "--writer", json.dumps(config)],
        cwd=REPOSITORY,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def _worker(url: str, options: Options, log: Path) -> subprocess.Popen[bytes]:
    """One ``outbox work`` command (one process) on the proof's application."""
    command = [str(OUTBOX), "--app", APP, "--database-url", url, "--log-level", "warning"]
    # The settings are the application's alone: none from the environment (OUTBOX_*).
    env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}
    return subprocess.Popen(
        [*command, "work", "--concurrency", str(options.concurrency)],
        cwd=REPOSITORY,
        env={**env, **options.handler.environment()},
        stdin=subprocess.DEVNULL,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def _run(
    url: str,
    options: Options,
    reader: Engine,
    control: Path,
    proof: Proof,
    log: Callable[[str], None],
) -> float:
    """Run the workers, the writer and the kills until everything is handled; when the
    workers were started (``time.time()``)."""
    rng = random.Random(f"{options.seed}:kills")
    output = control / "log"
    workers: dict[int, subprocess.Popen[bytes]] = {}
    ops = Outbox(url)
    summary = control / "writer.json"
    writer_config = {
        "url": url,
        "employees": options.employees,
        "seconds": options.seconds,
        "changes_per_second": options.changes_per_second,
        "rows_per_change": options.rows_per_change,
        "aimed_fraction": options.aimed_fraction,
        "seed": options.seed,
        "summary": str(summary),
    }
    started = time.time()
    proof.load_average["start"] = round(os.getloadavg()[0], 2)
    low, high = KILL_SPAN
    due = sorted(
        options.seconds * (low + (high - low) * (n + rng.random()) / options.kills)
        for n in range(options.kills)
    )
    writer: subprocess.Popen[bytes] | None = None
    try:
        for slot in range(options.workers):
            workers[slot] = _worker(url, options, output)
        # The writer and the kills start once the workers are at work.
        while not _called(reader):
            _check_running(workers)
            if time.time() - started > options.timeout:
                raise RuntimeError(f"no call of the handler after {options.timeout:g} s")
            time.sleep(0.1)
        begun = time.time()
        writer = _writer(writer_config, output)
        writer_ended: float | None = None
        last_look = 0.0
        while True:
            now = time.time()
            _check_running(workers)
            if now - started > options.timeout:
                raise RuntimeError(f"not done after {options.timeout:g} s: {_left(reader, ops)}")
            if due and now - begun >= due[0]:
                due.pop(0)
                slot = rng.choice(sorted(workers))
                victim = workers[slot]
                victim.kill()
                victim.wait()
                at = time.time()
                proof.kills.append(Kill(slot, victim.pid, round(at - started, 1), at))
                workers[slot] = _worker(url, options, output)
                log(f"  kill {len(proof.kills)}: {proof.kills[-1]}")
            code = writer.poll()
            if code not in (None, 0):
                raise RuntimeError(f"the writer exited ({code})")
            if code == 0 and writer_ended is None:
                writer_ended = time.time()
                log(f"  writer done at {writer_ended - started:.1f} s")
            if writer_ended is not None and not due and now - last_look >= CHECK_EVERY:
                last_look = now
                if _left(reader, ops)["not_dead"] == 0:
                    break
            time.sleep(0.1)
        for process in workers.values():
            process.send_signal(signal.SIGTERM)
        for slot, process in workers.items():
            if process.wait(STOP_SECONDS) != 0:
                raise RuntimeError(f"worker {slot} stopped with {process.returncode}")
        workers.clear()
        proof.load_average["end"] = round(os.getloadavg()[0], 2)
    except BaseException:
        tail = output.read_text(errors="replace")[-4000:] if output.exists() else ""
        log(f"  processes' output (tail):\n{tail}")
        raise
    finally:
        for process in [*workers.values(), *([writer] if writer else [])]:
            if process.poll() is None:
                process.kill()
                process.wait()
        ops.engine.dispose()
    proof.writer = json.loads(summary.read_text())
    with reader.connect() as conn:
        last = conn.execute(select(func.max(calls.c.ended_at)).where(calls.c.succeeded)).scalar()
    last = float(last or started)
    proof.seconds = round(last - started, 2)
    proof.drain_after_writer_seconds = round(last - (writer_ended or last), 2)
    return started


def _check_running(workers: dict[int, subprocess.Popen[bytes]]) -> None:
    for slot, process in workers.items():
        if process.poll() is not None:
            raise RuntimeError(f"worker {slot} exited ({process.returncode})")


def _called(reader: Engine) -> bool:
    """Whether the handler was called yet."""
    with reader.connect() as conn:
        return conn.execute(select(calls.c.id).limit(1)).first() is not None


def _left(reader: Engine, ops: Outbox) -> dict[str, int]:
    """What is left to do: flagged employees, keys in the buffer, and those of them held back
    by a dead-lettered row (``not_dead``: flagged ones that are not)."""
    held = {int(key.key) for key in holds.held_keys(ops) if key.handler == HANDLER}
    employee, work = Employee.__table__, EmployeeWork.__table__
    with reader.connect() as conn:
        flagged = conn.execute(
            select(func.count()).select_from(employee).where(employee.c.needs_work_done)
        ).scalar_one()
        waiting = conn.execute(select(func.count()).select_from(work)).scalar_one()
        if flagged <= len(held):
            flagged_ids = set(
                conn.execute(select(employee.c.id).where(employee.c.needs_work_done)).scalars()
            )
            flagged = len(flagged_ids - held)
            waiting = max(0, waiting - len(held))
        else:
            flagged -= len(held)
    return {"not_dead": int(flagged) + int(waiting), "held": len(held)}


# --- the checks -------------------------------------------------------------------------------


def _succeeded_on(employee_id: Any, version: Any, name: Any) -> Any:
    """A recorded success of the handler on this state of an employee."""
    return exists().where(
        handed.c.call_id == calls.c.id,
        calls.c.succeeded,
        handed.c.employee_id == employee_id,
        handed.c.version == version,
        handed.c.name == name,
    )


def _check(url: str, reader: Engine, options: Options, proof: Proof, started: float) -> None:
    employee = Employee.__table__
    ops = Outbox(url)
    try:
        dead = {int(key.key) for key in holds.held_keys(ops) if key.handler == HANDLER}
    finally:
        ops.engine.dispose()
    with reader.connect() as conn:
        flagged = set(
            conn.execute(select(employee.c.id).where(employee.c.needs_work_done)).scalars()
        )
        unflagged = conn.execute(
            select(func.count()).select_from(employee).where(~employee.c.needs_work_done)
        ).scalar_one()
        unflagged_without = conn.execute(
            select(func.count())
            .select_from(employee)
            .where(
                ~employee.c.needs_work_done,
                ~_succeeded_on(employee.c.id, employee.c.version, employee.c.name),
            )
        ).scalar_one()
        changes = conn.execute(select(func.sum(employee.c.version - 1))).scalar_one()
        logged = conn.execute(select(func.count()).select_from(clears)).scalar_one()
        clears_without = conn.execute(
            select(func.count())
            .select_from(clears)
            .where(~_succeeded_on(clears.c.employee_id, clears.c.version, clears.c.name))
        ).scalar_one()
        found = [
            Call(*row)
            for row in conn.execute(
                select(
                    calls.c.id,
                    calls.c.pid,
                    calls.c.group_id,
                    calls.c.attempt,
                    calls.c.rows,
                    calls.c.started_at,
                    calls.c.ended_at,
                    calls.c.succeeded,
                )
            )
        ]
        succeeded = {c.id: c for c in found if c.succeeded}
        states: dict[tuple[int, int], list[Call]] = defaultdict(list)
        for employee_id, version, call_id in conn.execute(
            select(handed.c.employee_id, handed.c.version, handed.c.call_id)
        ):
            if call_id in succeeded:
                states[(int(employee_id), int(version))].append(succeeded[call_id])
    proof.employees = {
        "employees": options.employees,
        "changes_written": int(changes or 0),
        "unflagged": int(unflagged),
        "flagged": len(flagged),
        "flagged_dead": len(flagged & dead),
        "flagged_not_dead": len(flagged - dead),
        "unflagged_without_success": int(unflagged_without),
    }
    proof.clears = {"logged": int(logged), "without_success": int(clears_without)}
    proof.handed = _handed_summary(states, proof.kills, started)
    proof.calls = _calls_summary(found, proof.kills)
    proof.overlap = _overlap(found)
    proof.retries = _retry_waits(found, proof.kills, options.handler)
    rows = proof.handed["rows_in_successes"]
    proof.rows_per_second = round(rows / proof.seconds) if proof.seconds else 0.0


def _handed_summary(
    states: dict[tuple[int, int], list[Call]], kills: Sequence[Kill], started: float
) -> dict[str, Any]:
    """What the successful calls were handed: rows, distinct (id, version) states and
    employees; states handed again after a success, split by whether the process of the first
    success was killed after it (before its completion cleared the flag, the state is handed
    again) or not (a change landed while the row was in a claimed group: the flag stays, and
    the row is handed again in whatever state it is then, often the one already handed); and
    when every employee had had its first success."""
    killed_at = {kill.pid: kill.at for kill in kills}
    again_after_kill = again_otherwise = 0
    first_success: dict[int, float] = {}
    versions: dict[int, int] = defaultdict(int)
    for (employee_id, _version), handed_in in states.items():
        handed_in.sort(key=lambda c: c.ended_at)
        first = handed_in[0]
        versions[employee_id] += 1
        if first.ended_at < first_success.get(employee_id, float("inf")):
            first_success[employee_id] = first.ended_at
        if len(handed_in) > 1:
            if killed_at.get(first.pid, 0.0) > first.ended_at:
                again_after_kill += len(handed_in) - 1
            else:
                again_otherwise += len(handed_in) - 1
    rows = sum(len(handed_in) for handed_in in states.values())
    return {
        "rows_in_successes": rows,
        "distinct_states_succeeded": len(states),
        "handed_again_after_a_success": rows - len(states),
        "of_which_the_first_success_process_was_killed": again_after_kill,
        "of_which_not": again_otherwise,
        "employees_succeeded": len(first_success),
        "employees_succeeded_at_several_versions": sum(1 for n in versions.values() if n > 1),
        "every_employee_handed_once_after_seconds": round(
            max(first_success.values(), default=started) - started, 2
        ),
    }


def _calls_summary(found: Sequence[Call], kills: Sequence[Kill]) -> dict[str, Any]:
    killed = {kill.pid for kill in kills}
    return {
        "calls": len(found),
        "succeeded": sum(c.succeeded for c in found),
        "failed": sum(not c.succeeded for c in found),
        "processes": len({c.pid for c in found}),
        "calls_in_killed_processes": sum(c.pid in killed for c in found),
        "most_attempts": max((c.attempt for c in found), default=0),
        "mean_rows": round(sum(c.rows for c in found) / len(found), 1) if found else 0,
    }


def _overlap(found: Sequence[Call]) -> dict[str, Any]:
    """How the handler's calls overlapped in time across processes: the calls that overlapped
    one of another process, the most processes inside a call at one moment, and the share of
    the time some call ran during which calls of two processes or more ran."""
    ordered = sorted(found, key=lambda c: c.started_at)
    across = [False] * len(ordered)
    for i, call in enumerate(ordered):
        for j in range(i + 1, len(ordered)):
            other = ordered[j]
            if other.started_at >= call.ended_at:
                break
            if other.pid != call.pid:
                across[i] = across[j] = True
    moments = sorted(
        [(c.started_at, 1, c.pid) for c in ordered] + [(c.ended_at, -1, c.pid) for c in ordered]
    )
    inside: dict[int, int] = defaultdict(int)
    most, busy, shared, since = 0, 0.0, 0.0, 0.0
    for moment, step, pid in moments:
        processes = sum(1 for n in inside.values() if n)
        if processes:
            busy += moment - since
            if processes >= 2:
                shared += moment - since
        since = moment
        inside[pid] += step
        most = max(most, sum(1 for n in inside.values() if n))
    return {
        "calls_overlapping_another_process": sum(across),
        "share_of_calls": round(sum(across) / len(ordered), 3) if ordered else 0,
        "most_processes_in_a_call_at_once": most,
        "share_of_busy_time_with_two_or_more_processes": round(shared / busy, 3) if busy else 0,
    }


def _retry_waits(
    found: Sequence[Call], kills: Sequence[Kill], config: HandlerConfig
) -> dict[str, Any]:
    """The wait between each failed call and the next call of its group: the retry policy's,
    but where the failing process was killed before that next call (its group then came back
    when the dead worker's jobs were rescued), counted apart."""
    by_group: dict[str, list[Call]] = defaultdict(list)
    for call in found:
        by_group[call.group_id].append(call)
    kill_times: dict[int, list[float]] = defaultdict(list)
    for kill in kills:
        kill_times[kill.pid].append(kill.at)
    waits: list[float] = []
    after_kill: list[float] = []
    unanswered = 0
    for group in by_group.values():
        group.sort(key=lambda c: c.started_at)
        for call in group:
            if call.succeeded:
                continue
            later = [c for c in group if c.started_at > call.ended_at]
            if not later:
                unanswered += 1
                continue
            wait = later[0].started_at - call.ended_at
            times = kill_times.get(call.pid, [])
            killed = bisect.bisect_left(times, call.ended_at) < bisect.bisect_right(
                times, later[0].started_at
            )
            (after_kill if killed else waits).append(wait)
    waits.sort()
    return {
        "failed_calls": sum(not c.succeeded for c in found),
        "waits": len(waits),
        "shortest_wait": round(waits[0], 3) if waits else None,
        "median_wait": round(percentile(waits, 0.5), 3) if waits else None,
        "longest_wait": round(waits[-1], 3) if waits else None,
        "policy_shortest_wait": round(config.shortest_retry_wait(), 3),
        "poll_interval": config.poll_interval,
        "waits_after_the_failing_worker_was_killed": len(after_kill),
        "shortest_wait_after_a_kill": round(min(after_kill), 3) if after_kill else None,
        "failures_without_a_later_attempt": unanswered,
    }


# --- the command ------------------------------------------------------------------------------


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--writer":
        writer_main(json.loads(sys.argv[2]))
        return
    defaults, handler = Options(), HandlerConfig()
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--database", choices=DATABASES, default="postgresql")
    parser.add_argument("--employees", type=int, default=defaults.employees)
    parser.add_argument("--workers", type=int, default=defaults.workers)
    parser.add_argument("--concurrency", type=int, default=defaults.concurrency)
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="the writer's")
    parser.add_argument("--changes-per-second", type=float, default=defaults.changes_per_second)
    parser.add_argument("--rows-per-change", type=int, default=defaults.rows_per_change)
    parser.add_argument("--aimed-fraction", type=fraction, default=defaults.aimed_fraction)
    parser.add_argument("--kills", type=int, default=defaults.kills)
    parser.add_argument("--batch-size", type=int, default=handler.batch_size)
    parser.add_argument("--call-seconds", type=float, default=handler.call_seconds)
    parser.add_argument("--fail-fraction", type=fraction, default=handler.fail_fraction)
    parser.add_argument("--retry-seconds", type=float, default=handler.retry_seconds)
    parser.add_argument("--max-attempts", type=int, default=handler.max_attempts)
    parser.add_argument("--poll-interval", type=float, default=handler.poll_interval)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--timeout", type=float, default=defaults.timeout, help="seconds")
    args = parser.parse_args()
    if args.employees < 1 or args.workers < 1 or args.kills < 0 or args.rows_per_change < 1:
        parser.error("--employees ≥ 1, --workers ≥ 1, --kills ≥ 0, --rows-per-change ≥ 1")
    options = Options(
        employees=args.employees,
        workers=args.workers,
        concurrency=args.concurrency,
        seconds=args.seconds,
        changes_per_second=args.changes_per_second,
        rows_per_change=args.rows_per_change,
        aimed_fraction=args.aimed_fraction,
        kills=args.kills,
        seed=args.seed,
        timeout=args.timeout,
        handler=HandlerConfig(
            batch_size=args.batch_size,
            call_seconds=args.call_seconds,
            fail_fraction=args.fail_fraction,
            retry_seconds=args.retry_seconds,
            max_attempts=args.max_attempts,
            poll_interval=args.poll_interval,
            seed=args.seed,
        ),
    )
    print(f"{args.database}: {options.employees:,} employees flagged", flush=True)
    with scratch(args.database, "flags") as url:
        proof = prove(url, options, log=lambda line: print(line, flush=True))
    data = {
        "benchmark": "flags",
        "command": command_line("benchmarks.flags", args),
        "machine": machine(),
        "options": asdict(options),
        **asdict(proof),
        "violations": proof.violations,
    }
    print(json.dumps({k: v for k, v in data.items() if k != "kills"}, indent=2), flush=True)
    print(f"written to {write(f'flags_{proof.database}', data)}", flush=True)
    if proof.violations:
        raise SystemExit(f"{args.database}: {proof.violations} violations")


if __name__ == "__main__":
    main()
