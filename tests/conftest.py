"""Shared test set-up. Integration fixtures start a real Kafka broker (KRaft)
on their own ports and home, so they never touch a developer's broker."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from adpipe.settings import PROJECT_ROOT

# The helpers modules' asserts explain a failure as a test's own do (pytest
# rewrites test modules and conftests only, unless told before the import).
pytest.register_assert_rewrite("tests.integration.helpers", "tests.unit.helpers")

# Two suites may run side by side (e.g. while developing) when each sets its
# own ADPIPE_TEST_HOME and ADPIPE_TEST_PORT_BASE (Kafka, controller, PostgreSQL).
# Under pytest-xdist each worker is such a suite: worker gwN (N > 0) has the
# home ``<home>-gwN`` and ports 1,000 N higher (a suite uses base .. base+299),
# so two workers each run integration files on a broker of their own.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
_HOME = Path(os.environ.get("ADPIPE_TEST_HOME") or PROJECT_ROOT / ".adpipe-test").resolve()
TEST_HOME = _HOME if _WORKER == 0 else _HOME.with_name(f"{_HOME.name}-gw{_WORKER}")
PORT_BASE = int(os.environ.get("ADPIPE_TEST_PORT_BASE", "19092")) + 1000 * _WORKER
# The tests' JVMs (Spark drivers, the broker) are short-lived on few cores:
# C1 only spends about a third less CPU per stream run (adpipe.settings).
# C1's code cache is smaller, and a driver that runs many Great Expectations
# checks filled it ("Out of space in CodeCache for adapters"): 256 MB, as
# the JVM reserves by default with both compilers.
JVM_OPTIONS = os.environ.get("ADPIPE_TEST_JVM_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m")


# The integration files that take minutes, longest first: each file's
# tests' summed --durations in the one suite where they take longest (make
# test, make test-long or make test-extended; 2026-11-29). Under pytest -n 2
# (the Makefile passes --no-loadscope-reorder) they start first and the
# short files and unit tests fill the workers' ends: a long file started
# last would keep one worker busy alone. Any order is correct.
LONGEST_FIRST = (
    "test_load_by_arrival",  # 955 s (extended)
    "test_revisions_load",  # 450 s in make test-long
    "test_airflow_ui",  # 405 s
    "test_held_hours",  # 375 s
    "test_exactly_once",  # 330 s
    "test_dags",  # 330 s in make test-long, 50 s in make test, 190 s (extended)
    "test_airflow_scheduler",  # 325 s (extended)
    "test_chaos",  # 290 s (extended)
    "test_union_and_load",  # 245 s
    "test_airflow_hosts",  # 240 s in make test-long
    "test_two_homes_load",  # 300 s (extended)
    "test_restamped_retries",  # 205 s
    "test_connect_load",  # 200 s
    "test_spark_cluster",  # 195 s (extended)
    "test_past_retention",  # 180 s
    "test_hdfs",  # 170 s (extended)
    "test_demo_secrets",  # 155 s (extended)
    "test_hosts_leadership",  # 70 s in make test-long, 70 s (extended), 9 s in make test
    "test_revisions",  # 130 s
    "test_connect_hosts",  # 100 s in make test-long
    "test_metrics",  # 125 s (extended)
    "test_airflow_rails",  # 95 s in make test-long, 50 s in make test
    "test_budget_revisions",  # 90 s
    "test_budget",  # 75 s
    "test_kafka_cluster",  # 70 s
    "test_late_dedupe",  # 70 s
    "test_hour_closed",  # 70 s
    "test_watermark_alignment",  # 65 s in make test, 35 s in make test-long
    "test_budget_faults",  # 65 s (extended), 50 s in make test
    "test_ledger",  # 60 s
    "test_hostile_input",  # 60 s
    "test_secure_broker",  # 60 s
    "test_upgrade",  # 50 s
    "test_maintenance",  # 50 s
    "test_hour_deadline",  # 45 s
)

def chromium() -> str:
    """The browser of the ``ui`` tests: ``/usr/bin/chromium`` (Debian's, which
    ``make deps-ui`` installs) or ``ADPIPE_TEST_CHROMIUM``. Missing, the test
    fails saying how to get it: a browser test never passes unseen."""
    path = os.environ.get("ADPIPE_TEST_CHROMIUM", "/usr/bin/chromium")
    if not Path(path).exists():
        pytest.fail(f"no Chromium at {path}: `make deps-ui` installs Debian's (or set ADPIPE_TEST_CHROMIUM)")
    return path


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_overlap(base: int, ports: int = 300, range_file: Path = EPHEMERAL_RANGE) -> str | None:
    """Why a suite's ports ``base .. base + ports`` are unsafe, or None: the
    kernel hands ports of its ephemeral range to outgoing connections, so a
    broker or PostgreSQL of the suite may find its port taken ("Address
    already in use")."""
    try:
        low, high = (int(n) for n in range_file.read_text().split())
    except (OSError, ValueError):
        return None
    if base < high and base + ports > low:
        return (
            f"ADPIPE_TEST_PORT_BASE={base - 1000 * _WORKER}: this suite's ports {base}-{base + ports - 1} fall in "
            f"the kernel's ephemeral range {low}-{high}, where outgoing connections take ports; pick a base below "
            f"{low - 2000} (the default is 19092)"
        )
    return None


def pytest_configure(config: pytest.Config) -> None:
    why = ephemeral_overlap(PORT_BASE)
    if why is not None:
        raise pytest.UsageError(why)


def pytest_report_header() -> str:
    """The free disk under the test home, first in the run's output: a
    nearly full disk fails tests far from its cause (a CI run's HDFS test
    failed at its first file with a little over 1 GB free)."""
    probe = next(p for p in (_HOME, *_HOME.parents) if p.exists())
    free_gb = shutil.disk_usage(probe).free / 2**30
    low = "  LOW: the brokers, Spark and HDFS of the suite write gigabytes" if free_gb < 5 else ""
    return f"free disk under {_HOME}: {free_gb:.1f} GB{low}"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in item.nodeid.split("/"):
            item.add_marker(pytest.mark.integration)
            # Under `pytest -n N --dist loadgroup` (make test) a file's tests
            # run on one worker, in order, on that worker's broker and
            # PostgreSQL; the files and the unit tests are shared out.
            item.add_marker(pytest.mark.xdist_group(f"integration-{item.path.stem}"))
    rank = {stem: n for n, stem in enumerate(LONGEST_FIRST)}
    # Stable: a file's tests keep their order, as does everything unranked.
    unranked = len(rank)
    items.sort(key=lambda item: rank.get(item.path.stem, unranked) if item.get_closest_marker("integration")
               else unranked)
