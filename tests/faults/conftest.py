"""Fixtures of the fault suite: private PostgreSQL and MariaDB servers, and fresh databases.

The servers are the suite's own (``tests/faults/_cluster.py``, ``_mariadb_server.py``) because
the tests restart them, crash them and cut their connections. Without the server binaries the
suite is skipped on a developer's machine and fails loudly when ``CI=true``, like every database
test.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults._cluster import ClusterUnavailableError, PrivateCluster
from tests.faults._mariadb_server import PrivateMariaDB
from tests.faults._workload import create_tables


def _unavailable(error: ClusterUnavailableError) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{error} (CI=true: fault tests must not skip)", pytrace=False)
    pytest.skip(str(error))


@pytest.fixture(scope="session")
def private_cluster() -> Iterator[PrivateCluster]:
    """A PostgreSQL server of the suite's own, started for the session, removed at its end."""
    try:
        cluster = PrivateCluster()
    except ClusterUnavailableError as error:
        _unavailable(error)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def private_mariadb() -> Iterator[PrivateMariaDB]:
    """A MariaDB server of the suite's own, started for the session, removed at its end."""
    try:
        server = PrivateMariaDB()
    except ClusterUnavailableError as error:
        _unavailable(error)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["postgresql", "mariadb"])
def private_server(request: pytest.FixtureRequest) -> PrivateCluster | PrivateMariaDB:
    """A database server of the suite's own, of each kind: PostgreSQL and MariaDB."""
    name = "private_cluster" if request.param == "postgresql" else "private_mariadb"
    server: PrivateCluster | PrivateMariaDB = request.getfixturevalue(name)
    return server


@pytest.fixture
def private_database(private_server: PrivateCluster | PrivateMariaDB) -> Iterator[str]:
    """A fresh database with outbox's and the fault app's tables on each private server."""
    name = f"faults_{uuid.uuid4().hex[:10]}"
    url = private_server.create_database(name)
    create_tables(url)
    try:
        yield url
    finally:
        private_server.drop_database(name)


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
