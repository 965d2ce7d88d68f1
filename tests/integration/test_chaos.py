"""`adpipe chaos`, the short version: two thousand events and eight faults
(SIGKILL and SIGSTOP of the stream driver, SIGKILL of a budget instance and
of a load, SIGKILL of the broker and of the transaction coordinator) on a
broker of its own, then the independent check; and a short run across two
hosts of this machine (``--hosts 2``: namespaces, root) with hosts cut off
and killed among its faults. The three-broker, standalone-Spark run of the
README is `make chaos`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from adpipe.local import kafka_broker
from adpipe.settings import Settings, load_settings

from tests.conftest import JVM_OPTIONS, PORT_BASE, TEST_HOME

CHAOS_ENV = {
    "ADPIPE_HOME": str(TEST_HOME / "chaos"),
    "ADPIPE_KAFKA_BOOTSTRAP": f"127.0.0.1:{PORT_BASE + 40}",
    "ADPIPE_KAFKA_CONTROLLER_PORT": str(PORT_BASE + 41),
    "ADPIPE_PG_PORT": str(PORT_BASE + 2),  # the session's PostgreSQL
    "ADPIPE_JVM_OPTIONS": JVM_OPTIONS,
    "ADPIPE_SPARK_MASTER": "local[2]",
}
# A seed whose schedule of eight faults holds every kind of part this set-up
# has, and two broker faults (each one, with a single broker, stops all).
SEED = 10


@pytest.fixture
def own_broker(pg: Settings) -> Iterator[Settings]:
    """A broker of its own: the run kills and restarts it."""
    settings = load_settings(CHAOS_ENV)
    kafka_broker.down(settings)
    shutil.rmtree(settings.home, ignore_errors=True)
    kafka_broker.up(settings)
    try:
        yield settings
    finally:
        kafka_broker.down(settings)


# About 290 s, the longest of make test's: make test-extended, beside `make chaos`
# itself (the harness's fault accounting and verdict are unit-tested in make test).
@pytest.mark.slow
@pytest.mark.extended
def test_short_chaos_run_loses_and_doubles_nothing(own_broker: Settings) -> None:
    log_path = own_broker.home / "chaos.log"
    with log_path.open("w") as log:
        proc = subprocess.run(
            [sys.executable, "-m", "adpipe", "chaos", "--events", "2000", "--rate", "40", "--duration", "45"]
            + ["--fault-interval", "5", "--load-interval", "20", "--seed", str(SEED)],
            env={**os.environ, **CHAOS_ENV},
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=900,
            check=False,
        )
    out = log_path.read_text()
    runs = sorted((own_broker.home / "chaos").iterdir())
    assert len(runs) == 1, out[-3000:]
    report = json.loads((runs[0] / "report.json").read_text())
    assert proc.returncode == 0, json.dumps({k: report[k] for k in ("check", "spend", "tables", "exits")})[:3000]
    assert f"seed {SEED} (replay: --seed {SEED})" in out and "verdict: PASS" in out

    # The faults happened, all eight of the schedule, and each was recovered from.
    faults = report["faults"]
    assert {kind: row["injected"] for kind, row in faults.items()} == {
        "budget_kill": 1,
        "broker_sigkill": 1,
        "stream_pause": 2,
        "stream_kill": 2,
        "load_kill": 1,
        "txn_coordinator_kill": 1,
    }, report["fault_log"]
    assert all(row["recovered"] == row["injected"] for row in faults.values()), report["fault_log"]
    assert report["restarts"]["stream"] >= 2 and report["restarts"]["broker"] == 2
    assert report["stream_stalls_killed"] == 0  # every hang ended by the job itself

    # The check compared against what the producer recorded sending.
    produced = json.loads((runs[0] / "produced.json").read_text())
    distinct = sum(row["events"] for row in produced["counts"]) + len(produced["late_events"])
    assert report["events"]["distinct_events"] == distinct >= 2000
    check = report["check"]
    assert (check["lost"], check["duplicated"], check["problems"]) == (0, 0, [])
    # On time and late apart: the aggregates count the on-time events, the late topic lists the late ones.
    assert check["events_counted"] == sum(row["events"] for row in produced["counts"])
    assert check["late_justified"] == check["late_listed"] == len(produced["late_events"])
    assert check["dlq"] == produced["malformed"] > 0
    assert report["spend"]["ok"] and report["spend"]["actual_micros"] == report["spend"]["expected_micros"] > 0
    assert report["tables"]["ok"] and report["tables"]["hours"]
    _no_part_left(Path(runs[0]))


def _no_part_left(*homes: Path) -> None:
    """No process of the run outlives it (its children carry its home, or a
    home under its hosts' folder)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        home = next((v[len(b"ADPIPE_HOME=") :] for v in environ.split(b"\0") if v.startswith(b"ADPIPE_HOME=")), b"")
        assert not any(home.startswith(str(h).encode()) for h in homes), f"pid {pid} outlived the run"


# A seed whose eleven faults on two hosts hold three host cut-offs and three
# host kills, two driver kills and two broker kills.
HOSTS_SEED = 2


@pytest.mark.slow
@pytest.mark.extended
def test_a_short_run_across_two_hosts_survives_their_cut_offs_and_deaths() -> None:
    """``adpipe chaos --hosts 2``: the drivers, budget instances and Airflow's
    Celery workers on two hosts, brokers, PostgreSQL and Airflow's scheduler
    on a services host (namespaces of this machine); the loads are load-DAG
    runs whose tasks land on both workers; hosts cut off and killed whole
    among the faults. Nothing lost or doubled, every fault injected and
    recovered from, and nothing of the hosts left behind."""
    from adpipe.tools import hosts

    from tests.integration.on_hosts import skip

    reason = hosts.unavailable_reason()
    if reason is not None:
        skip(reason)
    if shutil.which("redis-server") is None:
        skip("needs redis-server, the Celery broker (make deps installs it)")
    home = TEST_HOME / "chaos-hosts"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    env = {**os.environ, "ADPIPE_HOME": str(home), "ADPIPE_JVM_OPTIONS": JVM_OPTIONS, "ADPIPE_STREAM_STANDBY": "on"}
    log_path = home / "chaos.log"
    with log_path.open("w") as log:
        proc = subprocess.run(
            [sys.executable, "-m", "adpipe", "chaos", "--hosts", "2", "--events", "3000", "--rate", "30"]
            + ["--duration", "100", "--fault-interval", "8", "--load-interval", "30", "--seed", str(HOSTS_SEED)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=1500,
            check=False,
        )
    out = log_path.read_text()
    runs = sorted((home / "chaos").iterdir())
    assert len(runs) == 1, out[-3000:]
    report = json.loads((runs[0] / "report.json").read_text())
    assert proc.returncode == 0, json.dumps({k: report[k] for k in ("verdict", "check", "spend", "tables")})[:3000]
    assert report["hosts"] == 2 and "verdict: PASS" in out
    faults = report["faults"]
    assert faults["host_cut"]["injected"] == faults["host_kill"]["injected"] == 3, report["fault_log"]
    assert all(row["recovered"] == row["injected"] == row["planned"] for row in faults.values()), report["fault_log"]
    for record in report["fault_log"]:
        if record["kind"] in ("host_cut", "host_kill"):
            assert record["target"].startswith(("host-1", "host-2")) and record["note"].startswith("on it: ")
    # Each killed host started again; the driver kills (at least) were failovers.
    assert report["restarts"]["host"] == 3 and report["failover"]["faults"] >= 2
    produced = json.loads((runs[0] / "produced.json").read_text())
    check = report["check"]
    assert (check["lost"], check["duplicated"], check["problems"]) == (0, 0, [])
    assert check["events_counted"] == sum(row["events"] for row in produced["counts"])
    assert report["spend"]["ok"] and report["tables"]["ok"]
    # The loads ran as load-DAG runs, their tasks on both hosts' workers
    # (Airflow's own record), the run's drain load among them.
    airflow = report["airflow"]
    assert airflow["load_runs"].get("success", 0) >= len(report["tables"]["hours"]), airflow
    assert {host for host, tries in airflow["task_tries_by_host"].items() if tries.get("success")} == {
        "host-1", "host-2"}, airflow
    # The run removed its hosts' namespaces, bridge and link (left behind, a
    # harness whose process is gone would be removed here, and named); no part outlived it.
    assert hosts.remove_stale() == []
    _no_part_left(Path(runs[0]), hosts.outside_tmp(Path(runs[0]) / "hosts"))
