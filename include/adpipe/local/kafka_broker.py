"""The local Apache Kafka broker of the embedded default.

A real broker in KRaft combined mode (broker + controller in one JVM), run
from the jars Maven fetched into the project cache, listening on loopback,
with its data under ``$ADPIPE_HOME/kafka``. Transactions work on one node
because the transaction-state and offsets logs are set to replication 1."""

from __future__ import annotations

import base64
import logging
import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from adpipe.jars import ensure_classpath
from adpipe.settings import Settings

log = logging.getLogger(__name__)


class BrokerError(RuntimeError):
    """The local broker could not be started, reached or stopped."""


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    answering: bool
    bootstrap: str

    def describe(self) -> str:
        if self.running and self.answering:
            return f"kafka up: pid {self.pid}, answering on {self.bootstrap}"
        if self.running:
            return f"kafka starting or unhealthy: pid {self.pid}, not answering on {self.bootstrap}"
        return f"kafka down (nothing of ours runs; {self.bootstrap} answering={self.answering})"


def _host_port(bootstrap: str) -> tuple[str, int]:
    first = bootstrap.split(",")[0]
    host, _, port = first.rpartition(":")
    return host or "127.0.0.1", int(port)


def _pid_file(settings: Settings) -> Path:
    return settings.kafka_dir / "broker.pid"


def _read_pid(settings: Settings) -> int | None:
    """The pid of the broker we started, if it still runs (and is ours)."""
    try:
        pid = int(_pid_file(settings).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return None
    return pid if "kafka.Kafka" in cmdline and str(settings.kafka_dir) in cmdline else None


def server_properties(settings: Settings) -> str:
    host, port = _host_port(settings.kafka_bootstrap)
    cport = settings.kafka_controller_port
    data = settings.kafka_dir / "data"
    return "\n".join(
        [
            "process.roles=broker,controller",
            "node.id=1",
            f"controller.quorum.voters=1@{host}:{cport}",
            f"listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{cport}",
            f"advertised.listeners=PLAINTEXT://{host}:{port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            f"log.dirs={data}",
            f"num.partitions={settings.topic_partitions}",
            "auto.create.topics.enable=false",
            # One node: the internal logs that transactions and consumer
            # offsets live in must not ask for more replicas than exist.
            "offsets.topic.replication.factor=1",
            "offsets.topic.num.partitions=4",
            "transaction.state.log.replication.factor=1",
            "transaction.state.log.min.isr=1",
            "transaction.state.log.num.partitions=4",
            "default.replication.factor=1",
            "min.insync.replicas=1",
            "group.initial.rebalance.delay.ms=0",
            # Producers may ask for up to 15 minutes (see Settings).
            "transaction.max.timeout.ms=900000",
            # A transaction past its timeout is aborted within a second of it
            # (default: checked every 10 s), so a stalled batch fails promptly.
            "transaction.abort.timed.out.transaction.cleanup.interval.ms=1000",
            "log.retention.hours=168",
            # The stream job's ledger is a consumer group's committed offsets:
            # Kafka drops an idle group's offsets after 7 days by default, and a
            # job stopped that long would then find no ledger. Keep them 10 years.
            "offsets.retention.minutes=5256000",
            "log.segment.bytes=67108864",
            "",
        ]
    )


def _log4j_config(settings: Settings) -> Path:
    path = settings.kafka_dir / "log4j2.properties"
    path.write_text(
        "\n".join(
            [
                "status = error",
                "appender.file.type = File",
                "appender.file.name = file",
                f"appender.file.fileName = {settings.kafka_dir / 'broker.log'}",
                "appender.file.layout.type = PatternLayout",
                "appender.file.layout.pattern = [%d] %p %m (%c)%n",
                "rootLogger.level = INFO",
                "rootLogger.appenderRef.file.ref = file",
                "logger.kafka.name = kafka",
                "logger.kafka.level = INFO",
                "logger.state.name = state.change.logger",
                "logger.state.level = WARN",
                "",
            ]
        )
    )
    return path


def _java(settings: Settings, main: str, *args: str) -> list[str]:
    jars = ensure_classpath(settings.jar_cache, "kafka")
    classpath = os.pathsep.join(str(j) for j in jars)
    return [
        "java",
        "-Xms256m",
        "-Xmx768m",
        "-XX:+UseG1GC",
        *settings.jvm_options,
        f"-Dlog4j2.configurationFile={_log4j_config(settings)}",
        f"-Dkafka.logs.dir={settings.kafka_dir}",
        "-cp",
        classpath,
        main,
        *args,
    ]


def _cluster_id() -> str:
    """A Kafka cluster id: a UUID in url-safe base64 without padding. Like
    Kafka's own Uuid.randomUuid, never one that starts with "-": the storage
    tool would read it as an option (one start in 64 failed that way)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _format_storage(settings: Settings, config: Path) -> None:
    data = settings.kafka_dir / "data"
    if (data / "meta.properties").exists():
        return
    log.info("formatting KRaft storage in %s", data)
    cmd = _java(settings, "kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c", str(config))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603
    if proc.returncode != 0:
        raise BrokerError(f"formatting Kafka storage failed:\n{proc.stdout}{proc.stderr}")


def answering(bootstrap: str, timeout_s: float = 3.0) -> bool:
    """True when a broker answers a metadata request at ``bootstrap``."""
    from confluent_kafka.admin import AdminClient

    host, port = _host_port(bootstrap)
    try:  # a closed port answers at once; spare librdkafka's retry noise
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:
        return False
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": int(timeout_s * 1000), "log_level": 0})
    try:
        md = admin.list_topics(timeout=timeout_s)
    except Exception:  # noqa: BLE001 - any failure means "not answering"
        return False
    return bool(md.brokers)


def status(settings: Settings) -> BrokerStatus:
    pid = _read_pid(settings)
    return BrokerStatus(pid is not None, pid, answering(settings.kafka_bootstrap), settings.kafka_bootstrap)


def up(settings: Settings, timeout_s: float = 90.0) -> BrokerStatus:
    """Start the broker unless ours already runs; wait until it answers."""
    settings.kafka_dir.mkdir(parents=True, exist_ok=True)
    pid = _read_pid(settings)
    started: subprocess.Popen | None = None
    if pid is None:
        if answering(settings.kafka_bootstrap, timeout_s=1.0):
            raise BrokerError(
                f"something else already answers on {settings.kafka_bootstrap}; "
                "stop it or point ADPIPE_KAFKA_BOOTSTRAP elsewhere"
            )
        config = settings.kafka_dir / "server.properties"
        config.write_text(server_properties(settings))
        _format_storage(settings, config)
        out = open(settings.kafka_dir / "broker.out", "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(  # noqa: S603
            _java(settings, "kafka.Kafka", str(config)),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        _pid_file(settings).write_text(f"{proc.pid}\n")
        pid, started = proc.pid, proc
        log.info("started Kafka broker pid %d on %s", pid, settings.kafka_bootstrap)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # The child we started: ask it (its /proc cmdline is empty for a few
        # milliseconds after fork, so _read_pid cannot tell yet).
        gone = started.poll() is not None if started is not None else _read_pid(settings) is None
        if gone:
            raise BrokerError(f"the broker exited during start-up; see {settings.kafka_dir / 'broker.out'}")
        if answering(settings.kafka_bootstrap, timeout_s=2.0):
            return BrokerStatus(True, pid, True, settings.kafka_bootstrap)
        time.sleep(0.5)
    raise BrokerError(f"the broker did not answer within {timeout_s:.0f}s; see {settings.kafka_dir}")


def down(settings: Settings, timeout_s: float = 60.0) -> bool:
    """Stop the broker we started (never another one). True if one stopped."""
    pid = _read_pid(settings)
    if pid is None:
        _pid_file(settings).unlink(missing_ok=True)
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _read_pid(settings) is not None:
        time.sleep(0.3)
    if _read_pid(settings) is not None:
        log.warning("broker pid %d ignored SIGTERM for %.0fs; killing it", pid, timeout_s)
        os.kill(pid, signal.SIGKILL)
    _pid_file(settings).unlink(missing_ok=True)
    return True
