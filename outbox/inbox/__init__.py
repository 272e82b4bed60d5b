"""The inbox: a receiver's record of the messages it has had an effect for, so that a message
delivered again has no second effect.

A consumer of a broker or of a webhook records each message's id in the transaction that has
the message's effect; a message delivered again (its acknowledgement lost, a consumer killed
between the commit and the ack, the sender re-sending after a lost confirm) finds its id
recorded and is acknowledged without a second effect::

    orders_in = app.inbox("partner-orders")

    with Session(engine) as session, session.begin():
        if orders_in.receive(session, message.message_id):
            apply(session, message)  # the effect, in the same transaction
    message.ack()  # after the commit

An id is kept for the inbox's ``horizon`` (seven days unless given), then pruned by the
fleet's retention pass (``outbox work``), ``outbox prune``, or :func:`prune`: a message
delivered again after its id was pruned has its effect again. The horizon must outlast the
longest time between two deliveries of one message; :meth:`outbox.Outbox.inbox` refuses one
shorter than the re-send horizon of the outbox handler that sends the messages
(``sender=``). docs/inbox.md says what it guarantees.

Ready consumers do all of this for the brokers the sinks publish to, each behind the sink's
extra: :mod:`outbox.inbox.rabbitmq`, :mod:`outbox.inbox.nats`, :mod:`outbox.inbox.redis`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session, scoped_session

from outbox._core.checks import is_number
from outbox._db import dialects, queries, run_in_transaction
from outbox._db.dialects import is_transient
from outbox.exceptions import ConfigurationError
from outbox.schema import MESSAGE_ID_LENGTH

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import (
        AsyncConnection,
        AsyncEngine,
        AsyncSession,
        async_scoped_session,
    )

DEFAULT_HORIZON = dt.timedelta(days=7)
"""How long an inbox keeps an id unless told: NServiceBus's default. Long enough for a sender's
retries over days and an operator's replay within the week; an id costs a row and two index
entries, about 210 bytes on PostgreSQL (docs/inbox.md sizes it)."""
MAX_HORIZON_SECONDS = 36500 * 86400.0
"""The longest horizon taken: 100 years, within every database's range of times."""
PRUNE_CHUNK = 1000
"""Ids one transaction of a prune deletes."""
_HASHED = "sha256:"


class Inbox:
    """A named record of message ids, each kept ``horizon`` seconds after it was received.

    Made by :meth:`outbox.Outbox.inbox`, which also lists it in ``outbox status``, the console
    and the metrics. :meth:`receive` and :meth:`receive_many` record ids in the caller's
    transaction; nothing is committed here.
    """

    def __init__(self, name: str, *, horizon: float | dt.timedelta = DEFAULT_HORIZON) -> None:
        if not isinstance(name, str) or not 0 < len(name) <= 200:
            raise ConfigurationError(
                f"inbox name: expected text of 1 to 200 characters, got {name!r}"
            )
        self.name = name
        self.horizon = _seconds(name, horizon)
        """Seconds an id is kept after it was received."""

    def __repr__(self) -> str:
        return f"Inbox({self.name!r}, horizon={self.horizon:g})"

    def receive(self, session: Session | Connection | scoped_session[Any], message_id: str) -> bool:
        """Record ``message_id`` in the caller's transaction; True when this inbox did not hold
        it, so that the caller has the message's effect in the same transaction, False when it
        did (the message was received before: acknowledge it, and do nothing more).

        A transaction recording the same id at the same time makes this one wait for its end:
        its commit makes this call say False, its rollback True.
        """
        return self.receive_many(session, (message_id,))[0]

    def receive_many(
        self, session: Session | Connection | scoped_session[Any], message_ids: Iterable[str]
    ) -> list[bool]:
        """Record ``message_ids`` in the caller's transaction (a few statements however many);
        for each id given, in its place, True when the message is to have its effect: the
        inbox did not hold the id, and this is its first place in the batch (a sink's re-send
        can land in the same batch as the first send). A batch consumer has the effect of
        those messages only, then acknowledges the whole batch after the commit::

            fresh = inbox.receive_many(session, [m.message_id for m in batch])
            apply(session, [m for m, new in zip(batch, fresh) if new])
        """
        conn = _connection(session, self.name)
        kept = [kept_id(self.name, m) for m in message_ids]
        dialect = dialects.name_of(conn.dialect)
        new = queries.record_inbox_ids(conn, dialect, self.name, kept, self.horizon)
        fresh = []
        for key in kept:
            fresh.append(key in new)
            new.discard(key)
        return fresh

    async def receive_async(
        self,
        session: AsyncSession | AsyncConnection | async_scoped_session[Any],
        message_id: str,
    ) -> bool:
        """:meth:`receive` for async code: ``await inbox.receive_async(session, id)``."""
        return (await self.receive_many_async(session, (message_id,)))[0]

    async def receive_many_async(
        self,
        session: AsyncSession | AsyncConnection | async_scoped_session[Any],
        message_ids: Iterable[str],
    ) -> list[bool]:
        """:meth:`receive_many` for async code, run through the session's ``run_sync`` in the
        caller's transaction."""
        from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

        if isinstance(session, async_scoped_session):
            session = session()
        if not isinstance(session, AsyncSession | AsyncConnection):
            raise TypeError(
                f"inbox {self.name!r}: receive_many_async takes an AsyncSession or an "
                f"AsyncConnection, got {type(session).__name__}; with a Session or a "
                "Connection, call receive_many(...)"
            )
        given = list(message_ids)
        return await session.run_sync(lambda sync: self.receive_many(sync, given))

    def holds(self, session: Session | Connection | scoped_session[Any], message_id: str) -> bool:
        """Whether this inbox holds ``message_id`` (recorded by a committed transaction, or by
        the caller's own), without recording it."""
        conn = _connection(session, self.name)
        return queries.inbox_holds(conn, self.name, kept_id(self.name, message_id))


def check_sender(inbox: Inbox, sender: str, resends: float) -> None:
    """Refuse ``inbox`` when its horizon is shorter than ``resends``, the re-send horizon of
    the handler ``sender`` of the messages: a message re-sent after its id was pruned would
    have its effect twice."""
    if inbox.horizon < resends:
        raise ConfigurationError(
            f"inbox {inbox.name!r} keeps a message id {inbox.horizon:g} s, but handler "
            f"{sender!r} may send a message again up to {resends:.0f} s after it first sent it "
            f"(the longest retry wait, the lease and the timeout): make the horizon at least "
            f"{math.ceil(resends)} s"
        )


def kept_id(inbox: str, message_id: object) -> str:
    """``message_id`` as the inbox keeps it: as it is, or, when longer than
    :data:`~outbox.schema.MESSAGE_ID_LENGTH` characters, ``sha256:`` and its digest. Anything
    but non-empty text is refused in one line naming the inbox."""
    if not isinstance(message_id, str) or not message_id:
        got = type(message_id).__name__ if not isinstance(message_id, str) else "empty text"
        raise TypeError(
            f"inbox {inbox!r}: a message id is non-empty text, got {got}; a message without an "
            "id cannot be told from its re-delivery"
        )
    if len(message_id) <= MESSAGE_ID_LENGTH:
        return message_id
    return _HASHED + hashlib.sha256(message_id.encode()).hexdigest()


def prune(engine: Engine, chunks: int | None = None) -> int:
    """Delete the ids of every inbox past their horizon, :data:`PRUNE_CHUNK` a transaction, up
    to ``chunks`` transactions (all of them when None); how many were deleted."""
    total = 0
    done = 0
    while chunks is None or done < chunks:
        deleted = run_in_transaction(
            engine, lambda conn: queries.delete_expired_inbox_ids(conn, PRUNE_CHUNK)
        )
        total += deleted
        done += 1
        if deleted < PRUNE_CHUNK:
            break
    return total


async def prune_async(engine: AsyncEngine, chunks: int | None = None) -> int:
    """:func:`prune` on an ``AsyncEngine``: each chunk in a transaction of its own, through
    the connection's ``run_sync``; how many ids were deleted."""
    total = 0
    done = 0
    while chunks is None or done < chunks:
        async with engine.begin() as conn:
            deleted = await conn.run_sync(
                lambda sync: queries.delete_expired_inbox_ids(sync, PRUNE_CHUNK)
            )
        total += deleted
        done += 1
        if deleted < PRUNE_CHUNK:
            break
    return total


def is_retryable(error: BaseException) -> bool:
    """Whether ``error``, raised by a transaction that recorded ids, is contention or a lost
    connection: run the whole transaction again (its effect included), it may pass. Two
    consumers recording some of the same ids at once can deadlock on MariaDB (InnoDB's shared
    locks on a duplicate key), fail to serialize on PostgreSQL at REPEATABLE READ or above,
    or find SQLite locked past the engine's timeout; nothing was recorded then."""
    return is_transient(error)


def _connection(session: object, inbox: str) -> Connection:
    if isinstance(session, scoped_session):
        session = session()
    if isinstance(session, Session):
        conn = session.connection()
    elif isinstance(session, Connection):
        conn = session
    else:
        raise _not_a_session(session, inbox)
    # A connection's own option, else its engine's (create_engine(isolation_level=...), which
    # SQLAlchemy applies to each new connection and keeps on the dialect): read without a
    # round trip.
    isolation = conn.get_execution_options().get("isolation_level") or getattr(
        conn.dialect, "_on_connect_isolation_level", None
    )
    if isolation == "AUTOCOMMIT":
        # Each statement would commit alone: the id could be kept without the effect.
        raise TypeError(
            f"inbox {inbox!r}: receive needs the transaction of the message's effect, and this "
            "connection commits each statement by itself (isolation_level AUTOCOMMIT)"
        )
    return conn


def _not_a_session(session: object, inbox: str) -> TypeError:
    got = type(session).__name__
    hint = "; async code awaits receive_async(...)" if got.startswith("Async") else ""
    return TypeError(
        f"inbox {inbox!r}: receive takes a Session or a Connection in the transaction of the "
        f"message's effect, got {got}{hint}"
    )


def _seconds(name: str, horizon: object) -> float:
    seconds = horizon.total_seconds() if isinstance(horizon, dt.timedelta) else horizon
    if not is_number(seconds) or not 0 < float(seconds) <= MAX_HORIZON_SECONDS:  # type: ignore[arg-type]
        raise ConfigurationError(
            f"inbox {name!r}: horizon must be a timedelta or seconds, more than 0 and at most "
            f"{MAX_HORIZON_SECONDS:.0f} (100 years), got {horizon!r}"
        )
    return float(seconds)  # type: ignore[arg-type]
