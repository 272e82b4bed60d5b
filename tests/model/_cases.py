"""Hypothesis strategies for cases: handler options, events and a script of calls.

Two profiles. ``CORE`` uses the values whose meaning the documentation gave before the
handler-outcome contract: waits of at least the 1 s floor, ``str`` reasons, one kind of op per
call. ``CONTRACT`` adds everything the contract decides: waits of 0, negative, under the floor,
past HTTP dates and garbage text, other types of ``after``, reasons of every type, events
given as a ``str``, one event both retried and discarded, ``DataError`` and ``DownstreamError``.

Deferrals wait at least a second each, so a case holds at most ``MAX_DEFERRING_CALLS`` calls
that defer; its time budget (:func:`budget`) follows from its waits.
"""

from __future__ import annotations

from enum import StrEnum

from hypothesis import strategies as st

from tests.model._behaviour import Case, Setup
from tests.model._model import (
    After,
    AfterKind,
    Call,
    CallKind,
    Op,
    OpKind,
    Pick,
    ReasonKind,
    Refused,
    Wait,
    wait_for,
)

MAX_DEFERRING_CALLS = 2
MAX_CALLS = 8
MAX_BUDGET_SECONDS = 12.0


class Profile(StrEnum):
    CORE = "core"
    CONTRACT = "contract"


def _afters(profile: Profile) -> st.SearchStrategy[After]:
    valid = st.one_of(
        st.builds(After, st.just(AfterKind.SECONDS), st.sampled_from([1.0, 1.2, 1.5])),
        st.builds(After, st.just(AfterKind.TIMEDELTA), st.sampled_from([1.0, 1.3])),
        st.builds(After, st.just(AfterKind.AWARE), st.sampled_from([1.2, 1.5])),
        st.builds(After, st.just(AfterKind.HTTP_DATE), st.sampled_from([1.0, 1.5])),
        st.builds(After, st.just(AfterKind.TEXT_SECONDS), st.sampled_from([1.0, 1.4])),
    )
    refused = st.one_of(
        st.just(After(AfterKind.NAIVE, 1.0)),
        st.just(After(AfterKind.SECONDS, 1e9)),  # over a year
    )
    if profile is Profile.CORE:
        return st.one_of(valid, refused)
    floored = st.one_of(
        st.builds(After, st.just(AfterKind.SECONDS), st.sampled_from([0.0, -3.0, 0.3])),
        st.just(After(AfterKind.HTTP_DATE, -5.0)),  # in the past
        st.just(After(AfterKind.TEXT_SECONDS, 0.0)),
    )
    odd = st.sampled_from(
        [After(AfterKind.GARBAGE), After(AfterKind.BOOL, 1.0), After(AfterKind.LIST, 1.0)]
    )
    return st.one_of(valid, refused, floored, odd)


def _reasons(profile: Profile, *, optional: bool) -> st.SearchStrategy[ReasonKind | None]:
    if profile is Profile.CORE:
        return st.sampled_from([ReasonKind.STR, None] if optional else [ReasonKind.STR])
    return st.sampled_from([ReasonKind.STR, None, *ReasonKind])


def _ops(profile: Profile) -> st.SearchStrategy[tuple[Op, ...]]:
    picks = [Pick.FIRST, Pick.LAST, Pick.ALL, Pick.STRANGER]
    if profile is Profile.CONTRACT:
        picks.append(Pick.TEXT)
    reasons = _reasons(profile, optional=False).map(lambda r: r or ReasonKind.NONE)
    retry = st.builds(
        Op,
        st.just(OpKind.RETRY),
        st.sampled_from(picks),
        reasons,
        st.one_of(st.none(), _afters(profile)),
    )
    discard = st.builds(Op, st.just(OpKind.DISCARD), st.sampled_from(picks), reasons)
    if profile is Profile.CORE:  # one kind of op per call: the contract decides mixes
        return st.one_of(
            st.lists(retry, max_size=3).map(tuple), st.lists(discard, max_size=2).map(tuple)
        )
    return st.lists(st.one_of(retry, discard), max_size=3).map(tuple)


def _calls(profile: Profile, setup: Setup) -> st.SearchStrategy[Call]:
    kinds = [CallKind.RAISE, CallKind.BAD_STR, CallKind.SYSTEM_EXIT]
    if profile is Profile.CONTRACT:
        kinds += [CallKind.DATA_ERROR, CallKind.DOWNSTREAM_ERROR]
    if setup.timeout is not None:
        kinds.append(CallKind.SLOW)
    return st.one_of(
        st.builds(Call, st.just(CallKind.RETURN), _ops(profile)),
        st.builds(Call, st.sampled_from(kinds)),
        st.builds(
            Call,
            st.just(CallKind.RETRY_AFTER),
            st.just(()),
            _afters(profile),
            _reasons(profile, optional=True),
        ),
    )


def _setups() -> st.SearchStrategy[Setup]:
    @st.composite
    def build(draw: st.DrawFn) -> Setup:
        keys = draw(st.integers(0, 3))
        rate = draw(st.sampled_from([None, None, 3.0, 5.0]))
        return Setup(
            events=draw(st.integers(1, 8)),
            keys=keys,
            batch_size=draw(st.integers(1, 4)),
            max_attempts=draw(st.integers(1, 4)),
            max_deferrals=draw(st.sampled_from([0, 1, 2, 100])),
            bisect=draw(st.booleans()),
            ordered=keys > 0 and draw(st.booleans()),
            grouped=keys > 0 and draw(st.booleans()),
            rate_limit=rate,
            per_key=rate is not None and keys > 0 and draw(st.booleans()),
            breaker=draw(
                st.one_of(
                    st.none(),
                    st.tuples(st.integers(1, 3), st.sampled_from([0.5, 1.0])),
                )
            ),
            expires_after=draw(st.sampled_from([None, None, None, 3.0])),
            timeout=draw(st.sampled_from([None, None, 0.6])),
            is_async=draw(st.booleans()),
            archive=draw(st.booleans()),
        )

    return build()


def _deferring(call: Call) -> float:
    """The seconds of the waits a call asks for (0 when it defers nothing)."""
    afters = [call.after] if call.kind is CallKind.RETRY_AFTER else [o.after for o in call.ops]
    waits = [wait_for(a) for a in afters if a is not None]
    return max((w.seconds for w in waits if isinstance(w, Wait)), default=0.0)


def cases(profile: Profile) -> st.SearchStrategy[Case]:
    """Cases of ``profile``, with at most ``MAX_DEFERRING_CALLS`` calls that defer."""

    @st.composite
    def build(draw: st.DrawFn) -> Case:
        setup = draw(_setups())
        calls = draw(st.lists(_calls(profile, setup), max_size=MAX_CALLS))
        deferring = [c for c in calls if _deferring(c) > 0]
        if len(deferring) > MAX_DEFERRING_CALLS:
            extra = {id(c) for c in deferring[MAX_DEFERRING_CALLS:]}
            calls = [c for c in calls if id(c) not in extra]
        return Case(setup, tuple(calls))

    return build()


def budget(case: Case) -> float:
    """Seconds a case may run: its work, its waits (a wait past the budget is checked as
    scheduled, not waited for), the breaker's pauses."""
    s = case.setup
    seconds = 3.0 + sum(min(_deferring(c), 2.0) * 1.1 for c in case.calls)
    if s.rate_limit:
        seconds += (s.events + len(case.calls)) / s.rate_limit
    if s.breaker:
        seconds += 3 * s.breaker[1]
    if s.timeout:
        seconds += sum(1.0 for c in case.calls if c.kind is CallKind.SLOW)
    return min(seconds, MAX_BUDGET_SECONDS)


_ = Refused  # re-exported for the tests' readers
