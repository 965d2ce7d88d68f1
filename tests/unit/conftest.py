"""Unit-test fixtures: one local SparkSession for the whole session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from adpipe.settings import PROJECT_ROOT, load_settings
from adpipe.spark import build_spark
from pyspark.sql import SparkSession

UNIT_HOME = PROJECT_ROOT / ".adpipe-test" / "unit"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = build_spark(load_settings({"ADPIPE_HOME": str(UNIT_HOME)}), "adpipe-unit-tests")
    yield session
    session.stop()
