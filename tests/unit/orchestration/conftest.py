"""Fixtures of the DAG tests: a scratch AIRFLOW_HOME, and the DagBag of dags/."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from adpipe.settings import PROJECT_ROOT

from tests.conftest import TEST_HOME


@pytest.fixture(scope="module", autouse=True)
def airflow_home() -> Iterator[None]:
    """Airflow reads AIRFLOW_HOME when first imported: give it a scratch one."""
    home = TEST_HOME / "unit-airflow"
    home.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("AIRFLOW_HOME", "AIRFLOW__CORE__LOAD_EXAMPLES")}
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def dagbag():  # noqa: ANN201 - airflow's DagBag, imported late on purpose
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(PROJECT_ROOT / "dags"))
