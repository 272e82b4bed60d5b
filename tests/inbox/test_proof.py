"""The inbox's proof on a real broker: deliveries through RabbitMQ, a fifth of them of an id
delivered before, consumers SIGKILLed at random and between their commit and their ack, and no
message has a second effect, on SQLite, PostgreSQL and MariaDB.

The harness is ``benchmarks/inbox.py`` (its docstring says how it runs); the test run's small
size is 20,000 deliveries, 2 consumers and 2 kills per database. ``OUTBOX_FULL_RUN=1`` adds the
full size: 1,000,000 deliveries, 4 consumers, 20 kills (the figures in benchmarks/RESULTS.md).
"""

from __future__ import annotations

import random
from typing import Any
from urllib.parse import urlsplit

import pytest

from benchmarks.inbox import RABBITMQ_URL, Options, Proof, prove
from tests.sinks._contract import require_service


def _outcome(proof: Proof) -> dict[str, Any]:
    effects, deliveries = proof.effects, proof.deliveries
    return {
        "lost": effects["lost"],
        "ids with two effects": effects["ids_with_two_effects"],
        "effect rows": effects["effect_rows"],
        "ids in the inbox": effects["inbox_ids"],
        "handler runs": deliveries["handler_runs"],
        "left in the queue": proof.queue_left,
        "pruned": proof.prune["deleted"],
        "kept after the prune": proof.prune["left"],
    }


def _proved(database_url: str, options: Options) -> None:
    parts = urlsplit(RABBITMQ_URL)
    require_service("RabbitMQ", parts.hostname or "127.0.0.1", parts.port or 5672)
    proof = prove(database_url, options)
    distinct = options.distinct
    print(f"\n{proof.database}: {proof.deliveries}, {len(proof.kills)} kills, {proof.seconds} s")
    assert {
        "lost": 0,
        "ids with two effects": 0,
        "effect rows": distinct,
        "ids in the inbox": distinct,
        "handler runs": distinct,
        "left in the queue": 0,
        "pruned": distinct,
        "kept after the prune": 0,
    } == _outcome(proof)
    # The faults happened: every kill, one of them between a commit and its ack, whose batch
    # the broker delivered again, marked, and had no effect; published repeats had none.
    assert options.kills == len(proof.kills)
    assert any(kill.between_commit_and_ack for kill in proof.kills)
    assert proof.deliveries["redelivered_without_effect"] > 0
    assert proof.deliveries["published_repeats_without_effect"] > 0
    assert proof.deliveries["redeliveries"] >= options.repeats


@pytest.mark.timeout(120)
def test_redelivered_messages_have_no_second_effect(database_url: str) -> None:
    """20,000 deliveries, a fifth repeated, two consumers killed: each id has one effect."""
    options = Options(
        deliveries=20_000, consumers=2, kills=2, hold=0.5, seed=random.randrange(1 << 30)
    )
    _proved(database_url, options)


@pytest.mark.timeout(3600)
def test_a_million_deliveries_have_no_second_effect(database_url: str) -> None:
    """1,000,000 deliveries, a fifth repeated, four consumers, twenty kills: each id has one
    effect."""
    options = Options(deliveries=1_000_000, consumers=4, kills=20, seed=random.randrange(1 << 30))
    _proved(database_url, options)
