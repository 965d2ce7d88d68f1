"""The hosts harness (tests/hosts.py) in pytest: a skip that says loudly why
the hosts cannot be made here, and the hosts of a test, removed after it."""

from __future__ import annotations

import logging
import re
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests import hosts
from tests.conftest import TEST_HOME

log = logging.getLogger("adpipe.tests.hosts")


def skip(reason: str) -> None:
    message = f"HOSTS ON ONE MACHINE NOT TESTED: {reason}"
    log.warning(message)
    warnings.warn(message, pytest.PytestWarning, stacklevel=2)
    pytest.skip(message)


def base_for(node_name: str) -> Path:
    """A folder of its own for a test's hosts, outside /tmp (each host has
    its own /tmp); the previous run's is removed, this one's kept for a
    post-mortem. Skips when hosts cannot be made here."""
    reason = hosts.unavailable_reason()
    if reason is not None:
        skip(reason)
    base = TEST_HOME / "hosts" / re.sub(r"[^A-Za-z0-9_.-]", "_", node_name)
    shutil.rmtree(base, ignore_errors=True)
    return base


@contextmanager
def made_hosts(base: Path, names: list[str]) -> Iterator[hosts.Hosts]:
    net = hosts.Hosts(base, names)
    try:
        net.up()
    except hosts.HostsUnavailable as exc:
        skip(str(exc))
    try:
        yield net
    finally:
        net.down()
