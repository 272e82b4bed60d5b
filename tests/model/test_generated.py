"""Generated handler behaviour against the reference model, with a real worker on every database.

Each case (:mod:`tests.model._cases`) registers a handler with generated options, writes a few
events and plays a generated script of calls (return after ``retry``/``discard`` of some events,
raise, ``RetryAfter`` with every kind of value, ...) through a real one-thread worker, the loop
of ``outbox.testing.drain`` polling until nothing more is due. The checker
(:mod:`tests.model._model`) then holds every recorded call and where every event ended against
the documented contract. A failing case is printed as the ``Case(...)`` that reproduces it: it
goes to ``test_regressions.py`` under a name.
"""

from __future__ import annotations

from hypothesis import given, note, seed

from tests.model._behaviour import Case
from tests.model._cases import Profile, budget, cases
from tests.model._run import run_case
from tests.model._settings import MODEL, SEED
from tests.model.conftest import Target


def _run(target: Target, case: Case, *, window_slack: int) -> None:
    note(f"seed {SEED} (OUTBOX_MODEL_SEED), on {target.name}; the case:\n{case!r}")
    _, checker, final = run_case(
        target.url, case, budget=budget(case), admin_url=target.admin_url, window_slack=window_slack
    )
    checker.check(final)


@MODEL
@seed(SEED)
@given(case=cases(Profile.CORE))
def test_core_cases_keep_the_contract(target: Target, case: Case) -> None:
    """Values the documentation gave a meaning before the contract; a rate-limit window may
    still hold one call over the limit (the exact windows are the contract's)."""
    _run(target, case, window_slack=1)


@MODEL
@seed(SEED)
@given(case=cases(Profile.CONTRACT))
def test_contract_cases_keep_the_contract(target: Target, case: Case) -> None:
    """Every value the contract decides, rate-limit windows exact."""
    _run(target, case, window_slack=0)
