"""Real processes: a Kafka broker, Spark stream jobs as subprocesses (killed
with SIGKILL at named points), and read-back with plain Kafka consumers.

The fixtures; the helpers the tests share are in helpers.py."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from adpipe.local import kafka_broker, postgres
from adpipe.settings import Settings, load_settings

from tests.integration import on_hosts
from tests.integration.budget_helpers import BudgetEnv
from tests.integration.helpers import BROKER_ENV, Pipeline, close_dump_servers, make_pipeline, stop_warm_drivers


@pytest.fixture(scope="module", autouse=True)
def _sessions_closed() -> Iterator[None]:
    """A test file's table-dump session and warm load drivers end with it
    (each holds a metastore connection and a JVM)."""
    yield
    close_dump_servers()
    stop_warm_drivers()


@pytest.fixture(scope="session")
def broker() -> Iterator[Settings]:
    home = Path(BROKER_ENV["ADPIPE_HOME"])
    settings = load_settings(BROKER_ENV)
    kafka_broker.down(settings)
    shutil.rmtree(home, ignore_errors=True)
    kafka_broker.up(settings)
    yield settings
    kafka_broker.down(settings)


@pytest.fixture(scope="session")
def pg(broker: Settings) -> Iterator[Settings]:
    """A real PostgreSQL cluster (Debian's server) under the test home, with
    the project's databases created. Depends on ``broker`` so that the home
    is wiped before, not after, the cluster is initialised."""
    settings = load_settings(BROKER_ENV)
    postgres.down(settings)
    postgres.up(settings)
    yield settings
    postgres.down(settings)


@pytest.fixture
def hosts_base(request: pytest.FixtureRequest) -> Path:
    """The folder of a test's hosts on one machine (tests/integration/on_hosts.py)."""
    return on_hosts.base_for(request.node.name)


@pytest.fixture
def pipeline(broker: Settings, tmp_path: Path) -> Pipeline:
    return make_pipeline(tmp_path)


@pytest.fixture
def budget(pg: Settings, tmp_path: Path) -> BudgetEnv:
    """One test's budget service (test_budget, test_budget_faults)."""
    return BudgetEnv(pg, tmp_path)
