"""Generated handler behaviour in real ``outbox work`` processes, killed at random.

Two worker processes (``--concurrency 2``) play a generated case (:mod:`tests.model._cases`,
``CORE`` profile) while the test SIGKILLs one of them at generated moments and starts another
in its place. A call its process was killed in (or shortly after) has no known outcome: its
events may come back, on any later attempt. Everything else holds as in one process: every
event ends once, as the calls that finished say; nothing is handed over again after a call
that succeeded and whose process lived on; deferrals and pauses hold; rate-limit windows and
ordered keys hold across the processes.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from hypothesis import given, note, seed
from hypothesis import strategies as st
from sqlalchemy import create_engine, func, select

from outbox import schema
from tests.faults._processes import ROOT, environment
from tests.model._behaviour import Case, case_from_json, case_to_json, record_from_json
from tests.model._cases import Profile, budget, cases
from tests.model._model import Checker, Record
from tests.model._run import commit_events, read_final
from tests.model._settings import KILLED, SEED
from tests.model._tables import ModelEvent, reset
from tests.model.conftest import Target
from tests.model.model_app import CASE_ENV, RECORDS_ENV

APP = "tests.model.model_app:app"
WORK = ["work", "--concurrency", "2", "--lease", "3", "--poll-interval", "0.1",
        "--distribute-every", "0.2", "--shutdown-grace-period", "1"]  # fmt: skip
SETTLE_SECONDS = 20.0


def _start(
    target: Target, case: Case, records: Path, logs: Path, n: int
) -> subprocess.Popen[bytes]:
    env = environment(records, {CASE_ENV: case_to_json(case), RECORDS_ENV: str(records)})
    with (logs / f"work-{n}.log").open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "outbox", "--app", APP, "--database-url", target.url, *WORK],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
        )  # fmt: skip


def _records(directory: Path) -> list[Record]:
    """The last line recorded of each call (its end, or its start when it never ended)."""
    latest: dict[tuple[int, int], Record] = {}
    for path in directory.glob("*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = record_from_json(line)
                latest[(record.pid, record.index)] = record
    return list(latest.values())


def _settled(target: Target) -> bool:
    engine = create_engine(target.admin_url)
    try:
        with engine.connect() as conn:
            jobs = conn.execute(select(func.count()).select_from(schema.jobs)).scalar_one()
            rows = conn.execute(select(func.count()).select_from(ModelEvent)).scalar_one()
        return jobs == 0 and rows == 0
    finally:
        engine.dispose()


@KILLED
@seed(SEED)
@given(case=cases(Profile.CORE), kills=st.lists(st.floats(0.2, 3.0), min_size=1, max_size=2))
def test_killed_workers_keep_the_contract(
    target: Target, tmp_path_factory: object, case: Case, kills: list[float]
) -> None:
    note(
        f"seed {SEED} (OUTBOX_MODEL_SEED), on {target.name}; kills at {kills}; the case:\n{case!r}"
    )
    assert case_from_json(case_to_json(case)) == case
    base = Path(str(tmp_path_factory.mktemp("model-processes")))  # type: ignore[attr-defined]
    records, logs = base / "records", base / "logs"
    records.mkdir()
    logs.mkdir()
    reset(target.admin_url)
    engine = create_engine(target.admin_url)
    created, keys = commit_events(engine, case)
    engine.dispose()
    workers = [_start(target, case, records, logs, n) for n in range(2)]
    killed_at: list[float] = []
    started = time.monotonic()
    try:
        for n, moment in enumerate(sorted(kills)):
            time.sleep(max(0.0, started + moment - time.monotonic()))
            victim = workers[n % len(workers)]
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=10)
            killed_at.append(time.time())
            workers[n % len(workers)] = _start(target, case, records, logs, len(workers) + n)
        deadline = time.monotonic() + min(SETTLE_SECONDS, budget(case) + 8.0)
        while time.monotonic() < deadline and not _settled(target):
            time.sleep(0.2)
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                worker.wait(timeout=10)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(timeout=10)
    engine = create_engine(target.admin_url)
    try:
        final = read_final(engine, settled=False)
    finally:
        engine.dispose()
    recorded = _records(records)
    assert recorded, "no handler call was recorded"
    options = case.options(killed=True, window_slack=1)
    checker = Checker(options, recorded, created, keys, kills=killed_at)
    checker.check(final)
