"""Keeps the long-running aggregation stream job alive (the logic of the
``ad_aggregation_stream`` DAG).

Design. The stream job runs for days; an Airflow task must not. So the DAG
is a short run every few minutes that (1) inspects the job, (2) starts it
with spark-submit when it is down, detached from the task, and
(3) checks it against the alert thresholds. Nothing is lost while it is
down: the job's checkpoint and its Kafka ledger say where it stopped, and a
restart resumes from there exactly once (see ``adpipe.stream.sink``).

What "alive" means:

* **process**: the pid this supervisor started (``supervisor.json`` next to
  the heartbeat) exists, is not a zombie, and its command line is the
  stream job's (a reused pid is not mistaken for it);
* or a driver leads the job in its leadership group, on any host (a standby
  that took over from the one this supervisor started, or a job started by
  hand or by another worker's supervisor: adpipe.stream.leadership).

A heartbeat (``home/stream/<job_id>/heartbeat.json``, written after every
batch) says when the last batch ended, never that a driver runs: an
``--available-now`` run that has ended leaves a fresh one, and every live
driver is a member of the group.

**Lag** is the raw topic's read_committed end offsets minus the offsets the
job committed to its ledger group in its last transaction, summed over
partitions: raw records not yet counted. A live process with lag and no
batch for ``ADPIPE_STREAM_STALL_S`` is **stalled**: it is stopped and started
again. Every start after the first is a **restart**; restarts are kept in
``supervisor.json`` with their time. The check fails the run (and so fires
the failure notifier) when restarts within ``ADPIPE_STREAM_RESTART_WINDOW_S``
pass ``ADPIPE_STREAM_MAX_RESTARTS`` or lag passes ``ADPIPE_STREAM_MAX_LAG``."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow.sdk import BaseOperator

from adpipe.processes import start_detached
from adpipe.settings import PROJECT_ROOT, Settings, load_settings
from adpipe.stream import leadership
from adpipe.stream.liveness import (
    STREAM_APPLICATION,
    descends_from,
    input_stalled,
    polled_at,
    process_alive,
    read_failover,
    read_heartbeat,
    read_state,
    stream_dir,
    supervisor_state_path,
)

log = logging.getLogger(__name__)

STARTED_MARK = "stream job {job_id} started"
# StreamStartOperator's XCom: the host it ran on (wait_for_stream may run on another).
STARTED_ON_XCOM = "host"


class StreamAlertError(RuntimeError):
    """The stream job passed an alert threshold."""


class StreamStartError(RuntimeError):
    """The stream job did not come up."""


def write_state(settings: Settings, state: dict[str, Any]) -> None:
    path = supervisor_state_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    tmp.replace(path)


@dataclass
class StreamHealth:
    job_id: str
    alive: bool
    how: str  # "process", "leader" or "down"
    pid: int | None
    heartbeat_age_s: float | None
    last_batch: int | None
    watermark_ms: int | None
    lag: int
    lag_by_partition: dict[int, int] = field(default_factory=dict)
    lag_s: float | None = None  # how long the oldest waiting raw record has waited (None: unknown)
    stalled: bool = False
    starts: int = 0
    restarts_in_window: int = 0
    standby_pids: list[int] = field(default_factory=list)  # standby drivers waiting for the checkpoint
    last_failover: dict[str, Any] | None = None  # the last standby takeover (liveness.record_failover)
    host: str | None = None  # where the active driver runs (None: unknown, a heartbeat only)

    @property
    def needs_start(self) -> bool:
        return not self.alive or self.stalled

    def _lag_age(self) -> str:
        return "" if not self.lag or self.lag_s is None else f", the oldest {self.lag_s:.0f} s"

    def describe(self) -> str:
        state = "stalled" if self.stalled else ("alive" if self.alive else "down")
        age = "never" if self.heartbeat_age_s is None else f"{self.heartbeat_age_s:.0f}s ago"
        standby = f"standby pid {', '.join(map(str, self.standby_pids))}" if self.standby_pids else "no standby"
        failover = self.last_failover
        took_over = (
            f"; last failover {time.time() - failover['at']:.0f}s ago ({failover.get('reason')}, next batch "
            f"{failover.get('seconds')}s after)" if failover and "at" in failover else ""
        )
        where = f" on {self.host}" if self.host and self.pid else ""
        watermark = f" (watermark {_utc_text(self.watermark_ms / 1000)})" if self.watermark_ms else ""
        return (
            f"stream {self.job_id}: {state} ({self.how}, pid {self.pid}{where}; {standby}); "
            f"last batch {self.last_batch} "
            f"{age}{watermark}; lag {self.lag} records{self._lag_age()}; restarts in window "
            f"{self.restarts_in_window}{took_over}"
        )


def _utc_text(at_s: float) -> str:
    return datetime.fromtimestamp(at_s, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def inspect(settings: Settings, now: float | None = None) -> StreamHealth:
    from adpipe import kafka_io

    now = time.time() if now is None else now
    state = read_state(settings)
    pid = state.get("pid")
    beat = read_heartbeat(settings)
    age = now - beat["at"] if beat else None
    commits = kafka_io.stream_commits(settings)
    lag_by_partition = kafka_io.stream_lag(settings, commits)
    lag = sum(lag_by_partition.values())
    try:
        lag_s = kafka_io.stream_lag_seconds(settings, lag_by_partition, commits, now)
    except Exception as exc:  # noqa: BLE001 - the count stands without its age
        log.warning("the age of the stream's lag is unknown: %s", exc)
        lag_s = None
    drivers = _drivers(settings)
    lead = next((d for d in drivers if d.leads), None)
    here = socket.gethostname()
    if process_alive(pid):
        alive, how = True, "process"
    elif lead is not None:
        # A driver leads the job: a standby that took over from the one we
        # started, or a job started by hand or on another host. Starting
        # another would only be refused.
        alive, how, pid = True, "leader", lead.pid if lead.host == here else None
    else:
        alive, how, pid = False, "down", None
    # Stalled: input waiting, neither a batch finished nor a poll for stall_s,
    # and (for a job we started) it has been up longer than that.
    if how == "leader" and lead is not None and lead.host != here:
        # Its heartbeat and polls are in its own host's home: judged by what
        # every host sees, how long the oldest raw record not yet committed
        # has waited (the brokers' timestamps).
        stalled = lag > 0 and lag_s is not None and lag_s > settings.stream_stall_s
    else:
        stalled = alive and input_stalled(
            lag,
            now,
            settings.stream_stall_s,
            beat["at"] if beat else None,
            polled_at(settings),
            state.get("started_at", 0.0) if how == "process" else 0.0,
        )
    window_start = now - settings.stream_restart_window_s
    return StreamHealth(
        job_id=settings.job_id,
        alive=alive,
        how=how,
        pid=pid,
        heartbeat_age_s=age,
        last_batch=beat["batch_id"] if beat else None,
        watermark_ms=beat.get("watermark_ms") if beat else None,
        lag=lag,
        lag_by_partition=lag_by_partition,
        lag_s=lag_s,
        stalled=stalled,
        starts=len(state.get("starts", [])),
        restarts_in_window=sum(1 for t in state.get("restarts", []) if t >= window_start),
        standby_pids=[d.pid for d in drivers if not d.leads and d.host == here],
        last_failover=read_failover(settings),
        # The leader's host from its group membership; a pid seen running is here.
        host=lead.host if lead is not None else (here if how == "process" else None),
    )


def _drivers(settings: Settings) -> list[leadership.Driver]:
    """The job's drivers in its leadership group (none when the brokers do not answer)."""
    try:
        return leadership.drivers(settings, timeout_s=10)
    except Exception as exc:  # noqa: BLE001 - the local process still tells
        log.warning("the stream's leadership group is not described: %s", exc)
        return []


def stream_state(health: StreamHealth, now: float | None = None) -> dict[str, Any]:
    """What the Airflow UI shows of the stream job (``check_stream``'s XCom
    ``stream_state``): its state, the active and standby drivers, the last
    batch and its age, the watermark, the lag, restarts and the last
    failover, and :meth:`StreamHealth.describe`'s line."""
    now = time.time() if now is None else now
    state = "stalled" if health.stalled else ("alive" if health.alive else "down")
    active = {"pid": health.pid, "host": health.host, "seen_by": health.how} if health.alive else None
    standby_host = socket.gethostname()  # standby_pids are this host's drivers in the group
    watermark = _utc_text(health.watermark_ms / 1000) if health.watermark_ms else None
    return {
        "state": state,
        "summary": health.describe(),
        "job_id": health.job_id,
        "active_driver": active,
        "standby_drivers": [{"pid": pid, "host": standby_host} for pid in health.standby_pids],
        "last_batch": health.last_batch,
        "last_batch_age_s": None if health.heartbeat_age_s is None else round(health.heartbeat_age_s, 1),
        "watermark": watermark,
        "lag_records": health.lag,
        "lag_oldest_s": None if health.lag_s is None else round(health.lag_s, 1),
        "restarts_in_window": health.restarts_in_window,
        "last_failover": health.last_failover,
        "checked_at": _utc_text(now),
    }


def threshold_breaches(health: StreamHealth, settings: Settings) -> list[str]:
    breaches = []
    if health.restarts_in_window > settings.stream_max_restarts:
        breaches.append(
            f"stream {health.job_id} restarted {health.restarts_in_window} times in the last "
            f"{settings.stream_restart_window_s}s (threshold ADPIPE_STREAM_MAX_RESTARTS={settings.stream_max_restarts})"
        )
    if health.lag > settings.stream_max_lag:
        breaches.append(
            f"stream {health.job_id} consumer lag {health.lag} records "
            f"(threshold ADPIPE_STREAM_MAX_LAG={settings.stream_max_lag})"
        )
    if not health.alive:
        breaches.append(f"stream {health.job_id} is down")
    elif health.stalled and health.how == "leader" and health.pid is None:
        breaches.append(
            f"stream {health.job_id} stalled on {health.host}: records waiting {health.lag_s or 0:.0f} s "
            f"(ADPIPE_STREAM_STALL_S={settings.stream_stall_s}); only that host can stop it"
        )
    return breaches


# The XComs of check_stream the UI shows (the task instance's XCom tab): the
# health line, readable at a glance, and the state as JSON.
SUMMARY_XCOM = "stream_summary"
STATE_XCOM = "stream_state"


def check(settings: Settings, ti: Any = None) -> dict[str, Any]:
    """The DAG's last task: the health, or StreamAlertError naming each
    breach. With the task instance ``ti``, first the XComs
    ``stream_summary`` (:meth:`StreamHealth.describe`) and ``stream_state``
    (:func:`stream_state`), so that the UI shows the job's state whether the
    check passes or fails."""
    health = inspect(settings)
    log.info("%s", health.describe())
    if ti is not None:
        state = stream_state(health)
        ti.xcom_push(key=SUMMARY_XCOM, value=state["summary"])
        ti.xcom_push(key=STATE_XCOM, value=state)
    breaches = threshold_breaches(health, settings)
    if breaches:
        raise StreamAlertError("; ".join(breaches))
    return asdict(health)


def stop_stream(pid: int, timeout_s: float = 60.0) -> None:
    """SIGTERM the job's process group (the job stops after its batch), then
    SIGKILL. Either is safe: every batch is one Kafka transaction."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not process_alive(pid):
                return
            time.sleep(0.5)


def record_start(settings: Settings, pid: int, log_path: Path, now: float | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    state = read_state(settings)
    if state.get("starts"):
        state.setdefault("restarts", []).append(now)
    state.setdefault("starts", []).append(now)
    # Keep the files small: only what a restart window can still count.
    keep = now - max(settings.stream_restart_window_s, 86_400)
    state["starts"] = [t for t in state["starts"] if t >= keep] or [now]
    state["restarts"] = [t for t in state.get("restarts", []) if t >= keep]
    state.update(pid=pid, started_at=now, log=str(log_path))
    write_state(settings, state)
    return state


def stream_started(settings: Settings, started_on: str | None = None) -> bool:
    """Sensor body after ``StreamStartOperator``: True once the job's query
    runs (the started line in the log of the job we started, a driver
    leading the job in its leadership group on any host, or a fresh
    heartbeat of a job started by hand); raises when the process we started
    died (its log tail in the message) and nothing else is alive.
    ``started_on``: the host the start task ran on (its XCom); from another
    host, this one waits for a driver to lead (this host's files know
    nothing of it), and the sensor's timeout bounds the wait."""
    state = read_state(settings)
    log_path = Path(state.get("log", ""))
    if process_alive(state.get("pid")):
        text = log_path.read_text(errors="replace") if log_path.is_file() else ""
        return STARTED_MARK.format(job_id=settings.job_id) in text
    if leadership.leader_or_none(settings) is not None:
        return True
    if started_on and started_on != socket.gethostname():
        log.info("stream %s: started on %s, waiting for a driver to lead", settings.job_id, started_on)
        return False
    beat = read_heartbeat(settings)
    if beat and time.time() - beat["at"] < settings.stream_stall_s:
        return True
    text = log_path.read_text(errors="replace") if log_path.is_file() else "(no log)"
    tail = "\n".join(text.splitlines()[-15:])
    raise StreamStartError(f"stream {settings.job_id} is not running (log {log_path}):\n{tail}")


def submit_conf(
    settings: Settings, app_name: str, extra_conf: dict[str, str] | None = None
) -> tuple[dict[str, str], str]:
    """spark-submit's --conf and --jars for a job, from the one Spark
    configuration (adpipe.spark; ``extra_conf``: a part's own, e.g. the
    load's Hive metastore). The master goes on the command line; the jars
    must be on the driver's classpath from the start, so they go to --jars
    rather than being set by the job's session builder."""
    from adpipe.spark import spark_conf

    conf = spark_conf(settings, app_name, extra_conf)
    conf.pop("spark.master", None)
    conf.pop("spark.app.name", None)
    jars = conf.pop("spark.jars")
    conf["spark.pyspark.python"] = sys.executable
    conf["spark.pyspark.driver.python"] = sys.executable
    return conf, jars


def stream_command(settings: Settings, *args: str) -> list[str]:
    """spark-submit of the stream job (``args``: its own, e.g. --standby)."""
    from adpipe.spark import stream_job_conf

    name = f"adpipe-stream-{settings.job_id}"
    conf, jars = submit_conf(settings, name, stream_job_conf(settings))
    return submit_command(settings, STREAM_APPLICATION, name, conf, jars, args)


def spark_submit_binary() -> str:
    """spark-submit of this environment (pyspark's, next to the interpreter)."""
    local = Path(sys.executable).parent / "spark-submit"
    return str(local) if local.exists() else (shutil.which("spark-submit") or "spark-submit")


def submit_command(
    settings: Settings, application: Path | str, name: str, conf: dict[str, str], jars: str, args: tuple[str, ...] = ()
) -> list[str]:
    """The spark-submit command line of a driver on this host (client mode):
    the master of the settings (under Airflow, the ``adpipe_spark``
    Connection's), adpipe's conf and jars (:func:`submit_conf`)."""
    command = [spark_submit_binary(), "--master", settings.spark_master, "--name", name]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    if jars:
        command += ["--jars", jars]
    return [*command, str(application), *args]


class StreamStartOperator(BaseOperator):
    """Starts the aggregation stream job when it is down: ``spark-submit
    jobs/aggregation_stream.py`` detached (its own session and log file, so
    it outlives this task, which returns its pid), its master and
    credentials the task's (its Connections': adpipe.orchestration.connections).

    Not a ``SparkSubmitOperator``: the provider's operator and hook wait for
    spark-submit to exit, which in client mode is the life of the driver
    (days, for a stream), and offer no public way to start it and return.
    Idempotent: a job that is alive is left alone."""

    def execute(self, context: Any) -> int:
        from adpipe.orchestration.connections import task_env

        env = task_env()
        settings = load_settings(env)
        ti = context.get("ti") if isinstance(context, dict) else None
        if ti is not None:  # wait_for_stream, on any worker, knows where this ran
            ti.xcom_push(key=STARTED_ON_XCOM, value=socket.gethostname())
        health = inspect(settings)
        if health.stalled and health.how == "leader" and health.pid is None:
            # A driver on another host leads: only that host can stop it, and
            # a driver started here would be refused. check_stream alerts.
            log.warning("%s: stalled on another host, left to its supervisor there", health.describe())
            return 0
        if health.alive and not health.stalled:
            log.info("%s: nothing to start", health.describe())
            if settings.stream_standby:
                self.start_standby_if_missing(settings, env)
            return health.pid or 0
        if health.stalled and health.pid:
            log.warning("%s: stopping the stalled job", health.describe())
            stop_stream(health.pid)
        proc, log_path = self._start(settings, stream_command(settings), "stream", env)
        state = record_start(settings, proc.pid, log_path)
        log.info(
            "started stream %s: pid %d, log %s (start %d, restarts in state %d)",
            settings.job_id,
            proc.pid,
            log_path,
            len(state["starts"]),
            len(state["restarts"]),
        )
        return proc.pid

    def _start(self, settings: Settings, command: list[str], name: str, env: dict[str, str]) -> tuple[Any, Path]:
        log_path = stream_dir(settings) / f"{name}-{time.strftime('%Y%m%dT%H%M%S')}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # Its own process group: the task's end does not take it down.
        return start_detached(command, log_path, env=env, cwd=PROJECT_ROOT), log_path

    def start_standby_if_missing(self, settings: Settings, env: dict[str, str]) -> int | None:
        """With ADPIPE_STREAM_STANDBY=on, beside a live active driver: a
        standby (``--standby``) unless one waits or is still warming up. A
        standby that took over is the active driver now (recorded as such),
        and gets a standby of its own. Its pid, or None."""
        state = read_state(settings)
        standby = state.get("standby_pid")
        here = socket.gethostname()
        drivers = [d for d in _drivers(settings) if d.host == here]
        holder = next((d.pid for d in drivers if d.leads), None)
        if standby and holder and descends_from(holder, standby):  # it took over: the job's driver now
            state.update(pid=standby, log=state.get("standby_log"), standby_pid=None)
            write_state(settings, state)
            standby = None
        waiting = [d.pid for d in drivers if not d.leads]
        present = waiting[0] if waiting else (standby if standby and process_alive(standby) else None)
        if present:
            log.info("stream %s: standby pid %s %s", settings.job_id, present, "waits" if waiting else "is starting")
            return present
        proc, log_path = self._start(settings, stream_command(settings, "--standby"), "standby", env)
        state.update(standby_pid=proc.pid, standby_log=str(log_path))
        write_state(settings, state)
        log.info("started a standby driver of stream %s: pid %d, log %s", settings.job_id, proc.pid, log_path)
        return proc.pid
