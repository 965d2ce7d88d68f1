"""The local Spark standalone cluster: one master and N workers, run from the
installed Spark (pip's pyspark ships ``bin/spark-class``, not ``sbin/``), on
loopback only, with their logs and work folders under
``$ADPIPE_HOME/spark-cluster``.

``adpipe spark up --workers 2`` starts them; jobs then run on it with
``ADPIPE_SPARK_MASTER=spark://127.0.0.1:<ADPIPE_SPARK_MASTER_PORT>``
(adpipe.spark adds what executors need). The master's web UI listens on
``ADPIPE_SPARK_MASTER_UI_PORT``, worker k's on that port + k; a worker's RPC
port is any free one. Each worker offers ``ADPIPE_SPARK_WORKER_CORES`` cores
and ``ADPIPE_SPARK_WORKER_MEMORY`` to executors.

Each daemon runs in a session of its own, so a worker's executors (children
of the worker JVM) share its process group: :func:`kill_worker` SIGKILLs a
worker with its executors and their Python workers at once, as when a
machine dies. Only processes we started are ever signalled: a pid file is
trusted only while ``/proc/<pid>/cmdline`` still names the daemon's class
and this home's files."""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from adpipe.processes import alive, start_detached
from adpipe.settings import Settings

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
MAX_WORKERS = 8
# The heap of the master and of each worker daemon (executors have their own,
# spark.executor.memory): they only schedule, 512 MB is plenty.
DAEMON_MEMORY = "512m"
# How long a stopped worker's executors may take to go before a SIGKILL.
LEFTOVER_WAIT_S = 10.0

# Spark properties of the daemons (--properties-file; a path under this home,
# so the file also marks the master's command line as ours).
MASTER_PROPERTIES = {
    # The REST submission server would listen on 6066 for every cluster.
    "spark.master.rest.enabled": "false",
    # A port in use is an error, not a silent move to the next one (workers
    # are known to the master by their UI ports).
    "spark.port.maxRetries": "0",
}
WORKER_PROPERTIES = {
    "spark.port.maxRetries": "0",
    # Finished applications' folders (their copies of the jars, executor
    # logs) are deleted a day after they ended.
    "spark.worker.cleanup.enabled": "true",
    "spark.worker.cleanup.interval": "1800",
    "spark.worker.cleanup.appDataTtl": "86400",
}


class SparkClusterError(RuntimeError):
    """The local Spark cluster could not be started, reached or stopped."""


def cluster_dir(settings: Settings) -> Path:
    return settings.home / "spark-cluster"


def master_url(settings: Settings) -> str:
    return f"spark://{HOST}:{settings.spark_master_port}"


def master_ui_url(settings: Settings) -> str:
    return f"http://{HOST}:{settings.spark_master_ui_port}"


def worker_ui_port(settings: Settings, index: int) -> int:
    return settings.spark_master_ui_port + index


def worker_dir(settings: Settings, index: int) -> Path:
    """Worker ``index``'s work folder (applications' jars, executor logs)."""
    return cluster_dir(settings) / f"worker-{index}"


def log_file(settings: Settings, name: str) -> Path:
    """The log of ``master`` or ``worker-<k>`` (stdout and stderr)."""
    return cluster_dir(settings) / f"{name}.log"


def _pid_file(settings: Settings, name: str) -> Path:
    return cluster_dir(settings) / f"{name}.pid"


def _master_properties(settings: Settings) -> Path:
    return cluster_dir(settings) / "master.properties"


def _worker_properties(settings: Settings) -> Path:
    return cluster_dir(settings) / "worker.properties"


def _cluster_file(settings: Settings) -> Path:
    return cluster_dir(settings) / "cluster.json"


def recorded_size(settings: Settings) -> int:
    """How many workers the cluster under ADPIPE_HOME was last started with
    (2 when never)."""
    try:
        return int(json.loads(_cluster_file(settings).read_text())["workers"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return 2


def spark_home() -> Path:
    """The installed Spark: the pyspark package (its jars/ and bin/), the
    same version as every driver of this environment."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def master_command(settings: Settings) -> list[str]:
    return [
        str(spark_home() / "bin" / "spark-class"),
        MASTER_CLASS,
        "--host",
        HOST,
        "--port",
        str(settings.spark_master_port),
        "--webui-port",
        str(settings.spark_master_ui_port),
        "--properties-file",
        str(_master_properties(settings)),
    ]


def worker_command(settings: Settings, index: int) -> list[str]:
    return [
        str(spark_home() / "bin" / "spark-class"),
        WORKER_CLASS,
        master_url(settings),
        "--host",
        HOST,
        "--cores",
        str(settings.spark_worker_cores),
        "--memory",
        settings.spark_worker_memory,
        "--work-dir",
        str(worker_dir(settings, index)),
        "--webui-port",
        str(worker_ui_port(settings, index)),
        "--properties-file",
        str(_worker_properties(settings)),
    ]


def daemon_env(settings: Settings) -> dict[str, str]:
    """The daemons' environment (inherited by the executors a worker starts)."""
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        # An empty folder of ours: no spark-defaults.conf or spark-env.sh of
        # another installation changes the cluster.
        "SPARK_CONF_DIR": str(cluster_dir(settings) / "conf"),
        # Every socket of the daemons and their executors on loopback (the
        # web UIs bind to SPARK_LOCAL_IP, else to every address).
        "SPARK_LOCAL_IP": HOST,
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_DAEMON_JAVA_OPTS": shlex.join(settings.jvm_options),
        "PYSPARK_PYTHON": sys.executable,
    }


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


def _read_pid(settings: Settings, name: str) -> int | None:
    """The pid of our ``master`` or ``worker-<k>``, if it still runs: the pid
    file's process must name the daemon's class and this home's file (a pid
    reused by another process, or another cluster's daemon, is not ours).
    A zombie has an empty command line: not running."""
    try:
        pid = int(_pid_file(settings, name).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    parts = _cmdline(pid)
    if name == "master":
        marker, main = str(_master_properties(settings)), MASTER_CLASS
    else:
        marker, main = str(worker_dir(settings, int(name.split("-")[1]))), WORKER_CLASS
    return pid if main in parts and marker in parts else None


def master_pid(settings: Settings) -> int | None:
    return _read_pid(settings, "master")


def _worker_indexes(settings: Settings) -> list[int]:
    """Every worker index with a pid file, and those of the recorded size."""
    found = {int(p.stem.split("-")[1]) for p in cluster_dir(settings).glob("worker-*.pid") if p.stem[7:].isdigit()}
    return sorted(found | set(range(1, recorded_size(settings) + 1)))


def worker_pids(settings: Settings) -> dict[int, int]:
    """Worker index -> pid of each worker of ours that runs."""
    pids = {index: _read_pid(settings, f"worker-{index}") for index in _worker_indexes(settings)}
    return {index: pid for index, pid in pids.items() if pid is not None}


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, for every process (from /proc)."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first)."""
    tree, found, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(0), []):
            found.append(child)
            todo.append(child)
    return found


def executor_pids(settings: Settings, index: int) -> list[int]:
    """The executor JVMs worker ``index`` runs (its children)."""
    pid = _read_pid(settings, f"worker-{index}")
    if pid is None:
        return []
    return [p for p in descendants(pid) if EXECUTOR_CLASS in _cmdline(p)]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _wait_gone(pids: list[int], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return not any(alive(p) for p in pids)


def master_state(settings: Settings, timeout_s: float = 2.0) -> dict | None:
    """The master's own view (its web UI's JSON: status, workers and their
    state, applications), or None when it does not answer."""
    url = f"{master_ui_url(settings)}/json/"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - loopback http, our port
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


def alive_workers(state: dict | None, settings: Settings) -> dict[int, dict]:
    """Worker index -> the master's entry of it, for the workers the master
    holds ALIVE (known by their web UI port; a killed worker's entry stays,
    DEAD, beside its successor's)."""
    index_of = {worker_ui_port(settings, i): i for i in range(1, MAX_WORKERS + 1)}
    alive = {}
    for worker in (state or {}).get("workers", []):
        port = urlparse(str(worker.get("webuiaddress", ""))).port
        if worker.get("state") == "ALIVE" and port in index_of:
            alive[index_of[port]] = worker
    return alive


@dataclass(frozen=True)
class WorkerStatus:
    index: int
    pid: int | None
    alive: bool  # the master holds it ALIVE
    ui: str
    log: Path
    executors: tuple[int, ...] = ()

    @property
    def running(self) -> bool:
        return self.pid is not None

    def describe(self) -> str:
        if self.running:
            state = "ALIVE at the master" if self.alive else "not registered with the master"
            executors = ", ".join(map(str, self.executors)) or "none"
            return f"worker {self.index}: pid {self.pid}, {state}, executors {executors}, UI {self.ui}, log {self.log}"
        return f"worker {self.index}: down (log {self.log})"


@dataclass(frozen=True)
class ClusterStatus:
    master_url: str
    ui_url: str
    master_pid: int | None
    master_answering: bool  # the master's UI answers and says ALIVE
    workers: tuple[WorkerStatus, ...]
    log_dir: Path

    @property
    def pid(self) -> int | None:
        return self.master_pid

    @property
    def running(self) -> bool:
        return self.master_pid is not None and bool(self.workers) and all(w.running for w in self.workers)

    @property
    def answering(self) -> bool:
        return self.master_answering and bool(self.workers) and all(w.alive for w in self.workers)

    def describe(self) -> str:
        alive = sum(w.alive for w in self.workers)
        if self.master_pid is None:
            head = f"spark cluster down (nothing of ours runs; {self.master_url} answering={self.master_answering})"
        elif self.running and self.answering:
            head = (
                f"spark cluster up: master pid {self.master_pid} at {self.master_url} (UI {self.ui_url}), "
                f"{alive} of {len(self.workers)} workers alive; logs in {self.log_dir}"
            )
        else:
            head = (
                f"spark cluster starting or unhealthy: master pid {self.master_pid} at {self.master_url} "
                f"(answering={self.master_answering}), {alive} of {len(self.workers)} workers alive; "
                f"logs in {self.log_dir}"
            )
        running = [w for w in self.workers if w.running or self.master_pid is not None]
        return "\n".join([head, *(f"  {w.describe()}" for w in running)])


def _worker_status(settings: Settings, index: int, state: dict | None) -> WorkerStatus:
    return WorkerStatus(
        index,
        _read_pid(settings, f"worker-{index}"),
        index in alive_workers(state, settings),
        f"http://{HOST}:{worker_ui_port(settings, index)}",
        log_file(settings, f"worker-{index}"),
        tuple(executor_pids(settings, index)),
    )


def status(settings: Settings) -> ClusterStatus:
    state = master_state(settings)
    indexes = sorted(set(_worker_indexes(settings)) | set(alive_workers(state, settings)))
    return ClusterStatus(
        master_url(settings),
        master_ui_url(settings),
        master_pid(settings),
        state is not None and state.get("status") == "ALIVE",
        tuple(_worker_status(settings, i, state) for i in indexes),
        cluster_dir(settings),
    )


def _listening(port: int) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=1.0).close()
    except OSError:
        return False
    return True


def _write_properties(path: Path, properties: dict[str, str]) -> None:
    path.write_text("".join(f"{key}={value}\n" for key, value in properties.items()))


def _prepare(settings: Settings, count: int) -> None:
    (cluster_dir(settings) / "conf").mkdir(parents=True, exist_ok=True)
    _write_properties(_master_properties(settings), MASTER_PROPERTIES)
    _write_properties(_worker_properties(settings), WORKER_PROPERTIES)
    _cluster_file(settings).write_text(json.dumps({"workers": count}) + "\n")


def _spawn(settings: Settings, name: str, command: list[str]) -> subprocess.Popen:
    proc = start_detached(command, log_file(settings, name), env=daemon_env(settings), cwd=cluster_dir(settings))
    _pid_file(settings, name).write_text(f"{proc.pid}\n")
    log.info("started Spark %s pid %d (log %s)", name, proc.pid, log_file(settings, name))
    return proc


# How long a port may stay taken after its process was seen gone: a killed
# JVM's leader thread is reaped first, and its sockets close only when its
# last thread has exited (after unmapping its heap).
PORT_RELEASE_S = 15.0


def _check_free(settings: Settings, port: int, what: str, variable: str) -> None:
    deadline = time.monotonic() + PORT_RELEASE_S
    while _listening(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    if _listening(port):
        raise SparkClusterError(f"something else already listens on {HOST}:{port} ({what}): stop it or set {variable}")


def _wait_master(settings: Settings, started: subprocess.Popen | None, deadline: float) -> None:
    while time.monotonic() < deadline:
        if started is not None and started.poll() is not None:
            raise SparkClusterError(f"the Spark master exited during start-up; see {log_file(settings, 'master')}")
        state = master_state(settings)
        if state is not None and state.get("status") == "ALIVE":
            return
        time.sleep(0.5)
    raise SparkClusterError(
        f"the Spark master did not answer at {master_ui_url(settings)}/json/; see {log_file(settings, 'master')}"
    )


def _wait_workers(
    settings: Settings, indexes: list[int], started: dict[int, subprocess.Popen], deadline: float
) -> None:
    while True:
        alive = alive_workers(master_state(settings), settings)
        missing = [i for i in indexes if i not in alive]
        if not missing:
            return
        for index in missing:
            proc = started.get(index)
            gone = proc.poll() is not None if proc is not None else _read_pid(settings, f"worker-{index}") is None
            if gone:
                raise SparkClusterError(
                    f"Spark worker {index} exited during start-up; see {log_file(settings, f'worker-{index}')}"
                )
        if time.monotonic() >= deadline:
            logs = ", ".join(str(log_file(settings, f"worker-{i}")) for i in missing)
            raise SparkClusterError(
                f"Spark worker(s) {', '.join(map(str, missing))} did not register with the master at "
                f"{master_url(settings)}; see {logs}"
            )
        time.sleep(0.5)


def _spawn_worker(settings: Settings, index: int) -> subprocess.Popen:
    _check_free(settings, worker_ui_port(settings, index), f"worker {index}'s web UI", "ADPIPE_SPARK_MASTER_UI_PORT")
    worker_dir(settings, index).mkdir(parents=True, exist_ok=True)
    return _spawn(settings, f"worker-{index}", worker_command(settings, index))


def up(settings: Settings, workers: int | None = None, timeout_s: float = 120.0) -> ClusterStatus:
    """Start the master and the workers of ours that do not run yet (workers
    beyond ``workers`` are stopped); wait until the master holds every worker
    ALIVE. ``workers``: default as last started, else 2."""
    count = workers or recorded_size(settings)
    if not 1 <= count <= MAX_WORKERS:
        raise SparkClusterError(f"a local cluster has 1 to {MAX_WORKERS} workers, not {count}")
    _prepare(settings, count)
    deadline = time.monotonic() + timeout_s
    master = None
    if master_pid(settings) is None:
        _check_free(settings, settings.spark_master_port, "the master", "ADPIPE_SPARK_MASTER_PORT")
        _check_free(settings, settings.spark_master_ui_port, "the master's web UI", "ADPIPE_SPARK_MASTER_UI_PORT")
        master = _spawn(settings, "master", master_command(settings))
    for index in [i for i in worker_pids(settings) if i > count]:
        stop_worker(settings, index)
    _wait_master(settings, master, deadline)
    started = {
        index: _spawn_worker(settings, index)
        for index in range(1, count + 1)
        if _read_pid(settings, f"worker-{index}") is None
    }
    _wait_workers(settings, list(range(1, count + 1)), started, deadline)
    return status(settings)


def start_worker(settings: Settings, index: int, timeout_s: float = 120.0) -> WorkerStatus:
    """Start worker ``index`` again (after a fault killed it); wait until the
    master holds it ALIVE. The master must run."""
    if master_pid(settings) is None:
        raise SparkClusterError(f"the Spark master of {cluster_dir(settings)} does not run: `adpipe spark up` first")
    started = {}
    if _read_pid(settings, f"worker-{index}") is None:
        started[index] = _spawn_worker(settings, index)
    _wait_workers(settings, [index], started, time.monotonic() + timeout_s)
    return _worker_status(settings, index, master_state(settings))


def kill_worker(settings: Settings, index: int, sig: int = signal.SIGKILL) -> list[int]:
    """Signal worker ``index`` together with everything below it (its
    executors and their Python workers), as when its machine dies; return
    the pids signalled (empty: it did not run). With SIGKILL, waits until
    they are gone."""
    pid = _read_pid(settings, f"worker-{index}")
    if pid is None:
        return []
    pids = [pid, *descendants(pid)]
    # The worker leads its own process group, which its executors share:
    # one signal reaches them at the same instant. Python workers set up a
    # group of their own and are signalled one by one right after.
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
    for child in pids:
        _signal(child, sig)
    log.warning("Spark worker %d: signal %d to pids %s", index, sig, pids)
    if sig == signal.SIGKILL and not _wait_gone(pids, 30.0):
        raise SparkClusterError(f"Spark worker {index}'s processes {pids} outlived a SIGKILL")
    return pids


def _finish_stop(pid: int, below: list[int], what: str, timeout_s: float) -> None:
    """After a SIGTERM to ``pid``: wait for it (SIGKILL after ``timeout_s``),
    then for the processes that were below it (a worker's executors and their
    Python workers: ours), SIGKILLed if still there after LEFTOVER_WAIT_S."""
    if not _wait_gone([pid], timeout_s):
        log.warning("Spark %s (pid %d) ignored SIGTERM for %.0fs; killing it", what, pid, timeout_s)
        _signal(pid, signal.SIGKILL)
        _wait_gone([pid], 10.0)
    leftovers = [p for p in below if alive(p)]
    if leftovers and not _wait_gone(leftovers, LEFTOVER_WAIT_S):
        for p in leftovers:
            _signal(p, signal.SIGKILL)
        _wait_gone(leftovers, 10.0)


def stop_worker(settings: Settings, index: int, timeout_s: float = 30.0) -> bool:
    """SIGTERM worker ``index`` (it stops its executors) and wait; SIGKILL
    what is left after ``timeout_s``. True if it ran."""
    pid = _read_pid(settings, f"worker-{index}")
    if pid is not None:
        below = descendants(pid)
        _signal(pid, signal.SIGTERM)
        _finish_stop(pid, below, f"worker {index}", timeout_s)
    _pid_file(settings, f"worker-{index}").unlink(missing_ok=True)
    return pid is not None


def _stop_master(settings: Settings, timeout_s: float) -> bool:
    pid = master_pid(settings)
    if pid is not None:
        _signal(pid, signal.SIGTERM)
        _finish_stop(pid, [], "master", timeout_s)
    _pid_file(settings, "master").unlink(missing_ok=True)
    return pid is not None


def down(settings: Settings, timeout_s: float = 30.0) -> bool:
    """Stop every worker, then the master, that we started (never another
    cluster's). True if something stopped."""
    running = {index: (pid, descendants(pid)) for index, pid in worker_pids(settings).items()}
    for pid, _below in running.values():  # all at once, then wait for each
        _signal(pid, signal.SIGTERM)
    for index, (pid, below) in running.items():
        _finish_stop(pid, below, f"worker {index}", timeout_s)
    for index in _worker_indexes(settings):
        _pid_file(settings, f"worker-{index}").unlink(missing_ok=True)
    return _stop_master(settings, timeout_s) or bool(running)
