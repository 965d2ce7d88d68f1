"""DAG integrity (imports, docs, callbacks, task graphs, the hourly data
interval), the stream supervisor's pure parts, and the one notifier posting
to a real local HTTP server."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
from adpipe.settings import load_settings

from tests.unit.orchestration.stream_health import health as _health
from tests.unit.orchestration.stream_health import unit_settings as _settings

DAG_IDS = {"ad_aggregation_stream", "ad_union_and_load", "ad_table_maintenance", "ad_hour_repair"}
EDGES = {
    "ad_table_maintenance": set(),  # two independent tasks
    "ad_hour_repair": set(),  # one task
    "ad_aggregation_stream": {
        ("start_stream_if_down", "wait_for_stream"),
        ("wait_for_stream", "check_stream"),
    },
    "ad_union_and_load": {
        ("wait_for_hour_closed", "stage"),
        ("stage", "validate"),
        ("stage", "verify"),
        ("stage", "publish"),  # publish reads stage's XCom, the staged run
        ("validate", "publish"),
        ("verify", "publish"),
        ("validate", "publish_data_docs"),
        ("verify", "publish_data_docs"),
    },
}
# Airflow's rails, with the settings' defaults (no ADPIPE_* here): each task's
# execution_timeout (s), retries and pool, and each DAG's dagrun_timeout (s).
RAILS = {
    "ad_aggregation_stream": {
        "start_stream_if_down": (600, 0, "default_pool"),
        "wait_for_stream": (600, 0, "default_pool"),
        "check_stream": (600, 0, "default_pool"),
    },
    "ad_union_and_load": {
        "wait_for_hour_closed": (6 * 3600, 1, "default_pool"),
        "stage": (3600, 1, "adpipe_tables"),
        "validate": (3600, 0, "adpipe_tables"),
        "verify": (3600, 0, "default_pool"),
        "publish": (3600, 1, "adpipe_tables"),
        "publish_data_docs": (3600, 1, "default_pool"),
    },
    "ad_table_maintenance": {
        "optimize_and_vacuum": (4800, 1, "adpipe_tables"),
        "prune_budget_ledger": (4800, 1, "default_pool"),
    },
    "ad_hour_repair": {
        "act_on_held_hour": (3600, 0, "adpipe_tables"),
    },
}
RUN_TIMEOUTS = {
    "ad_aggregation_stream": 15 * 60,
    "ad_union_and_load": 8 * 3600,
    "ad_table_maintenance": 3 * 3600,
    "ad_hour_repair": 8 * 3600,
}


def test_dagbag_imports_with_zero_errors(dagbag) -> None:  # noqa: ANN001
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == DAG_IDS


@pytest.mark.parametrize("dag_id", sorted(DAG_IDS))
def test_dag_docs_tags_and_one_failure_notifier_per_task(dagbag, dag_id: str) -> None:  # noqa: ANN001
    from adpipe.orchestration.alerts import AdpipeNotifier, notify_failure

    dag = dagbag.dags[dag_id]
    assert dag.doc_md and len(dag.doc_md) > 200
    assert "adpipe" in dag.tags
    # One level only: a DAG-level callback would send a second alert for the same failure.
    assert not dag.on_failure_callback
    assert isinstance(notify_failure, AdpipeNotifier)
    for task in dag.tasks:
        callbacks = task.on_failure_callback
        callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
        assert notify_failure in callbacks, task.task_id
        assert task.retries is not None


@pytest.mark.parametrize("dag_id", sorted(DAG_IDS))
def test_exact_task_graph(dagbag, dag_id: str) -> None:  # noqa: ANN001
    dag = dagbag.dags[dag_id]
    edges = {(t.task_id, d) for t in dag.tasks for d in t.downstream_task_ids}
    assert edges == EDGES[dag_id]


@pytest.mark.parametrize("dag_id", sorted(DAG_IDS))
def test_every_task_has_its_timeout_retries_and_pool_and_every_dag_a_run_timeout(dagbag, dag_id: str) -> None:  # noqa: ANN001
    from adpipe.settings import TABLES_POOL

    assert TABLES_POOL == "adpipe_tables"
    dag = dagbag.dags[dag_id]
    rails = {t.task_id: (t.execution_timeout.total_seconds(), t.retries, t.pool) for t in dag.tasks}
    assert rails == RAILS[dag_id]
    assert dag.dagrun_timeout == timedelta(seconds=RUN_TIMEOUTS[dag_id])
    # One slot: the table writers of the load and the maintenance never run at once.
    assert all(t.pool_slots == 1 for t in dag.tasks)


def test_the_timeouts_are_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    from adpipe.settings import SettingsError

    for name, value in (
        ("ADPIPE_STREAM_TASK_TIMEOUT_S", "7"),
        ("ADPIPE_LOAD_STEP_TIMEOUT_S", "11"),
        ("ADPIPE_LOAD_WAIT_TIMEOUT_S", "13"),
        ("ADPIPE_LOAD_RUN_TIMEOUT_S", "17"),
        ("ADPIPE_MAINTENANCE_TIMEOUT_S", "19"),
    ):
        monkeypatch.setenv(name, value)
    dags = {dag_id: _parsed(dag_id) for dag_id in DAG_IDS}
    timeouts = {d: {t.task_id: t.execution_timeout.total_seconds() for t in dag.tasks} for d, dag in dags.items()}
    assert timeouts == {
        "ad_aggregation_stream": dict.fromkeys(RAILS["ad_aggregation_stream"], 7),
        "ad_union_and_load": {**dict.fromkeys(RAILS["ad_union_and_load"], 11), "wait_for_hour_closed": 13},
        "ad_table_maintenance": dict.fromkeys(RAILS["ad_table_maintenance"], 19),
        "ad_hour_repair": {"act_on_held_hour": 11},
    }
    assert dags["ad_union_and_load"].dagrun_timeout == timedelta(seconds=17)
    assert dags["ad_hour_repair"].dagrun_timeout == timedelta(seconds=17)
    assert dags["ad_union_and_load"].get_task("wait_for_hour_closed").timeout == 13
    # A run must outlast its hour's wait; unset, it is 8 h, or the wait plus an hour.
    with pytest.raises(SettingsError, match="ADPIPE_LOAD_RUN_TIMEOUT_S=17 must exceed ADPIPE_LOAD_WAIT_TIMEOUT_S=20"):
        load_settings({"ADPIPE_LOAD_WAIT_TIMEOUT_S": "20", "ADPIPE_LOAD_RUN_TIMEOUT_S": "17"})
    assert load_settings({"ADPIPE_LOAD_WAIT_TIMEOUT_S": str(9 * 3600)}).rails.load_run_timeout_s == 10 * 3600


def _parsed(dag_id: str):  # noqa: ANN202 - airflow's DAG
    """``dags/<dag_id>.py`` parsed afresh, in this process's environment."""
    import importlib.util

    from adpipe.settings import PROJECT_ROOT

    spec = importlib.util.spec_from_file_location(f"{dag_id}_reparsed", PROJECT_ROOT / "dags" / f"{dag_id}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.dag


def test_each_operator_is_what_its_type_says(monkeypatch: pytest.MonkeyPatch) -> None:
    """The steps that run in the warm load driver or in the task's process
    are no SparkSubmitOperator; the one that runs spark-submit is; the
    stream's detached start is none (the provider's waits for the driver)."""
    from adpipe.orchestration.hour_actions import HourActionOperator, HourActionSubmitOperator
    from adpipe.orchestration.load_tasks import LoadStepOperator, LoadStepSubmitOperator
    from adpipe.orchestration.stream_supervisor import StreamStartOperator
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator

    steps = ("stage", "validate", "publish")
    for submit in ("warm", "in-process", "spark-submit"):
        monkeypatch.setenv("ADPIPE_LOAD_SUBMIT", submit)
        dag = _parsed("ad_union_and_load")
        for step in steps:
            task = dag.get_task(step)
            assert isinstance(task, SparkSubmitOperator) is (submit == "spark-submit"), (submit, step)
            assert type(task) is (LoadStepSubmitOperator if submit == "spark-submit" else LoadStepOperator)
            assert task.step == step
        assert not [t for t in dag.tasks if t.task_id not in steps and isinstance(t, SparkSubmitOperator)]
        action = _parsed("ad_hour_repair").get_task("act_on_held_hour")
        assert isinstance(action, SparkSubmitOperator) is (submit == "spark-submit"), submit
        assert type(action) is (HourActionSubmitOperator if submit == "spark-submit" else HourActionOperator)
    start = _parsed("ad_aggregation_stream").get_task("start_stream_if_down")
    assert type(start) is StreamStartOperator and not isinstance(start, SparkSubmitOperator)


def test_no_private_member_of_a_provider_is_used() -> None:
    """No attribute of the providers' operators and hooks whose name starts
    with one underscore (methods and instance attributes alike) is read,
    called or set anywhere in adpipe.orchestration or the DAG files."""
    import ast

    from adpipe.settings import PROJECT_ROOT
    from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
    from airflow.providers.postgres.hooks.postgres import PostgresHook

    objects = [SparkSubmitOperator(task_id="x"), SparkSubmitHook(conn_id="none"), KafkaBaseHook(), PostgresHook()]
    private = {
        name
        for obj in objects
        for name in {*dir(type(obj)), *vars(obj)}
        if name.startswith("_") and not name.startswith("__")
    }
    assert {"_build_spark_submit_command", "_connection", "_spark_binary", "_hook", "_build_config"} <= private
    orchestration = PROJECT_ROOT / "include" / "adpipe" / "orchestration"
    files = [*orchestration.glob("*.py"), *(PROJECT_ROOT / "dags").glob("*.py")]
    used = sorted(
        f"{path.name}:{node.lineno} {node.attr}"
        for path in files
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and node.attr in private
    )
    assert used == []


def test_load_dag_hourly_data_interval_catchup_and_doc(dagbag) -> None:  # noqa: ANN001
    import pendulum
    from airflow.serialization.encoders import coerce_to_core_timetable
    from airflow.timetables.base import TimeRestriction

    dag = dagbag.dags["ad_union_and_load"]
    assert dag.catchup is False  # no ADPIPE_LOAD_START here: no backlog (the tests below)
    assert dag.max_active_runs == 1
    assert "Uber" in dag.doc_md and "hourly by design" in dag.doc_md.lower()
    timetable = coerce_to_core_timetable(dag.timetable)
    first = timetable.next_dagrun_info(
        last_automated_data_interval=None,
        restriction=TimeRestriction(earliest=pendulum.datetime(2026, 11, 22, 5), latest=None, catchup=True),
    )
    assert (first.data_interval.start, first.data_interval.end) == (
        pendulum.datetime(2026, 11, 22, 5),
        pendulum.datetime(2026, 11, 22, 6),
    )
    following = timetable.next_dagrun_info(
        last_automated_data_interval=first.data_interval,
        restriction=TimeRestriction(earliest=pendulum.datetime(2026, 11, 22, 5), latest=None, catchup=True),
    )
    assert (following.data_interval.start, following.data_interval.end) == (
        pendulum.datetime(2026, 11, 22, 6),
        pendulum.datetime(2026, 11, 22, 7),
    )
    # A manual run (dag.test) covers the whole hour ending at its logical date.
    manual = timetable.infer_manual_data_interval(run_after=pendulum.datetime(2026, 11, 22, 13, 20))
    assert (manual.start, manual.end) == (pendulum.datetime(2026, 11, 22, 12), pendulum.datetime(2026, 11, 22, 13))


def test_load_dag_publishes_the_table_assets_names_its_hour_and_always_links_data_docs(dagbag) -> None:  # noqa: ANN001
    dag = dagbag.dags["ad_union_and_load"]
    outlets = {getattr(o, "name", None) for o in dag.get_task("publish").outlets}
    assert outlets == {"ads.ad_events_raw", "ads.ad_minute_aggregates", "ads.ad_events_quarantine",
                       "ads.ad_minute_aggregate_revisions"}
    assert dag.get_task("publish_data_docs").trigger_rule == "all_done"
    # Publish waits on the two checks (and on stage, whose XCom it reads),
    # never on the cosmetic Data Docs page.
    assert dag.get_task("publish").upstream_task_ids == {"stage", "validate", "verify"}
    assert sorted(t.task_id for t in dag.tasks if not t.downstream_task_ids) == ["publish", "publish_data_docs"]
    assert dag.get_task("validate").retries == 0 and dag.get_task("verify").retries == 0
    assert "hour" in dag.params and dag.params["hour"] is None


def test_a_manual_run_names_its_hour_else_the_interval_decides() -> None:
    from adpipe.orchestration.load_tasks import hour_of_run

    interval = (datetime(2026, 11, 22, 5, tzinfo=UTC), datetime(2026, 11, 22, 6, tzinfo=UTC))
    assert hour_of_run({"hour": "2026-11-21T23"}, *interval) == datetime(2026, 11, 21, 23, tzinfo=UTC)
    assert hour_of_run({"hour": None}, *interval) == interval[0]
    assert hour_of_run(None, *interval) == interval[0]
    with pytest.raises(ValueError, match="not the start of an hour"):
        hour_of_run({"hour": "2026-11-21T23:30"}, *interval)


def test_load_start_is_configurable(dagbag) -> None:  # noqa: ANN001
    assert load_settings({"ADPIPE_LOAD_START": "2026-11-20T05:00:00Z"}).load_start == datetime(
        2026, 11, 20, 5, tzinfo=UTC
    )


def test_a_new_deployment_without_a_start_loads_from_its_first_hour_not_a_backlog(dagbag) -> None:  # noqa: ANN001
    from airflow.serialization.encoders import coerce_to_core_timetable
    from airflow.timetables.base import TimeRestriction

    assert load_settings({}).load_start is None
    dag = dagbag.dags["ad_union_and_load"]
    assert dag.catchup is False
    # The first run the scheduler would create now (the DAG's schedule, as
    # the scheduler holds it): the hour that closed last, not 2026's first.
    first = coerce_to_core_timetable(dag.timetable).next_dagrun_info(
        last_automated_data_interval=None, restriction=TimeRestriction(dag.start_date, None, dag.catchup)
    )
    now = datetime.now(UTC)
    last_closed = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    assert first is not None and first.data_interval.start in (last_closed, last_closed + timedelta(hours=1))
    assert first.data_interval.end - first.data_interval.start == timedelta(hours=1)


def test_a_configured_start_catches_up_from_its_hour(monkeypatch) -> None:  # noqa: ANN001
    import importlib.util

    from adpipe.settings import PROJECT_ROOT

    monkeypatch.setenv("ADPIPE_LOAD_START", "2026-11-20T05:00:00Z")
    spec = importlib.util.spec_from_file_location("load_dag_with_start", PROJECT_ROOT / "dags" / "ad_union_and_load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    assert module.dag.catchup is True
    assert module.dag.start_date == datetime(2026, 11, 20, 5, tzinfo=UTC)


def test_hour_of_interval_takes_only_whole_utc_hours() -> None:
    from adpipe.orchestration.load_tasks import IntervalError, hour_of_interval

    start = datetime(2026, 11, 22, 12, tzinfo=UTC)
    assert hour_of_interval(start, datetime(2026, 11, 22, 13, tzinfo=UTC)) == start
    for bad in (
        (start, start),
        (start, datetime(2026, 11, 22, 14, tzinfo=UTC)),
        (datetime(2026, 11, 22, 12, 30, tzinfo=UTC), datetime(2026, 11, 22, 13, 30, tzinfo=UTC)),
        (None, start),
    ):
        with pytest.raises(IntervalError):
            hour_of_interval(*bad)


def test_connections_from_settings_name_our_master_broker_and_databases() -> None:
    from adpipe.local.airflow import connections_env

    settings = load_settings({"ADPIPE_SPARK_MASTER": "local[2]", "ADPIPE_KAFKA_BOOTSTRAP": "127.0.0.1:39092"})
    env = {k: json.loads(v) for k, v in connections_env(settings).items()}
    assert env["AIRFLOW_CONN_ADPIPE_SPARK"] == {"conn_type": "spark", "host": "local[2]"}
    assert env["AIRFLOW_CONN_ADPIPE_KAFKA"] == {"conn_type": "kafka", "extra": {"bootstrap.servers": "127.0.0.1:39092"}}
    assert env["AIRFLOW_CONN_ADPIPE_METASTORE_DB"] == {
        "conn_type": "postgres", "host": "127.0.0.1", "port": 5433, "login": "adpipe", "password": "adpipe",
        "schema": "adpipe_metastore",
    }
    budget = env["AIRFLOW_CONN_ADPIPE_BUDGET_DB"]
    assert budget["conn_type"] == "sqlite" and budget["host"].endswith("budget.db")


# --- stream supervisor ------------------------------------------------------




def test_thresholds_name_each_breach(tmp_path: Path) -> None:
    from adpipe.orchestration.stream_supervisor import threshold_breaches

    settings = _settings(tmp_path, ADPIPE_STREAM_MAX_RESTARTS="2", ADPIPE_STREAM_MAX_LAG="100")
    assert threshold_breaches(_health(restarts_in_window=2, lag=100), settings) == []
    breaches = threshold_breaches(_health(restarts_in_window=3, lag=101), settings)
    assert len(breaches) == 2
    assert "restarted 3 times" in breaches[0] and "ADPIPE_STREAM_MAX_RESTARTS=2" in breaches[0]
    assert "lag 101" in breaches[1] and "ADPIPE_STREAM_MAX_LAG=100" in breaches[1]
    assert threshold_breaches(_health(alive=False, how="down"), settings) == ["stream unit is down"]


def test_restarts_are_counted_after_the_first_start_and_age_out(tmp_path: Path) -> None:
    from adpipe.orchestration.stream_supervisor import read_state, record_start

    settings = _settings(tmp_path, ADPIPE_STREAM_RESTART_WINDOW_S="3600")
    t0 = 1_800_000_000.0
    record_start(settings, 101, tmp_path / "a.log", now=t0)
    assert read_state(settings)["restarts"] == []
    record_start(settings, 102, tmp_path / "b.log", now=t0 + 60)
    record_start(settings, 103, tmp_path / "c.log", now=t0 + 120)
    state = read_state(settings)
    assert state["restarts"] == [t0 + 60, t0 + 120]
    assert state["pid"] == 103 and state["log"].endswith("c.log")
    # Two days later the old restarts have aged out of the kept history.
    record_start(settings, 104, tmp_path / "d.log", now=t0 + 2 * 86_400)
    assert read_state(settings)["restarts"] == [t0 + 2 * 86_400]


def test_process_alive_needs_the_stream_command_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from adpipe.orchestration.stream_supervisor import process_alive

    assert not process_alive(None)
    assert not process_alive(os.getpid())  # alive, but pytest is not the stream job
    script = tmp_path / "aggregation_stream.py"
    script.write_text("import sys\nsys.stdin.read()\n")  # runs until killed (or its stdin closes)
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE)  # noqa: S603
    try:
        # Right after fork the child's /proc cmdline is empty, until it execs.
        deadline = time.monotonic() + 10
        while not Path(f"/proc/{proc.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert process_alive(proc.pid)
        proc.kill()
        time.sleep(0.3)  # not reaped yet: a zombie is not alive
        assert not process_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert not process_alive(proc.pid)


# --- the notifier -------------------------------------------------------------


class _Capture(BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append({"content_type": self.headers["Content-Type"], "body": json.loads(body)})
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict]]]:
    _Capture.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Capture)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/alerts", _Capture.received
    server.shutdown()
    server.server_close()


def _failure_context(dagbag) -> dict:  # noqa: ANN001
    dag = dagbag.dags["ad_union_and_load"]
    return {
        "dag": dag,
        "ti": SimpleNamespace(dag_id=dag.dag_id, task_id="validate", run_id="manual__x", try_number=1),
        "dag_run": SimpleNamespace(dag_id=dag.dag_id, run_id="manual__x"),
        "exception": RuntimeError("1 expectation failed: aggregates_unique_ad_window"),
        "data_interval_start": datetime(2026, 11, 22, 12, tzinfo=UTC),
        "data_interval_end": datetime(2026, 11, 22, 13, tzinfo=UTC),
    }


def test_notifier_records_and_posts_the_alert(tmp_path: Path, webhook, dagbag) -> None:  # noqa: ANN001
    from adpipe.orchestration.alerts import AdpipeNotifier, alerts_file

    url, received = webhook
    settings = _settings(tmp_path, ADPIPE_ALERT_WEBHOOK=url)
    AdpipeNotifier(settings)(_failure_context(dagbag))

    assert len(received) == 1
    posted = received[0]["body"]
    assert received[0]["content_type"] == "application/json"
    assert posted["dag_id"] == "ad_union_and_load" and posted["task_id"] == "validate"
    assert posted["message"] == "RuntimeError: 1 expectation failed: aggregates_unique_ad_window"
    assert posted["data_interval_start"] == "2026-11-22T12:00:00+00:00"
    recorded = [json.loads(line) for line in alerts_file(settings).read_text().splitlines()]
    assert recorded == [posted]


def test_notifier_survives_a_dead_webhook(tmp_path: Path, dagbag) -> None:  # noqa: ANN001
    import socket

    from adpipe.orchestration.alerts import AdpipeNotifier, alerts_file

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = _settings(tmp_path, ADPIPE_ALERT_WEBHOOK=f"http://127.0.0.1:{port}/", ADPIPE_ALERT_WEBHOOK_TIMEOUT_S="2")
    started = time.monotonic()
    AdpipeNotifier(settings)(_failure_context(dagbag))  # must not raise
    assert time.monotonic() - started < 5
    assert len(alerts_file(settings).read_text().splitlines()) == 1


def test_a_driver_holding_the_checkpoint_is_the_live_job_when_the_one_started_died(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A standby that took over from the driver the supervisor started leads
    the job (its leadership group, on any host): the job is alive (a new
    start would be refused)."""
    import socket

    from adpipe import kafka_io
    from adpipe.orchestration.stream_supervisor import inspect, record_start
    from adpipe.stream import leadership

    settings = _settings(tmp_path)
    monkeypatch.setattr(kafka_io, "stream_commits", lambda _settings: {0: (5, "")})
    monkeypatch.setattr(kafka_io, "stream_lag", lambda _settings, _commits: {0: 0})
    record_start(settings, 2**22 + 12345, tmp_path / "gone.log")  # a pid that does not run
    health = inspect(settings)
    assert (health.alive, health.how, health.needs_start) == (False, "down", True)
    group: list[leadership.Driver] = []
    monkeypatch.setattr(leadership, "drivers", lambda _settings, timeout_s=10.0: list(group))
    assert inspect(settings).alive is False
    group.append(leadership.Driver(socket.gethostname(), os.getpid(), True))  # this process took over
    health = inspect(settings)
    assert (health.alive, health.how, health.pid, health.needs_start) == (True, "leader", os.getpid(), False)
    group[0] = leadership.Driver("another-host", 77, True)  # a driver on another worker leads
    health = inspect(settings)
    assert (health.alive, health.how, health.pid, health.needs_start) == (True, "leader", None, False)


def test_descends_from_follows_the_parent_chain() -> None:
    import subprocess
    import sys

    from adpipe.stream.liveness import descends_from

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)  # noqa: S603
    try:
        assert descends_from(child.pid, os.getpid()) and descends_from(os.getpid(), os.getpid())
        assert not descends_from(os.getpid(), child.pid)
        assert not descends_from(2**22 + 12345, os.getpid())  # no such process
    finally:
        child.kill()
        child.wait()


def test_the_health_line_names_the_active_driver_and_the_standby() -> None:
    line = _health(pid=41, standby_pids=[42]).describe()
    assert line.startswith("stream unit: alive (process, pid 41; standby pid 42); last batch 3 ")
    assert "(process, pid 41; no standby)" in _health(pid=41).describe()


def test_the_health_line_gives_the_lags_age_and_the_last_failover() -> None:
    import time

    line = _health(pid=41, lag=12, lag_s=7.4, last_failover={
        "at": time.time() - 30, "reason": "the active driver died", "seconds": 5.9}).describe()
    assert "lag 12 records, the oldest 7 s;" in line
    assert line.endswith("last failover 30s ago (the active driver died, next batch 5.9s after)")
    quiet = _health(pid=41, lag=0, lag_s=0.0).describe()
    assert "lag 0 records;" in quiet and "failover" not in quiet


def test_the_hour_closed_sensor_defers_to_a_trigger_that_fires_when_the_hour_closes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An hour closed already: True at once. Else the sensor defers (no
    worker slot held) to a trigger that asks again every interval_s and
    fires the moment the hour closes."""
    import asyncio

    from adpipe.orchestration import hour_closed
    from airflow.sdk.exceptions import TaskDeferred

    hour = datetime(2026, 11, 22, 12, tzinfo=UTC)
    context = {"params": {}, "data_interval_start": hour, "data_interval_end": hour + timedelta(hours=1)}
    answers: list[bool] = []
    monkeypatch.setattr(hour_closed, "hour_is_closed", lambda _settings, asked: asked == hour and answers.pop(0))
    sensor = hour_closed.HourClosedSensor(task_id="wait_for_hour_closed", timeout=600, interval_s=0.01)

    answers[:] = [True]
    assert sensor.execute(context) is True
    answers[:] = [False]
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute(context)
    trigger = deferred.value.trigger
    assert deferred.value.method_name == "execute_complete" and deferred.value.timeout == timedelta(seconds=600)
    classpath, kwargs = trigger.serialize()
    assert classpath == "adpipe.orchestration.hour_closed.HourClosedTrigger"
    assert kwargs == {"hour": "2026-11-22T12", "interval_s": 0.01}

    async def first_event() -> object:
        async for event in hour_closed.HourClosedTrigger(**kwargs).run():
            return event
        return None

    answers[:] = [False, False, True]  # closed at the third question
    event = asyncio.run(first_event())
    assert event.payload == {"hour": "2026-11-22T12", "closed": True} and answers == []
    assert sensor.execute_complete(context, event.payload) is True
