"""Shared test set-up. Integration fixtures start a real Kafka broker (KRaft)
on their own ports and home, so they never touch a developer's broker."""

from __future__ import annotations

import pytest
from adpipe.settings import PROJECT_ROOT

TEST_HOME = PROJECT_ROOT / ".adpipe-test"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in item.nodeid.split("/"):
            item.add_marker(pytest.mark.integration)
