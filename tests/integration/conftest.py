"""Real processes: a Kafka broker, Spark stream jobs as subprocesses (killed
with SIGKILL at named points), and read-back with plain Kafka consumers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from adpipe import kafka_io
from adpipe import pg as pg_client
from adpipe.faults import wait_group_gone as _wait_group_gone
from adpipe.local import kafka_broker, postgres
from adpipe.local.airflow import (
    admin_password,
    airflow_env,
    ensure_admin_password,
    migrate,
    stop_standalone,
    ui_answers,
)
from adpipe.settings import Settings, isolated_env, load_settings
from adpipe.tools import produce, verify

from tests.conftest import JVM_OPTIONS, PORT_BASE, TEST_HOME

BROKER_ENV = {
    "ADPIPE_HOME": str(TEST_HOME / "it"),
    "ADPIPE_KAFKA_BOOTSTRAP": f"127.0.0.1:{PORT_BASE}",
    "ADPIPE_KAFKA_CONTROLLER_PORT": str(PORT_BASE + 1),
    "ADPIPE_PG_PORT": str(PORT_BASE + 2),
    "ADPIPE_JVM_OPTIONS": JVM_OPTIONS,
    # The jobs' /metrics (adpipe.metrics) on the suite's ports, never the
    # defaults a developer's own pipeline serves on.
    "ADPIPE_STREAM_METRICS_PORT": str(PORT_BASE + 70),
    "ADPIPE_BUDGET_METRICS_PORT": str(PORT_BASE + 71),
    "ADPIPE_LOAD_METRICS_PORT": str(PORT_BASE + 72),
}


@pytest.fixture(scope="session")
def broker() -> Iterator[Settings]:
    home = Path(BROKER_ENV["ADPIPE_HOME"])
    settings = load_settings(BROKER_ENV)
    kafka_broker.down(settings)
    shutil.rmtree(home, ignore_errors=True)
    kafka_broker.up(settings)
    yield settings
    kafka_broker.down(settings)


@pytest.fixture(scope="session")
def pg(broker: Settings) -> Iterator[Settings]:
    """A real PostgreSQL cluster (Debian's server) under the test home, with
    the project's databases created. Depends on ``broker`` so that the home
    is wiped before, not after, the cluster is initialised."""
    settings = load_settings(BROKER_ENV)
    postgres.down(settings)
    postgres.up(settings)
    yield settings
    postgres.down(settings)


@dataclass
class StreamRun:
    returncode: int
    log: str

    def batch_lines(self) -> list[str]:
        return [line for line in self.log.splitlines() if "adpipe.stream: batch" in line]


@dataclass
class Pipeline:
    """One isolated pipeline: its own topics, job id and checkpoint."""

    env: dict[str, str]
    settings: Settings
    workdir: Path

    def produce(self, **spec_args: object) -> dict:
        plan = produce.plan(produce.ProduceSpec(**spec_args))  # type: ignore[arg-type]
        produce.send(self.settings.kafka_bootstrap, self.settings.topics.events, plan)
        return plan.summary

    def start_stream(self, *args: str, extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
        """Start ``adpipe stream`` as its own process group (so a fault
        SIGKILLs Spark's JVM together with the Python driver)."""
        log_path = self.workdir / f"stream-{uuid.uuid4().hex[:6]}.log"
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "adpipe", "stream", *args],
                env={**self.env, **(extra_env or {})},
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return proc, log_path

    @contextmanager
    def continuous_stream(self) -> Iterator[tuple[subprocess.Popen, Path]]:
        """``adpipe stream`` with a 1 s trigger for the length of the block."""
        proc, log_path = self.start_stream(extra_env={"ADPIPE_TRIGGER_INTERVAL_S": "1"})
        with _reaped(proc):
            yield proc, log_path

    def stream(
        self,
        max_offsets: int = 700,
        fault: dict[str, str] | None = None,
        timeout: int = 300,
        env: dict[str, str] | None = None,
        extra_args: tuple[str, ...] = (),
    ) -> StreamRun:
        """One ``--available-now`` run to its end (or its injected death)."""
        proc, log_path = self.start_stream(
            "--available-now",
            "--max-offsets-per-trigger",
            str(max_offsets),
            *extra_args,
            extra_env={**(fault or {}), **(env or {})},
        )
        with _reaped(proc):
            proc.wait(timeout=timeout)
        return StreamRun(proc.returncode, log_path.read_text())

    def read(self, topic: str, isolation: str = "read_committed") -> list[kafka_io.Record]:
        return list(kafka_io.read_topic(self.settings.kafka_bootstrap, topic, isolation))

    def aggregates(self, isolation: str = "read_committed") -> list[dict]:
        return [json.loads(r.value) for r in self.read(self.settings.topics.aggregates, isolation)]

    def verify(self) -> dict:
        return verify.reconcile(self.settings, kafka_io.ledger_group(self.settings.job_id))


@contextmanager
def _reaped(proc: subprocess.Popen) -> Iterator[None]:
    """On leaving: SIGKILL the job's process group if it still runs, and wait
    until the whole group (Spark's JVM too) is gone."""
    try:
        yield
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        _wait_group_gone(proc.pid)


@pytest.fixture
def pipeline(broker: Settings, tmp_path: Path) -> Pipeline:
    return make_pipeline(tmp_path)


def make_pipeline(workdir: Path, extra_env: dict[str, str] | None = None) -> Pipeline:
    """A pipeline with fresh topics and job id on the session broker."""
    name = f"t{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        **BROKER_ENV,
        **isolated_env(name),
        "ADPIPE_SPARK_DRIVER_MEMORY": "1g",
        # Two state partitions instead of four: each stateful operator runs a
        # task per partition and batch; the same semantics at half the tasks.
        "ADPIPE_SHUFFLE_PARTITIONS": "2",
        **(extra_env or {}),
    }
    settings = load_settings(env)
    kafka_io.ensure_pipeline_topics(settings)
    return Pipeline(env, settings, workdir)


def on_producers_clock(settings: Settings) -> None:
    """The raw topic back on the producers' clock (``CreateTime``), as an
    existing topic may be: for tests that write records 'during' a past hour
    by their timestamps (adpipe creates it on the broker's clock)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    entry = ConfigEntry(kafka_io.TIMESTAMP_TYPE, "CreateTime", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ConfigResource.Type.TOPIC, settings.topics.events, incremental_configs=[entry])
    client = kafka_io.admin(settings.kafka)
    for future in client.incremental_alter_configs([resource]).values():
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    while kafka_io.timestamp_type(settings.kafka, settings.topics.events) != "CreateTime":
        assert time.monotonic() < deadline, "the raw topic's timestamp type did not change"
        time.sleep(0.2)


def until(what: str, probe: Callable[[], object], timeout_s: float, log_path: Path) -> object:
    """``probe()``'s first true answer, asked every 5 s (a URL or OS error
    counts as no answer); past ``timeout_s`` the test fails with the tail of
    ``log_path``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            got = probe()
        except (urllib.error.URLError, OSError, KeyError):
            got = None
        if got:
            return got
        time.sleep(5)
    tail = log_path.read_text()[-6000:] if log_path.exists() else ""
    pytest.fail(f"{what}: not within {timeout_s:.0f}s\n--- {log_path.name} ---\n{tail}")


@dataclass
class Standalone:
    """A running ``airflow standalone`` and what a test needs to talk to it."""

    settings: Settings
    env: dict[str, str]
    log_path: Path
    password: str

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.settings.airflow_port}"


@contextmanager
def airflow_standalone(pipeline: Pipeline, name: str) -> Iterator[Standalone]:
    """``airflow standalone`` (scheduler, dag-processor, api-server,
    triggerer; LocalExecutor) as ``make airflow`` starts it, for ``pipeline``
    (the UI on its ``ADPIPE_AIRFLOW_PORT``): metadata in a PostgreSQL
    database of its own, ``airflow_<name>``, and the admin password written
    before Airflow starts. On leaving, the whole process group is stopped."""
    settings = load_settings(pipeline.env)
    database = f"airflow_{name}"
    pg_client.ensure_databases(settings, (database,))
    env = airflow_env(settings, settings.pg_url(database), base=pipeline.env)
    # The scheduler's and triggerer's log servers listen on fixed ports (8793,
    # 8794) by default: beside the UI's, so that two test homes never collide.
    env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] = str(settings.airflow_port + 1)
    env["AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT"] = str(settings.airflow_port + 2)
    ensure_admin_password(settings)
    migrate(env)
    log_path = pipeline.workdir / "standalone.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(  # noqa: S603
            [str(Path(sys.executable).parent / "airflow"), "standalone"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        until("the Airflow UI", lambda: ui_answers(settings.airflow_port), 300, log_path)
        yield Standalone(settings, env, log_path, str(admin_password(settings)))
    finally:
        stop_standalone(proc)
