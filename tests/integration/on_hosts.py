"""The hosts harness (adpipe.tools.hosts) in pytest: a skip that says loudly why
the hosts cannot be made here, and the hosts of a test, removed after it."""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from adpipe.tools import hosts

from tests.conftest import TEST_HOME
from tests.integration.helpers import BROKER_ENV

log = logging.getLogger("adpipe.tests.hosts")

# The services host's ports: each host has its own, so any number is free there.
KAFKA_PORT = 9092
PG_PORT = 5432


def skip(reason: str) -> None:
    message = f"HOSTS ON ONE MACHINE NOT TESTED: {reason}"
    log.warning(message)
    warnings.warn(message, pytest.PytestWarning, stacklevel=2)
    pytest.skip(message)


def hosts_root() -> Path:
    """Where the tests' hosts keep their folders: ``TEST_HOME/hosts``, or,
    with the test home under /tmp (a clone in ``mktemp -d``), a folder of
    /var/tmp named after it: each host binds a /tmp of its own."""
    return hosts.outside_tmp(TEST_HOME / "hosts")


def base_for(node_name: str) -> Path:
    """A folder of its own for a test's hosts, outside /tmp (each host has
    its own /tmp); the previous run's is removed, this one's kept for a
    post-mortem. Skips when hosts cannot be made here."""
    reason = hosts.unavailable_reason()
    if reason is not None:
        skip(reason)
    base = hosts_root() / re.sub(r"[^A-Za-z0-9_.-]", "_", node_name)
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


def services_env(net: hosts.Hosts) -> dict[str, str]:
    """The settings that reach the services host's Kafka and PostgreSQL, for
    every process of the test's hosts and for the test itself."""
    services = net.services
    return {"ADPIPE_KAFKA_BOOTSTRAP": f"{services.ip}:{KAFKA_PORT}",
            "ADPIPE_KAFKA_CONTROLLER_PORT": str(KAFKA_PORT + 1),
            "ADPIPE_PG_HOST": services.ip, "ADPIPE_PG_PORT": str(PG_PORT)}


def start_services(net: hosts.Hosts) -> dict[str, str]:
    """``adpipe kafka up`` and ``adpipe pg up`` on the services host, its
    PostgreSQL letting in the hosts of its subnet and the test's end of its
    own link; returns :func:`services_env`."""
    reach = services_env(net)
    env = net.services.env({**os.environ, **BROKER_ENV, **reach,
                            "ADPIPE_PG_CLIENTS": f"samenet,{net.root_address}/32"})
    for verb in ("kafka", "pg"):
        up = net.services.run([sys.executable, "-m", "adpipe", verb, "up"], env=env, timeout=300)
        assert up.returncode == 0, up.stdout[-3000:] + up.stderr[-3000:]
    return reach
