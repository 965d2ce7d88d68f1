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
    confs = {command[i + 1].split("=", 1)[0] for i, arg in enumerate(command) if arg == "--conf"}
    assert {"spark.pyspark.python", "spark.sql.shuffle.partitions"} <= confs
    assert "--jars" in command and "spark-sql-kafka" in command[command.index("--jars") + 1]
    # A connection to another master than the settings' is refused.
    monkeypatch.setenv("AIRFLOW_CONN_ADPIPE_SPARK", json.dumps({"conn_type": "spark", "host": "spark://elsewhere:7077"}))
    with pytest.raises(StreamStartError, match="gives master 'spark://elsewhere:7077'"):
        StreamSubmitOperator(task_id="start").submit_command(settings)
