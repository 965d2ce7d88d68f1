"""Airflow the way the scheduler runs it: ``airflow standalone`` (scheduler,
dag-processor, api-server, triggerer; LocalExecutor; metadata in a
PostgreSQL database), as ``make airflow`` starts it, drives
``ad_union_and_load`` on its own: the DAG is unpaused through the REST API,
the scheduler runs the closed hours since ``ADPIPE_LOAD_START`` (the Spark
steps in the warm load driver, ``ADPIPE_LOAD_SUBMIT=warm``, which the first
step starts; the UI test and test_dags submit them with SparkSubmitOperator),
then a backfill created through the REST API runs the last one again and
changes no table. The tables are checked against
the producer's own summary and ``verify --hour``.

A long scenario (about five minutes on two busy cores): make test-extended."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from adpipe.lakehouse import warm
from adpipe.local.airflow import admin_password
from adpipe.settings import Settings

from tests.conftest import PORT_BASE
from tests.integration.helpers import (
    NO_REVISIONS,
    Api,
    Pipeline,
    airflow_standalone,
    dump,
    make_pipeline,
    until,
    warm_env,
)

pytestmark = [pytest.mark.slow, pytest.mark.extended, pytest.mark.timeout(3000)]
DAG = "ad_union_and_load"


@dataclass
class Scene:
    pipeline: Pipeline
    env: dict[str, str]
    settings: Settings
    hours: list[datetime]  # the two closed hours since ADPIPE_LOAD_START
    sent: dict
    log_path: Path


@pytest.fixture(scope="module")
def scene(broker: Settings, pg: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scene]:
    workdir = tmp_path_factory.mktemp("scheduler")
    now = datetime.now(UTC)
    current = now.replace(minute=0, second=0, microsecond=0)
    if now < current + timedelta(minutes=3):  # events run to 2 minutes past the hour: none in the future
        time.sleep((current + timedelta(minutes=3) - now).total_seconds())
    start = current - timedelta(hours=2)
    name = uuid.uuid4().hex[:8]
    p = make_pipeline(
        workdir,
        warm_env(
            {
                "ADPIPE_HOME": str(workdir / "home"),
                "ADPIPE_METASTORE_DATABASE": f"adpipe_ms_{name}",
                "ADPIPE_LOAD_START": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
                "ADPIPE_AIRFLOW_PORT": str(PORT_BASE + 30),
                **NO_REVISIONS,
            },
            ADPIPE_LOAD_SUBMIT="warm",
        ),
    )
    sent = p.produce(events=300, seed=7301, ads=4, ad_offset=900, minutes=122, start=start, duplicate_rate=0.05,
                     malformed_rate=0.02)
    run = p.stream(max_offsets=400)
    assert run.returncode == 0, run.log[-3000:]

    with airflow_standalone(p, name) as airflow:
        yield Scene(p, airflow.env, airflow.settings, [start, start + timedelta(hours=1)], sent, airflow.log_path)


def _runs(api: Api) -> list[dict]:
    return api("GET", f"/api/v2/dags/{DAG}/dagRuns?order_by=logical_date&limit=100")["dag_runs"]


def _finished(runs: list[dict], run_type: str, labels: list[str]) -> list[dict] | None:
    """The runs of ``run_type`` for the hours ``labels``, once all have ended
    (a run of a later hour, still waiting for it to close, is not one)."""
    mine = [r for r in runs if r["run_type"] == run_type and r["data_interval_start"][:13] in labels]
    done = [r for r in mine if r["state"] in ("success", "failed")]
    return done if len(done) == len(labels) else None


def _task_states(api: Api, run: dict) -> dict[str, str]:
    path = f"/api/v2/dags/{DAG}/dagRuns/{run['dag_run_id']}/taskInstances"
    return {t["task_id"]: t["state"] for t in api("GET", path)["task_instances"]}


def test_the_scheduler_loads_the_closed_hours_and_a_rest_api_backfill_changes_nothing(scene: Scene) -> None:
    password = until("the admin password", lambda: admin_password(scene.settings), 120, scene.log_path)
    api = Api(scene.settings.airflow_port, str(password))
    until("the DAG parsed", lambda: api("GET", f"/api/v2/dags/{DAG}")["dag_id"], 300, scene.log_path)
    assert api("PATCH", f"/api/v2/dags/{DAG}", {"is_paused": False})["is_paused"] is False

    labels = [h.strftime("%Y-%m-%dT%H") for h in scene.hours]
    scheduled = until("two scheduled runs", lambda: _finished(_runs(api), "scheduled", labels), 1500, scene.log_path)
    assert [r["data_interval_start"][:13] for r in scheduled] == labels
    for run in scheduled:
        states = _task_states(api, run)
        assert run["state"] == "success" and set(states.values()) == {"success"}, (run, states)
        assert set(states) == {"wait_for_hour_closed", "stage", "validate", "verify", "publish", "publish_data_docs"}
    # Every Spark step and the verify task ran in the one warm load driver.
    served = warm.log_file(scene.settings).read_text()
    for label in labels:
        for step in ("stage", "audit", "publish"):
            assert f"adpipe load --hour {label} --step {step} --run-file " in served, served[-3000:]
        assert f"adpipe verify --hour {label} --tables-only" in served, served[-3000:]
    assert served.count("warm load driver ready") == 1, served[-3000:]

    tables = dump(scene.env)
    published_hours = {r["event_hour"][:13] for r in tables["rows"]["ads.ad_minute_aggregates"]}
    # (A test that runs past the next hour's end sees that hour's own run too.)
    assert set(labels) <= published_hours and not {h for h in published_hours if h < labels[0]}
    on_time = {label: 0 for label in labels}
    for count in scene.sent["counts"]:
        if count["window_start"][:13] in on_time:
            on_time[count["window_start"][:13]] += count["events"]
    raw_by_hour = {label: 0 for label in labels}
    for row in tables["rows"]["ads.ad_events_raw"]:
        if row["event_hour"][:13] in raw_by_hour:
            raw_by_hour[row["event_hour"][:13]] += 1
    assert raw_by_hour == on_time  # the producer's own count of distinct on-time events, per hour
    for label in labels:
        report = Path(scene.env["ADPIPE_HOME"]) / f"verify-{label}.json"
        subprocess.run([sys.executable, "-m", "adpipe", "verify", "--hour", label, "--tables-only", "--report",
                        str(report)], env=scene.env, capture_output=True, check=False)
        assert json.loads(report.read_text())["tables"]["ok"], report.read_text()[:3000]

    # A backfill of the last loaded hour (one is enough to show it rewrites
    # nothing).
    backfill = api("POST", "/api/v2/backfills", {
        "dag_id": DAG, "from_date": scene.hours[1].isoformat(), "to_date": scene.hours[1].isoformat(),
        "reprocess_behavior": "completed", "max_active_runs": 1,
    })
    assert backfill["dag_id"] == DAG
    backfilled = until("the backfill run", lambda: _finished(_runs(api), "backfill", labels[1:]), 1500,
                       scene.log_path)
    assert [r["data_interval_start"][:13] for r in backfilled] == labels[1:]
    assert all(r["state"] == "success" for r in backfilled), backfilled
    again = dump(scene.env)

    def of_labels(dumped: dict) -> dict:
        return {t: [r for r in rows if r["event_hour"][:13] in labels] for t, rows in dumped["rows"].items()}

    assert of_labels(again) == of_labels(tables)
    if all(r["data_interval_start"][:13] in labels for r in _runs(api)):  # no later hour's run published meanwhile
        assert again["versions"] == tables["versions"], "a backfill of loaded hours must write no table version"
