"""The jobs on a local Spark standalone cluster (``adpipe spark up``): a
master and two workers under the test home, the stream job and Union & Load
run on it through ``ADPIPE_SPARK_MASTER=spark://...`` with the checkpoint
on a ``file://`` URI every node reaches.

A worker is SIGKILLed while a micro-batch runs, the way a machine dies: the
worker JVM, its executor (a child of the worker) and the executor's Python
workers at once. The driver loses the executor's tasks, its shuffle output
and its state stores; Spark runs them again on the other worker (state
reloaded from the checkpoint), the killed worker comes back and gets a new
executor, and the output is still exactly once. Expected counts come from
the producer's summary, the tables' rows from plain Kafka reads."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from adpipe import schemas as S
from adpipe.lakehouse import tables as T
from adpipe.local import spark_cluster
from adpipe.settings import Settings, load_settings
from adpipe.tools import verify

from tests.conftest import PORT_BASE
from tests.integration.helpers import (
    BROKER_ENV,
    NO_REVISIONS,
    Pipeline,
    StreamRun,
    assert_exactly_once,
    dump,
    in_hour,
    make_pipeline,
    reaped,
    wait_for,
)

# The cluster's ports: master PORT_BASE+10, its web UI +11, the workers' UIs +12 and +13.
SPARK_ENV = {
    "ADPIPE_SPARK_MASTER_PORT": str(PORT_BASE + 10),
    "ADPIPE_SPARK_MASTER_UI_PORT": str(PORT_BASE + 11),
    "ADPIPE_SPARK_WORKER_MEMORY": "1g",
    "ADPIPE_SPARK_EXECUTOR_MEMORY": "768m",
    # Spark's own lines in the job's log, where the tests look for "Lost executor".
    "ADPIPE_JVM_LOGS": "console",
}
MASTER = f"spark://127.0.0.1:{PORT_BASE + 10}"
# Events from 06:56 to 07:02 (an hour of its own in the session's tables):
# the stream closes hour 06, which the load then loads.
HOUR = "2026-11-20T06"
START = datetime(2026, 11, 20, 6, 56, tzinfo=UTC)


@pytest.fixture(scope="module")
def cluster(broker: Settings) -> Iterator[Settings]:
    settings = load_settings({**BROKER_ENV, **SPARK_ENV})
    spark_cluster.down(settings)
    status = spark_cluster.up(settings, workers=2)
    assert status.running and status.answering, status.describe()
    yield settings
    spark_cluster.down(settings)


# An executor's own log (INFO, in its work folder) of each task it runs:
# task <partition>.<attempt> in stage <stage>.<attempt> (TID <tid>).
TASK_LINE = re.compile(r"Executor: (Running|Finished) task (\d+)\.\d+ in stage (\d+)\.\d+ \(TID (\d+)\)")


@dataclass(frozen=True)
class Task:
    stage: str
    partition: str
    tid: str


def _executor_logs(settings: Settings, index: int) -> dict[str, Path]:
    """Spark executor id -> stderr log of each executor worker ``index`` runs
    (from their command lines: ``--executor-id N --app-id A``)."""
    logs = {}
    for pid in spark_cluster.executor_pids(settings, index):
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        executor_id, app_id = args[args.index("--executor-id") + 1], args[args.index("--app-id") + 1]
        logs[executor_id] = spark_cluster.worker_dir(settings, index) / app_id / executor_id / "stderr"
    return logs


def _tasks(stderr: Path) -> tuple[set[Task], set[Task]]:
    """The tasks an executor started, and those it finished."""
    started, finished = set(), set()
    for kind, partition, stage, tid in TASK_LINE.findall(stderr.read_text(errors="replace")):
        (started if kind == "Running" else finished).add(Task(stage, partition, tid))
    return started, finished


def _running(logs: dict[str, Path]) -> set[Task]:
    running: set[Task] = set()
    for path in logs.values():
        started, finished = _tasks(path) if path.exists() else (set(), set())
        running |= started - finished
    return running


@dataclass
class KilledRun:
    pipeline: Pipeline
    summary: dict
    run: StreamRun
    killed_pids: list[int]
    executor_ids: list[str]  # of the executors the killed worker ran
    tasks_in_flight: set[Task]  # what they had started and not finished at the kill
    tasks_finished: set[Task]  # by every executor of the application
    batches_before_kill: int
    listening: list[str]  # the sockets the cluster, the driver and the executors listened on


def _listening(settings: Settings, driver: int) -> list[str]:
    """The local addresses our processes listen on: the master, the workers,
    their executors and Python workers, the driver and its JVM (from /proc:
    each process's socket inodes, matched with the kernel's TCP tables)."""
    roots = [spark_cluster.master_pid(settings), *spark_cluster.worker_pids(settings).values(), driver]
    pids = {p for root in roots if root for p in (root, *spark_cluster.descendants(root))}
    inodes = set()
    for pid in pids:
        try:
            links = [os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:  # gone meanwhile
            continue
        inodes |= {link[8:-1] for link in links if link.startswith("socket:[")}
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                listening.append(_address(fields[1]))
    return listening


def _address(hex_address: str) -> str:
    """A /proc/net/tcp[6] local address (little-endian hex) as host:port."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        return f"{ipaddress.IPv4Address(raw[::-1])}:{int(port, 16)}"
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    address = ipaddress.IPv6Address(words)
    return f"[{address.ipv4_mapped or address}]:{int(port, 16)}"


def _batches(log_path: Path) -> int:
    return sum("adpipe.stream: batch" in line for line in log_path.read_text().splitlines())


def _stop_mid_task(cluster: Settings, logs: dict[str, Path], proc: subprocess.Popen, log_path: Path) -> set[Task]:
    """SIGSTOP worker 1's executors while one of them runs a task, and return
    the tasks they had started and not finished. A task seen running twice
    may still finish before a signal lands: the executors are frozen first,
    their worker (still running) copies what they wrote to their stderr
    files, and only then is the log read; with no task in flight they go on
    (SIGCONT) and the next one is awaited."""
    deadline = time.monotonic() + 180
    seen: set[Task] = set()

    def task_in_flight() -> bool:
        nonlocal seen
        running = _running(logs)
        in_flight, seen = running & seen, running
        return bool(in_flight)

    while time.monotonic() < deadline:
        wait_for(task_in_flight, proc, log_path, "worker 1's executor ran no task", timeout_s=120)
        executors = spark_cluster.executor_pids(cluster, 1)
        for pid in executors:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(0.5)
        in_flight = _running(logs)
        if in_flight:
            return in_flight
        for pid in executors:
            os.kill(pid, signal.SIGCONT)
    pytest.fail("worker 1's executors were never frozen with a task in flight")


@pytest.fixture(scope="module")
def killed_run(cluster: Settings, tmp_path_factory: pytest.TempPathFactory) -> KilledRun:
    """One ``--available-now`` stream run on the cluster, whose worker 1 is
    SIGKILLed (with its executor) while a batch runs, then started again."""
    workdir = tmp_path_factory.mktemp("spark-cluster")
    pipeline = make_pipeline(
        workdir,
        {**SPARK_ENV, **NO_REVISIONS, "ADPIPE_SPARK_MASTER": MASTER, "ADPIPE_CHECKPOINT_URI": f"file://{workdir}/checkpoints"},
    )
    summary = pipeline.produce(
        events=1500, seed=1401, ads=10, ad_offset=1400, minutes=6, start=START, duplicate_rate=0.04,
        malformed_rate=0.02, late_rate=0.02,
    )  # fmt: skip
    proc, log_path = pipeline.start_stream("--available-now", "--max-offsets-per-trigger", "250")
    with reaped(proc):
        # One batch done (both workers run an executor of the job), then
        # the kill while worker 1's executor has a task in flight (frozen
        # first, to know which).
        wait_for(lambda: _batches(log_path) >= 1, proc, log_path, "no batch was committed")
        logs = _executor_logs(cluster, 1)
        assert logs, "worker 1 runs no executor of the job"
        listening = _listening(cluster, proc.pid)
        in_flight = _stop_mid_task(cluster, logs, proc, log_path)
        batches_before_kill = _batches(log_path)
        killed = spark_cluster.kill_worker(cluster, 1)  # SIGKILL ends stopped processes too
        assert proc.poll() is None, "the kill must happen while the job runs"
        spark_cluster.start_worker(cluster, 1)
        proc.wait(timeout=600)
    run = StreamRun(proc.returncode, log_path.read_text())
    # Every executor the application had, on either worker (the dead one's
    # included): their logs say where each task finished.
    app_dir = next(iter(logs.values())).parent.parent.name
    finished: set[Task] = set()
    for stderr in cluster.home.glob(f"spark-cluster/worker-*/{app_dir}/*/stderr"):
        finished |= _tasks(stderr)[1]
    return KilledRun(pipeline, summary, run, killed, sorted(logs), in_flight, finished, batches_before_kill, listening)


# About 2 minutes: in make test-extended, so that make test stays within its 30
# (make chaos kills workers too, and the short chaos run is in make test).
@pytest.mark.slow
@pytest.mark.extended
def test_a_worker_sigkilled_mid_batch_is_survived_exactly_once(killed_run: KilledRun, cluster: Settings) -> None:
    run, pipeline = killed_run.run, killed_run.pipeline
    assert run.returncode == 0, run.log[-4000:]
    # The worker died with its executor while it ran tasks (mid-batch);
    # each of them was run again, and finished, by another executor (Spark
    # does not count a task lost with its worker as a failure of the task).
    assert len(killed_run.killed_pids) >= 2  # the worker JVM and its executor at least
    assert killed_run.tasks_in_flight, "no task was running on the killed executor"
    for task in killed_run.tasks_in_flight:
        assert task not in killed_run.tasks_finished
        again = [t for t in killed_run.tasks_finished if (t.stage, t.partition) == (task.stage, task.partition)]
        assert again, f"{task} was never run again"
    assert re.search(r"Lost executor (\d+) on 127\.0\.0\.1: worker lost", run.log), run.log[-4000:]
    # Nothing of the cluster or the job listened beyond loopback.
    assert len(killed_run.listening) >= 6  # master RPC and UI, two workers' RPC and UI, executors, driver
    assert [a for a in killed_run.listening if not a.rsplit(":", 1)[0].strip("[]").endswith("127.0.0.1")] == []
    assert len(run.batch_lines()) > killed_run.batches_before_kill
    assert "Spark dropped" not in run.log
    assert spark_cluster.status(cluster).answering  # the worker is back

    summary = killed_run.summary
    assert summary["duplicates"] > 30 and summary["malformed"] > 20 and summary["late"] == 30
    assert_exactly_once(pipeline, [summary], min_windows=10 * 5)
    late = pipeline.read(pipeline.settings.topics.late)
    assert sorted(json.loads(r.value)["event_id"] for r in late) == sorted(
        e["event_id"] for e in summary["late_events"]
    )
    dlq = pipeline.read(pipeline.settings.topics.dlq)
    assert len({r.header(S.HEADER_SOURCE) for r in dlq}) == len(dlq) == summary["malformed"]


@pytest.mark.slow  # about 2 minutes (the load, then the tables read back): make test-extended
@pytest.mark.extended
def test_union_and_load_on_the_cluster_loads_the_hour_once(
    killed_run: KilledRun, pg: Settings, tmp_path: Path
) -> None:
    pipeline = killed_run.pipeline
    assert killed_run.run.returncode == 0
    # Tables of its own (a warehouse and a metastore database): the shared
    # test home's warehouse may hold another metastore's tables (a demo's).
    tables_env = {
        **pipeline.env,
        "ADPIPE_HOME": str(tmp_path / "tables"),
        "ADPIPE_METASTORE_DATABASE": f"adpipe_ms_{pipeline.settings.job_id}".lower().replace("-", "_"),
    }
    load = subprocess.run(
        [sys.executable, "-m", "adpipe", "load", "--hour", HOUR],
        env={**tables_env, "ADPIPE_MAX_LATE_SHARE": "0.1"},
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert load.returncode == 0, load.stdout[-2000:] + load.stderr[-4000:]
    assert f" on {MASTER}" in load.stderr, load.stderr[-2000:]  # adpipe.spark's line: it ran on the cluster

    # What the tables must hold, from plain Kafka reads and verify's own
    # (Python) reading of the raw events.
    aggregates = {
        (a["record_uuid"], a["ad_id"], a["window_start"], a["impressions"], a["clicks"])
        for a in pipeline.aggregates()
        if a["window_start"].startswith(HOUR)
    }
    raw, late = set(), set()
    for topic, ids in ((pipeline.settings.topics.events, raw), (pipeline.settings.topics.late, late)):
        for record in pipeline.read(topic):
            event = verify.classify(record.value)
            if not isinstance(event, str) and in_hour(event.event_ms, HOUR):
                ids.add(event.event_id)
    assert len(aggregates) >= 10 * 4 and late

    # Read back on the local master: the check does not run on what it checks.
    rows = dump({**tables_env, "ADPIPE_SPARK_MASTER": "local[2]"}, HOUR)["rows"]
    region = pipeline.settings.job_id
    ours = {t: [r for r in table_rows if r["region"] == region] for t, table_rows in rows.items()}
    got = {
        (r["record_uuid"], r["ad_id"], r["window_start"][:19] + "Z", r["impressions"], r["clicks"])
        for r in ours[T.AGGREGATES]
    }
    assert got == aggregates and len(ours[T.AGGREGATES]) == len(got)
    raw_ids = [r["event_id"] for r in ours[T.RAW]]
    assert sorted(raw_ids) == sorted(raw)
    late_keys = [r["event_key"] for r in ours[T.QUARANTINE] if r["source"] == T.SOURCE_LATE]
    assert sorted(late_keys) == sorted(late)
