"""`adpipe chaos`, the short version: two thousand events and eight faults
(SIGKILL and SIGSTOP of the stream driver, SIGKILL of a budget instance and
of a load, SIGKILL of the broker and of the transaction coordinator) on a
broker of its own, then the independent check. The three-broker,
standalone-Spark run of the README is `make chaos`."""

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


def _no_part_left(run_home: Path) -> None:
    """No process of the run outlives it (its children carry its home)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        assert f"ADPIPE_HOME={run_home}".encode() not in environ.split(b"\0"), f"pid {pid} outlived the run"
