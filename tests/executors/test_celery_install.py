"""``outbox.executors.celery.install``: what it adds to a Celery application (three tasks on a
queue of their own, two beat entries) and nothing else, and what it refuses."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from sqlalchemy.ext.asyncio import create_async_engine

from outbox import Batch, Outbox
from outbox.executors.celery import (
    BEAT_ENTRIES,
    BEAT_SENDS_PER_TICK,
    DISTRIBUTE_TASK,
    RESCUE_TASK,
    RUN_JOB_TASK,
    CeleryExecutor,
    install,
)
from tests.models import ActivityEvent


def _celery() -> Celery:
    """An application as a shop configures it: routes, a default queue, a schedule of its own."""
    app = Celery("shop", broker="memory://", set_as_current=False)
    app.conf.update(
        task_default_queue="shop",
        task_routes={"shop.*": {"queue": "shop-slow"}},
        task_acks_late=True,
        worker_prefetch_multiplier=8,
        beat_schedule={"shop.report": {"task": "shop.report", "schedule": 60.0}},
    )
    return app


def _outbox() -> Outbox:
    app = Outbox("sqlite://")

    @app.handler(ActivityEvent)
    def record(batch: Batch[ActivityEvent]) -> None:
        """Nothing."""

    return app


def _settings(app: Celery) -> dict[str, Any]:
    """A copy of every setting, each dict copied (the beat schedule is changed in place)."""
    return {k: dict(v) if isinstance(v, dict) else v for k, v in app.conf.items()}


def test_install_changes_no_setting_but_adds_outboxs_beat_entries() -> None:
    """Every setting is as it was, and the beat schedule gains exactly outbox's two entries,
    the application's own kept."""
    celery = _celery()
    before = _settings(celery)
    install(celery, _outbox())
    after = _settings(celery)
    schedule = after.pop("beat_schedule")
    assert before.pop("beat_schedule") == {
        k: v for k, v in schedule.items() if k not in BEAT_ENTRIES
    }
    assert before == after
    assert set(BEAT_ENTRIES) == set(schedule) - {"shop.report"}


def test_install_routes_its_messages_to_its_queue_by_their_own_options() -> None:
    """The beat entries name the queue, and a job's message goes to it; the app's routes and
    default queue are untouched."""
    celery = _celery()
    executor = install(celery, _outbox(), queue="outbox-q")
    executor.publish(42)
    with celery.connection_for_read() as conn:
        message = conn.SimpleQueue("outbox-q").get(timeout=1)
    entries = [celery.conf.beat_schedule[name] for name in BEAT_ENTRIES]
    assert ["outbox-q"] * 2 == [entry["options"]["queue"] for entry in entries]
    assert (RUN_JOB_TASK, [42]) == (message.headers["task"], message.decode()[0])


def test_install_keeps_no_results() -> None:
    """outbox's tasks write nothing to the application's result backend."""
    celery = _celery()
    install(celery, _outbox())
    tasks = [celery.tasks[name] for name in (RUN_JOB_TASK, DISTRIBUTE_TASK, RESCUE_TASK)]
    assert [True] * 3 == [task.ignore_result for task in tasks]


def test_install_schedules_distribution_and_rescue_as_asked() -> None:
    """The rescue's beat entry comes every ``rescue_every``, the distribution's
    ``BEAT_SENDS_PER_TICK`` times every ``distribute_every``."""
    celery = _celery()
    executor = install(celery, _outbox(), distribute_every=2.5, rescue_every=7.0)
    schedule = celery.conf.beat_schedule
    assert isinstance(executor, CeleryExecutor)
    assert (2.5 / BEAT_SENDS_PER_TICK, 7.0) == (
        schedule[DISTRIBUTE_TASK]["schedule"],
        schedule[RESCUE_TASK]["schedule"],
    )


def test_rescue_every_defaults_to_the_apps_rescue_interval() -> None:
    """Without ``rescue_every``, the rescue runs every ``Settings.rescue_interval``."""
    outbox = _outbox()
    executor = install(_celery(), outbox)
    assert outbox.settings.rescue_interval == executor.rescue_every


def test_install_refuses_what_is_not_a_celery_application() -> None:
    """A module, a string: refused, naming the argument."""
    with pytest.raises(TypeError, match=r"celery_app must be a celery\.Celery application"):
        install("shop.tasks:celery", _outbox())  # type: ignore[arg-type]


def test_install_refuses_an_async_engine_for_the_outbox() -> None:
    """An ``AsyncEngine`` where the ``Outbox`` goes: refused, naming the argument."""
    engine = create_async_engine("sqlite+aiosqlite://")
    with pytest.raises(TypeError, match=r"outbox_app must be an outbox\.Outbox"):
        install(_celery(), engine)  # type: ignore[arg-type]


@pytest.mark.parametrize("seconds", [0, -1.0, float("nan"), float("inf"), True, "1"])
def test_install_refuses_a_period_that_is_not_seconds(seconds: object) -> None:
    """``distribute_every`` of zero, negative, NaN, infinite or not a number: refused."""
    with pytest.raises(ValueError, match=r"distribute_every must be 0\.001 to 604800 seconds"):
        install(_celery(), _outbox(), distribute_every=seconds)  # type: ignore[arg-type]


def test_install_refuses_an_empty_queue_name() -> None:
    """A blank queue: refused, naming it."""
    with pytest.raises(ValueError, match="queue must be a queue's name"):
        install(_celery(), _outbox(), queue=" ")


def test_install_refuses_a_handler_the_app_does_not_have() -> None:
    """An unknown handler name is refused where it is passed."""
    with pytest.raises(Exception, match="nope"):
        install(_celery(), _outbox(), handlers=["nope"])


def test_install_twice_on_one_celery_application_is_refused() -> None:
    """Outbox's task names are taken by the first install: a second is refused."""
    celery = _celery()
    install(celery, _outbox())
    with pytest.raises(ValueError, match="already installed"):
        install(celery, _outbox())
