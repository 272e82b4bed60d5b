"""The network tier runs the fault suite's servers, application and checker (tests/faults)."""

from tests.faults.conftest import (  # noqa: F401 - fixtures, found by name
    handled_dir,
    log_dir,
    private_cluster,
    private_database,
    private_mariadb,
    private_server,
)
