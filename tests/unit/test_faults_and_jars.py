"""Fault plans (named crash points), JVM jar names and adpipe's own jar."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from adpipe import jars
from adpipe.faults import AFTER_COMMIT, AFTER_PRODUCE, DURING_COMMIT, FaultPlan
from adpipe.jars import artifact_name

# --- fault plans -------------------------------------------------------------


@pytest.mark.parametrize(
    "env", [{}, {"ADPIPE_FAULT": ""}, {"ADPIPE_FAULT_BATCH": "3"}], ids=["unset", "empty", "batch_only"]
)
def test_no_fault_plan_when_unset(env: dict[str, str]) -> None:
    assert FaultPlan.from_env(env) is None


def test_fault_plan_from_env() -> None:
    assert FaultPlan.from_env({"ADPIPE_FAULT": "after_produce"}) == FaultPlan(AFTER_PRODUCE, 1, 0)
    plan = FaultPlan.from_env(
        {"ADPIPE_FAULT": "during_commit", "ADPIPE_FAULT_BATCH": "3", "ADPIPE_FAULT_DELAY_MS": "250"}
    )
    assert plan == FaultPlan(DURING_COMMIT, 3, 250)


def test_unknown_fault_point_raises() -> None:
    with pytest.raises(ValueError, match="ADPIPE_FAULT='before_produce'"):
        FaultPlan.from_env({"ADPIPE_FAULT": "before_produce"})


def test_fault_armed_only_at_or_after_its_batch_with_records() -> None:
    plan = FaultPlan(AFTER_COMMIT, from_batch=3)
    assert plan.armed(AFTER_COMMIT, 2, 10) is False
    assert plan.armed(AFTER_COMMIT, 3, 10) is True
    assert plan.armed(AFTER_COMMIT, 4, 1) is True
    assert plan.armed(AFTER_COMMIT, 3, 0) is False
    assert plan.armed(AFTER_PRODUCE, 3, 10) is False


def test_fault_on_records_fires_at_a_batch_of_copies_only() -> None:
    plan = FaultPlan.from_env({"ADPIPE_FAULT": "after_produce", "ADPIPE_FAULT_ON": "records"})
    assert plan == FaultPlan(AFTER_PRODUCE, 1, 0, on_any_record=True)
    assert plan.armed(AFTER_PRODUCE, 1, aggregates=0, records=12) is True
    assert plan.armed(AFTER_PRODUCE, 1, aggregates=0, records=0) is False
    assert FaultPlan(AFTER_PRODUCE).armed(AFTER_PRODUCE, 1, aggregates=0, records=12) is False
    with pytest.raises(ValueError, match="ADPIPE_FAULT_ON='late'"):
        FaultPlan.from_env({"ADPIPE_FAULT": "after_produce", "ADPIPE_FAULT_ON": "late"})


def test_hit_does_nothing_when_not_armed() -> None:
    # Armed it would SIGKILL the test process.
    assert FaultPlan(AFTER_COMMIT, from_batch=5).hit(AFTER_COMMIT, 4, 10) is None


# --- jar names ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("jar", "artifact"),
    [
        ("kafka-clients-3.9.1.jar", "kafka-clients"),
        ("commons-pool2-2.12.1.jar", "commons-pool2"),
        ("jackson-datatype-jdk8-2.13.5.jar", "jackson-datatype-jdk8"),
        ("delta-spark_4.1_2.13-4.4.0.jar", "delta-spark_4.1_2.13"),
        ("guava-33.4.8-jre.jar", "guava"),
        ("netty-transport-native-epoll-4.2.7.Final-linux-x86_64.jar", "netty-transport-native-epoll"),
        ("kafka_2.13-3.9.1.jar", "kafka_2.13"),
        ("spark-sql-kafka-0-10_2.13-4.1.3.jar", "spark-sql-kafka-0-10_2.13"),
        ("log4j-1.2-api-2.24.3.jar", "log4j-1.2-api"),
        ("zstd-jni-1.5.6-10.jar", "zstd-jni"),
        ("hive-exec-2.3.10-core.jar", "hive-exec"),
    ],
)
def test_artifact_name(jar: str, artifact: str) -> None:
    assert artifact_name(jar) == artifact


def test_wait_group_gone_waits_for_a_killed_group_and_kills_a_lingering_one() -> None:
    import os
    import signal
    import subprocess
    import time

    from adpipe.faults import wait_group_gone

    # A group whose leader ignores SIGTERM: "gone" only after the SIGKILL.
    stubborn = subprocess.Popen(
        ["python3", "-c", "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
         "signal.pause()"],
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    # Once it ignores SIGTERM (a fixed sleep lost the race on a loaded machine).
    assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == "ready"
    os.killpg(stubborn.pid, signal.SIGTERM)
    started = time.monotonic()
    wait_group_gone(stubborn.pid, timeout_s=1.0)
    assert stubborn.wait(timeout=10) == -signal.SIGKILL
    assert time.monotonic() - started < 5
    quick = subprocess.Popen(["sleep", "60"], start_new_session=True)
    os.killpg(quick.pid, signal.SIGKILL)
    quick.wait()
    wait_group_gone(quick.pid, timeout_s=5.0)  # returns at once: nothing left


def test_adpipe_spark_jar_is_built_once_per_source_and_a_changed_source_builds_anew(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sources = tmp_path / "src"
    source = (jars.JAVA_SOURCES / "adpipe" / "spark" / "CanonicalEvent.java").read_text()
    (sources / "adpipe" / "spark").mkdir(parents=True)
    (sources / "adpipe" / "spark" / "CanonicalEvent.java").write_text(source)
    monkeypatch.setattr(jars, "JAVA_SOURCES", sources)
    first = jars.adpipe_spark_jar(tmp_path / "cache")
    with zipfile.ZipFile(first) as archive:
        assert "adpipe/spark/CanonicalEvent.class" in archive.namelist()
    mtime = first.stat().st_mtime_ns
    assert jars.adpipe_spark_jar(tmp_path / "cache") == first and first.stat().st_mtime_ns == mtime
    (sources / "adpipe" / "spark" / "CanonicalEvent.java").write_text(source + "\n// changed\n")
    second = jars.adpipe_spark_jar(tmp_path / "cache")
    assert second != first and second.is_file() and not first.exists()  # the stale one is removed


def test_a_source_that_does_not_compile_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "src" / "x").mkdir(parents=True)
    (tmp_path / "src" / "x" / "Broken.java").write_text("package x; class Broken { int f() { return ; } }")
    monkeypatch.setattr(jars, "JAVA_SOURCES", tmp_path / "src")
    with pytest.raises(jars.JarFetchError, match="javac failed"):
        jars.adpipe_spark_jar(tmp_path / "cache")
    assert list((tmp_path / "cache" / "adpipe").glob("*.jar")) == []


def test_without_a_jdk_the_error_says_which_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    monkeypatch.setattr(jars.shutil, "which", lambda _name: None)
    with pytest.raises(jars.JarFetchError, match="openjdk-17-jdk-headless"):
        jars.adpipe_spark_jar(tmp_path / "cache")
