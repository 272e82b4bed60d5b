from __future__ import annotations

import pytest

from outbox import Outbox
from outbox.worker import Worker


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"concurrency": 0}, "concurrency must be >= 1, got 0"),
        ({"claims_in_flight": 0}, "claims_in_flight must be >= 1, got 0"),
        ({"distribute_every": 0}, "distribute_every must be > 0 seconds"),
    ],
)
def test_a_worker_refuses_options_below_their_minimum(option: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Worker(Outbox("sqlite://"), **option)  # type: ignore[arg-type]
