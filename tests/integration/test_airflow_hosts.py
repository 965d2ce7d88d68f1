"""Airflow across hosts (adpipe.tools.hosts): the CeleryExecutor with Redis as
its broker, the scheduler, API server, dag-processor and triggerer on one
host, a Celery worker on each of two others, Kafka, PostgreSQL (Airflow's
metadata, the metastore) and Redis on the services host; the checkpoint
and the warehouse on the file system the hosts share. Each worker has its
own ``ADPIPE_HOME``: nothing passes between them but through the services.

One scenario, real processes throughout:

1. Only worker-1 runs. ``ad_aggregation_stream`` starts the stream driver
   there; ``ad_union_and_load`` runs the closed hour (sensor in the
   triggerer, stage, validate, verify on worker-1), and its ``publish``
   freezes in worker-1's warm load driver after writing one table
   (``ADPIPE_FAULT=load_after_publish``, STOP: mid-publish, the
   deployment's load lock held).
2. worker-2 starts; worker-1's host is killed (every process of it: the
   Celery worker, the task, the warm load driver, the stream driver).
3. The scheduler finds ``publish``'s heartbeat gone and retries it; it runs
   on worker-2, which starts a warm load driver of its own, takes the load
   lock the dead host's session released, and publishes the hour. The
   stream DAG, run again, lands on worker-2 and starts a driver there.
4. The hour is in the tables whole and once (against the producer's own
   summary), published by one ledger row, the aggregates are exactly once,
   and the task instances say where each try ran: the first tries on
   worker-1, publish's second on worker-2.

The same with worker-1's host cut off instead of killed (make
test-extended): publish's retry on worker-2 waits for the load lock until
the server ends the silent holder's session; after the heal, the frozen
publication is resumed, its lock lost, and the hour is still there once.
And the kill with the load's steps as clients of the load's Spark Connect
servers instead of warm load drivers (make test-extended):
``ADPIPE_SPARK_CONNECT`` names one on each worker; worker-1's steps start
worker-1's (``publish`` freezes in its own task process), and publish's
retry on worker-2 finds it dead with its host and starts worker-2's.

Needs root (namespaces): elsewhere it skips, loudly. A long scenario:
make test-long."""

from __future__ import annotations

import json
import logging
import secrets
import shutil
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from adpipe import pg as pg_client
from adpipe.faults import LOAD_AFTER_PUBLISH
from adpipe.lakehouse import connect_client, warm
from adpipe.local.airflow import airflow_env, migrate
from adpipe.settings import load_settings
from adpipe.stream import leadership
from adpipe.tools import hosts
from confluent_kafka import KafkaException

from tests.integration.helpers import NO_REVISIONS, assert_exactly_once, dump, make_pipeline
from tests.integration.on_hosts import made_hosts, skip, start_services

log = logging.getLogger("adpipe.tests.hosts")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

REDIS_PORT = 6379
API_PORT = 8080
AIRFLOW = str(Path(sys.executable).parent / "airflow")
STREAM_DAG, LOAD_DAG = "ad_aggregation_stream", "ad_union_and_load"


def _fail(what: str, *procs: hosts.HostProcess) -> None:
    logs = "\n".join(f"--- {p.host}: {p.log_path.name} ---\n{p.log()[-4000:]}" for p in procs)
    pytest.fail(f"{what}\n{logs}")


def _until(what: str, probe, timeout_s: float, *watched: hosts.HostProcess, interval_s: float = 1.0):  # noqa: ANN001, ANN202
    """``probe()``'s first truthy value within ``timeout_s``; the test fails
    with the logs of ``watched`` if one ends first or time runs out."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / interval_s) + 2):
        found = probe()
        if found:
            return found
        ended = [p for p in watched if p.poll() is not None]
        if ended:
            _fail(f"{what}: {', '.join(f'{p.host} {p.log_path.name}' for p in ended)} ended first", *watched)
        if time.monotonic() >= deadline:
            break
        time.sleep(interval_s)
    _fail(f"{what}: not within {timeout_s:.0f} s", *watched)
    return None


def _leader(settings) -> leadership.Driver | None:  # noqa: ANN001
    try:
        return leadership.leader(settings, timeout_s=5)
    except KafkaException:
        return None


@pytest.mark.parametrize("fault", [
    "kill",
    # The cut: the same retry, after the server ends the cut-off holder's
    # session; then the heal and the frozen publication resumed. Longer: make test-extended.
    pytest.param("cut", marks=pytest.mark.extended),
    # The kill with the load's steps as clients of Spark Connect servers
    # (ADPIPE_SPARK_CONNECT naming one on each worker): worker-1's steps start
    # worker-1's, publish's retry on worker-2 starts worker-2's. make test-extended.
    pytest.param("connect", marks=pytest.mark.extended),
])
def test_airflow_s_celery_workers_on_two_hosts_run_the_dags_and_a_lost_worker_s_publish_is_retried_on_the_other(
    hosts_base: Path, fault: str
) -> None:
    if shutil.which("redis-server") is None:
        skip("needs redis-server, the Celery broker (make deps installs it)")
    now = datetime.now(UTC)
    current = now.replace(minute=0, second=0, microsecond=0)
    if now < current + timedelta(minutes=3):  # events run to 2 minutes past the hour: none in the future
        time.sleep((current + timedelta(minutes=3) - now).total_seconds())
    hour = current - timedelta(hours=1)
    label = f"{hour:%Y-%m-%dT%H}"
    with made_hosts(hosts_base, ["airflow", "worker-1", "worker-2"]) as net:
        services = net.services
        shared = hosts_base / "shared"
        cluster = {
            **start_services(net),
            "ADPIPE_CHECKPOINT_URI": f"file://{shared / 'checkpoints'}",
            "ADPIPE_WAREHOUSE_URI": f"file://{shared / 'warehouse'}",
            "ADPIPE_LOAD_START": f"{hour:%Y-%m-%dT%H:%M:%SZ}",
            "ADPIPE_LOAD_SUBMIT": "warm",
            **({"ADPIPE_SPARK_CONNECT": f"sc://{net['worker-1'].ip}:15002,sc://{net['worker-2'].ip}:15002"}
               if fault == "connect" else {}),
            "ADPIPE_LOAD_RETRY_DELAY_S": "5",
            "ADPIPE_TRIGGER_INTERVAL_S": "2",
            **NO_REVISIONS,
        }
        redis = services.start(["redis-server", "--bind", services.ip, "--port", str(REDIS_PORT), "--protected-mode",
                                "no", "--save", "", "--appendonly", "no", "--dir", str(services.directory)],
                               services.directory / "redis.log")
        # The test's own clients (producing, reading, the tables' dump) in the root namespace.
        pipeline = make_pipeline(hosts_base, {**cluster, "ADPIPE_HOME": str(hosts_base / "client")})
        settings = pipeline.settings
        # To 2 minutes past the hour: the watermark passes its end and closes it
        # (its records all arrived after its end: not a quiet region's hour).
        sent = pipeline.produce(atomic=True, events=620, seed=4901, ads=4, ad_offset=700, minutes=62, start=hour,
                                duplicate_rate=0.05, malformed_rate=0.02)

        jwt, api_key = secrets.token_urlsafe(32), secrets.token_urlsafe(32)

        def airflow_on(host: hosts.Host, **extra: str) -> dict[str, str]:
            env = host.env(pipeline.env)
            on_host = load_settings(env)
            env = airflow_env(on_host, on_host.pg_url("airflow"), base=env)
            env.update({
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__CELERY__BROKER_URL": f"redis://{hosts.SERVICES}:{REDIS_PORT}/0",
                "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + on_host.pg_url("airflow").replace("+psycopg2", ""),
                "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
                "AIRFLOW__API__HOST": "0.0.0.0",  # noqa: S104 - the airflow host's own address, on the harness's bridge
                "AIRFLOW__API__PORT": str(API_PORT),
                "AIRFLOW__API__BASE_URL": f"http://airflow:{API_PORT}",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://airflow:{API_PORT}/execution/",
                # Every component signs and checks the tasks' tokens with the same secrets.
                "AIRFLOW__API_AUTH__JWT_SECRET": jwt,
                "AIRFLOW__API__SECRET_KEY": api_key,
                # A worker's host that dies: its task failed (and retried) 20 s after its last heartbeat.
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "20",
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
                **extra,
            })
            return env

        scheduler_env = airflow_on(net["airflow"])
        migrate(scheduler_env)  # from the test's namespace: it reaches the services host's PostgreSQL
        components = [net["airflow"].start([AIRFLOW, part], net["airflow"].directory / f"{part}.log", scheduler_env)
                      for part in ("api-server", "scheduler", "dag-processor", "triggerer")]
        # worker-1's load steps freeze mid-publish (its warm load driver stops itself).
        freeze = {"ADPIPE_FAULT": LOAD_AFTER_PUBLISH, "ADPIPE_FAULT_SIGNAL": "STOP", "ADPIPE_FAULT_BATCH": "1"}
        w1_env = airflow_on(net["worker-1"], **freeze)
        worker_1 = net["worker-1"].start([AIRFLOW, "celery", "worker", "--concurrency", "2"],
                                         net["worker-1"].directory / "celery-worker.log", w1_env)
        everything = [*components, worker_1, redis]

        metadata = pg_client.connect(settings, "airflow")

        def rows(sql: str, *args: object) -> list[tuple]:
            with metadata.cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchall()

        def cli(*args: str) -> str:
            done = subprocess.run([AIRFLOW, *args], env=scheduler_env, capture_output=True, text=True, timeout=180,
                                  check=False)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            return done.stdout

        _until("both DAGs parsed", lambda: len(rows("SELECT dag_id FROM dag WHERE dag_id IN (%s, %s)",
                                                   STREAM_DAG, LOAD_DAG)) == 2, 300, *everything)
        cli("dags", "unpause", STREAM_DAG)
        cli("dags", "trigger", STREAM_DAG)
        first = _until("the stream's driver leading", lambda: _leader(settings), 400, *everything, interval_s=2)
        assert first.host == "worker-1"

        cli("dags", "unpause", LOAD_DAG)  # ADPIPE_LOAD_START: the scheduler runs the closed hour
        w1_settings = load_settings(w1_env)
        frozen = f"fault injection: SIGSTOP at {LOAD_AFTER_PUBLISH}"

        def publish_frozen() -> bool:
            if fault != "connect":  # in worker-1's warm load driver
                path = warm.log_file(w1_settings)
                return path.is_file() and frozen in path.read_text(errors="replace")
            # in publish's own task process, a client of worker-1's Spark Connect server
            tries = [path for path in net["worker-1"].home.rglob("attempt=1.log") if "task_id=publish" in str(path)]
            return any(frozen in path.read_text(errors="replace") for path in tries)

        _until("worker-1's publish frozen mid-way", publish_frozen, 900, *everything, interval_s=2)

        worker_2 = net["worker-2"].start([AIRFLOW, "celery", "worker", "--concurrency", "2"],
                                         net["worker-2"].directory / "celery-worker.log",
                                         airflow_on(net["worker-2"]))
        if fault in ("kill", "connect"):
            net["worker-1"].kill()  # the whole host: Celery worker, task, warm load driver, stream driver
        else:
            # Cut off, everything on it running on: the stream driver ends
            # itself (its leadership lapsed), the frozen warm load driver keeps
            # its load lock until the server ends its silent session.
            net.cut_off("worker-1", "everything")
        everything = [*components, worker_2, redis]
        # The dead driver's session lapses; the stream DAG, run again, starts one on the live worker.
        _until("the dead driver's leadership lapsed", lambda: _leader(settings) is None, 60, *everything)
        cli("dags", "trigger", STREAM_DAG)
        second = _until("a driver leading again", lambda: _leader(settings), 400, *everything, interval_s=2)
        assert second.host == "worker-2"

        def load_run() -> tuple | None:
            found = rows("SELECT run_id, state FROM dag_run WHERE dag_id = %s AND data_interval_start = %s",
                         LOAD_DAG, hour)
            return found[0] if found and found[0][1] in ("success", "failed") else None

        run_id, state = _until("the hour's load run ended", load_run, 900, *everything, interval_s=2)
        tries = rows("SELECT task_id, try_number, state, hostname FROM task_instance WHERE dag_id = %s AND run_id = %s"
                     " UNION ALL SELECT task_id, try_number, state, hostname FROM task_instance_history"
                     " WHERE dag_id = %s AND run_id = %s ORDER BY 1, 2", LOAD_DAG, run_id, LOAD_DAG, run_id)
        assert state == "success", tries
        by_task: dict[str, list[tuple[int, str, str]]] = {}
        for task_id, try_number, ti_state, hostname in tries:
            by_task.setdefault(task_id, []).append((try_number, ti_state, hostname))
        for task_id in ("stage", "validate", "verify"):
            assert by_task[task_id] == [(1, "success", "worker-1")], by_task
        assert by_task["publish"] == [(1, "failed", "worker-1"), (2, "success", "worker-2")], by_task
        streams = rows("SELECT DISTINCT hostname FROM task_instance WHERE dag_id = %s AND task_id = %s",
                       STREAM_DAG, "start_stream_if_down")
        assert sorted(h for (h,) in streams) == ["worker-1", "worker-2"]
        metadata.close()

        if fault == "cut":
            # The heal, and the frozen publication resumed, its lock long lost:
            # whatever it does next (it stops at its next write's check, or
            # hangs on a connection the server dropped), the tables below are
            # the hour once, with the one ledger row of the retry.
            net.heal("worker-1")
            serving = json.loads((w1_settings.home / "load" / "warm.json").read_text())
            resumed = net["worker-1"].run(["kill", "-CONT", str(serving["pid"])])
            assert resumed.returncode == 0, resumed.stderr
            zombie_log = warm.log_file(w1_settings)
            done = ("lost the load lock", "--step publish --run-file")
            for _ in range(60):  # up to a minute for its verb to end, if it ends
                text = zombie_log.read_text(errors="replace").split("resumed (SIGCONT)", 1)[-1]
                if done[0] in text or (done[1] in text and ": exit " in text):
                    break
                time.sleep(1)
            log.info("the resumed publication's log after SIGCONT:\n%s", zombie_log.read_text(errors="replace")
                     .split("resumed (SIGCONT)", 1)[-1][-3000:])

        if fault == "connect":
            # Each worker's steps ran on a Spark Connect server they started on their own host.
            for name in ("worker-1", "worker-2"):
                server_log = connect_client.log_file(load_settings(net[name].env(pipeline.env)))
                assert f"Spark Connect server on sc://{net[name].ip}:15002" in server_log.read_text(), name

        # The hour whole and once: every distinct on-time event of it, as the producer counted them.
        # Read by the test's own Spark session (the workers' Spark Connect servers are not the test's to reach).
        tables = dump({k: v for k, v in pipeline.env.items() if k != "ADPIPE_SPARK_CONNECT"}, label)
        raw = [r for r in tables["rows"]["ads.ad_events_raw"] if r["event_hour"][:13] == label]
        assert [i for i, n in Counter(r["event_id"] for r in raw).items() if n > 1] == []
        on_time = sum(c["events"] for c in sent["counts"] if c["window_start"][:13] == label)
        assert len(raw) == on_time > 0
        published = [r for r in tables["load_runs"] if r["step"] == "published" and label in r["hours"]]
        assert len(published) == 1, tables["load_runs"]  # the retry's; the first try died (or stopped) before it
        assert_exactly_once(pipeline, [sent], min_windows=60)

