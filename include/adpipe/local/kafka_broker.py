"""The local Apache Kafka broker (or cluster) of the embedded default.

Real brokers in KRaft combined mode (broker + controller in one JVM per node),
run from the jars Maven fetched into the project cache, listening on loopback,
with their data under ``$ADPIPE_HOME/kafka``. One node by default; with
``--brokers 3`` three nodes that are each broker and controller (a controller
quorum of three: any one node may die), replication factor 3 and
``min.insync.replicas=2`` for the topics and for Kafka's own transaction-state
and offsets logs. Node 1 listens on ``ADPIPE_KAFKA_BOOTSTRAP`` and
``ADPIPE_KAFKA_CONTROLLER_PORT``; node *k* on those ports plus ``100·(k-1)``,
unless the bootstrap lists one address per node.

With ``--secure`` (or ``ADPIPE_KAFKA_SECURITY=sasl_ssl``) every listener is
SASL_SSL, users authenticate with SCRAM-SHA-512 and ACLs decide what each may
do (:mod:`adpipe.local.kafka_security`); the home records that it is secure,
and later ``up``/``status`` talk to it as its admin user."""

from __future__ import annotations

import base64
import json
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
from adpipe.local import kafka_security
from adpipe.processes import start_detached
from adpipe.settings import KafkaAccess, Settings

log = logging.getLogger(__name__)

# Node k's ports are node 1's plus this times (k - 1).
NODE_PORT_STEP = 100


class BrokerError(RuntimeError):
    """The local broker could not be started, reached or stopped."""


@dataclass(frozen=True)
class Node:
    """One node of the local cluster: its id, addresses and folder."""

    node_id: int
    host: str
    port: int
    controller_port: int
    directory: Path

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def config(self) -> Path:
        return self.directory / "server.properties"

    @property
    def pid_file(self) -> Path:
        return self.directory / "broker.pid"

    @property
    def log_file(self) -> Path:
        return self.directory / "broker.log"


@dataclass(frozen=True)
class BrokerStatus:
    """One node: is our process alive, does it answer."""

    node_id: int
    running: bool
    pid: int | None
    answering: bool
    bootstrap: str
    secure: bool = False

    def describe(self) -> str:
        if self.running and self.answering:
            how = " (SASL_SSL, SCRAM-SHA-512 users, ACLs)" if self.secure else ""
            return f"kafka up: pid {self.pid}, answering on {self.bootstrap}{how}"
        if self.running:
            return f"kafka starting or unhealthy: pid {self.pid}, not answering on {self.bootstrap}"
        return f"kafka down (nothing of ours runs; {self.bootstrap} answering={self.answering})"


@dataclass(frozen=True)
class ClusterStatus:
    """Every node of the local cluster (one by default)."""

    nodes: tuple[BrokerStatus, ...]

    @property
    def running(self) -> bool:
        return all(n.running for n in self.nodes)

    @property
    def answering(self) -> bool:
        return all(n.answering for n in self.nodes)

    @property
    def pid(self) -> int | None:
        return self.nodes[0].pid

    @property
    def secure(self) -> bool:
        return self.nodes[0].secure

    @property
    def bootstrap(self) -> str:
        """What clients should use: every node's address."""
        return ",".join(n.bootstrap for n in self.nodes)

    def describe(self) -> str:
        if len(self.nodes) == 1:
            return self.nodes[0].describe()
        lines = [f"kafka cluster of {len(self.nodes)} nodes (bootstrap {self.bootstrap}):"]
        lines += [f"  node {n.node_id}: {n.describe()}" for n in self.nodes]
        return "\n".join(lines)


def _host_port(bootstrap: str) -> tuple[str, int]:
    first = bootstrap.split(",")[0].strip()
    host, _, port = first.rpartition(":")
    return host or "127.0.0.1", int(port)


def _cluster_file(settings: Settings) -> Path:
    return settings.kafka_dir / "cluster.json"


def recorded_size(settings: Settings) -> int:
    """How many nodes the local cluster under ADPIPE_HOME was made with (1
    when none was made yet)."""
    try:
        return int(json.loads(_cluster_file(settings).read_text())["brokers"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return 1


def recorded_secure(settings: Settings) -> bool:
    """Whether the local cluster under ADPIPE_HOME was made secure."""
    try:
        return bool(json.loads(_cluster_file(settings).read_text()).get("secure", False))
    except (FileNotFoundError, ValueError, AttributeError):
        return False


def admin_access(settings: Settings, bootstrap: str | None = None) -> KafkaAccess | str:
    """How adpipe's own tools (``up``, ``status``, topic creation) reach the
    local cluster: as its admin user when it is secure."""
    bootstrap = bootstrap or cluster_bootstrap(settings)
    if recorded_secure(settings):
        return kafka_security.access(settings, kafka_security.ADMIN, bootstrap)
    return bootstrap


def nodes(settings: Settings, count: int | None = None) -> list[Node]:
    """The nodes of the local cluster (``count``, else as recorded). Node 1
    keeps the single broker's folder, so a one-node home stays as it was."""
    count = recorded_size(settings) if count is None else count
    listed = [part.strip() for part in settings.kafka_bootstrap.split(",")]
    host, port = _host_port(settings.kafka_bootstrap)
    result = []
    for index in range(count):
        if len(listed) == count:
            node_host, node_port = _host_port(listed[index])
        else:
            node_host, node_port = host, port + NODE_PORT_STEP * index
        directory = settings.kafka_dir if index == 0 else settings.kafka_dir / f"node-{index + 1}"
        controller_port = settings.kafka_controller_port + NODE_PORT_STEP * index
        result.append(Node(index + 1, node_host, node_port, controller_port, directory))
    return result


def cluster_bootstrap(settings: Settings) -> str:
    """Every node's address, for clients of the local cluster."""
    return ",".join(n.bootstrap for n in nodes(settings))


def _read_pid(node: Node) -> int | None:
    """The pid of the node's broker we started, if it still runs (and is ours)."""
    try:
        pid = int(node.pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except FileNotFoundError:
        return None
    return pid if "kafka.Kafka" in cmdline and str(node.config) in cmdline.split("\0") else None


def node_pid(settings: Settings, node_id: int) -> int | None:
    """The live pid of one node of ours (None: it does not run)."""
    return _read_pid(nodes(settings)[node_id - 1])


FAST_FENCING = ("broker.session.timeout.ms=4000", "broker.heartbeat.interval.ms=1000")


def replication(count: int) -> tuple[int, int]:
    """Replication factor and min.insync.replicas for a cluster of ``count``
    nodes: three copies where three nodes exist, and a write needs two of
    them, so one node may die without losing an acknowledged record."""
    factor = min(3, count)
    return factor, 2 if factor >= 3 else 1


def server_properties(
    settings: Settings, node: Node | None = None, cluster: list[Node] | None = None, secure: bool = False
) -> str:
    """One node's server.properties (default: the single broker). Secure:
    SASL_SSL listeners, TLS and ACLs, with the admin and keystore passwords
    (:func:`adpipe.local.kafka_security.listener_properties`)."""
    cluster = cluster or nodes(settings, 1)
    node = node or cluster[0]
    factor, min_isr = replication(len(cluster))
    voters = ",".join(f"{n.node_id}@{n.host}:{n.controller_port}" for n in cluster)
    data = node.directory / "data"
    listeners = (
        kafka_security.listener_properties(settings, node.host, node.port, node.controller_port)
        if secure
        else [
            f"listeners=PLAINTEXT://{node.host}:{node.port},CONTROLLER://{node.host}:{node.controller_port}",
            f"advertised.listeners=PLAINTEXT://{node.host}:{node.port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        ]
    )
    return "\n".join(
        [
            "process.roles=broker,controller",
            f"node.id={node.node_id}",
            f"controller.quorum.voters={voters}",
            *listeners,
            f"log.dirs={data}",
            f"num.partitions={settings.topic_partitions}",
            "auto.create.topics.enable=false",
            # The internal logs that transactions and consumer offsets live in
            # never ask for more replicas than exist (one node: one copy).
            f"offsets.topic.replication.factor={factor}",
            "offsets.topic.num.partitions=4",
            f"transaction.state.log.replication.factor={factor}",
            f"transaction.state.log.min.isr={min_isr}",
            "transaction.state.log.num.partitions=4",
            f"default.replication.factor={factor}",
            f"min.insync.replicas={min_isr}",
            "group.initial.rebalance.delay.ms=0",
            # Consumer-protocol groups (KIP-848: the budget service) may ask
            # for a session of 6 s and a heartbeat every second (Kafka's
            # floors are 45 s and 5 s): a killed instance's partitions then
            # move within seconds (Settings.budget_session_timeout_ms).
            "group.consumer.min.session.timeout.ms=6000",
            "group.consumer.min.heartbeat.interval.ms=1000",
            # A node of several that dies is fenced 4 s after its last
            # heartbeat (Kafka's default: 9 s): its partitions move and it
            # leaves their ISRs, so writes carry on within seconds (`make bench
            # ARGS="--failover --part broker"`). A single node has nowhere to
            # move them, and a late heartbeat on a busy machine would only
            # fence it: it keeps the defaults.
            *(FAST_FENCING if len(cluster) > 1 else ()),
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
            # The operator's own (ADPIPE_KAFKA_BROKER_PROPERTIES): last, so they win.
            *settings.kafka_broker_properties,
            "",
        ]
    )


def _log4j_config(node: Node) -> Path:
    path = node.directory / "log4j2.properties"
    path.write_text(
        "\n".join(
            [
                "status = error",
                "appender.file.type = File",
                "appender.file.name = file",
                f"appender.file.fileName = {node.log_file}",
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


def _java(
    settings: Settings, main: str, *args: str, node: Node | None = None, argfile: Path | None = None
) -> list[str]:
    """The JVM command line; with ``argfile``, the main class and its
    arguments go into that file (0600) instead: a secret among them is then
    on no command line another user could read."""
    node = node or nodes(settings, 1)[0]
    jars = ensure_classpath(settings.jar_cache, "kafka")
    classpath = os.pathsep.join(str(j) for j in jars)
    tail = [main, *args]
    if argfile is not None:
        quoted = ['"' + a.replace("\\", "\\\\").replace('"', '\\"') + '"' for a in tail]
        kafka_security.write_secret(argfile, "\n".join(quoted))
        tail = [f"@{argfile}"]
    return [
        "java",
        "-Xms256m",
        "-Xmx768m",
        "-XX:+UseG1GC",
        *settings.jvm_options,
        f"-Dlog4j2.configurationFile={_log4j_config(node)}",
        f"-Dkafka.logs.dir={node.directory}",
        "-cp",
        classpath,
        *tail,
    ]


def _cluster_id() -> str:
    """A Kafka cluster id: a UUID in url-safe base64 without padding. Like
    Kafka's own Uuid.randomUuid, never one that starts with "-": the storage
    tool would read it as an option (one start in 64 failed that way)."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _format_storage(settings: Settings, node: Node, cluster_id: str, secure: bool = False) -> None:
    data = node.directory / "data"
    if (data / "meta.properties").exists():
        return
    log.info("formatting KRaft storage of node %d in %s", node.node_id, data)
    args = ["format", "-t", cluster_id, "-c", str(node.config)]
    # Secure: the admin user the brokers authenticate to each other as is in
    # the first metadata, its password passed in an argument file.
    argfile = node.directory / "format.args" if secure else None
    extra = kafka_security.format_scram_args(settings) if secure else []
    cmd = _java(settings, "kafka.tools.StorageTool", *args, *extra, node=node, argfile=argfile)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603
    finally:
        if argfile is not None:
            argfile.unlink(missing_ok=True)
    if proc.returncode != 0:
        raise BrokerError(f"formatting Kafka storage of node {node.node_id} failed:\n{proc.stdout}{proc.stderr}")


def answering(bootstrap: str | KafkaAccess, timeout_s: float = 3.0) -> bool:
    """True when a broker answers a metadata request at ``bootstrap`` (its
    first address: each node is asked on its own), with the credentials a
    :class:`KafkaAccess` carries."""
    from confluent_kafka.admin import AdminClient

    kafka = bootstrap if isinstance(bootstrap, KafkaAccess) else KafkaAccess(bootstrap)
    host, port = _host_port(kafka.bootstrap)
    try:  # a closed port answers at once; spare librdkafka's retry noise
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:
        return False
    first = KafkaAccess(f"{host}:{port}", kafka.credentials)
    try:  # (a secure home whose password files were removed: not answering us either)
        admin = AdminClient({**first.client_config(), "socket.timeout.ms": int(timeout_s * 1000), "log_level": 0})
        md = admin.list_topics(timeout=timeout_s)
    except Exception:  # noqa: BLE001 - any failure means "not answering"
        return False
    return bool(md.brokers)


def _node_access(settings: Settings, node: Node) -> KafkaAccess | str:
    return admin_access(settings, node.bootstrap)


def _node_status(settings: Settings, node: Node) -> BrokerStatus:
    pid = _read_pid(node)
    up_and_answering = answering(_node_access(settings, node))
    return BrokerStatus(node.node_id, pid is not None, pid, up_and_answering, node.bootstrap, recorded_secure(settings))


def status(settings: Settings) -> ClusterStatus:
    return ClusterStatus(tuple(_node_status(settings, n) for n in nodes(settings)))


def _write_private(path: Path, text: str) -> None:
    """A node's configuration: 0600 (a secure one holds passwords)."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(text)


def _prepare(settings: Settings, count: int, secure: bool = False) -> list[Node]:
    """The cluster's nodes, with their storage formatted (one cluster id);
    refuses a home made with another number of nodes, or made secure when
    ``secure`` is not asked for (or the other way round)."""
    recorded = recorded_size(settings)
    formatted = (settings.kafka_dir / "data" / "meta.properties").exists()
    if formatted and recorded != count:
        raise BrokerError(
            f"the local Kafka under {settings.kafka_dir} was made with {recorded} broker(s), not {count}: "
            f"run `adpipe kafka up --brokers {recorded}`, or `adpipe kafka down` and remove {settings.kafka_dir}"
        )
    if formatted and recorded_secure(settings) != secure:
        made = "with --secure" if recorded_secure(settings) else "without --secure"
        raise BrokerError(
            f"the local Kafka under {settings.kafka_dir} was made {made}: its data and users stay as made; "
            f"`adpipe kafka down` and remove {settings.kafka_dir} to make it again"
        )
    cluster = nodes(settings, count)
    settings.kafka_dir.mkdir(parents=True, exist_ok=True)
    info = {"brokers": count, "cluster_id": _cluster_id()}
    if _cluster_file(settings).exists():
        info = {**info, **json.loads(_cluster_file(settings).read_text()), "brokers": count}
    info["secure"] = secure
    _cluster_file(settings).write_text(json.dumps(info) + "\n")
    if secure:
        kafka_security.ensure_passwords(settings)
        kafka_security.ensure_tls(settings, sorted({n.host for n in cluster}))
    for node in cluster:
        node.directory.mkdir(parents=True, exist_ok=True)
        _write_private(node.config, server_properties(settings, node, cluster, secure))
        _format_storage(settings, node, info["cluster_id"], secure)
    return cluster


def _spawn(settings: Settings, node: Node) -> subprocess.Popen:
    proc = start_detached(_java(settings, "kafka.Kafka", str(node.config), node=node), node.directory / "broker.out")
    node.pid_file.write_text(f"{proc.pid}\n")
    log.info("started Kafka node %d pid %d on %s", node.node_id, proc.pid, node.bootstrap)
    return proc


def _wait_answering(
    node: Node, started: subprocess.Popen | None, deadline: float, kafka: KafkaAccess | str | None = None
) -> None:
    while time.monotonic() < deadline:
        # The child we started: ask it (its /proc cmdline is empty for a few
        # milliseconds after fork, so _read_pid cannot tell yet).
        gone = started.poll() is not None if started is not None else _read_pid(node) is None
        if gone:
            raise BrokerError(f"Kafka node {node.node_id} exited during start-up; see {node.directory / 'broker.out'}")
        if answering(kafka or node.bootstrap, timeout_s=2.0):
            return
        time.sleep(0.5)
    raise BrokerError(f"Kafka node {node.node_id} did not answer on {node.bootstrap}; see {node.log_file}")


def up(
    settings: Settings, brokers: int | None = None, timeout_s: float = 90.0, secure: bool | None = None
) -> ClusterStatus:
    """Start the node(s) of ours that do not run yet; wait until all answer.
    ``brokers``: the cluster's size (default: as made before, else 1).
    ``secure``: SASL_SSL, SCRAM users and ACLs (default: as made before,
    else as ``ADPIPE_KAFKA_SECURITY`` says); then the users and the ACLs of
    these settings' topics, job id and budget group are (re)applied."""
    count = brokers or recorded_size(settings)
    made = (settings.kafka_dir / "data" / "meta.properties").exists()
    if secure is None:
        secure = recorded_secure(settings) if made else settings.kafka.secure
    cluster = nodes(settings, count)
    for node in cluster:
        if _read_pid(node) is None and answering(node.bootstrap, timeout_s=1.0):
            raise BrokerError(
                f"something else already answers on {node.bootstrap}; stop it or point ADPIPE_KAFKA_BOOTSTRAP elsewhere"
            )
    cluster = _prepare(settings, count, secure)
    # A quorum of three elects no leader until two controllers run: start
    # every node first, then wait for each to answer.
    started = {n.node_id: _spawn(settings, n) for n in cluster if _read_pid(n) is None}
    deadline = time.monotonic() + timeout_s
    for node in cluster:
        _wait_answering(node, started.get(node.node_id), deadline, _node_access(settings, node))
    if secure:
        admin = admin_access(settings)
        assert isinstance(admin, KafkaAccess)
        kafka_security.ensure_users(settings, admin)
        rules = kafka_security.ensure_acls(settings, admin)
        log.info("Kafka users %s and %d ACLs in place", ", ".join(kafka_security.USERS), rules)
    return status(settings)


def start_node(settings: Settings, node_id: int, timeout_s: float = 90.0) -> BrokerStatus:
    """Start one node of the recorded cluster again (after a fault killed it)."""
    node = nodes(settings)[node_id - 1]
    started = _spawn(settings, node) if _read_pid(node) is None else None
    _wait_answering(node, started, time.monotonic() + timeout_s, _node_access(settings, node))
    return _node_status(settings, node)


def stop_node(settings: Settings, node_id: int, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> bool:
    """Signal one node of ours and wait until it is gone (SIGKILL after
    ``timeout_s`` if it ignores a SIGTERM). True if one was running."""
    node = nodes(settings)[node_id - 1]
    pid = _read_pid(node)
    if pid is None:
        node.pid_file.unlink(missing_ok=True)
        return False
    os.kill(pid, sig)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and _read_pid(node) is not None:
        time.sleep(0.2)
    if _read_pid(node) is not None:
        log.warning("Kafka node %d (pid %d) ignored signal %d for %.0fs; killing it", node_id, pid, sig, timeout_s)
        os.kill(pid, signal.SIGKILL)
        while _read_pid(node) is not None:
            time.sleep(0.2)
    node.pid_file.unlink(missing_ok=True)
    return True


# Once most voters of a cluster have stopped, a node still in its controlled
# shutdown waits for a quorum that left (up to the whole timeout): it is
# killed this long after (its logs are recovered at its next start).
QUORUM_GONE_GRACE_S = 5.0


def down(settings: Settings, timeout_s: float = 60.0) -> bool:
    """Stop every node we started (never another broker). True if one stopped."""
    # Signal all first: a controlled shutdown of the last voters then ends
    # together instead of one node waiting for a quorum that left.
    cluster = nodes(settings)
    running = [n for n in cluster if _read_pid(n) is not None]
    for node in running:
        pid = _read_pid(node)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    quorum_gone_at = None
    while time.monotonic() < deadline:
        alive = [n for n in running if _read_pid(n) is not None]
        if not alive:
            break
        if len(cluster) > 1 and len(alive) <= len(cluster) // 2:
            quorum_gone_at = quorum_gone_at or time.monotonic()
            if time.monotonic() - quorum_gone_at >= QUORUM_GONE_GRACE_S:
                for node in alive:
                    log.info("Kafka node %d still in its shutdown with its quorum gone; killing it", node.node_id)
                    stop_node(settings, node.node_id, signal.SIGKILL)
                break
        time.sleep(0.2)
    stopped = False
    for node in cluster:
        stopped = stop_node(settings, node.node_id, signal.SIGTERM, max(deadline - time.monotonic(), 0)) or stopped
    return stopped or bool(running)
