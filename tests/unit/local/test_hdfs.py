"""The local HDFS's configuration, command lines, reading of the NameNode's
JMX answer, and which processes it takes for its own (fake daemons: real
processes whose command lines look like a NameNode of this home)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from adpipe.cli import build_parser
from adpipe.local import cli as local_cli
from adpipe.local import hdfs
from adpipe.settings import Settings, SettingsError, load_settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings({"ADPIPE_HOME": str(tmp_path / "home"), "ADPIPE_JVM_OPTIONS": "-XX:TieredStopAtLevel=1"})


def test_the_port_comes_from_adpipe_hdfs_port_and_the_others_follow_it(tmp_path: Path) -> None:
    assert load_settings({"ADPIPE_HOME": str(tmp_path)}).hdfs_port == 9820
    p = hdfs.Ports(load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_HDFS_PORT": "29880"}).hdfs_port)
    assert (p.rpc, p.http, p.data, p.data_http, p.data_ipc) == (29880, 29881, 29882, 29883, 29884)
    assert p.uri == "hdfs://127.0.0.1:29880"
    with pytest.raises(SettingsError, match="ADPIPE_HDFS_PORT"):
        load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_HDFS_PORT": "http"})


def test_a_running_home_keeps_the_port_it_was_started_with(settings: Settings) -> None:
    settings = settings.with_overrides(hdfs_port=30000)
    assert hdfs.ports(settings).rpc == 30000  # never started: the setting
    hdfs.hdfs_dir(settings).mkdir(parents=True)
    (hdfs.hdfs_dir(settings) / "cluster.json").write_text('{"port": 31000}\n')
    assert hdfs.ports(settings).rpc == 31000


def _parsed(xml: str) -> dict[str, str]:
    root = ET.fromstring(xml)  # noqa: S314 - our own text
    return {p.findtext("name"): p.findtext("value") for p in root.iter("property")}


def test_site_files_render_as_hadoop_reads_them(settings: Settings) -> None:
    assert _parsed(hdfs.site_xml({"a.b": "x<y&z", "c": ""})) == {"a.b": "x<y&z", "c": ""}
    p = hdfs.Ports(29880)
    site = _parsed(hdfs.site_xml(hdfs.hdfs_site(settings, p)))
    home = settings.home / "hdfs"
    assert site["dfs.namenode.name.dir"] == str(home / "name")
    assert site["dfs.datanode.data.dir"] == str(home / "data")
    assert site["dfs.replication"] == "1" and site["dfs.permissions.enabled"] == "false"
    assert site["dfs.namenode.safemode.extension"] == "0"
    # Every address on loopback, on the ports of ADPIPE_HDFS_PORT.
    addresses = {k: v for k, v in site.items() if k.endswith("address")}
    assert addresses == {
        "dfs.namenode.rpc-address": "127.0.0.1:29880",
        "dfs.namenode.http-address": "127.0.0.1:29881",
        "dfs.datanode.address": "127.0.0.1:29882",
        "dfs.datanode.http.address": "127.0.0.1:29883",
        "dfs.datanode.ipc.address": "127.0.0.1:29884",
    }
    core = _parsed(hdfs.site_xml(hdfs.core_site(settings, p)))
    assert core["fs.defaultFS"] == "hdfs://127.0.0.1:29880"
    assert Path(core["hadoop.tmp.dir"]).is_relative_to(home)
    # The jobs' own: small blocks, no default file system (a path without a
    # scheme stays local).
    client = _parsed(hdfs.site_xml(hdfs.client_site()))
    assert client["dfs.blocksize"] == "16m" and client["dfs.replication"] == "1"
    assert "fs.defaultFS" not in client and not any("address" in k or ".dir" in k for k in client)


def test_daemon_command_lines(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    jars = [Path("/cache/hdfs/a.jar"), Path("/cache/hdfs/b.jar")]
    monkeypatch.setattr(hdfs, "ensure_classpath", lambda _cache, name: jars if name == "hdfs" else [])
    home = settings.home / "hdfs"
    assert hdfs.java_command(settings, "datanode") == [
        "java",
        "-Xmx384m",
        "-XX:+UseG1GC",
        "-XX:TieredStopAtLevel=1",
        f"-Dhadoop.log.dir={home}",
        "-Dhadoop.log.file=datanode.log",
        "-cp",
        f"{home / 'conf'}:/cache/hdfs/a.jar:/cache/hdfs/b.jar",
        "org.apache.hadoop.hdfs.server.datanode.DataNode",
    ]
    namenode = hdfs.java_command(settings, "namenode", "-format", "-nonInteractive")
    assert namenode[-3:] == ["org.apache.hadoop.hdfs.server.namenode.NameNode", "-format", "-nonInteractive"]
    assert hdfs.owns(namenode, "namenode", home / "conf")
    assert not hdfs.owns(namenode, "datanode", home / "conf")  # the other daemon's class
    assert not hdfs.owns(namenode, "namenode", Path("/elsewhere/hdfs/conf"))  # another home's
    assert not hdfs.owns([], "namenode", home / "conf")  # gone, or a zombie


def _bean(**fields: object) -> dict:
    return {"beans": [{"name": "Hadoop:service=NameNode,name=FSNamesystemState", **fields}]}


@pytest.mark.parametrize(
    ("payload", "expected", "ready"),
    [
        (_bean(FSState="Operational", NumLiveDataNodes=1), hdfs.NameNodeState(True, 1), True),
        (_bean(FSState="safeMode", NumLiveDataNodes=1), hdfs.NameNodeState(False, 1), False),
        (_bean(FSState="Operational", NumLiveDataNodes=0), hdfs.NameNodeState(True, 0), False),
        ({"beans": []}, None, False),
        ({}, None, False),
    ],
)
def test_the_namenode_state_from_its_jmx(payload: dict, expected: hdfs.NameNodeState | None, ready: bool) -> None:
    state = hdfs.parse_state(payload)
    assert state == expected
    assert (state is not None and state.ready) is ready


def test_status_lines(tmp_path: Path) -> None:
    p = hdfs.Ports(29880)
    up = hdfs.HdfsStatus({"namenode": 11, "datanode": 12}, hdfs.NameNodeState(True, 1), p, tmp_path)
    assert up.running and up.answering
    assert up.describe().startswith("hdfs up: namenode pid 11, datanode pid 12; hdfs://127.0.0.1:29880 (")
    safe = hdfs.HdfsStatus({"namenode": 11, "datanode": 12}, hdfs.NameNodeState(False, 1), p, tmp_path)
    assert safe.running and not safe.answering
    assert safe.describe().startswith(
        "hdfs starting or unhealthy: namenode pid 11, datanode pid 12; the NameNode is in safe mode"
    )
    half = hdfs.HdfsStatus({"namenode": 11, "datanode": None}, hdfs.NameNodeState(True, 0), p, tmp_path)
    assert not half.running and "datanode down; 0 live DataNode(s)" in half.describe()
    down = hdfs.HdfsStatus({"namenode": None, "datanode": None}, None, p, tmp_path)
    assert down.describe().startswith(
        "hdfs down (nothing of ours runs; the NameNode does not answer on 127.0.0.1:29881"
    )
    settings = load_settings({"ADPIPE_HOME": str(tmp_path)})
    assert hdfs.client_exports(settings, p) == [
        "export ADPIPE_CHECKPOINT_URI=hdfs://127.0.0.1:29880/adpipe/checkpoints",
        "export ADPIPE_WAREHOUSE_URI=hdfs://127.0.0.1:29880/adpipe/warehouse",
        f"export HADOOP_CONF_DIR={tmp_path}/hdfs/client",
    ]


@pytest.fixture
def fake_namenode(settings: Settings) -> Iterator[subprocess.Popen]:
    """A process whose command line looks like this home's NameNode."""
    conf = hdfs.conf_dir(settings)
    conf.mkdir(parents=True)
    with socket.socket() as free:  # a port nothing answers on: status asks its NameNode's
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1] - 1
    (hdfs.hdfs_dir(settings) / "cluster.json").write_text(f'{{"port": {port}}}\n')
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", "import signal; signal.pause()", "-cp", f"{conf}:x.jar", hdfs.NAMENODE_CLASS],
        start_new_session=True,
    )
    (hdfs.hdfs_dir(settings) / "namenode.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 20
    while hdfs.NAMENODE_CLASS.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield proc
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # this test's own group only
    except ProcessLookupError:
        pass
    proc.wait()


def test_down_stops_only_a_daemon_of_this_home(settings: Settings, fake_namenode: subprocess.Popen) -> None:
    # The DataNode's pid file names the NameNode's process: not a DataNode, left alone.
    (hdfs.hdfs_dir(settings) / "datanode.pid").write_text(f"{fake_namenode.pid}\n")
    st = hdfs.status(settings)
    assert st.pids == {"namenode": fake_namenode.pid, "datanode": None}
    assert not st.running and not st.answering
    assert hdfs.down(settings) is True
    assert fake_namenode.wait(timeout=10) == -signal.SIGTERM
    assert hdfs.status(settings).pids == {"namenode": None, "datanode": None}
    assert not (hdfs.hdfs_dir(settings) / "namenode.pid").exists()
    assert hdfs.down(settings) is False


def test_the_hdfs_verb_and_its_help(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["hdfs", "status"])
    assert args.func is local_cli.cmd_hdfs and args.action == "status"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["hdfs", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "ADPIPE_HDFS_PORT" in text and "ADPIPE_CHECKPOINT_URI=hdfs://127.0.0.1:9820/adpipe/checkpoints" in text
