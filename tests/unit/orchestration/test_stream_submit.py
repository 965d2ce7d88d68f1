"""StreamStartOperator: the stream job's spark-submit command line, built by
adpipe from the task's settings (the master of the ``adpipe_spark``
Connection, not the worker's environment), and the environment the detached
driver gets (the Connections' values: the Kafka password of ``adpipe_kafka``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from adpipe.settings import load_settings


def _connections(monkeypatch: pytest.MonkeyPatch, master: str, password: str = "") -> None:
    monkeypatch.setenv("AIRFLOW_CONN_ADPIPE_SPARK", json.dumps({"conn_type": "spark", "host": master}))
    extra = {"bootstrap.servers": "127.0.0.1:39092"}
    if password:
        extra.update({"security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
                      "sasl.username": "airflow", "sasl.password": password})
    monkeypatch.setenv("AIRFLOW_CONN_ADPIPE_KAFKA", json.dumps({"conn_type": "kafka", "extra": extra}))


def test_the_stream_job_is_submitted_detached_with_the_connections_master_and_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adpipe.orchestration import stream_supervisor
    from adpipe.orchestration.stream_supervisor import STREAM_APPLICATION, StreamStartOperator, read_state

    # The worker's own environment says local[2] and another broker: the Connections win.
    for key, value in {"ADPIPE_HOME": str(tmp_path), "ADPIPE_JOB_ID": "j1", "ADPIPE_SPARK_MASTER": "local[2]",
                       "ADPIPE_KAFKA_BOOTSTRAP": "127.0.0.1:1"}.items():
        monkeypatch.setenv(key, value)
    _connections(monkeypatch, "spark://elsewhere:7077", password="kafka-secret-123")
    monkeypatch.setattr(stream_supervisor, "inspect", lambda _s: stream_supervisor.StreamHealth(
        job_id="j1", alive=False, how="down", pid=None, heartbeat_age_s=None, last_batch=None, watermark_ms=None,
        lag=0))
    started: list[tuple[list[str], dict[str, str]]] = []
    operator = StreamStartOperator(task_id="start_stream_if_down")

    def fake_start(_settings, command: list[str], name: str, env: dict[str, str]):  # noqa: ANN001, ANN202
        started.append((command, env))
        return SimpleNamespace(pid=2**22 + 7), tmp_path / f"{name}.log"  # a pid that does not run

    monkeypatch.setattr(operator, "_start", fake_start)
    assert operator.execute({}) == 2**22 + 7
    [(command, env)] = started
    assert Path(command[0]).name == "spark-submit"
    assert command[command.index("--master") + 1] == "spark://elsewhere:7077"
    assert command[command.index("--name") + 1] == "adpipe-stream-j1"
    assert command[-1] == str(STREAM_APPLICATION)
    confs = dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf")
    assert {"spark.pyspark.python", "spark.sql.shuffle.partitions"} <= confs.keys()
    assert confs["spark.driver.memory"] == "2g"  # the stream job's own heap
    assert "--jars" in command and "spark-sql-kafka" in command[command.index("--jars") + 1]
    # The driver reads its settings from its environment: the Connections' values.
    assert env["ADPIPE_SPARK_MASTER"] == "spark://elsewhere:7077"
    assert (env["ADPIPE_KAFKA_BOOTSTRAP"], env["ADPIPE_KAFKA_SECURITY"]) == ("127.0.0.1:39092", "sasl_ssl")
    assert (env["ADPIPE_KAFKA_USERNAME"], env["ADPIPE_KAFKA_PASSWORD"]) == ("airflow", "kafka-secret-123")
    assert "kafka-secret-123" not in " ".join(command)  # never on a command line
    assert read_state(load_settings(env))["pid"] == 2**22 + 7


def test_a_standby_is_started_beside_a_live_driver_and_one_that_took_over_is_recorded_as_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import socket

    from adpipe.orchestration.stream_supervisor import StreamStartOperator, read_state, record_start
    from adpipe.stream import leadership

    env = {"ADPIPE_HOME": str(tmp_path), "ADPIPE_JOB_ID": "j1", "ADPIPE_STREAM_STANDBY": "on"}
    settings = load_settings(env)
    operator = StreamStartOperator(task_id="start")
    started: list[list[str]] = []

    def fake_start(_settings, command: list[str], name: str, _env: dict[str, str]):  # noqa: ANN001, ANN202
        started.append(command)
        return SimpleNamespace(pid=2**22 + len(started)), tmp_path / f"{name}.log"  # pids that do not run

    monkeypatch.setattr(operator, "_start", fake_start)
    record_start(settings, os.getpid(), tmp_path / "stream.log")
    # This process leads the job (its leadership group, the brokers' answer faked).
    leading = [leadership.Driver(socket.gethostname(), os.getpid(), True)]
    monkeypatch.setattr(leadership, "drivers", lambda _settings, timeout_s=10.0: list(leading))
    assert operator.start_standby_if_missing(settings, env) == 2**22 + 1
    assert started[-1][-1] == "--standby" and started[-1][-2].endswith("aggregation_stream.py")
    assert read_state(settings)["standby_pid"] == 2**22 + 1
    # That standby died before it waited: another is started.
    assert operator.start_standby_if_missing(settings, env) == 2**22 + 2
    # A standby that took over (the leader runs under it) is the driver now.
    state = read_state(settings)
    state["standby_pid"] = os.getppid()
    (tmp_path / "stream" / "j1" / "supervisor.json").write_text(json.dumps(state))
    assert operator.start_standby_if_missing(settings, env) == 2**22 + 3
    state = read_state(settings)
    assert state["pid"] == os.getppid() and state["standby_pid"] == 2**22 + 3
