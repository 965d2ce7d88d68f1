"""StreamSubmitOperator's command line comes from the Spark provider's hook
(private methods, see ``StreamSubmitOperator.submit_command``): pinned here
against the installed provider, so an upgrade that changes them fails."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from adpipe.settings import load_settings


def test_the_provider_builds_the_stream_jobs_command_from_its_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from adpipe.orchestration.stream_supervisor import STREAM_APPLICATION, StreamStartError, StreamSubmitOperator

    settings = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_SPARK_MASTER": "local[2]", "ADPIPE_JOB_ID": "j1"})
    monkeypatch.setenv("AIRFLOW_CONN_ADPIPE_SPARK", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    command = StreamSubmitOperator(task_id="start").submit_command(settings)
    assert Path(command[0]).name == "spark-submit"
    assert command[command.index("--master") + 1] == "local[2]"
    assert command[command.index("--name") + 1] == "adpipe-stream-j1"
    assert command[-1] == str(STREAM_APPLICATION)
    confs = dict(command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf")
    assert {"spark.pyspark.python", "spark.sql.shuffle.partitions"} <= confs.keys()
    # The stream job's own heap and its workers' preloaded operator, as when pyspark starts it.
    assert confs["spark.driver.memory"] == "2g"
    assert "--jars" in command and "spark-sql-kafka" in command[command.index("--jars") + 1]
    # A connection to another master than the settings' is refused.
    monkeypatch.setenv("AIRFLOW_CONN_ADPIPE_SPARK", json.dumps({"conn_type": "spark", "host": "spark://elsewhere:7077"}))
    with pytest.raises(StreamStartError, match="gives master 'spark://elsewhere:7077'"):
        StreamSubmitOperator(task_id="start").submit_command(settings)


def test_a_standby_is_started_beside_a_live_driver_and_one_that_took_over_is_recorded_as_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import socket
    from types import SimpleNamespace

    from adpipe.orchestration.stream_supervisor import StreamSubmitOperator, read_state, record_start
    from adpipe.stream import leadership

    settings = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_JOB_ID": "j1", "ADPIPE_STREAM_STANDBY": "on"})
    monkeypatch.setenv("AIRFLOW_CONN_ADPIPE_SPARK", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    operator = StreamSubmitOperator(task_id="start")
    started: list[list[str]] = []

    def fake_start(_settings, command: list[str], name: str):  # noqa: ANN001, ANN202
        started.append(command)
        return SimpleNamespace(pid=2**22 + len(started)), tmp_path / f"{name}.log"  # pids that do not run

    monkeypatch.setattr(operator, "_start", fake_start)
    record_start(settings, os.getpid(), tmp_path / "stream.log")
    # This process leads the job (its leadership group, the brokers' answer faked).
    leading = [leadership.Driver(socket.gethostname(), os.getpid(), True)]
    monkeypatch.setattr(leadership, "drivers", lambda _settings, timeout_s=10.0: list(leading))
    assert operator.start_standby_if_missing(settings) == 2**22 + 1
    assert started[-1][-1] == "--standby" and started[-1][-2].endswith("aggregation_stream.py")
    assert read_state(settings)["standby_pid"] == 2**22 + 1
    # That standby died before it waited: another is started.
    assert operator.start_standby_if_missing(settings) == 2**22 + 2
    # A standby that took over (the leader runs under it) is the driver now.
    state = read_state(settings)
    state["standby_pid"] = os.getppid()
    (tmp_path / "stream" / "j1" / "supervisor.json").write_text(json.dumps(state))
    assert operator.start_standby_if_missing(settings) == 2**22 + 3
    state = read_state(settings)
    assert state["pid"] == os.getppid() and state["standby_pid"] == 2**22 + 3
