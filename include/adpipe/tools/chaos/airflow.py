"""Airflow in a run with ``--hosts N``: the loads are runs of the load DAG
(``ad_union_and_load``, one run per hour, its ``hour`` param set) on the
CeleryExecutor, as a deployment runs them. Redis (the Celery broker), the
API server, the scheduler, the DAG processor and the triggerer run on the
services host; a Celery worker on each host, restarted there when it dies
or its host is back. The load steps run in each worker host's warm load
driver (the default), handing the staged run over through XCom.

The run triggers each load from its own namespace (``airflow dags
trigger``) and follows it in Airflow's metadata database; a load kill
SIGKILLs the Celery worker running the load's task at that moment (the
worker and its task processes), and the scheduler, finding the task's
heartbeat gone, retries it on a worker that runs."""

from __future__ import annotations

import json
import logging
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from adpipe import pg
from adpipe.local.airflow import airflow_env, migrate
from adpipe.settings import load_settings
from adpipe.tools import hosts

from .context import RunContext, db_name
from .parts import Part, Restarts
from .spread import Spread

log = logging.getLogger("adpipe.tools.chaos")

AIRFLOW = str(Path(sys.executable).parent / "airflow")
LOAD_DAG = "ad_union_and_load"
REDIS_PORT = 6379  # the services host's own ports
API_PORT = 8080
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer")
PARSE_TIMEOUT_S = 300.0
# A dead worker's task is failed (and retried on another) this long after its last heartbeat.
HEARTBEAT_TIMEOUT_S = 20
QUEUED_TIMEOUT_S = 120
STATE_POLL_S = 2.0
# The load DAG's start date in the run: no scheduled run comes before it.
NO_SCHEDULED_RUNS_BEFORE = "2999-01-01T00:00:00Z"
# States a DAG run ends in.
ENDED = ("success", "failed")


class AirflowError(RuntimeError):
    """Airflow of the run could not be set up."""


class Airflow:
    """The run's Airflow: its services-host components and a Celery worker
    pinned to each host."""

    def __init__(self, ctx: RunContext, spread: Spread) -> None:
        self.ctx, self.spread = ctx, spread
        self.database = db_name(ctx.run_id, "airflow")
        # Every component signs and checks the tasks' tokens with the same secrets.
        self.secrets = {
            "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(32),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
        }
        self.components: dict[str, hosts.HostProcess] = {}
        self.component_restarts: Counter[str] = Counter()
        self.workers = [
            Part(
                f"airflow-worker-{name}",
                [AIRFLOW, "celery", "worker", "--concurrency", "2"],
                self.env_on(spread.net[name]),
                ctx.logs,
                spread,
                name,
                pinned=True,
            )
            for name in spread.names
        ]
        # The services host's components and the run's own airflow commands.
        self.services_env = self.env_on(spread.net.services)
        self._db = None

    def env_on(self, host: hosts.Host) -> dict[str, str]:
        """Airflow's environment on ``host``: the run's, that host's home,
        the services host's metadata database, Redis and API server."""
        env = host.env(self.ctx.env)
        settings = load_settings(env)
        env = airflow_env(settings, settings.pg_url(self.database), base=env)
        services = self.spread.net.services.ip
        env.update(
            {
                **self.secrets,
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__CELERY__BROKER_URL": f"redis://{services}:{REDIS_PORT}/0",
                "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + settings.pg_url(self.database).replace("+psycopg2", ""),
                "AIRFLOW__API__HOST": "0.0.0.0",  # noqa: S104 - the services host's own address, on the run's bridge
                "AIRFLOW__API__PORT": str(API_PORT),
                "AIRFLOW__API__BASE_URL": f"http://{services}:{API_PORT}",
                "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{services}:{API_PORT}/execution/",
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S),
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "2",
                # A task queued to a worker killed before it started it: queued
                # again after this long (Redis would redeliver it after a day).
                "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(QUEUED_TIMEOUT_S),
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "3600",
                # The load steps in each worker host's warm load driver (the
                # run's own loads run without one: there a kill must kill the load).
                "ADPIPE_LOAD_WARM": "auto",
                "ADPIPE_LOAD_RETRY_DELAY_S": "5",
                # The run's hours are its own (days back): only its triggered
                # runs load them, none of the scheduler's own hourly runs.
                "ADPIPE_LOAD_START": NO_SCHEDULED_RUNS_BEFORE,
            }
        )
        return env

    # ---- set-up

    def up(self) -> None:
        """The metadata database, Redis and the components on the services
        host, the load DAG parsed and unpaused. The workers are the
        supervisor's to start."""
        if shutil.which("redis-server") is None:
            raise AirflowError("needs redis-server, the Celery broker (make deps installs it)")
        services = self.spread.net.services
        pg.ensure_databases(self.ctx.base, (self.database,))
        env = self.services_env
        try:
            migrate(env)  # from the run's namespace: it reaches the services host's PostgreSQL
        except subprocess.CalledProcessError as exc:
            raise AirflowError(f"airflow db migrate on the run's metadata database: exit {exc.returncode}") from exc
        self.components["redis"] = services.start(
            [
                "redis-server",
                "--bind",
                services.ip,
                "--port",
                str(REDIS_PORT),
                "--protected-mode",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(services.directory),
            ],
            self.ctx.logs / "redis.log",
        )
        for part in COMPONENTS:
            self._start(part, env)
        deadline = time.monotonic() + PARSE_TIMEOUT_S
        while not self._rows("SELECT dag_id FROM dag WHERE dag_id = %s", LOAD_DAG):
            ended = [name for name, proc in self.components.items() if proc.poll() is not None]
            if ended or time.monotonic() > deadline:
                why = f"{', '.join(ended)} ended" if ended else f"not parsed within {PARSE_TIMEOUT_S:.0f} s"
                raise AirflowError(f"Airflow on the services host: {why} (logs in {self.ctx.logs})")
            time.sleep(2)
        done = subprocess.run(
            [AIRFLOW, "dags", "unpause", LOAD_DAG],
            env=env,
            capture_output=True,
            text=True,  # noqa: S603
            timeout=180,
            check=False,
        )
        if done.returncode != 0:
            raise AirflowError(f"airflow dags unpause {LOAD_DAG}: {(done.stdout + done.stderr)[-2000:]}")

    def _start(self, part: str, env: dict[str, str]) -> None:
        services = self.spread.net.services
        self.components[part] = services.start([AIRFLOW, part], self.ctx.logs / f"airflow-{part}.log", env)

    # ---- supervision

    def supervise(self, restarts: Restarts) -> None:
        """A worker that died is started again on its own host once that one
        is usable; a services-host component that ended is started again."""
        now = time.monotonic()
        for worker in self.workers:
            if worker.proc is not None and worker.proc.poll() is not None:
                worker.reap()
                worker.hold_until = now + 1
            if worker.proc is None and now >= worker.hold_until and worker.start():
                restarts.counts["airflow_worker"] += 1
        for part in COMPONENTS:
            if self.components[part].poll() is not None:
                log.error("Airflow's %s ended on the services host; started again", part)
                self.component_restarts[part] += 1
                self._start(part, self.services_env)

    def worker_on(self, host: str | None) -> Part | None:
        return next((w for w in self.workers if w.alive and w.host == host), None)

    # ---- the metadata database

    def _rows(self, sql: str, *args: object) -> list[tuple]:
        """``sql``'s rows; none while the database does not answer (asked again later)."""
        import psycopg2

        try:
            if self._db is None or self._db.closed:
                self._db = pg.connect(self.ctx.settings, self.database)
            with self._db.cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchall()
        except psycopg2.Error as exc:
            log.debug("Airflow's metadata database: %s", exc)
            if self._db is not None:
                self._db.close()
            self._db = None
            return []

    def states(self, run_ids: list[str]) -> dict[str, str]:
        rows = self._rows("SELECT run_id, state FROM dag_run WHERE dag_id = %s AND run_id = ANY(%s)", LOAD_DAG, run_ids)
        return {run_id: state for run_id, state in rows}

    def running_host(self, run_ids: list[str]) -> str | None:
        """The host of the load's task running now (the latest started), if any."""
        rows = self._rows(
            "SELECT hostname FROM task_instance WHERE dag_id = %s AND run_id = ANY(%s)"
            " AND state = 'running' ORDER BY start_date DESC LIMIT 1",
            LOAD_DAG,
            run_ids,
        )
        return rows[0][0] if rows else None

    def task_tries(self) -> dict[str, dict[str, int]]:
        """The load DAG's task tries per host, by how they ended (the retried ones included)."""
        rows = self._rows(
            "SELECT hostname, state FROM task_instance WHERE dag_id = %s AND hostname <> ''"
            " UNION ALL SELECT hostname, state FROM task_instance_history WHERE dag_id = %s AND hostname <> ''",
            LOAD_DAG,
            LOAD_DAG,
        )
        tries: dict[str, Counter[str]] = {}
        for hostname, state in rows:
            tries.setdefault(hostname, Counter())[state or "none"] += 1
        return {host: dict(sorted(states.items())) for host, states in sorted(tries.items())}

    def summary(self) -> dict:
        """What Airflow did in the run, for the report."""
        runs = Counter(state for (state,) in self._rows("SELECT state FROM dag_run WHERE dag_id = %s", LOAD_DAG))
        return {
            "load_runs": dict(runs),
            "task_tries_by_host": self.task_tries(),
            "worker_exits": {w.name: dict(w.exits) for w in self.workers},
            "component_restarts": dict(self.component_restarts),
        }

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def load(self, name: str, hours: list[str]) -> DagRunLoad:
        return DagRunLoad(self, name, hours)


class DagRuns:
    """A load's DAG runs as a process would be seen (``poll``, ``wait``,
    ``returncode``): the triggers run one after another, then the runs are
    followed until each ended; 0 when every one succeeded."""

    def __init__(self, airflow: Airflow, name: str, run_ids: list[str], hours: list[str]) -> None:
        self.airflow, self.run_ids = airflow, run_ids
        self.pending = list(zip(run_ids, hours, strict=True))
        self.trigger: subprocess.Popen | None = None
        self.log_path = airflow.ctx.logs / f"{name}-trigger.log"
        self.returncode: int | None = None
        self.polled_at = 0.0

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        if self.trigger is not None:
            rc = self.trigger.poll()
            if rc is None:
                return None
            self.trigger = None
            if rc != 0:  # not triggered: the load failed (the next one tries again)
                log.warning("airflow dags trigger exited %d (%s)", rc, self.log_path)
                self.returncode = rc
                return rc
        if self.pending:
            run_id, hour = self.pending.pop(0)
            argv = [AIRFLOW, "dags", "trigger", LOAD_DAG, "--run-id", run_id, "--conf", json.dumps({"hour": hour})]
            with self.log_path.open("ab") as out:
                self.trigger = subprocess.Popen(  # noqa: S603
                    argv,
                    env=self.airflow.services_env,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            return None
        if time.monotonic() - self.polled_at < STATE_POLL_S:
            return None
        self.polled_at = time.monotonic()
        states = self.airflow.states(self.run_ids)
        if len(states) == len(self.run_ids) and all(s in ENDED for s in states.values()):
            self.returncode = 0 if all(s == "success" for s in states.values()) else 1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (rc := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired("dag runs", timeout or 0)
            time.sleep(0.5)
        return rc


class DagRunLoad:
    """One load of the run as DAG runs of the load DAG (one per hour): it
    stands in for a load's :class:`~.parts.Part` (``start``, ``alive``,
    ``signal``, ``reap``, ``proc``)."""

    def __init__(self, airflow: Airflow, name: str, hours: list[str]) -> None:
        self.airflow, self.name, self.hours = airflow, name, hours
        stamp = airflow.ctx.run_id
        self.run_ids = [f"chaos-{stamp}-{name}-{hour}" for hour in hours]
        self.proc: DagRuns | None = None
        self.started_at = 0.0
        self.exits: Counter[int] = Counter()

    def start(self) -> bool:
        self.proc = DagRuns(self.airflow, self.name, self.run_ids, self.hours)
        self.proc.poll()  # the first trigger on its way
        self.started_at = time.monotonic()
        return True

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def host(self) -> str | None:
        """The host of its task running now, if any."""
        return self.airflow.running_host(self.run_ids) if self.alive else None

    def signal(self, sig: int) -> bool:
        """``sig`` to the Celery worker running the load's task now (its
        process group: the worker and its task processes); False when no
        task of it runs now (a trigger, the sensor deferred, between tasks)."""
        if not self.alive:
            return False
        worker = self.airflow.worker_on(self.airflow.running_host(self.run_ids))
        if worker is None or not worker.signal(sig):
            return False
        if sig == signal.SIGKILL:
            log.info("load %s: killed %s, which ran its task", self.name, worker.name)
        return True

    def reap(self) -> None:
        if self.proc is not None and self.proc.returncode is not None:
            self.exits[self.proc.returncode] += 1
            self.proc = None
