"""The one SparkSession builder, used by jobs and by the tests' fixture.

The master is ``ADPIPE_SPARK_MASTER``: ``local[2]`` by default, or a
standalone cluster's ``spark://host:port`` (``adpipe spark up`` starts one
on this machine). On a cluster the executors are other JVMs, so the session
also tells them which Python to run (this environment's interpreter, which
has adpipe, pandas and pyarrow), their heap, the driver's address and the
JVM options; the jars are shipped by ``spark.jars``, and the checkpoint and
warehouse must be paths every node reaches (on one machine: any local path)."""

from __future__ import annotations

import logging
import os
import re
import shlex
import socket
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlparse

from pyspark.sql import SparkSession

from adpipe import class_archive, raw_events
from adpipe.jars import adpipe_spark_jar, ensure_classpath, spark_home
from adpipe.setting_values import binds_here
from adpipe.settings import Settings

log = logging.getLogger(__name__)

Result = TypeVar("Result")

# The driver's log4j2 when ADPIPE_JVM_LOGS=file (see the file itself).
LOG4J2_FILE_CONFIG = Path(__file__).parent / "jvm" / "log4j2-file.properties"

# Conf keys whose values are never printed (a metastore password, a JAAS
# config with a Kafka password, a token). Spark's own redaction of its UI and
# event logs is widened to the same words.
SECRET_KEY = re.compile(r"password|secret|jaas|token|access[._]?key|credential", re.IGNORECASE)
SPARK_REDACTION_REGEX = "(?i)secret|password|token|access[.]?key|jaas|credential"
REDACTED = "*********(redacted)"


def redacted(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` fit to print: the value of every key naming a secret hidden."""
    return {key: REDACTED if SECRET_KEY.search(key) else value for key, value in conf.items()}


def on_cluster(settings: Settings) -> bool:
    """True when jobs run on a standalone cluster's executors (``spark://``)."""
    return settings.spark_master.startswith("spark://")


def driver_log_file(settings: Settings, app_name: str) -> Path:
    """Where the driver of ``app_name`` writes its log4j lines when
    ADPIPE_JVM_LOGS=file: ``ADPIPE_HOME/logs/<app_name>.log``."""
    return settings.log_dir / (re.sub(r"[^A-Za-z0-9._-]", "_", app_name) + ".log")


def driver_log_options(settings: Settings, app_name: str) -> list[str]:
    """The driver JVM's options that send its log4j lines to
    :func:`driver_log_file` (errors also to stderr); none for
    ADPIPE_JVM_LOGS=console, which leaves Spark's own console logging."""
    if settings.jvm_logs != "file":
        return []
    return [
        f"-Dlog4j2.configurationFile={LOG4J2_FILE_CONFIG.as_uri()}",
        f"-Dadpipe.log.file={driver_log_file(settings, app_name)}",
    ]


def host_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container's
    cpuset limits it), which the JVM options' ``auto`` modes go by."""
    return len(os.sched_getaffinity(0))


# ADPIPE_SPARK_JIT=quick: the JIT's first tier only (C1). On two cores a
# Spark JVM's C2 compiler threads took as much CPU as its tasks for the first
# minutes (17 of 39 CPU s of `adpipe stream --available-now` over make
# bench's 1M topic), just when a start, a failover or a backlog needs the
# cores; C1's code is a little slower (tasks 16 s against 14 s) but compiles
# in a tenth of the time. full: the JVM's default tiers, for long-lived
# drivers on hosts with cores to spare; auto: quick on QUICK_JIT_MAX_CORES or fewer.
# C1 alone reserves a smaller code cache (48 MB), which a load's driver
# running the gate's many Spark jobs filled ("Out of space in CodeCache"):
# the tiered default's size, as the tests run.
QUICK_JIT = ("-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=256m")
QUICK_JIT_MAX_CORES = 4


def jit_options(settings: Settings) -> list[str]:
    """The Spark JVMs' JIT options (ADPIPE_SPARK_JIT)."""
    mode = settings.spark_jit
    if mode == "auto":
        mode = "quick" if host_cores() <= QUICK_JIT_MAX_CORES else "full"
    return list(QUICK_JIT) if mode == "quick" else []


# ADPIPE_SPARK_GC=serial: the serial collector. On two cores G1's
# concurrent threads and its write barriers (costly in C1's code) compete
# with the tasks, and it grows the heap generously: over make bench's 1M topic
# `adpipe stream --available-now` peaked at 1.14-1.18 GB instead of 1.38-1.58
# GB (the JVM 0.72-0.79 GB instead of 0.96-1.19) at the same throughput or
# better, and the 10,000-ad hour's load took 52.0-58.5 s instead of 56.8-60.2.
# default: the JVM's choice (G1); auto: serial on SERIAL_GC_MAX_CORES or
# fewer. Never added when ADPIPE_JVM_OPTIONS picks a collector (the JVM
# refuses two).
SERIAL_GC = ("-XX:+UseSerialGC",)
SERIAL_GC_MAX_CORES = 2
_COLLECTOR_OPTION = re.compile(r"-XX:\+Use\w*GC")


def gc_options(settings: Settings) -> list[str]:
    """The Spark JVMs' garbage collector options (ADPIPE_SPARK_GC)."""
    if any(_COLLECTOR_OPTION.fullmatch(option) for option in settings.jvm_options):
        return []
    mode = settings.spark_gc
    if mode == "auto":
        mode = "serial" if host_cores() <= SERIAL_GC_MAX_CORES else "default"
    return list(SERIAL_GC) if mode == "serial" else []


def cluster_conf(settings: Settings) -> dict[str, str]:
    """What executors of a ``spark://`` master need (empty for ``local[N]``)."""
    if not on_cluster(settings):
        return {}
    conf = {
        # Python workers (the stream job's stateful operator, pandas UDFs)
        # run this interpreter, on every node: the same path on each.
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        "spark.executor.memory": settings.spark_executor_memory,
        "spark.executor.extraJavaOptions": shlex.join(
            [*jit_options(settings), *gc_options(settings), *settings.jvm_options]
        ),
    }
    if settings.spark_cores_max:
        conf["spark.cores.max"] = str(settings.spark_cores_max)
    return conf


def spark_conf(settings: Settings, app_name: str, extra_conf: dict[str, str] | None = None) -> dict[str, str]:
    """Every Spark setting adpipe relies on, in one place; ``extra_conf`` is a
    part's own (the lakehouse's Hive catalog, adpipe.lakehouse.metastore)."""
    jars = [*ensure_classpath(settings.jar_cache, "spark"), adpipe_spark_jar(settings.jar_cache)]
    conf = {
        "spark.app.name": app_name,
        "spark.master": settings.spark_master,
        "spark.jars": ",".join(str(j) for j in jars),
        # Fixed for the life of a checkpoint (Spark refuses a change).
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": settings.spark_driver_memory,
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.warehouse.dir": settings.warehouse_uri,
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        # A batch's state commit writes a changelog of its changes, not a
        # snapshot of the store (snapshots are uploaded in the background):
        # a steady batch's commits took 90-130 ms per partition. A checkpoint
        # written either way is read either way.
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.adaptive.enabled": "false",
        # Python workers fork from a daemon that has imported what they use
        # (adpipe.spark_worker): none compiles pyspark or imports pandas itself.
        "spark.python.daemon.module": "adpipe.spark_worker",
        # The driver listens on this address only: loopback by default, in
        # local mode too (Spark would bind the host's own address, reachable
        # from the network); on a cluster, the one executors connect back to.
        "spark.driver.host": settings.spark_driver_host,
        "spark.driver.bindAddress": settings.spark_driver_host,
        # Only where pyspark launches the JVM (not under spark-submit, whose
        # log goes where spark-submit's stderr goes: Airflow's task log).
        "spark.driver.extraJavaOptions": shlex.join(
            [
                f"-Dderby.system.home={settings.home / 'derby'}",
                *driver_log_options(settings, app_name),
                *jit_options(settings),
                *gc_options(settings),
                *settings.jvm_options,
            ]
        ),
        # Delta retries its own commits; ours retry whole MERGEs (adpipe.lakehouse.load).
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        # A MERGE that inserts nothing writes no table version (Delta's
        # default, relied on by adpipe.lakehouse.merge: a rerun changes nothing).
        "spark.databricks.delta.skipRecordingEmptyCommits": "true",
        # A MERGE's inserts are written by the tasks that found them, not
        # first shuffled by the partition column: a load's rows are mostly of
        # one event_hour, and one task then wrote the hour's whole file (and
        # one task read it back). A 10,000-ad hour: 125 -> 116 s here.
        "spark.databricks.delta.merge.repartitionBeforeWrite.enabled": "false",
        # Secrets stay out of Spark's UI, event log and plans (a Kafka
        # source's JAAS option included), as out of ours (redacted()).
        "spark.redaction.regex": SPARK_REDACTION_REGEX,
        "spark.sql.redaction.options.regex": f"(?i)url|{SPARK_REDACTION_REGEX.removeprefix('(?i)')}",
    }
    conf.update(cluster_conf(settings))
    conf.update(extra_conf or {})
    if "spark.driver.extraJavaOptions" not in (extra_conf or {}):
        # The class archive of this driver's classpath (adpipe.class_archive), once trained.
        archive = class_archive.driver_options(settings, conf.get("spark.driver.extraClassPath", ""))
        if archive:
            conf["spark.driver.extraJavaOptions"] += " " + shlex.join(archive)
    return conf


def _warn_local_folders_on_a_cluster(settings: Settings) -> None:
    """A file: checkpoint or warehouse on a cluster of other machines is a
    different folder on each: say so (one machine, the local cluster, is fine)."""
    host = urlparse(settings.spark_master).hostname or ""
    if host in ("127.0.0.1", "localhost", "::1"):
        return
    for what, uri, variable in (
        ("checkpoint", settings.checkpoint_uri, "ADPIPE_CHECKPOINT_URI"),
        ("warehouse", settings.warehouse_uri, "ADPIPE_WAREHOUSE_URI"),
    ):
        if urlparse(uri).scheme == "file":
            log.warning(
                "%s %s is a local folder but the master %s may run executors on other machines: "
                "set %s to a URI every node reaches (hdfs://, s3a://, a shared mount)",
                what, uri, settings.spark_master, variable,
            )  # fmt: skip


def worker_imports_conf(*modules: str) -> dict[str, str]:
    """A job's conf that has its Python workers' daemon import ``modules``
    before it forks them (adpipe.spark_worker)."""
    from adpipe.spark_worker import WORKER_IMPORTS_ENV

    return {f"spark.executorEnv.{WORKER_IMPORTS_ENV}": ",".join(modules)}


def stream_job_conf(settings: Settings) -> dict[str, str]:
    """The stream job's own conf, whether pyspark or spark-submit starts its
    driver: its heap (ADPIPE_STREAM_DRIVER_MEMORY, apart from the loads':
    its operators' in-memory tables of event ids live in it on ``local[N]``)."""
    return {"spark.driver.memory": settings.stream_driver_memory}


def worker_python(settings: Settings) -> str:
    """The Python Spark runs for its workers: on a cluster this interpreter
    (the same path on every node); in a local session the shim of
    adpipe.spark_worker.worker_python, which keeps the installed pyspark
    compiled for the processes Spark starts without the daemon (the stream
    job's state schema check at a query's start: 0.87 -> 0.38 s; its first
    batch starts 0.2-0.35 s sooner)."""
    if on_cluster(settings):
        return sys.executable
    from adpipe.spark_worker import worker_python as local_worker_python

    return local_worker_python(settings.jar_cache / "python", str(spark_home()))


def build_spark(settings: Settings, app_name: str = "adpipe", extra_conf: dict[str, str] | None = None) -> SparkSession:
    """The session of a job, with a part's ``extra_conf`` on top (see
    :func:`spark_conf`)."""
    settings.home.mkdir(parents=True, exist_ok=True)
    settings.log_dir.mkdir(exist_ok=True)
    # Python workers (the stream job's stateful operator) run this
    # environment's interpreter, which has adpipe, pandas and pyarrow
    # (in a local session through a shim: worker_python). One set by the user stays.
    if "PYSPARK_PYTHON" not in os.environ:
        os.environ["PYSPARK_PYTHON"] = worker_python(settings)
    conf = spark_conf(settings, app_name, extra_conf)
    if on_cluster(settings):
        _warn_local_folders_on_a_cluster(settings)
    log.info(
        "Spark application %s on %s%s",
        app_name,
        settings.spark_master,
        f", its log in {driver_log_file(settings, app_name)}" if settings.jvm_logs == "file" else "",
    )
    log.debug("Spark conf: %s", redacted(conf))
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(settings.spark_log_level)
    raw_events.register_functions(spark)  # the raw event's fast path, from the jar shipped above
    return spark


DEFAULT_CONNECT_PORT = 15002  # Spark's own
# How long a Spark Connect client waits for its server (one restarted by its supervisor).
CONNECT_WAIT_S = 60.0


def connect_urls(settings: Settings) -> list[str]:
    """The load's Spark Connect servers (``ADPIPE_SPARK_CONNECT``), in the
    order clients try them; Spark's port 15002 on loopback when unset."""
    return settings.spark_connect.split(",") if settings.spark_connect else [f"sc://127.0.0.1:{DEFAULT_CONNECT_PORT}"]


def _host_port(url: str) -> tuple[str, int]:
    parsed = urlparse(url)
    return parsed.hostname or "127.0.0.1", parsed.port or DEFAULT_CONNECT_PORT


def connect_address(settings: Settings) -> tuple[str, int]:
    """Where this host's Spark Connect server listens: the first of
    ``ADPIPE_SPARK_CONNECT``'s servers at an address of this host (each host
    of several runs the one named by its own address)."""
    for url in connect_urls(settings):
        host, port = _host_port(url)
        if binds_here(host):
            return host, port
    raise RuntimeError(
        f"none of ADPIPE_SPARK_CONNECT's servers ({settings.spark_connect}) is at an address of this host: "
        "name this host's there"
    )


def connect_server_conf(settings: Settings) -> dict[str, str]:
    """A session's conf for a Spark Connect server at :func:`connect_address`
    (:func:`start_connect_service` starts it on the session)."""
    host, port = connect_address(settings)
    return {"spark.connect.grpc.binding.address": host, "spark.connect.grpc.binding.port": str(port)}


def start_connect_service(spark: SparkSession) -> None:
    """Serve ``spark`` over Spark Connect, as Spark's own SparkConnectServer
    does: started once the session is ready (not as a plugin at its start,
    which opens the port to clients before the tables are in place)."""
    jvm = spark.sparkContext._jvm  # noqa: SLF001 - py4j gateway
    jvm.org.apache.spark.sql.connect.service.SparkConnectService.start(spark.sparkContext._jsc.sc())  # noqa: SLF001


def answers(host: str, port: int) -> bool:
    """Whether something accepts connections at ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=3.0):
            return True
    except OSError:
        return False


def answering_server(settings: Settings, wait_s: float = 0.0) -> str | None:
    """The first of the load's Spark Connect servers that accepts
    connections, trying them in turn for up to ``wait_s`` (one that its
    supervisor restarts); None when none does."""
    deadline = time.monotonic() + wait_s
    while True:
        for url in connect_urls(settings):
            if answers(*_host_port(url)):
                return url
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.5)


def connect_session(settings: Settings) -> SparkSession:
    """A session of the first of the load's Spark Connect servers that
    answers (``ADPIPE_SPARK_CONNECT``): its JVM, Spark settings and
    metastore are the server's (adpipe connect serve); this process only
    sends plans."""
    from pyspark.sql.connect.client.retries import DefaultPolicy

    url = answering_server(settings, CONNECT_WAIT_S)
    if url is None:
        raise RuntimeError(
            f"no Spark Connect server answers at {settings.spark_connect} (waited {CONNECT_WAIT_S:.0f} s): "
            "start one there (adpipe connect serve), or unset ADPIPE_SPARK_CONNECT for a session of this process"
        )
    log.info("Spark Connect session on %s", url)
    spark = SparkSession.builder.remote(url).getOrCreate()
    # pyspark's client retries an unreachable server for 10 minutes, silently;
    # a server gone mid-step fails the step within about a minute instead.
    spark.client.set_retry_policies([DefaultPolicy(max_retries=15, max_backoff=5000)])
    raw_events.register_functions(spark)  # per session: a server's sessions share no functions
    return spark


def is_connect(spark: SparkSession) -> bool:
    """Whether ``spark`` is a Spark Connect client's session (no JVM here)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def default_parallelism(spark: SparkSession) -> int:
    """The cores the session's tasks run on (a Spark Connect session has no
    SparkContext here: its master's, from the server's conf)."""
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    configured = spark.conf.get("spark.default.parallelism", None)
    if configured:
        return int(configured)
    local = re.fullmatch(r"local\[(\d+)(?:,\d+)?\]", spark.conf.get("spark.master", "") or "")
    return int(local.group(1)) if local else int(spark.conf.get("spark.cores.max", None) or os.cpu_count() or 1)


def keep_zip_directories() -> None:
    """For a Spark Python worker that runs adpipe's code: re-read a zip on
    ``sys.path`` only when the archive changed.

    pyspark's worker calls ``importlib.invalidate_caches()`` before every
    task, and on Python 3.10 and 3.11 each zip importer then re-reads its
    archive's whole directory at once (Spark puts ``pyspark.zip``, 1,300
    entries, first on a worker's path): about 0.1 s of CPU per task, 4.6 s of
    a 1M-record stream run (py-spy). Later Pythons re-read lazily (their
    zipimporter has ``_get_files``); there this does nothing. Called where a
    worker imports adpipe (the load's pandas functions)."""
    import zipimport

    importer = zipimport.zipimporter
    if hasattr(importer, "_get_files") or getattr(importer, "_adpipe_rereads_when_changed", False):
        return
    reread = importer.invalidate_caches

    def invalidate_if_changed(self: zipimport.zipimporter) -> None:
        try:
            stat = os.stat(self.archive)
            stamp = (stat.st_size, stat.st_mtime_ns)
        except OSError:
            stamp = None
        if stamp is None or getattr(self, "_adpipe_stamp", None) != stamp:
            reread(self)
            self._adpipe_stamp = stamp

    importer.invalidate_caches = invalidate_if_changed
    importer._adpipe_rereads_when_changed = True


def in_threads(calls: dict[str, Callable[[], Result]]) -> dict[str, Result]:
    """Each call in its own thread, Spark running the jobs of all of them at
    once (one call's planning, commits and metastore calls then overlap
    another's tasks); their results by name, in the order given. The first
    failure is raised once every call has ended."""
    with ThreadPoolExecutor(max_workers=len(calls) or 1, thread_name_prefix="adpipe-spark") as pool:
        futures = {name: pool.submit(call) for name, call in calls.items()}
    return {name: future.result() for name, future in futures.items()}
