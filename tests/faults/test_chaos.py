"""The chaos smoke run: 30 seconds of seeded faults against a fleet of workers, then the checker.

The long tier is ``nox -s chaos`` (docs/reliability.md); this one runs in CI with a fixed seed
and a modest event count.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults._cluster import PrivateCluster
from tests.faults.chaos import ChaosConfig, run

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]

SEED = 20261122


def test_chaos_smoke_run_violates_no_invariant(
    private_cluster: PrivateCluster, tmp_path: Path
) -> None:
    """Kills, cut connections, database restarts and zombies: nothing lost, phantom or stuck."""
    config = ChaosConfig(seed=SEED, duration=30, events=3000, drain_timeout=90)

    result = run(config, cluster=private_cluster, workdir=tmp_path)

    assert {} == result.failures, f"seed {SEED}: {result.report.summary()}"
