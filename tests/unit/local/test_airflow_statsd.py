"""Airflow's own metrics: ``airflow_env`` turns on Airflow's StatsD client at
``ADPIPE_AIRFLOW_STATSD``, and Airflow, started with that environment,
really sends its metrics there (a UDP listener stands in for statsd_exporter)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from adpipe.local import airflow
from adpipe.settings import PROJECT_ROOT, load_settings


def test_airflow_env_points_statsd_at_the_setting_or_turns_it_off(tmp_path: Path) -> None:
    on = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_AIRFLOW_STATSD": "10.1.2.3:9999"})
    env = airflow.airflow_env(on, airflow.sqlite_url(on), base={})
    assert {k: env[k] for k in env if k.startswith("AIRFLOW__METRICS__")} == {
        "AIRFLOW__METRICS__STATSD_ON": "True",
        "AIRFLOW__METRICS__STATSD_HOST": "10.1.2.3",
        "AIRFLOW__METRICS__STATSD_PORT": "9999",
        "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
    }
    off = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_AIRFLOW_STATSD": "off"})
    assert airflow.airflow_env(off, airflow.sqlite_url(off), base={})["AIRFLOW__METRICS__STATSD_ON"] == "False"


def test_airflow_sends_its_metrics_to_the_configured_statsd_address(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.settimeout(1.0)
        port = listener.getsockname()[1]
        settings = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_AIRFLOW_STATSD": f"127.0.0.1:{port}"})
        env = airflow.airflow_env(settings, airflow.sqlite_url(settings))
        # Loading the DAGs folder the way Airflow's DAG processor does: Airflow
        # times its serializers' loading through its configured Stats client.
        code = f"from airflow.dag_processing.dagbag import DagBag; DagBag({str(airflow.DAGS_FOLDER)!r})"
        done = subprocess.run(  # noqa: S603
            [sys.executable, "-c", code], env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        lines: list[str] = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not lines:
            try:
                lines += listener.recv(65535).decode().splitlines()
            except TimeoutError:
                continue
    assert lines, "Airflow sent nothing to its StatsD address"
    # StatsD lines: <prefix>.<name>:<value>|<type>
    assert all(line.startswith("airflow.") and "|" in line for line in lines), lines
