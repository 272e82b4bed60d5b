"""Statements on ``outbox_rate_limits``: the fleet's shared rate limits (sliding windows)."""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    Text,
    case,
    delete,
    literal,
    or_,
    select,
    update,
)

from outbox import schema
from outbox._core.checks import MAX_WAIT_SECONDS
from outbox._db import dialects
from outbox._db.dialects.clock import age_seconds, db_now_plus, time_plus
from outbox.schema import db_now

_limits = schema.rate_limits

# A window's recent starts are kept to a thousandth of the window, each rounded up (later: it
# stays counted a little longer), so that a row holds about a thousand entries at most whatever
# the limit: a few kilobytes, which every database's TEXT holds.
GRAIN_PER_WINDOW = 1000
# A locking read of the limits' rows that took longer than this waited for their locks (or for
# the machine): its clock, read as it began, is read again once they are held.
READ_AGAIN_AFTER_SECONDS = 0.005
# The longest a call's own keys' limits may hold it past the fleet-wide limits' turn and still
# be reserved (see :func:`reserve`).
KEY_WAIT_RESERVED_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class Spend:
    """What one call spends of one limit (one row): ``cost`` units (1 per call, or the events
    it carries) of the ``capacity`` that any ``window`` seconds may hold."""

    key: str
    cost: int
    capacity: int
    window: float
    per_key: bool = False
    """A limit of one key (one tenant), not of the whole fleet."""


@dataclass(frozen=True, slots=True)
class Turn:
    """A reservation's answer: the call may start ``wait`` seconds after the database's clock
    was read (reserved only when ``reserved``). ``asked_at`` and ``told_at``: the caller's
    ``time.monotonic()`` just before and just after that read, so that it can start no earlier
    than reserved (``told_at + wait``) and know how late it is (from ``asked_at + wait``)."""

    wait: float
    reserved: bool
    asked_at: float
    told_at: float


def reserve(
    conn: Connection, dialect: str, handler: str, spends: Sequence[Spend], *, max_wait: float
) -> Turn:
    """Reserve a call against a handler's limits: when, from now, it may start (0: at once).
    Nothing is reserved when that is further off than ``max_wait``.

    Each limit's row keeps the recent starts it counted (``starts``) and the earliest the next
    may start (``tat``: the last reserved start, or the end of a hold). A call may start at the
    earliest ``t`` not before that where the starts in ``(t - window, t]`` and its own cost fit
    the capacity; every limit then records it at the latest of its limits' ``t``. Reserved
    starts only move forwards, so no later reservation lands in an earlier one's window
    unseen. The rows are locked (``FOR UPDATE``, in key order; SQLite's transaction holds the
    write lock) until the transaction ends: sessions reserving at once are served one after
    the other, each after the other's reservation. The rows are locked and read, with the
    database's clock, in one statement; that clock is read as the statement begins, so a
    statement that took longer than :data:`READ_AGAIN_AFTER_SECONDS` (it waited for the locks)
    reads the rows and the clock again once it holds them, and a session that waited reserves
    from when it got them. A clock read up to that much before the locks were held is on the
    safe side: the caller's ``asked_at`` is taken before it, so the caller's lateness, counted
    from there, can only be overstated.
    """
    spends = _strictest(spends)
    keys = sorted({spend.key for spend in spends})
    asked_at = time.monotonic()
    rows = _lock_and_read(conn, dialect, handler, keys)
    told_at = time.monotonic()
    if told_at - asked_at > READ_AGAIN_AFTER_SECONDS:
        # The locking read waited (for another session's reservation, or the machine): its
        # clock, read as it began, is behind the locks by that much. Read again, the locks
        # held, so that the call is reserved from now rather than found late and reserved twice.
        asked_at = time.monotonic()
        rows = conn.execute(_windows(handler, keys)).all()
        told_at = time.monotonic()
    read_at = rows[0][3]
    now = _epoch(read_at)
    floors = {key: now if age is None else now - float(age) for key, _, age, _ in rows}
    logs = {key: _parse(text) for key, text, _, _ in rows}
    start = fleet_start = now
    for spend in spends:
        earliest = max(floors[spend.key], _earliest(logs[spend.key], spend, now))
        start = max(start, earliest)
        if not spend.per_key:
            fleet_start = max(fleet_start, earliest)
    wait = start - now
    fleet_wide = any(not spend.per_key for spend in spends)
    if wait > max_wait or (fleet_wide and start - fleet_start > KEY_WAIT_RESERVED_SECONDS):
        # A call that its own keys' limits hold back, beside fleet-wide ones, is not reserved:
        # its reserved start would become the fleet-wide limits' latest, and every other key's
        # call would queue behind it. It goes back for that long, and other keys' calls go on.
        return Turn(wait, False, asked_at, told_at)
    # The times are written from the clock read above, not from the update's: a process held
    # up between the two would otherwise put the next start that much later, every time.
    # One UPDATE for every row (each row's values chosen by its key), not one per row.
    starts, tats, untils = {}, {}, {}
    for spend in spends:
        entries = [(at, cost) for at, cost in logs[spend.key] if at > now - spend.window]
        entries.append((start, spend.cost))
        last = max(at for at, _ in entries)
        starts[spend.key] = literal(_format(entries, spend.window / GRAIN_PER_WINDOW), Text())
        tats[spend.key] = time_plus(read_at, _capped(max(floors[spend.key], start) - now))
        untils[spend.key] = time_plus(read_at, _capped(last + spend.window - now))
    conn.execute(
        update(_limits)
        .where(_limits.c.handler == handler, _limits.c.key.in_(keys))
        .values(
            starts=_by_key(starts),
            tat=_by_key(tats),
            starts_until=_by_key(untils),
        )
    )
    return Turn(wait, True, asked_at, told_at)


def hold_back(
    conn: Connection, dialect: str, handler: str, keys: Iterable[str], seconds: float
) -> None:
    """Let no call of these limits (a key's, for its ``Retry-After``) start for ``seconds``:
    each limit's next start (``tat``) becomes at least that far off; never brought forward.
    Locked as :func:`reserve` locks them."""
    keys = sorted(set(keys))
    if not keys:
        return
    _lock(conn, dialect, handler, keys)
    until = db_now_plus(_capped(seconds))
    conn.execute(
        update(_limits)
        .where(
            _limits.c.handler == handler,
            _limits.c.key.in_(keys),
            or_(_limits.c.tat.is_(None), _limits.c.tat < until),
        )
        .values(tat=until)
    )


def _lock(conn: Connection, dialect: str, handler: str, keys: Sequence[str]) -> None:
    """Lock the limits' rows, made first where missing."""
    _lock_and_read(conn, dialect, handler, keys)


def _lock_and_read(
    conn: Connection, dialect: str, handler: str, keys: Sequence[str]
) -> Sequence[Any]:
    """Lock the limits' rows (made first where missing) and read them: their windows, as
    :func:`_windows` reads them."""
    # The rows exist but for a limit's first reservation (or one of a key gone quiet long
    # enough for :func:`delete_idle_limits`): they are locked first, and made only when the
    # lock found fewer than asked for, not inserted again on every reservation.
    rows = conn.execute(_windows(handler, keys).with_for_update()).all()
    if len(rows) == len(keys):
        return rows
    made = [{"handler": handler, "key": key} for key in keys]
    # Twice at most: a row :func:`delete_idle_limits` removed between the insert and the lock
    # is inserted again (a removed row held no state: its window had passed).
    for _ in range(2):
        dialects.statements(dialect).insert_ignoring_duplicates(conn, _limits, made)
        rows = conn.execute(_windows(handler, keys).with_for_update()).all()
        if len(rows) == len(keys):
            break
    return rows


def _windows(handler: str, keys: Sequence[str]) -> Select[Any]:
    """The limits' rows in key order (two sessions locking them never wait on each other in
    turn): key, recent starts, seconds since the next start (``tat``), the database's clock.
    Its clock is read as the statement begins, before the locks it waits for."""
    return (
        select(_limits.c.key, _limits.c.starts, age_seconds(_limits.c.tat), db_now())
        .where(_limits.c.handler == handler, _limits.c.key.in_(keys))
        .order_by(_limits.c.key)
    )


def _by_key(values: Mapping[str, ColumnElement[Any]]) -> ColumnElement[Any]:
    """The value for each row of one UPDATE, chosen by the row's key."""
    return case(dict(values), value=_limits.c.key)


def _strictest(spends: Sequence[Spend]) -> list[Spend]:
    """One spend per row: two limits that share a row (the same unit, period and key) are kept
    as the stricter of the two."""
    kept: dict[str, Spend] = {}
    for spend in spends:
        other = kept.get(spend.key)
        if other is not None:
            spend = Spend(
                spend.key,
                max(spend.cost, other.cost),
                min(spend.capacity, other.capacity),
                max(spend.window, other.window),
                spend.per_key,
            )
        kept[spend.key] = spend
    return list(kept.values())


def _earliest(entries: list[tuple[float, int]], spend: Spend, now: float) -> float:
    """The earliest time at which ``spend`` fits its window, given the starts it holds
    (oldest first): the oldest starts must leave the window until the rest and the call's cost
    fit. A call costlier than the whole capacity waits for an empty window."""
    recent = [(at, cost) for at, cost in entries if at > now - spend.window]
    need = min(spend.cost, spend.capacity)
    held = sum(cost for _, cost in recent)
    earliest = now
    for at, cost in recent:
        if held + need <= spend.capacity:
            break
        held -= cost
        earliest = at + spend.window
    return earliest


def _format(entries: list[tuple[float, int]], grain: float) -> str:
    """The starts as text: ``grain base offset[xcost] ...``, each start rounded up to a grain
    (counted a little later than it was: never too early) and merged with its grain's."""
    merged: dict[int, int] = {}
    for at, cost in entries:
        index = math.ceil(at / grain)
        merged[index] = merged.get(index, 0) + cost
    base = min(merged)
    parts = [str(i - base) if c == 1 else f"{i - base}x{c}" for i, c in sorted(merged.items())]
    return " ".join([repr(grain), str(base), *parts])


def _parse(text: str | None) -> list[tuple[float, int]]:
    """The starts :func:`_format` wrote (oldest first); none for a row without (new, or kept
    by an older version, whose ``tat`` alone says when the next call may start)."""
    if not text:
        return []
    grain_text, base_text, *parts = text.split()
    grain, base = float(grain_text), int(base_text)
    entries = []
    for part in parts:
        offset, _, cost = part.partition("x")
        entries.append(((base + int(offset)) * grain, int(cost or 1)))
    return entries


def _epoch(now: Any) -> float:
    """A time the database returned, as Unix seconds (MariaDB and SQLite return UTC with no
    zone)."""
    assert isinstance(now, dt.datetime)
    return (now if now.tzinfo else now.replace(tzinfo=dt.UTC)).timestamp()


def _capped(seconds: float) -> float:
    """Seconds from now that every database stores an end for: a year at most."""
    return min(seconds, MAX_WAIT_SECONDS)


def delete_idle_limits(conn: Connection, idle_seconds: float) -> int:
    """Forget the limits whose next start and whose recent starts' window both passed more than
    ``idle_seconds`` ago (a tenant gone quiet): such a row holds no state, a reservation makes
    it again. Returns how many were deleted."""
    before = db_now_plus(-idle_seconds)
    return conn.execute(
        delete(_limits).where(
            _limits.c.tat < before,
            or_(_limits.c.starts_until.is_(None), _limits.c.starts_until < before),
        )
    ).rowcount


def window_usage(conn: Connection, handler: str, name: str, window: float) -> int:
    """What the last ``window`` seconds spent of a handler's limit row ``name`` (its recent
    starts, by the database clock); 0 for a row not there yet. One primary-key read."""
    row = conn.execute(
        select(_limits.c.starts, db_now()).where(
            _limits.c.handler == handler, _limits.c.key == name
        )
    ).first()
    if row is None:
        return 0
    now = _epoch(row[1])
    return sum(cost for at, cost in _parse(row[0]) if at > now - window)
