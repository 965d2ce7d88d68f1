"""The Airflow DAGs end to end with ``dag.test()`` against the real broker,
Spark and PostgreSQL (Airflow's metadata database): the stream DAG starts
the stream job with spark-submit, detached, and restarts it after a SIGKILL
(alerting past the restart threshold); the load DAG loads closed hours; a
backfill created with ``airflow backfill create`` loads each hour as the
producer sent it; an hour staged on one worker is validated,
verified and published once on another (``ADPIPE_HOME`` and ``AIRFLOW_HOME``
of their own: the staged run goes through XCom only); an injected duplicate
aggregate fails the run and the notifier names the failed expectation.

Each ``dag.test()`` runs in a subprocess with the Airflow environment of
``make airflow`` (adpipe.local.airflow.airflow_env).

The backfill: ``airflow backfill create`` (the real CLI, against the metadata
database in the test PostgreSQL) creates the three runs and their data
intervals; they are then executed by an in-process driver, ``BACKFILL_RUN``
(the driver scripts are in dag_runs.py),
with the loop ``dag.test()`` itself uses (``update_state`` for the scheduling
decisions, ``_run_task`` -> ``run_task_in_process`` for the real task code),
in logical-date order. Chosen over a real ``airflow scheduler``: on two cores
a scheduler needs an api-server (the Execution API) and a dag-processor beside
it, with LocalExecutor worker processes each starting their own Spark; the
driver runs the same task code and callbacks with one Spark session.

On a failed run the assertion message carries the log of every task that did
not succeed (``explain``); each run's whole output is kept under
``$ADPIPE_HOME/test-logs`` of that run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from adpipe import kafka_io
from adpipe.lakehouse import warm
from adpipe.lakehouse.load import hour_closed
from adpipe.local.airflow import DAGS_FOLDER, airflow_env, connections_env
from adpipe.orchestration.alerts import alerts_file
from adpipe.orchestration.stream_supervisor import process_alive, read_state
from adpipe.settings import Settings, isolated_env, load_settings
from adpipe.tools import produce

from tests.alert_receivers import Hooks, Inbox, alert_env, hooks_server, html_text, smtp_server
from tests.integration.dag_runs import BACKFILL_RUN, DAG_TEST, WORKER_RUN, explain
from tests.integration.dag_runs import run_script as _run
from tests.integration.dag_runs import start_script as _start
from tests.integration.helpers import BROKER_ENV, inject_duplicate_aggregate, warm_env

H0 = datetime(2026, 11, 22, 6, tzinfo=UTC)
HOURS = [H0 + timedelta(hours=i) for i in range(3)]
AIRFLOW = str(Path(sys.executable).parent / "airflow")
# What the flow produces: three past hours of events, then a few minutes into
# the fourth, past the third hour's end plus the allowed lateness (300 s), so
# the stream's watermark closes the third hour (ranges.hour_closed).
SPECS = (
    produce.ProduceSpec(events=600, seed=7, ads=6, minutes=180, start=H0, duplicate_rate=0.05, malformed_rate=0.01),
    produce.ProduceSpec(events=30, seed=8, ads=6, minutes=2, start=H0 + timedelta(hours=3, minutes=7)),
)

TABLE_HOURS = {"ADPIPE_TEST_TABLE_HOURS": ",".join(h.isoformat() for h in HOURS)}


def _tables(output: str) -> dict[str, list[str]]:
    lines = [line for line in output.splitlines() if line.startswith("TABLES ")]
    assert lines, output[-5000:]
    return json.loads(lines[0][7:])


class Flow:
    def __init__(self, env: dict[str, str], settings: Settings, workdir: Path, inbox: Inbox) -> None:
        self.env = env
        self.settings = settings
        self.workdir = workdir
        self.inbox = inbox  # the alerts' e-mails; Hooks: the webhook's and Slack's

    def load_env(self, name: str, home: str | None = None, **extra: str) -> dict[str, str]:
        """The load DAG's environment with tables of its own (a metastore
        database and a warehouse under ``name``; the verify task's process
        shares them, which Derby would not allow); Airflow's home and
        database stay shared. ``home``: another ADPIPE_HOME under the work
        folder than ``name`` (a worker of its own; give it the warehouse
        then). The tasks read the metastore's database from their
        Connection (adpipe_metastore_db), made again from these settings."""
        database = f"adpipe_ms_{self.env['ADPIPE_JOB_ID']}_{name}".lower().replace("-", "_")
        env = {
            **self.env,
            "ADPIPE_HOME": str(self.workdir / (home or name)),
            "ADPIPE_METASTORE_DATABASE": database,
            # One Spark session for every step of a run (the spark-submit path: the duplicate test).
            "ADPIPE_LOAD_SUBMIT": "in-process",
            **extra,
        }
        return {**env, **connections_env(load_settings(env))}

    def stop_stream(self) -> None:
        pid = read_state(self.settings).get("pid")
        if pid and process_alive(pid):
            os.killpg(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while process_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)


@pytest.fixture(scope="module")
def flow(broker: Settings, pg: Settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flow]:
    name = f"af{uuid.uuid4().hex[:8]}"
    workdir = tmp_path_factory.mktemp("airflow-dags")
    receivers = ExitStack()
    inbox = receivers.enter_context(smtp_server())
    hooks_url = receivers.enter_context(hooks_server())
    base = {
        **os.environ,
        **BROKER_ENV,
        **isolated_env(name),
        "ADPIPE_SPARK_DRIVER_MEMORY": "1g",
        **alert_env(inbox, hooks_url),  # every alert by e-mail, to Slack and the webhook
        "ADPIPE_LOAD_START": H0.isoformat(),
    }
    settings = load_settings(base)
    env = airflow_env(settings, pg.pg_url("airflow"), base=base)
    subprocess.run([AIRFLOW, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)  # noqa: S603
    kafka_io.ensure_pipeline_topics(settings)
    for spec in SPECS:
        produce.send(settings.kafka_bootstrap, settings.topics.events, produce.plan(spec))
    the_flow = Flow(env, settings, workdir, inbox)
    yield the_flow
    the_flow.stop_stream()
    receivers.close()


def test_stream_dag_starts_the_job_and_restarts_it_after_a_death(flow: Flow) -> None:
    # 1. The stream is down: the DAG starts it (spark-submit, detached).
    results, out = _run(DAG_TEST, [str(DAGS_FOLDER), "ad_aggregation_stream", ""], flow.env)
    assert results and results[0]["state"] == "success", explain(results, out)
    assert set(results[0]["tis"].values()) == {"success"}
    first = read_state(flow.settings)
    assert len(first["starts"]) == 1 and first["restarts"] == []
    assert process_alive(first["pid"])
    deadline = time.monotonic() + 240
    while not hour_closed(flow.settings, HOURS[-1]):
        assert time.monotonic() < deadline, "the stream did not close the third hour"
        time.sleep(3)

    # 2. SIGKILL it. The next run restarts it; with the threshold at 0 the
    # restart also fails the run and the notifier fires.
    flow.stop_stream()
    assert not process_alive(first["pid"])
    results, out = _run(
        DAG_TEST, [str(DAGS_FOLDER), "ad_aggregation_stream", ""], {**flow.env, "ADPIPE_STREAM_MAX_RESTARTS": "0"}
    )
    assert results and results[0]["state"] == "failed", explain(results, out)
    assert results[0]["tis"] == {
        "start_stream_if_down": "success",
        "wait_for_stream": "success",
        "check_stream": "failed",
    }
    second = read_state(flow.settings)
    assert second["pid"] != first["pid"] and process_alive(second["pid"])
    assert len(second["restarts"]) == 1
    alerts = [json.loads(line) for line in alerts_file(flow.settings).read_text().splitlines()]
    task_alerts = [a for a in alerts if a.get("task_id") == "check_stream"]
    assert task_alerts and "restarted 1 times" in task_alerts[-1]["message"]
    assert "ADPIPE_STREAM_MAX_RESTARTS=0" in task_alerts[-1]["message"]
    assert any(p.get("task_id") == "check_stream" for p in Hooks.posted())
    assert any(m["Subject"] == "[adpipe] ad_aggregation_stream.check_stream failed" for m in flow.inbox.messages)
    flow.stop_stream()  # the loads below need only the committed ledger


def _hours_closed_by_the_stream(flow: Flow) -> None:
    """The load scenarios need the three hours closed: in make test the
    stream DAG's test above runs the stream; on its own (make test-slow
    deselects that test) an ``--available-now`` run of the job does."""
    if not hour_closed(flow.settings, HOURS[-1]):
        done = subprocess.run(  # noqa: S603
            [sys.executable, "-m", "adpipe", "stream", "--available-now"],
            env=flow.env, capture_output=True, text=True, timeout=900,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert hour_closed(flow.settings, HOURS[-1])


def _expected_tables(hours: list[datetime]) -> tuple[dict[tuple[str, str], tuple[int, int]], Counter]:
    """From the producer's own plans: each (ad, minute)'s impressions and
    clicks in ``hours``, and each hour's distinct on-time events."""
    labels = {f"{h:%Y-%m-%dT%H}" for h in hours}
    windows: dict[tuple[str, str], list[int]] = {}
    raw: Counter = Counter()
    for spec in SPECS:
        for count in produce.plan(spec).summary["counts"]:
            minute = count["window_start"][:16]
            if minute[:13] in labels:
                window = windows.setdefault((count["ad_id"], minute), [0, 0])
                window[count["event_type"] == "click"] += count["events"]
                raw[minute[:13]] += count["events"]
    return {key: (n[0], n[1]) for key, n in windows.items()}, raw


# The load DAG's two scenarios take about five minutes: make test-slow.
@pytest.mark.slow
def test_a_backfill_of_three_hours_loads_each_hour_as_the_producer_sent_it(flow: Flow) -> None:
    _hours_closed_by_the_stream(flow)
    # Its Spark steps run in the home's warm load driver (started by the first).
    env_b = warm_env(flow.load_env("backfill"), ADPIPE_LOAD_SUBMIT="warm")
    # The DAG must be in the metadata database (the stream DAG's dag.test()
    # wrote it in make test; on its own, as the dag-processor would).
    subprocess.run(  # noqa: S603
        [AIRFLOW, "dags", "reserialize"], env={**env_b, "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER)},
        check=True, capture_output=True, timeout=300,
    )
    created = subprocess.run(  # noqa: S603
        [
            AIRFLOW,
            "backfill",
            "create",
            "--dag-id",
            "ad_union_and_load",
            "--from-date",
            HOURS[0].isoformat(),
            "--to-date",
            HOURS[-1].isoformat(),
        ],
        env={**env_b, "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert created.returncode == 0, created.stdout[-2000:] + created.stderr[-3000:]
    results, out = _start(BACKFILL_RUN, [str(DAGS_FOLDER), "ad_union_and_load"], {**env_b, **TABLE_HOURS}).finish()
    assert [r["interval"][0][:13].replace(" ", "T") for r in results] == [h.strftime("%Y-%m-%dT%H") for h in HOURS], (
        explain(results, out)
    )
    assert all(r["state"] == "success" for r in results), explain(results, out)
    assert all(r["run_id"].startswith("backfill__") for r in results)

    # Every hour once, as the producer sent it: duplicates and malformed
    # records out, each minute's counts exact, one raw row per event.
    backfilled = {table: [json.loads(r) for r in rows] for table, rows in _tables(out).items()}
    windows, raw = _expected_tables(HOURS)
    aggregates = backfilled["ads.ad_minute_aggregates"]
    assert len(aggregates) == len(windows), f"{len(aggregates)} rows for {len(windows)} windows"
    assert {(r["ad_id"], r["window_start"][:16]): (r["impressions"], r["clicks"]) for r in aggregates} == windows
    events = backfilled["ads.ad_events_raw"]
    assert len({r["event_id"] for r in events}) == len(events)
    assert Counter(r["event_hour"][:13] for r in events) == raw
    assert (Path(env_b["ADPIPE_HOME"]) / "data_docs" / "latest.html").exists()
    served = warm.log_file(load_settings(env_b)).read_text()
    for hour in HOURS:
        assert f"adpipe load --hour {hour:%Y-%m-%dT%H} --step publish" in served, served[-3000:]


def _delta_rows(warehouse: Path, table: str) -> list[dict]:
    """A published table's rows read without Spark (delta-rs), as a reader
    of the warehouse would."""
    from deltalake import DeltaTable

    database, name = table.split(".")
    return DeltaTable(str(warehouse / f"{database}.db" / name)).to_pyarrow_table().to_pylist()


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


# About 2.5 minutes on two busy cores (two warm drivers' starts, new tables,
# the three closed hours audited), after the stream's test: make test-extended,
# since test_airflow_hosts (make test-long) hands an hour's staged run over
# between Celery workers on two hosts through XCom.
@pytest.mark.slow
@pytest.mark.extended
def test_an_hour_staged_on_one_worker_is_validated_and_published_once_on_another(flow: Flow) -> None:
    """Two workers that share nothing but Airflow's metadata database, the
    broker, the metastore's PostgreSQL and the warehouse: worker A (an
    ADPIPE_HOME and an AIRFLOW_HOME of its own) waits for the hour and
    stages it in its warm load driver; worker B (other homes, its own warm
    driver) validates, verifies and publishes it. The staged run reaches B
    through the stage task's XCom only, and the hour is published once:
    its rows against what the producer sent, counted here in plain Python."""
    _hours_closed_by_the_stream(flow)
    hour = HOURS[0]
    label = hour.strftime("%Y-%m-%dT%H")
    warehouse = flow.workdir / "handover-warehouse"
    # The stream's checkpoint, where a shared one would be on every worker.
    checkpoints = flow.settings.checkpoint_uri.removesuffix(f"/{flow.settings.job_id}")
    envs = {}
    for worker in ("a", "b"):
        home = flow.workdir / f"handover-{worker}"
        envs[worker] = warm_env(flow.load_env(
            "handover", home=home.name, ADPIPE_LOAD_SUBMIT="warm", ADPIPE_WAREHOUSE_URI=f"file://{warehouse}",
            ADPIPE_CHECKPOINT_URI=checkpoints, AIRFLOW_HOME=str(home / "airflow"),
        ))
    # Each worker's warm load driver starts now, side by side (a worker's
    # driver outlives the task that started it; the steps find it up).
    for env in envs.values():
        threading.Thread(target=warm.ensure_driver, args=(load_settings(env),), kwargs={"env": env},
                         daemon=True).start()
    airflow_cli = {**flow.env, "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER)}
    run_id = f"manual__handover_{uuid.uuid4().hex[:6]}"
    subprocess.run([AIRFLOW, "dags", "reserialize"], env=airflow_cli, check=True, capture_output=True, timeout=300)  # noqa: S603
    triggered = subprocess.run(  # noqa: S603
        [AIRFLOW, "dags", "trigger", "ad_union_and_load", "--run-id", run_id, "--conf", json.dumps({"hour": label})],
        env=airflow_cli, capture_output=True, text=True, timeout=300,
    )
    assert triggered.returncode == 0, triggered.stdout[-2000:] + triggered.stderr[-3000:]

    dag = [str(DAGS_FOLDER), "ad_union_and_load", run_id]
    results, out = _run(WORKER_RUN, [*dag, "wait_for_hour_closed,stage"], envs["a"])
    assert results and results[0]["tis"]["stage"] == "success", explain(results, out)
    assert results[0]["state"] == "running"
    results, out = _run(WORKER_RUN, [*dag, "validate,verify,publish,publish_data_docs"], envs["b"])
    assert results and results[0]["state"] == "success", explain(results, out)
    assert set(results[0]["tis"].values()) == {"success"}, explain(results, out)

    # The hand-over: the staged run, in the metadata database, small.
    [line] = [line for line in out.splitlines() if line.startswith("XCOM ")]
    staged = json.loads(line[5:])
    assert staged["hour"] == label and label in staged["hours"], staged
    assert len(json.dumps(staged)) < 10_000
    # Each step ran in its own worker's driver; neither home holds a run file.
    homes = {w: Path(env["ADPIPE_HOME"]) for w, env in envs.items()}
    served = {w: warm.log_file(load_settings(env)).read_text() for w, env in envs.items()}
    assert f"adpipe load --hour {label} --step stage " in served["a"], served["a"][-3000:]
    for step in ("audit", "publish"):
        assert f"--step {step} " not in served["a"] and f"--step {step} " in served["b"], served["b"][-3000:]
    assert not [home for home in homes.values() if (home / "load" / "airflow").exists()]

    # Published once: the hour's rows against the producer's own plan.
    expected: dict[tuple[str, str], list[int]] = {}
    for spec in SPECS:
        for count in produce.plan(spec).summary["counts"]:
            if count["window_start"].startswith(label):
                slot = expected.setdefault((count["ad_id"], count["window_start"]), [0, 0])
                slot[count["event_type"] == "click"] += count["events"]
    aggregates = [r for r in _delta_rows(warehouse, "ads.ad_minute_aggregates") if _utc(r["event_hour"]) == hour]
    windows = Counter((r["ad_id"], _utc(r["window_start"]).strftime("%Y-%m-%dT%H:%M:%SZ")) for r in aggregates)
    assert [w for w, n in windows.items() if n > 1] == []
    published = {
        (r["ad_id"], _utc(r["window_start"]).strftime("%Y-%m-%dT%H:%M:%SZ")): [r["impressions"], r["clicks"]]
        for r in aggregates
    }
    assert published == expected
    raw = [r for r in _delta_rows(warehouse, "ads.ad_events_raw") if _utc(r["event_hour"]) == hour]
    assert len(raw) == len({r["event_id"] for r in raw}) == sum(sum(v) for v in expected.values())
    ledger = _delta_rows(warehouse, "ads.load_runs")
    publications = [r for r in ledger if r["step"] == "published" and label in json.loads(r["hours"] or "[]")]
    assert len(publications) == 1, ledger


@pytest.mark.slow
def test_injected_duplicate_aggregate_fails_the_run_and_alerts_naming_the_expectation(flow: Flow) -> None:
    # A second record for an existing (region, ad_id, window_start) under a new record_uuid.
    original, duplicate = inject_duplicate_aggregate(flow.settings, HOURS[1].strftime("%Y-%m-%dT%H"))

    # The backfill's tables (hours 0..2 loaded): the rerun of hour 1 stages
    # the duplicate, whose record_uuid is new. The Spark steps are submitted
    # with SparkSubmitOperator this time (LoadStepSubmitOperator).
    env = flow.load_env("backfill", ADPIPE_LOAD_SUBMIT="spark-submit")
    Hooks.received.clear()
    flow.inbox.messages.clear()
    results, out = _run(
        DAG_TEST,
        [str(DAGS_FOLDER), "ad_union_and_load", (HOURS[1] + timedelta(hours=1)).isoformat()],
        {**env, **TABLE_HOURS},
    )
    assert results and results[0]["state"] == "failed", explain(results, out)
    published = [json.loads(r)["record_uuid"] for r in _tables(out)["ads.ad_minute_aggregates"]]
    assert original["record_uuid"] in published and duplicate["record_uuid"] not in published, "published unchecked"
    tis = results[0]["tis"]
    assert (tis["stage"], tis["validate"], tis["verify"]) == ("success", "failed", "failed"), explain(results, out)
    assert tis["publish"] == "upstream_failed"
    assert tis["publish_data_docs"] == "success"  # the failed hour's Data Docs are linked too
    page = Path(env["ADPIPE_HOME"]) / "data_docs" / f"{HOURS[1]:%Y-%m-%dT%H}.html"
    assert "adpipe_ad_minute_aggregates" in page.read_text()
    settings = load_settings(env)
    alerts = [json.loads(line) for line in alerts_file(settings).read_text().splitlines()]
    validate_alerts = [a for a in alerts if a.get("task_id") == "validate"]
    assert validate_alerts, alerts
    message = validate_alerts[-1]["message"]
    assert message.startswith("QualityError")
    # The failing expectation, its columns and the duplicated key are named.
    assert "expect_compound_columns_to_be_unique(column_list=['region', 'ad_id', 'window_start'])" in message, message
    assert f"ad_id={original['ad_id']!r}, window_start={original['window_start'][:19]}" in message, message
    # A new record_uuid: the record_uuid uniqueness check itself still holds.
    assert "expect_column_values_to_be_unique(column='record_uuid')" not in message, message
    posted = [p for p in Hooks.posted() if p.get("task_id") == "validate"]
    assert posted and posted[-1]["message"] == message
    # One alert per failed task (task-level callbacks only), none for the DAG run itself.
    assert sorted(p.get("task_id") for p in Hooks.posted()) == ["validate", "verify"]
    verify_alert = next(p for p in Hooks.posted() if p.get("task_id") == "verify")
    assert verify_alert["message"].startswith("TablesDisagree") and "duplicated" in verify_alert["message"]
    # The same two alerts by e-mail (the real SMTP server) and to Slack, each naming the hour.
    label = HOURS[1].strftime("%Y-%m-%dT%H")
    mails = {m["Subject"]: html_text(m) for m in flow.inbox.messages}
    subjects = [f"[adpipe] ad_union_and_load.{task} failed, hour {label}" for task in ("validate", "verify")]
    assert sorted(mails) == subjects
    assert message in mails[f"[adpipe] ad_union_and_load.validate failed, hour {label}"]
    slack = sorted(m["text"] for m in Hooks.slack())
    assert [t.split("\n", 1)[0] for t in slack] == sorted(mails)
    assert "expect_compound_columns_to_be_unique(column_list=['region', 'ad_id', 'window_start'])" in slack[0]
