"""``adpipe status`` against real servers: the session's broker and
PostgreSQL up with their addresses, pids and logs; a real budget service
found in its consumer group; the raw records nobody has counted as the
stream job's lag. And with nothing running and no ADPIPE_HOME, every row
down within seconds and the home still not made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from adpipe import kafka_io
from adpipe.local import kafka_broker
from adpipe.settings import Settings, isolated_env, load_settings
from adpipe.tools import produce

from tests.conftest import PORT_BASE
from tests.integration.helpers import BROKER_ENV

# Ports nothing listens on, so that a developer's Airflow or Spark cluster
# on the default ports never shows up here.
QUIET_PORTS = {
    "ADPIPE_AIRFLOW_PORT": str(PORT_BASE + 60),
    "ADPIPE_SPARK_MASTER_PORT": str(PORT_BASE + 61),
    "ADPIPE_SPARK_MASTER_UI_PORT": str(PORT_BASE + 62),
}


def _status(env: dict[str, str]) -> tuple[dict, float]:
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "adpipe", "status", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), time.monotonic() - started


def _rows(report: dict) -> dict[str, dict]:
    return {row["name"]: row for row in report["components"]}


def test_status_reports_the_running_servers_a_budget_service_and_the_stream_jobs_lag(
    pg: Settings, tmp_path: Path
) -> None:
    name = f"st{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        **BROKER_ENV,
        **QUIET_PORTS,
        **isolated_env(name),
        "ADPIPE_BUDGET_GROUP": f"{name}-budget",
        "ADPIPE_BUDGET_DB": f"sqlite:///{tmp_path / 'budget.db'}",
    }
    settings = load_settings(env)
    kafka_io.ensure_pipeline_topics(settings)
    plan = produce.plan(produce.ProduceSpec(events=25, seed=3))
    before = time.time()
    sent = produce.send(settings.kafka, settings.topics.events, plan)
    sent_at = time.time()
    budget_log = tmp_path / "budget.log"
    with budget_log.open("w") as log:
        budget = subprocess.Popen([sys.executable, "-m", "adpipe", "budget"], env=env, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 45
        while True:
            asked_at = time.time()
            report, _took = _status(env)
            rows = _rows(report)
            if rows["budget"]["state"] == "up" or time.monotonic() > deadline:
                break
            time.sleep(1)
        kafka, postgres, stream, service = rows["kafka"], rows["postgres"], rows["stream"], rows["budget"]

        assert kafka["state"] == "up" and kafka["address"] == BROKER_ENV["ADPIPE_KAFKA_BOOTSTRAP"]
        assert kafka["facts"]["nodes"][0]["pid"] == kafka_broker.node_pid(settings, 1)
        assert kafka["logs"] == [str(settings.kafka_dir / "broker.log")]

        assert postgres["state"] == "up" and postgres["address"] == f"127.0.0.1:{BROKER_ENV['ADPIPE_PG_PORT']}"
        assert postgres["logs"] and postgres["logs"][0].endswith("postgres.log")

        # Nobody runs this job: down, nothing committed, every raw record sent waiting.
        assert stream["state"] == "down" and stream["address"] == settings.checkpoint_uri
        assert stream["facts"]["last_batch"] is None and stream["facts"]["lag"] == sent >= 25
        # ...the oldest since the broker took it (LogAppendTime): between the send and the status call.
        assert asked_at - sent_at - 1 <= stream["facts"]["lag_s"] <= time.time() - before + 1, stream
        assert f"lag {sent} records, the oldest " in stream["detail"]

        assert service["state"] == "up", service
        assert service["facts"]["pids"] == [budget.pid]
        assert service["facts"]["lag"] == 0  # the job wrote no aggregates yet
        assert service["logs"] == [str(budget_log)]

        assert {rows["spark"]["state"], rows["airflow"]["state"], rows["load"]["state"]} == {"down"}
    finally:
        budget.terminate()
        budget.wait(timeout=60)
    # Gone from its group once stopped (a clean leave, not a session timeout).
    report, _took = _status(env)
    assert _rows(report)["budget"]["state"] == "down"


def test_with_nothing_running_and_no_home_every_row_is_down_quickly(tmp_path: Path) -> None:
    home = tmp_path / "never-made"
    env = {
        **os.environ,
        **QUIET_PORTS,
        "ADPIPE_HOME": str(home),
        "ADPIPE_KAFKA_BOOTSTRAP": f"127.0.0.1:{PORT_BASE + 63}",
        "ADPIPE_KAFKA_CONTROLLER_PORT": str(PORT_BASE + 64),
        "ADPIPE_PG_PORT": str(PORT_BASE + 65),
    }
    report, took = _status(env)
    assert {row["name"]: row["state"] for row in report["components"]} == {
        "kafka": "down",
        "postgres": "down",
        "stream": "down",
        "budget": "down",
        "load": "down",
        "spark": "down",
        "airflow": "down",
    }
    assert report["home_exists"] is False and not home.exists()
    assert took < 15, f"adpipe status took {took:.1f}s with nothing running"
    table = subprocess.run(
        [sys.executable, "-m", "adpipe", "status"], env=env, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert table.splitlines()[0] == f"ADPIPE_HOME {home} (does not exist yet: nothing was started with it)"
    assert f"kafka      down   127.0.0.1:{PORT_BASE + 63}" in table
