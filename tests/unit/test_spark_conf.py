"""The Spark settings: the local cluster's ports and sizes, what executors of
a spark:// master are told, and a conf that never prints a secret."""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from pathlib import Path

import pytest
from adpipe.settings import SettingsError, load_settings
from adpipe.spark import REDACTED, in_threads, redacted, spark_conf

CLUSTER_ONLY = (
    "spark.pyspark.python",
    "spark.executorEnv.PYSPARK_PYTHON",
    "spark.executor.memory",
    "spark.executor.extraJavaOptions",
    "spark.cores.max",
)


def test_spark_cluster_settings_defaults() -> None:
    settings = load_settings({})
    assert settings.spark_master == "local[2]"
    assert (settings.spark_master_port, settings.spark_master_ui_port) == (7077, 8091)
    assert (settings.spark_worker_cores, settings.spark_worker_memory) == (1, "2g")
    assert (settings.spark_executor_memory, settings.spark_cores_max) == ("1g", 0)
    assert (settings.spark_driver_memory, settings.spark_log_level) == ("2g", "WARN")
    assert settings.spark_driver_host == "127.0.0.1"


def test_spark_cluster_settings_from_the_environment() -> None:
    settings = load_settings(
        {
            "ADPIPE_SPARK_MASTER": "spark://127.0.0.1:17077",
            "ADPIPE_SPARK_MASTER_PORT": "17077",
            "ADPIPE_SPARK_MASTER_UI_PORT": "18091",
            "ADPIPE_SPARK_WORKER_CORES": "2",
            "ADPIPE_SPARK_WORKER_MEMORY": "1536M",
            "ADPIPE_SPARK_EXECUTOR_MEMORY": "768m",
            "ADPIPE_SPARK_CORES_MAX": "1",
            "ADPIPE_SPARK_DRIVER_MEMORY": "1g",
            "ADPIPE_SPARK_LOG_LEVEL": "info",
            "ADPIPE_SPARK_DRIVER_HOST": "10.0.0.5",
        }
    )
    assert settings.spark_master == "spark://127.0.0.1:17077"
    assert (settings.spark_master_port, settings.spark_master_ui_port) == (17077, 18091)
    assert (settings.spark_worker_cores, settings.spark_worker_memory) == (2, "1536M")
    assert (settings.spark_executor_memory, settings.spark_cores_max) == ("768m", 1)
    assert (settings.spark_driver_memory, settings.spark_log_level) == ("1g", "INFO")
    assert settings.spark_driver_host == "10.0.0.5"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ADPIPE_SPARK_WORKER_MEMORY": "2 GB"}, "ADPIPE_SPARK_WORKER_MEMORY='2 GB' must be a size such as 512m or 2g"),
        ({"ADPIPE_SPARK_EXECUTOR_MEMORY": "lots"}, "ADPIPE_SPARK_EXECUTOR_MEMORY='lots' must be a size"),
        ({"ADPIPE_SPARK_DRIVER_MEMORY": "-1g"}, "ADPIPE_SPARK_DRIVER_MEMORY='-1g' must be a size"),
        ({"ADPIPE_SPARK_MASTER_PORT": "0"}, "ADPIPE_SPARK_MASTER_PORT=0 must be >= 1"),
        ({"ADPIPE_SPARK_MASTER_UI_PORT": "http"}, "ADPIPE_SPARK_MASTER_UI_PORT='http' is not an integer"),
        ({"ADPIPE_SPARK_WORKER_CORES": "0"}, "ADPIPE_SPARK_WORKER_CORES=0 must be >= 1"),
        ({"ADPIPE_SPARK_CORES_MAX": "-2"}, "ADPIPE_SPARK_CORES_MAX=-2 must be >= 0"),
    ],
    ids=["worker_memory", "executor_memory", "driver_memory", "port", "ui_port", "cores", "cores_max"],
)
def test_bad_spark_values_raise_settings_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(env)
    assert str(info.value).startswith(message)


def test_a_local_master_gets_no_executor_settings_and_a_driver_on_loopback(tmp_path: Path) -> None:
    conf = spark_conf(load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_SPARK_DRIVER_MEMORY": "1g"}), "t")
    assert conf["spark.master"] == "local[2]"
    assert conf["spark.driver.memory"] == "1g"
    assert [k for k in CLUSTER_ONLY if k in conf] == []
    # Not the host's own address, which Spark binds by default.
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "127.0.0.1"


def test_a_spark_master_tells_executors_the_python_heap_driver_address_and_jvm_options(tmp_path: Path) -> None:
    env = {
        "ADPIPE_HOME": str(tmp_path),
        "ADPIPE_SPARK_MASTER": "spark://127.0.0.1:17077",
        "ADPIPE_SPARK_EXECUTOR_MEMORY": "768m",
        "ADPIPE_JVM_OPTIONS": "-XX:TieredStopAtLevel=1",
        "ADPIPE_SPARK_JIT": "full",
        "ADPIPE_SPARK_GC": "default",
    }
    conf = spark_conf(load_settings(env), "t")
    assert conf["spark.master"] == "spark://127.0.0.1:17077"
    assert conf["spark.pyspark.python"] == conf["spark.executorEnv.PYSPARK_PYTHON"] == sys.executable
    assert conf["spark.executor.memory"] == "768m"
    assert conf["spark.executor.extraJavaOptions"] == "-XX:TieredStopAtLevel=1"
    assert conf["spark.driver.host"] == conf["spark.driver.bindAddress"] == "127.0.0.1"
    assert "spark.cores.max" not in conf  # 0: all the cluster offers
    assert conf["spark.jars"]  # shipped to the executors
    capped = spark_conf(load_settings({**env, "ADPIPE_SPARK_CORES_MAX": "1"}), "t")
    assert capped["spark.cores.max"] == "1"


def test_a_printed_conf_hides_every_secret(tmp_path: Path) -> None:
    conf = spark_conf(
        load_settings({"ADPIPE_HOME": str(tmp_path)}),
        "t",
        {
            "spark.hadoop.javax.jdo.option.ConnectionPassword": "pg-s3cret",
            "spark.kafka.sasl.jaas.config": "ScramLoginModule required password='k-s3cret';",
            "spark.hadoop.fs.s3a.secret.key": "s3-s3cret",
            "spark.hadoop.fs.s3a.access.key": "AKIA-s3cret",
            "spark.authenticate.secret": "auth-s3cret",
        },
    )
    shown = redacted(conf)
    assert "s3cret" not in repr(shown)
    assert shown["spark.hadoop.javax.jdo.option.ConnectionPassword"] == REDACTED
    assert shown["spark.kafka.sasl.jaas.config"] == REDACTED
    assert shown["spark.master"] == conf["spark.master"]  # the rest as it is
    assert len(shown) == len(conf)
    # Spark's own redaction (UI, event log, plans) covers the same words.
    assert "jaas" in conf["spark.redaction.regex"] and "password" in conf["spark.sql.redaction.options.regex"]


def test_the_driver_logs_to_a_file_under_the_home_unless_jvm_logs_is_console(tmp_path: Path) -> None:
    import shlex

    from adpipe.spark import LOG4J2_FILE_CONFIG, driver_log_file

    settings = load_settings({"ADPIPE_HOME": str(tmp_path)})
    assert settings.jvm_logs == "file"
    options = shlex.split(spark_conf(settings, "adpipe-load-2026-11-22T12")["spark.driver.extraJavaOptions"])
    assert f"-Dadpipe.log.file={tmp_path / 'logs' / 'adpipe-load-2026-11-22T12.log'}" in options
    assert f"-Dlog4j2.configurationFile={LOG4J2_FILE_CONFIG.as_uri()}" in options
    # The configuration writes to the file it is given, errors also to stderr.
    config = LOG4J2_FILE_CONFIG.read_text()
    assert "appender.file.fileName = ${sys:adpipe.log.file}" in config
    assert "appender.console.target = SYSTEM_ERR" in config and "threshold.level = error" in config
    assert driver_log_file(settings, "a b/c").name == "a_b_c.log"  # an application name is a file name

    console = spark_conf(load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_JVM_LOGS": "console"}), "t")
    assert "log4j" not in console["spark.driver.extraJavaOptions"]
    assert "adpipe.log.file" not in console["spark.driver.extraJavaOptions"]
    with pytest.raises(SettingsError, match="ADPIPE_JVM_LOGS='stdout' must be one of file, console"):
        load_settings({"ADPIPE_JVM_LOGS": "stdout"})


ZIP_PROBE = """
import importlib, json, sys, time, zipfile, zipimport
archive = sys.argv[1]
with zipfile.ZipFile(archive, "w") as z:
    z.writestr("first_mod.py", "X = 1")
sys.path.insert(0, archive)
import first_mod
reads = []
read_directory = zipimport._read_directory
zipimport._read_directory = lambda path: reads.append(path) or read_directory(path)
from adpipe.spark import keep_zip_directories
keep_zip_directories()
keep_zip_directories()  # twice: wrapped once
for _ in range(3):
    importlib.invalidate_caches()
unchanged = len(reads)
time.sleep(0.01)
with zipfile.ZipFile(archive, "a") as z:
    z.writestr("second_mod.py", "Y = 2")
importlib.invalidate_caches()
import second_mod
print(json.dumps({"unchanged": unchanged, "changed": len(reads) - unchanged, "y": second_mod.Y}))
"""


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="later Pythons re-read a zip lazily")
def test_workers_re_read_a_zip_on_the_path_only_when_it_changed(tmp_path: Path) -> None:
    import json
    import subprocess

    run = subprocess.run(
        [sys.executable, "-c", ZIP_PROBE, str(tmp_path / "probe.zip")], capture_output=True, text=True, check=True
    )
    # Each importer reads the directory once after the patch, then only when the zip changed.
    counts = json.loads(run.stdout)
    assert counts["unchanged"] == 1 and counts["changed"] >= 1 and counts["y"] == 2


def test_in_threads_runs_calls_at_once_and_raises_a_failure_after_all_ended() -> None:
    started = threading.Barrier(3, timeout=10)  # all three running at once, or the barrier breaks
    finished: list[str] = []

    def call(name: str, fail: bool = False, pause: float = 0.0) -> str:
        started.wait()
        time.sleep(pause)
        finished.append(name)
        if fail:
            raise ValueError(f"{name} failed")
        return name.upper()

    assert in_threads({n: functools.partial(call, n) for n in ("c", "a", "b")}) == {"c": "C", "a": "A", "b": "B"}
    assert list(in_threads({n: functools.partial(call, n) for n in ("c", "a", "b")})) == ["c", "a", "b"]
    finished.clear()
    calls = {"fails": functools.partial(call, "fails", True), "slow": functools.partial(call, "slow", pause=0.3),
             "other": functools.partial(call, "other")}
    with pytest.raises(ValueError, match="fails failed"):
        in_threads(calls)
    assert sorted(finished) == ["fails", "other", "slow"]


def _jvm_options_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int, env: dict[str, str]
) -> dict[str, list[str]]:
    """The driver's and the executors' JVM options of a cluster session on a
    host of ``cores`` cores, under ``env``."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    settings = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_SPARK_MASTER": "spark://h:7077", **env})
    conf = spark_conf(settings, "t")
    return {name: conf[name].split() for name in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")}


@pytest.mark.parametrize(
    ("jit", "cores", "expected"),
    [("quick", 64, True), ("full", 2, False), ("auto", 2, True), ("auto", 4, True), ("auto", 8, False)],
)
def test_the_jit_of_the_spark_jvms_is_quick_on_few_cores_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, jit: str, cores: int, expected: bool
) -> None:
    for name, options in _jvm_options_on(tmp_path, monkeypatch, cores, {"ADPIPE_SPARK_JIT": jit}).items():
        assert ("-XX:TieredStopAtLevel=1" in options) == bool(expected), name
        # C1 alone would reserve a code cache a load's driver fills.
        assert ("-XX:ReservedCodeCacheSize=256m" in options) == bool(expected), name


@pytest.mark.parametrize(
    ("gc", "cores", "expected"),
    [("serial", 64, True), ("default", 2, False), ("auto", 1, True), ("auto", 2, True), ("auto", 4, False)],
)
def test_the_spark_jvms_collect_serially_on_two_cores_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gc: str, cores: int, expected: bool
) -> None:
    for name, options in _jvm_options_on(tmp_path, monkeypatch, cores, {"ADPIPE_SPARK_GC": gc}).items():
        assert ("-XX:+UseSerialGC" in options) == expected, name


@pytest.mark.parametrize("collector", ["-XX:+UseG1GC", "-XX:+UseParallelGC", "-XX:+UseZGC"])
def test_a_collector_in_the_jvm_options_is_the_only_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collector: str
) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    env = {"ADPIPE_HOME": str(tmp_path), "ADPIPE_SPARK_GC": "serial", "ADPIPE_JVM_OPTIONS": f"-Xss4m {collector}"}
    options = spark_conf(load_settings(env), "t")["spark.driver.extraJavaOptions"].split()
    assert collector in options and "-XX:+UseSerialGC" not in options  # the JVM refuses two collectors


def test_an_unknown_collector_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="ADPIPE_SPARK_GC"):
        load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_SPARK_GC": "g1"})


def test_an_unknown_jit_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="ADPIPE_SPARK_JIT"):
        load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_SPARK_JIT": "c2"})


def test_the_stream_job_has_a_heap_of_its_own(tmp_path: Path) -> None:
    from adpipe.spark import stream_job_conf

    assert stream_job_conf(load_settings({"ADPIPE_HOME": str(tmp_path)}))["spark.driver.memory"] == "2g"
    own = load_settings(
        {"ADPIPE_HOME": str(tmp_path), "ADPIPE_STREAM_DRIVER_MEMORY": "1g", "ADPIPE_SPARK_DRIVER_MEMORY": "3g"}
    )
    assert stream_job_conf(own)["spark.driver.memory"] == "1g"
    assert spark_conf(own, "t", stream_job_conf(own))["spark.driver.memory"] == "1g"
    assert spark_conf(own, "t")["spark.driver.memory"] == "3g"  # the other jobs'
