"""Unit-test fixtures: one local SparkSession for the whole session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from adpipe.settings import load_settings
from adpipe.spark import build_spark
from pyspark.sql import SparkSession

from tests.conftest import JVM_OPTIONS, TEST_HOME

# One home per xdist worker: each has a Spark session of its own.
UNIT_HOME = TEST_HOME / f"unit-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    settings = load_settings({"ADPIPE_HOME": str(UNIT_HOME), "ADPIPE_JVM_OPTIONS": JVM_OPTIONS})
    session = build_spark(settings, "adpipe-unit-tests")
    yield session
    session.stop()
