"""The integration tests' helpers, one module for every test module (the
fixtures are in conftest.py): the isolated pipeline on the session broker
and its stream runs, waiting and reaping, Union & Load as real processes
(``adpipe load``, ``adpipe verify --hour``, the tables dumped by
``tables_dump.py``), the exactly-once check against the producer's summary,
and ``airflow standalone``. The budget service's environment, with its
independent Decimal arithmetic and prices, is in budget_helpers.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from adpipe import kafka_io
from adpipe import pg as pg_client
from adpipe.faults import wait_group_gone
from adpipe.lakehouse import warm
from adpipe.local.airflow import (
    admin_password,
    airflow_env,
    ensure_admin_password,
    migrate,
    stop_standalone,
    ui_answers,
)
from adpipe.processes import start_detached
from adpipe.settings import Settings, isolated_env, load_settings
from adpipe.stream import job as stream_job
from adpipe.tools import produce, verify
from confluent_kafka import Consumer, Producer, TopicPartition

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


# ---- a pipeline of its own on the session broker, its stream runs


def start_adpipe(workdir: Path, verb: str, args: tuple[str, ...], env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    """``adpipe <verb> <args>`` as its own process group (a fault SIGKILLs
    Spark's JVM together with the Python driver), its output in a new log
    under ``workdir``."""
    log_path = workdir / f"{verb}-{uuid.uuid4().hex[:6]}.log"
    return start_detached([sys.executable, "-m", "adpipe", verb, *args], log_path, env=env, append=False), log_path


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

    def produce(self, atomic: bool = False, **spec_args: object) -> dict:
        """Send a plan. ``atomic``: in one Kafka transaction, so that a
        read_committed job sees all of it at once (its commit marker takes
        an offset in each partition written); otherwise a running job may
        read one partition's records before another's (each partition is
        acknowledged on its own), and a later event seen early makes
        another partition's earlier ones late."""
        plan = produce.plan(produce.ProduceSpec(**spec_args))  # type: ignore[arg-type]
        if not atomic:
            produce.send(self.settings.kafka_bootstrap, self.settings.topics.events, plan)
            return plan.summary
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.settings.kafka_bootstrap,
                             "transactional.id": f"test-produce-{uuid.uuid4().hex[:8]}"})
        producer.init_transactions(30)
        producer.begin_transaction()
        for msg in plan.messages:
            producer.produce(self.settings.topics.events, msg.value, msg.key)
            producer.poll(0)
        producer.commit_transaction(60)
        return plan.summary

    def start_stream(self, *args: str, extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, Path]:
        """Start ``adpipe stream`` as its own process group (so a fault
        SIGKILLs Spark's JVM together with the Python driver)."""
        return start_adpipe(self.workdir, "stream", args, {**self.env, **(extra_env or {})})

    @contextmanager
    def continuous_stream(self) -> Iterator[tuple[subprocess.Popen, Path]]:
        """``adpipe stream`` with a 1 s trigger for the length of the block."""
        proc, log_path = self.start_stream(extra_env={"ADPIPE_TRIGGER_INTERVAL_S": "1"})
        with reaped(proc):
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
        with reaped(proc):
            proc.wait(timeout=timeout)
        return StreamRun(proc.returncode, log_path.read_text())

    def read(self, topic: str, isolation: str = "read_committed") -> list[kafka_io.Record]:
        return list(kafka_io.read_topic(self.settings.kafka_bootstrap, topic, isolation))

    def aggregates(self, isolation: str = "read_committed") -> list[dict]:
        return [json.loads(r.value) for r in self.read(self.settings.topics.aggregates, isolation)]

    def verify(self) -> dict:
        return verify.reconcile(self.settings, kafka_io.ledger_group(self.settings.job_id))


@contextmanager
def reaped(proc: subprocess.Popen) -> Iterator[None]:
    """On leaving: SIGKILL the job's process group if it still runs, and wait
    until the whole group (Spark's JVM too) is gone."""
    try:
        yield
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        wait_group_gone(proc.pid)


# For tests of something else than revisions whose events end a minute or
# two past their last hour: a window closes for good at the watermark, and
# so does an hour (the default allowed lateness, 300 s, would keep it open).
NO_REVISIONS = {"ADPIPE_ALLOWED_LATENESS_S": "0"}


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


def poll(
    what: str,
    probe: Callable[[], object],
    timeout_s: float,
    interval_s: float = 0.5,
    proc: subprocess.Popen | None = None,
    log_path: Path | None = None,
    tolerate: tuple[type[BaseException], ...] = (),
) -> object:
    """``probe()``'s first true answer, asked every ``interval_s`` (an
    exception of ``tolerate`` counts as no answer). The test fails, with the
    tail of ``log_path`` when given, once ``timeout_s`` passes or ``proc``
    ends first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            got = probe()
        except tolerate:
            got = None
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            _fail(f"{what}: the process ended first", log_path)
        if time.monotonic() >= deadline:
            _fail(f"{what}: not within {timeout_s:.0f}s", log_path)
        time.sleep(interval_s)


def _fail(message: str, log_path: Path | None) -> None:
    tail = log_path.read_text(errors="replace")[-6000:] if log_path and log_path.exists() else ""
    pytest.fail(f"{message}\n--- {log_path.name} ---\n{tail}" if log_path else message)


def until(what: str, probe: Callable[[], object], timeout_s: float, log_path: Path) -> object:
    """:func:`poll` every 5 s, an unreachable URL or process counting as no answer."""
    return poll(what, probe, timeout_s, 5, log_path=log_path, tolerate=(urllib.error.URLError, OSError, KeyError))


def wait_for(
    condition: Callable[[], object],
    proc: subprocess.Popen,
    log_path: Path,
    what: str,
    timeout_s: float = 300,
    interval_s: float = 0.2,
) -> None:
    """:func:`poll` while ``proc`` (a job writing ``log_path``) runs."""
    poll(what, condition, timeout_s, interval_s, proc=proc, log_path=log_path)


def send(p: Pipeline, values: list[bytes]) -> None:
    """Raw event values to ``p``'s raw topic, keyed by their ad_id."""
    producer = Producer({"bootstrap.servers": p.settings.kafka_bootstrap, "enable.idempotence": True})
    for value in values:
        producer.produce(p.settings.topics.events, value, json.loads(value)["ad_id"].encode())
    assert producer.flush(30) == 0


def inject_duplicate_aggregate(settings: Settings, hour: str) -> tuple[dict, dict]:
    """A second aggregate for an (ad_id, window_start) of ``hour`` under a new
    record_uuid: what a broken upstream would write. Returns (the original,
    the duplicate)."""
    records = kafka_io.read_topic(settings.kafka_bootstrap, settings.topics.aggregates)
    aggregates = [json.loads(r.value) for r in records]
    original = next(a for a in aggregates if a["window_start"].startswith(hour))
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "enable.idempotence": True})
    duplicate = {**original, "record_uuid": str(uuid.uuid4())}
    producer.produce(settings.topics.aggregates, key=duplicate["ad_id"].encode(), value=json.dumps(duplicate).encode())
    assert producer.flush(30) == 0
    return original, duplicate


# ---- exactly once, against the producer's own summary


def expected_windows(*summaries: dict) -> dict[tuple[str, str], tuple[int, int]]:
    """(ad_id, window_start) -> (impressions, clicks) from producer summaries."""
    counts: dict[tuple[str, str], list[int]] = {}
    for summary in summaries:
        for row in summary["counts"]:
            slot = counts.setdefault((row["ad_id"], row["window_start"]), [0, 0])
            slot[0 if row["event_type"] == "impression" else 1] += row["events"]
    return {k: (v[0], v[1]) for k, v in counts.items()}


def closed_watermark_ms(pipeline) -> int:  # noqa: ANN001
    """How far the job got: the watermark recorded with its last commit."""
    consumer = Consumer(
        {
            "bootstrap.servers": pipeline.settings.kafka_bootstrap,
            "group.id": kafka_io.ledger_group(pipeline.settings.job_id),
            "isolation.level": "read_committed",
        }
    )
    try:
        topic = pipeline.settings.topics.events
        parts = [TopicPartition(topic, p) for p in range(pipeline.settings.topic_partitions)]
        return max(json.loads(tp.metadata)["watermark_ms"] for tp in kafka_io.committed_offsets(consumer, parts))
    finally:
        consumer.close()


def window_end_ms(window_start: str) -> int:
    return int(datetime.fromisoformat(window_start).timestamp() * 1000) + 60_000


def latest_revisions(aggregates: list[dict]) -> dict[tuple[str, str], dict]:
    """Each window's latest revision (the contract: consumers keep the highest)."""
    latest: dict[tuple[str, str], dict] = {}
    for a in aggregates:
        key = (a["ad_id"], a["window_start"])
        if key not in latest or a.get("revision", 0) > latest[key].get("revision", 0):
            latest[key] = a
    return latest


def assert_exactly_once(pipeline, summaries: list[dict], min_windows: int) -> list[dict]:  # noqa: ANN001
    """The aggregates against the producers' summaries: each (window,
    revision) once, revisions 0..n with no gap, each window's latest
    revision equal to the summaries' count; then ``adpipe verify``. Returns
    the records read."""
    aggregates = pipeline.aggregates()
    keys = Counter((a["ad_id"], a["window_start"], a.get("revision", 0)) for a in aggregates)
    assert [k for k, n in keys.items() if n > 1] == [], "an (ad_id, window_start, revision) was emitted twice"
    assert len({a["record_uuid"] for a in aggregates}) == len(aggregates)
    revisions: dict[tuple[str, str], set[int]] = {}
    for ad_id, window_start, revision in keys:
        revisions.setdefault((ad_id, window_start), set()).add(revision)
    assert [k for k, found in revisions.items() if found != set(range(len(found)))] == [], "a revision is missing"
    watermark = closed_watermark_ms(pipeline)
    expected = {k: v for k, v in expected_windows(*summaries).items() if window_end_ms(k[1]) <= watermark}
    latest = latest_revisions(aggregates)
    actual = {key: (a["impressions"], a["clicks"]) for key, a in latest.items()}
    assert len(expected) >= min_windows
    assert actual == expected
    for a in aggregates:
        assert a["record_uuid"] == stream_job.record_uuid(
            pipeline.settings.job_id, a["ad_id"], datetime.fromisoformat(a["window_start"]), a.get("revision", 0)
        )
        assert window_end_ms(a["window_start"]) == window_end_ms(a["window_end"]) - 60_000
    report = pipeline.verify()
    assert report["ok"], json.dumps(report, indent=1)
    return aggregates


# ---- Union & Load as real processes

DUMP = Path(__file__).with_name("tables_dump.py")
# A script prefix: a Spark session on this home's metastore, as ``s``.
SPARK_SQL = (
    "from adpipe.lakehouse.metastore import metastore_session\n"
    "from adpipe.settings import load_settings\n"
    "s = metastore_session(load_settings(), 'test-sql')\n"
)


def run(env: dict[str, str], *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``python ARGS`` in ``env``; its whole output is kept under
    ``$ADPIPE_HOME/test-logs`` for a post-mortem (an assertion shows its end only)."""
    done = subprocess.run(  # noqa: S603
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=timeout, start_new_session=True
    )
    logs = Path(env["ADPIPE_HOME"]) / "test-logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"{time.strftime('%H%M%S')}-{uuid.uuid4().hex[:4]}.log").write_text(
        " ".join(args) + "\n" + done.stdout + done.stderr
    )
    return done


def load(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return run(env, "-m", "adpipe", "load", *args)


def outline(out: str) -> str:
    """A failed run's output for an assertion message: its adpipe lines and
    exceptions (the cause a long Java trace's tail hides), then its tail."""
    ours = [line for line in out.splitlines() if " adpipe" in line or "Error" in line or "Exception" in line]
    return "\n".join(ours[-40:]) + f"\n--- tail ---\n{out[-3000:]}"


def ok(proc: subprocess.CompletedProcess) -> str:
    """The output of a process that must have exited 0 (else its outline)."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{outline(out)}"
    return out


class _DumpServer:
    """``tables_dump.py --serve`` in ``env``: one Spark session answering
    every dump of a test file (a JVM start per dump cost a test file minutes)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        logs = Path(env["ADPIPE_HOME"]) / "test-logs"
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"dump-server-{uuid.uuid4().hex[:6]}.log"
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(  # noqa: S603
                [sys.executable, str(DUMP), "--serve"], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=log, text=True, start_new_session=True,
            )

    def ask(self, hour: str | None) -> dict:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write((hour or "") + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith('{"versions"'):
                return json.loads(line)
        raise AssertionError(f"the dump server ended (exit {self.proc.wait()}):\n{self.log_path.read_text()[-3000:]}")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()  # its loop ends, its session stops
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


_dump_servers: list[_DumpServer] = []


def dump(env: dict[str, str], hour: str | None = None) -> dict:
    """The tables, staging and ledger as ``tables_dump.py`` prints them, from
    one long-lived session per environment (closed by
    :func:`close_dump_servers` after each test file)."""
    server = next((s for s in _dump_servers if s.env == env), None)
    if server is None:
        server = _DumpServer(dict(env))
        _dump_servers.append(server)
    return server.ask(hour)


def close_dump_servers() -> None:
    while _dump_servers:
        _dump_servers.pop().close()


_warm_homes: set[str] = set()


def warm_env(env: dict[str, str], **extra: str) -> dict[str, str]:
    """``env`` whose loads, validations and ``verify --hour`` run in the
    home's warm load driver (started by the first of them; stopped by
    :func:`stop_warm_drivers` after each test file): one Spark session for
    all of them instead of a JVM each."""
    _warm_homes.add(env["ADPIPE_HOME"])
    return {**env, "ADPIPE_LOAD_WARM": "on", "ADPIPE_LOAD_WARM_IDLE_S": "900", **extra}


def stop_warm_drivers() -> None:
    while _warm_homes:
        warm.stop_driver(load_settings({**os.environ, "ADPIPE_HOME": _warm_homes.pop()}))


def verify_hour(env: dict[str, str], hour: str, tmp: Path) -> dict:
    """``adpipe verify --hour``'s tables section."""
    report = tmp / f"verify-{hour}-{uuid.uuid4().hex[:6]}.json"
    proc = run(env, "-m", "adpipe", "verify", "--hour", hour, "--report", str(report))
    assert report.exists(), (proc.stdout + proc.stderr)[-4000:]
    return json.loads(report.read_text())["tables"]


def ids(rows: list[dict], key: str = "event_id") -> list[str]:
    return [r[key] for r in rows]


def hours(rows: list[dict]) -> set[str]:
    return {r["event_hour"][:13] for r in rows}


def in_hour(ms: int, hour: str) -> bool:
    """Whether the epoch milliseconds ``ms`` fall in ``hour`` (``YYYY-MM-DDTHH``, UTC)."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H") == hour


# ---- airflow standalone


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


class Api:
    """Airflow's REST API as the UI uses it: a token from the simple auth
    manager's login, then JSON calls."""

    def __init__(self, port: int, password: str) -> None:
        self.base = f"http://127.0.0.1:{port}"
        body = self._request("POST", "/auth/token", {"username": "admin", "password": password}, token=None)
        self.token = body["access_token"]

    def _request(self, method: str, path: str, body: dict | None, token: str | None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback only
            return json.loads(response.read() or b"{}")

    def __call__(self, method: str, path: str, body: dict | None = None) -> dict:
        return self._request(method, path, body, self.token)


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
    # The DAG files do not change during a test: parsed once at the start, not
    # every 30 s (each parse imports adpipe and the providers: CPU the tests
    # on two cores need).
    env["AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL"] = "3600"
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
