"""Fixtures of the fault suite: a private PostgreSQL cluster, and fresh databases on it.

The cluster is the suite's own (``tests/faults/_cluster.py``) because the tests restart it,
crash it and terminate its connections. Without the PostgreSQL server binaries the suite is
skipped on a developer's machine and fails loudly when ``CI=true``, like every database test.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults._cluster import ClusterUnavailableError, PrivateCluster
from tests.faults._workload import create_tables


@pytest.fixture(scope="session")
def private_cluster() -> Iterator[PrivateCluster]:
    """A PostgreSQL server of the suite's own, started for the session, removed at its end."""
    try:
        cluster = PrivateCluster()
    except ClusterUnavailableError as error:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{error} (CI=true: fault tests must not skip)", pytrace=False)
        pytest.skip(str(error))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def fault_database(private_cluster: PrivateCluster) -> Iterator[str]:
    """A fresh database on the private cluster with outbox's and the fault app's tables."""
    name = f"faults_{uuid.uuid4().hex[:10]}"
    url = private_cluster.create_database(name)
    create_tables(url)
    try:
        yield url
    finally:
        private_cluster.drop_database(name)


@pytest.fixture
def handled_dir(tmp_path: Path) -> Path:
    """Where the fault app's handler writes its deliveries."""
    path = tmp_path / "handled"
    path.mkdir()
    return path


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    """Where the ``outbox`` commands of a test write their stdout and stderr."""
    path = tmp_path / "logs"
    path.mkdir()
    return path
