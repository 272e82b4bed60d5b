"""What the inbox consumers' tests share: the table an effect writes, an effect that records
each message (and fails as told), and a database made for one test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import Column, Engine, Integer, MetaData, String, Table, Text, insert, select
from sqlalchemy.orm import Session

from outbox import db_now, schema
from outbox.inbox import Inbox
from outbox.inbox._consumer import Message

REPOSITORY = Path(__file__).resolve().parents[2]
metadata = MetaData()
effects = Table(
    "test_inbox_effects",
    metadata,
    Column("n", Integer, primary_key=True, autoincrement=True),
    Column("message_id", String(200), nullable=False),
    Column("body", Text, nullable=False),
)
INBOX = "test-in"


def create_effects(engine: Engine) -> None:
    """The effects table, empty."""
    with engine.begin() as conn:
        metadata.drop_all(conn)
        metadata.create_all(conn)


def effect_counts(engine: Engine) -> Counter[str]:
    """How many effects each message id had."""
    with engine.connect() as conn:
        return Counter(conn.execute(select(effects.c.message_id)).scalars())


def rows(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """The effect rows of ``messages``."""
    return [{"message_id": m.id, "body": m.body.decode()} for m in messages]


class Recorder:
    """An effect that writes a row per message; a message named in ``failures`` raises on
    its first deliveries, that many (by the broker's count; ``ALWAYS``: on every one)."""

    def __init__(self, failures: Mapping[str, int] | None = None) -> None:
        self.failures = dict(failures or {})
        self.calls = 0

    def __call__(self, session: Session, messages: list[Message]) -> None:
        self.calls += 1
        for message in messages:
            if message.deliveries <= self.failures.get(message.id, 0):
                raise RuntimeError(f"the effect of {message.id} failed")
        session.execute(insert(effects), rows(messages))


class AsyncRecorder:
    """:class:`Recorder` for the async consumer."""

    def __init__(self, failures: Mapping[str, int] | None = None) -> None:
        self.sync = Recorder(failures)

    async def __call__(self, session: Any, messages: list[Message]) -> None:
        await session.run_sync(lambda s: self.sync(s, messages))


ALWAYS = 10**9


def start_program(
    broker: str, database_url: str, source: str, marker: Path
) -> subprocess.Popen[bytes]:
    """``tests/inbox/consumer_program.py`` in a process of its own: it consumes one message from
    ``source`` and, once its transaction committed, writes ``marker`` and waits to be killed."""
    env = {**os.environ, "OUTBOX_TEST_DIE_AFTER_COMMIT": str(marker)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.inbox.consumer_program", broker, database_url, source],
        cwd=REPOSITORY,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def kill(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process and reap it."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=20)
    if process.stderr is not None:
        process.stderr.close()


def expired(engine: Engine, inbox: Inbox) -> bool:
    """Whether every id ``inbox`` holds is past its horizon by the database's clock."""
    with engine.connect() as conn:
        now = conn.execute(select(db_now())).scalar_one()
        left = conn.execute(
            select(schema.inbox.c.message_id)
            .where(schema.inbox.c.inbox == inbox.name)
            .where(schema.inbox.c.expires_at >= now)
        ).first()
        return left is None


def kept_ids(engine: Engine) -> set[tuple[str, str]]:
    """Every (inbox, message id) the inbox table holds."""
    with engine.connect() as conn:
        rows = conn.execute(select(schema.inbox.c.inbox, schema.inbox.c.message_id))
        return {(inbox, message_id) for inbox, message_id in rows}
