"""The local HDFS of the embedded default: one NameNode and one DataNode,
Apache Hadoop's own daemons run from its jars (``hadoop-client-minicluster``
holds the HDFS server classes; the same Hadoop version as the client pyspark
ships), fetched from Maven Central like the Kafka broker's
(:mod:`adpipe.jars`, classpath ``hdfs``).

Both listen on loopback only. ``ADPIPE_HDFS_PORT`` (default 9820) is the
NameNode's RPC port, the one in ``hdfs://127.0.0.1:<port>``; the NameNode's
web UI and JMX answer on that port + 1, the DataNode's transfer, web and IPC
ports are + 2, + 3 and + 4. The metadata, blocks, configuration and logs live
under ``$ADPIPE_HOME/hdfs``; the NameNode is formatted on the first ``up``.
One DataNode: replication 1 (``dfs.replication`` and the NameNode's minimum),
permissions off (root, any local user, writes anywhere: a loopback-only test
set-up), and safe mode left as soon as the DataNode has reported its blocks.

The stream job and Union & Load use it through the settings they already
read: ``ADPIPE_CHECKPOINT_URI=hdfs://127.0.0.1:9820/adpipe/checkpoints`` and
``ADPIPE_WAREHOUSE_URI=hdfs://127.0.0.1:9820/adpipe/warehouse``, with
``HADOOP_CONF_DIR=$ADPIPE_HOME/hdfs/client`` for the clients' block size
(``up`` prints all three). Only processes we started are ever signalled: a pid file is
trusted only while ``/proc/<pid>/cmdline`` still names the daemon's class
and this home's configuration folder."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

from adpipe.jars import ensure_classpath
from adpipe.processes import alive, start_detached
from adpipe.settings import Settings

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
PORT_VARIABLE = "ADPIPE_HDFS_PORT"
NAMENODE_CLASS = "org.apache.hadoop.hdfs.server.namenode.NameNode"
DATANODE_CLASS = "org.apache.hadoop.hdfs.server.datanode.DataNode"
# Start order: the DataNode registers with a NameNode that runs.
DAEMONS = {"namenode": NAMENODE_CLASS, "datanode": DATANODE_CLASS}
# Heaps: a test-sized namespace and one DataNode's block map.
HEAP = {"namenode": "512m", "datanode": "384m"}
# The NameNode's JMX bean that says whether it is out of safe mode and how
# many DataNodes it holds live.
STATE_BEAN = "Hadoop:service=NameNode,name=FSNamesystemState"


class HdfsError(RuntimeError):
    """The local HDFS could not be started, reached or stopped."""


@dataclass(frozen=True)
class Ports:
    """The daemons' ports, all from the NameNode's RPC port."""

    rpc: int

    @property
    def http(self) -> int:
        return self.rpc + 1

    @property
    def data(self) -> int:
        return self.rpc + 2

    @property
    def data_http(self) -> int:
        return self.rpc + 3

    @property
    def data_ipc(self) -> int:
        return self.rpc + 4

    @property
    def uri(self) -> str:
        return f"hdfs://{HOST}:{self.rpc}"


def hdfs_dir(settings: Settings) -> Path:
    return settings.home / "hdfs"


def conf_dir(settings: Settings) -> Path:
    """core-site.xml, hdfs-site.xml and log4j.properties of both daemons
    (first on their classpath)."""
    return hdfs_dir(settings) / "conf"


def client_conf_dir(settings: Settings) -> Path:
    """The jobs' ``HADOOP_CONF_DIR``: an hdfs-site.xml of client settings
    only (no ``fs.defaultFS``: a path without a scheme stays local)."""
    return hdfs_dir(settings) / "client"


def name_dir(settings: Settings) -> Path:
    return hdfs_dir(settings) / "name"


def data_dir(settings: Settings) -> Path:
    return hdfs_dir(settings) / "data"


def log_file(settings: Settings, daemon: str) -> Path:
    """The daemon's log (``namenode`` or ``datanode``); what the JVM itself
    prints before logging starts goes to ``<daemon>.out`` beside it."""
    return hdfs_dir(settings) / f"{daemon}.log"


def _pid_file(settings: Settings, daemon: str) -> Path:
    return hdfs_dir(settings) / f"{daemon}.pid"


def _cluster_file(settings: Settings) -> Path:
    return hdfs_dir(settings) / "cluster.json"


def ports(settings: Settings) -> Ports:
    """The ports of the HDFS under this home: as it was last started with,
    else as ``ADPIPE_HDFS_PORT`` says."""
    try:
        return Ports(int(json.loads(_cluster_file(settings).read_text())["port"]))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return Ports(settings.hdfs_port)


def site_xml(properties: Mapping[str, str]) -> str:
    """A Hadoop ``*-site.xml`` holding ``properties``."""
    rows = [f"  <property><name>{escape(k)}</name><value>{escape(v)}</value></property>" for k, v in properties.items()]
    return "\n".join(['<?xml version="1.0" encoding="UTF-8"?>', "<configuration>", *rows, "</configuration>", ""])


def core_site(settings: Settings, p: Ports) -> dict[str, str]:
    return {
        "fs.defaultFS": p.uri,
        "hadoop.tmp.dir": str(hdfs_dir(settings) / "tmp"),
        # The web UI's signing secret: a file of ours, not ~/hadoop-http-auth-signature-secret.
        "hadoop.http.authentication.signature.secret.file": str(conf_dir(settings) / "http-secret"),
    }


# A NameNode places a block only on a DataNode with room for a whole block
# per block being written, and the DataNode reserves as much per replica:
# at Hadoop's 128 MB, a nearly full disk refuses files of kilobytes (a
# checkpoint's), which then "could only be written to 0 of the 1
# minReplication nodes".
CLIENT_BLOCK_SIZE = "16m"


def client_site() -> dict[str, str]:
    # One DataNode: the blocks are stored once (the client's default, 3, left
    # every block under-replicated in the NameNode's eyes).
    return {"dfs.blocksize": CLIENT_BLOCK_SIZE, "dfs.replication": "1", "dfs.client.use.datanode.hostname": "true"}


def hdfs_site(settings: Settings, p: Ports) -> dict[str, str]:
    return {
        "dfs.namenode.name.dir": str(name_dir(settings)),
        "dfs.datanode.data.dir": str(data_dir(settings)),
        "dfs.namenode.replication.min": "1",
        # A loopback-only set-up: every local user (root included) may write anywhere.
        "dfs.permissions.enabled": "false",
        # Out of safe mode as soon as the blocks are reported, not 30 s later.
        "dfs.namenode.safemode.extension": "0",
        "dfs.namenode.rpc-address": f"{HOST}:{p.rpc}",
        "dfs.namenode.http-address": f"{HOST}:{p.http}",
        "dfs.datanode.address": f"{HOST}:{p.data}",
        "dfs.datanode.http.address": f"{HOST}:{p.data_http}",
        "dfs.datanode.ipc.address": f"{HOST}:{p.data_ipc}",
        "dfs.datanode.hostname": HOST,
        # The DataNode reports its blocks at once after a start.
        "dfs.blockreport.initialDelay": "0",
        # A DataNode takes a block only on a volume with a block's room plus
        # this (Hadoop's default: 1 GB); with one volume there is nothing to
        # spread, and a CI disk with under 1.1 GB free failed every write.
        "dfs.datanode.round-robin-volume-choosing-policy.additional-available-space": "0",
        # Also the NameNode's "server defaults": what a client writing through
        # Hadoop's FileContext (Spark's checkpoints, Delta's log) uses.
        **client_site(),
    }


LOG4J_PROPERTIES = "\n".join(
    [
        "log4j.rootLogger=INFO,file",
        "log4j.appender.file=org.apache.log4j.FileAppender",
        "log4j.appender.file.File=${hadoop.log.dir}/${hadoop.log.file}",
        "log4j.appender.file.layout=org.apache.log4j.PatternLayout",
        "log4j.appender.file.layout.ConversionPattern=%d{ISO8601} %p %c{2}: %m%n",
        # A line per block received and per client request: the log stays readable.
        "log4j.logger.org.apache.hadoop.hdfs.server.datanode.DataNode.clienttrace=WARN",
        "log4j.logger.org.apache.hadoop.hdfs.StateChange=WARN",
        "log4j.logger.org.apache.hadoop.hdfs.server.namenode.FSNamesystem.audit=WARN",
        "",
    ]
)


def java_command(settings: Settings, daemon: str, *args: str) -> list[str]:
    """``daemon``'s JVM command line (``namenode`` or ``datanode``); the
    configuration folder on the classpath also marks it as this home's."""
    jars = ensure_classpath(settings.jar_cache, "hdfs")
    classpath = os.pathsep.join([str(conf_dir(settings)), *(str(j) for j in jars)])
    return [
        "java",
        f"-Xmx{HEAP[daemon]}",
        "-XX:+UseG1GC",
        *settings.jvm_options,
        f"-Dhadoop.log.dir={hdfs_dir(settings)}",
        f"-Dhadoop.log.file={log_file(settings, daemon).name}",
        "-cp",
        classpath,
        DAEMONS[daemon],
        *args,
    ]


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return []


def owns(cmdline: list[str], daemon: str, conf: Path) -> bool:
    """Whether a process's command line is ``daemon`` of the home whose
    configuration folder is ``conf`` (a reused pid, or another home's
    daemon, is not)."""
    if DAEMONS[daemon] not in cmdline or "-cp" not in cmdline:
        return False
    classpath = cmdline[cmdline.index("-cp") + 1] if cmdline.index("-cp") + 1 < len(cmdline) else ""
    return classpath.split(os.pathsep)[0] == str(conf)


def _read_pid(settings: Settings, daemon: str) -> int | None:
    try:
        pid = int(_pid_file(settings, daemon).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if owns(_cmdline(pid), daemon, conf_dir(settings)) else None


@dataclass(frozen=True)
class NameNodeState:
    """What the NameNode's JMX says (``FSNamesystemState``)."""

    operational: bool  # out of safe mode
    live_datanodes: int

    @property
    def ready(self) -> bool:
        return self.operational and self.live_datanodes >= 1


def parse_state(payload: Mapping) -> NameNodeState | None:
    """The ``FSNamesystemState`` bean of a ``/jmx`` answer, or None when absent."""
    for bean in payload.get("beans", []):
        if bean.get("name") == STATE_BEAN:
            return NameNodeState(bean.get("FSState") == "Operational", int(bean.get("NumLiveDataNodes", 0)))
    return None


def namenode_state(p: Ports, timeout_s: float = 2.0) -> NameNodeState | None:
    """The NameNode's state from its JMX servlet, or None when it does not answer."""
    url = f"http://{HOST}:{p.http}/jmx?qry={STATE_BEAN}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - loopback http, our port
            return parse_state(json.loads(response.read()))
    except (OSError, ValueError):
        return None


def _port_open(port: int, timeout_s: float = 1.0) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class HdfsStatus:
    """The NameNode and the DataNode of this home: do they run, does the
    NameNode answer out of safe mode with the DataNode live."""

    pids: dict[str, int | None]
    state: NameNodeState | None
    ports: Ports
    folder: Path

    @property
    def running(self) -> bool:
        return all(pid is not None for pid in self.pids.values())

    @property
    def answering(self) -> bool:
        return self.state is not None and self.state.ready

    @property
    def uri(self) -> str:
        return self.ports.uri

    def describe(self) -> str:
        pids = ", ".join(f"{d} pid {p}" if p else f"{d} down" for d, p in self.pids.items())
        where = f"web UI http://{HOST}:{self.ports.http}, data and logs under {self.folder}"
        if self.running and self.answering:
            return f"hdfs up: {pids}; {self.uri} ({where})"
        if self.state is None:
            answer = f"the NameNode does not answer on {HOST}:{self.ports.http}"
        elif not self.state.operational:
            answer = "the NameNode is in safe mode"
        else:
            answer = f"{self.state.live_datanodes} live DataNode(s)"
        if any(self.pids.values()):
            return f"hdfs starting or unhealthy: {pids}; {answer} ({where})"
        return f"hdfs down (nothing of ours runs; {answer}; {where})"


def status(settings: Settings) -> HdfsStatus:
    p = ports(settings)
    return HdfsStatus({d: _read_pid(settings, d) for d in DAEMONS}, namenode_state(p), p, hdfs_dir(settings))


def client_exports(settings: Settings, p: Ports) -> list[str]:
    """What the jobs need to keep their checkpoints and tables on it."""
    return [
        f"export ADPIPE_CHECKPOINT_URI={p.uri}/adpipe/checkpoints",
        f"export ADPIPE_WAREHOUSE_URI={p.uri}/adpipe/warehouse",
        f"export HADOOP_CONF_DIR={client_conf_dir(settings)}",
    ]


def _write_conf(settings: Settings, p: Ports) -> None:
    conf = conf_dir(settings)
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "core-site.xml").write_text(site_xml(core_site(settings, p)))
    (conf / "hdfs-site.xml").write_text(site_xml(hdfs_site(settings, p)))
    (conf / "log4j.properties").write_text(LOG4J_PROPERTIES)
    client_conf_dir(settings).mkdir(exist_ok=True)
    (client_conf_dir(settings) / "hdfs-site.xml").write_text(site_xml(client_site()))
    secret = conf / "http-secret"
    if not secret.exists():
        secret.touch(mode=0o600)
        secret.write_text(os.urandom(24).hex())
    _cluster_file(settings).write_text(json.dumps({"port": p.rpc}) + "\n")


def _format(settings: Settings) -> None:
    """Format the NameNode once; blocks of an earlier namespace (its
    metadata removed) could never register with the new one: removed."""
    if (name_dir(settings) / "current" / "VERSION").exists():
        return
    if data_dir(settings).exists():
        log.warning("removing %s: its blocks belong to a namespace that no longer exists", data_dir(settings))
        import shutil

        shutil.rmtree(data_dir(settings))
    log.info("formatting the HDFS NameNode in %s", name_dir(settings))
    cmd = java_command(settings, "namenode", "-format", "-nonInteractive", "-clusterid", "adpipe-local")
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)  # noqa: S603
    if proc.returncode != 0:
        raise HdfsError(
            f"formatting the NameNode failed (see {log_file(settings, 'namenode')}):\n{proc.stderr[-3000:]}"
        )


def up(settings: Settings, timeout_s: float = 120.0) -> HdfsStatus:
    """Start whichever daemon of ours does not run yet (formatting the
    NameNode on first use) on ``ADPIPE_HDFS_PORT``; wait until
    the NameNode is out of safe mode with the DataNode live."""
    running = {d: _read_pid(settings, d) for d in DAEMONS}
    p = ports(settings) if any(running.values()) else Ports(settings.hdfs_port)
    if not any(running.values()) and (_port_open(p.rpc) or _port_open(p.http)):
        raise HdfsError(f"something else already listens on {HOST}:{p.rpc} or {p.http}; stop it or set {PORT_VARIABLE}")
    hdfs_dir(settings).mkdir(parents=True, exist_ok=True)
    if not any(running.values()):
        _write_conf(settings, p)
        _format(settings)
    started: dict[str, subprocess.Popen] = {}
    for daemon in DAEMONS:
        if running[daemon] is None:
            out = hdfs_dir(settings) / f"{daemon}.out"
            started[daemon] = start_detached(java_command(settings, daemon), out, append=False)
            _pid_file(settings, daemon).write_text(f"{started[daemon].pid}\n")
            log.info("started the HDFS %s, pid %d", daemon, started[daemon].pid)
    deadline = time.monotonic() + timeout_s
    while True:
        for daemon, proc in started.items():
            if proc.poll() is not None:
                raise HdfsError(f"the HDFS {daemon} exited during start-up; see {log_file(settings, daemon)}")
        st = status(settings)
        if st.answering:
            return st
        if time.monotonic() >= deadline:
            raise HdfsError(f"{st.describe()}: not ready within {timeout_s:.0f} s")
        time.sleep(0.5)


def down(settings: Settings, timeout_s: float = 30.0) -> bool:
    """Stop the daemons we started (the DataNode first), never another
    HDFS; SIGKILL one that outlives ``timeout_s``. True if one ran."""
    stopped = False
    for daemon in reversed(DAEMONS):
        pid = _read_pid(settings, daemon)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout_s
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if alive(pid):
                log.warning("the HDFS %s (pid %d) ignored SIGTERM for %.0f s; killing it", daemon, pid, timeout_s)
                os.kill(pid, signal.SIGKILL)
                while alive(pid):
                    time.sleep(0.2)
            stopped = True
        _pid_file(settings, daemon).unlink(missing_ok=True)
    return stopped
