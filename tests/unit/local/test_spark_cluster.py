"""The local Spark cluster's command lines, its reading of the master's
state, and which processes it takes for its own (fake daemons: real
processes whose command lines look like a worker and its executor)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from adpipe.cli import build_parser, main
from adpipe.local import spark_cluster as sc
from adpipe.processes import alive
from adpipe.settings import Settings, load_settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings(
        {
            "ADPIPE_HOME": str(tmp_path / "home"),
            "ADPIPE_SPARK_MASTER_PORT": "17077",
            "ADPIPE_SPARK_MASTER_UI_PORT": "18091",
            "ADPIPE_SPARK_WORKER_CORES": "3",
            "ADPIPE_SPARK_WORKER_MEMORY": "1536m",
            "ADPIPE_JVM_OPTIONS": "-XX:TieredStopAtLevel=1 -Dx='a b'",
        }
    )


def test_master_and_worker_command_lines(settings: Settings) -> None:
    home = settings.home / "spark-cluster"
    spark_class = sc.spark_home() / "bin" / "spark-class"
    assert spark_class.is_file()
    assert sc.master_command(settings) == [
        str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "17077",
        "--webui-port", "18091", "--properties-file", str(home / "master.properties"),
    ]  # fmt: skip
    assert sc.worker_command(settings, 2) == [
        str(spark_class), "org.apache.spark.deploy.worker.Worker", "spark://127.0.0.1:17077", "--host",
        "127.0.0.1", "--cores", "3", "--memory", "1536m", "--work-dir", str(home / "worker-2"),
        "--webui-port", "18093", "--properties-file", str(home / "worker.properties"),
    ]  # fmt: skip
    assert sc.master_url(settings) == "spark://127.0.0.1:17077"
    assert sc.master_ui_url(settings) == "http://127.0.0.1:18091"


def test_daemons_run_the_installed_spark_on_loopback_with_our_jvm_options(settings: Settings) -> None:
    env = sc.daemon_env(settings)
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert env["SPARK_HOME"] == str(sc.spark_home())
    assert env["SPARK_CONF_DIR"] == str(settings.home / "spark-cluster" / "conf")
    assert env["SPARK_DAEMON_JAVA_OPTS"] == "-XX:TieredStopAtLevel=1 '-Dx=a b'"
    assert env["PYSPARK_PYTHON"] == sys.executable
    # No REST submission server on the fixed port 6066; a taken port fails.
    assert sc.MASTER_PROPERTIES["spark.master.rest.enabled"] == "false"
    assert sc.WORKER_PROPERTIES["spark.port.maxRetries"] == "0"


def test_alive_workers_are_known_by_their_ui_port_and_a_dead_entry_is_not_alive(settings: Settings) -> None:
    state = {
        "status": "ALIVE",
        "workers": [
            {"id": "worker-a", "webuiaddress": "http://127.0.0.1:18092", "state": "DEAD"},
            {"id": "worker-b", "webuiaddress": "http://127.0.0.1:18093", "state": "ALIVE"},
            {"id": "worker-c", "webuiaddress": "http://127.0.0.1:18092", "state": "ALIVE"},
            {"id": "other", "webuiaddress": "http://127.0.0.1:8081", "state": "ALIVE"},
            {"id": "gone", "webuiaddress": "http://127.0.0.1:18094", "state": "DEAD"},
        ],
    }
    alive = sc.alive_workers(state, settings)
    assert {index: w["id"] for index, w in alive.items()} == {1: "worker-c", 2: "worker-b"}
    assert sc.alive_workers(None, settings) == {}


def test_status_of_a_home_without_a_cluster(settings: Settings) -> None:
    st = sc.status(settings)
    assert not st.running and not st.answering and st.pid is None
    assert [w.index for w in st.workers] == [1, 2]  # the default size
    assert st.describe() == "spark cluster down (nothing of ours runs; spark://127.0.0.1:17077 answering=False)"
    assert sc.down(settings) is False
    assert sc.worker_pids(settings) == {}


def test_up_refuses_a_master_port_someone_else_listens_on(tmp_path: Path) -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        settings = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_SPARK_MASTER_PORT": str(port)})
        with pytest.raises(sc.SparkClusterError, match=f"something else already listens on 127.0.0.1:{port}"):
            sc.up(settings, workers=1)
    assert sc.master_pid(settings) is None
    with pytest.raises(sc.SparkClusterError, match="1 to 8 workers"):
        sc.up(settings, workers=9)


@pytest.fixture
def fake_worker(settings: Settings) -> Iterator[subprocess.Popen]:
    """A process that looks like our worker 1 (its class and work folder on
    its command line) with a child that looks like an executor."""
    directory = settings.home / "spark-cluster"
    directory.mkdir(parents=True)
    script = (
        "import signal, subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import signal; signal.pause()', "
        "'org.apache.spark.executor.CoarseGrainedExecutorBackend'])\n"
        "signal.pause()\n"
    )
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", script, sc.WORKER_CLASS, "--work-dir", str(sc.worker_dir(settings, 1))],
        start_new_session=True,
    )
    (directory / "worker-1.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 20
    while not sc.executor_pids(settings, 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    yield proc
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # this test's own group only
    except ProcessLookupError:
        pass
    proc.wait()


def test_kill_worker_kills_it_with_its_executor_as_a_machine_dying(
    settings: Settings, fake_worker: subprocess.Popen
) -> None:
    assert sc.worker_pids(settings) == {1: fake_worker.pid}
    [executor] = sc.executor_pids(settings, 1)
    assert sc.descendants(fake_worker.pid) == [executor]
    assert sc.kill_worker(settings, 1) == [fake_worker.pid, executor]
    fake_worker.wait(timeout=10)
    assert sc.worker_pids(settings) == {}
    assert not Path(f"/proc/{executor}").exists() or not alive(executor)
    assert sc.kill_worker(settings, 1) == []  # nothing of ours runs any more


def test_a_pid_file_naming_another_process_is_not_ours(settings: Settings, fake_worker: subprocess.Popen) -> None:
    directory = settings.home / "spark-cluster"
    # Worker 2's pid file names worker 1's process: its work folder differs.
    (directory / "worker-2.pid").write_text(f"{fake_worker.pid}\n")
    # The master's names a process without the master's class.
    (directory / "master.pid").write_text(f"{fake_worker.pid}\n")
    assert sc.worker_pids(settings) == {1: fake_worker.pid}
    assert sc.master_pid(settings) is None
    assert sc.stop_worker(settings, 2) is False
    assert fake_worker.poll() is None


def test_stop_worker_terminates_it_and_what_it_left_behind(
    settings: Settings, fake_worker: subprocess.Popen, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sc, "LEFTOVER_WAIT_S", 0.5)
    [executor] = sc.executor_pids(settings, 1)
    assert sc.stop_worker(settings, 1, timeout_s=10) is True
    assert fake_worker.wait(timeout=10) == -15
    assert not alive(executor)  # the fake worker does not stop it: stop_worker does
    assert not (settings.home / "spark-cluster" / "worker-1.pid").exists()


def test_spark_verb_has_help_and_status_exits_3_when_down(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["spark", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    assert "adpipe spark" in text and "--workers N" in text and "ADPIPE_SPARK_MASTER" in text
    assert build_parser().parse_args(["spark", "up", "--workers", "2"]).workers == 2
    monkeypatch.setenv("ADPIPE_HOME", str(settings.home))
    monkeypatch.setenv("ADPIPE_SPARK_MASTER_UI_PORT", "18091")
    assert main(["spark", "status"]) == 3
    assert "spark cluster down" in capsys.readouterr().out
    assert main(["spark", "down"]) == 0
    assert "not running" in capsys.readouterr().out
