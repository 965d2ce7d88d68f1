"""The local broker's pure parts."""

from __future__ import annotations

import base64
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from adpipe.local import kafka_broker
from adpipe.local.kafka_broker import Node, _cluster_file, _cluster_id, nodes, server_properties
from adpipe.settings import load_settings


def test_a_cluster_id_never_starts_like_an_option() -> None:
    ids = [_cluster_id() for _ in range(2000)]  # without the rule, about 31 would start with "-"
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_cluster_of_several_nodes_fences_a_dead_one_within_seconds_a_single_node_keeps_the_defaults(
    tmp_path: Path,
) -> None:
    settings = load_settings({"ADPIPE_HOME": str(tmp_path)})
    cluster = nodes(settings, 3)
    three = server_properties(settings, cluster[1], cluster).splitlines()
    assert "broker.session.timeout.ms=4000" in three and "broker.heartbeat.interval.ms=1000" in three
    one = server_properties(settings).splitlines()
    assert not [line for line in one if line.startswith(("broker.session.timeout.ms", "broker.heartbeat"))]


def _fake_node(node: Node, ignore_sigterm: bool) -> subprocess.Popen:
    """A process that passes for a node of ours (its command line names
    kafka.Kafka and the node's config), exiting on SIGTERM or ignoring it."""
    node.directory.mkdir(parents=True, exist_ok=True)
    node.config.write_text("")
    code = "import signal, time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_sigterm else "")
    code += "time.sleep(120)\n"
    proc = subprocess.Popen([sys.executable, "-c", code, "kafka.Kafka", str(node.config)])
    node.pid_file.write_text(str(proc.pid))
    return proc


def test_down_kills_a_node_left_waiting_for_a_quorum_that_stopped_not_after_the_whole_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_settings({"ADPIPE_HOME": str(tmp_path)})
    cluster = nodes(settings, 3)
    _cluster_file(settings).parent.mkdir(parents=True, exist_ok=True)
    _cluster_file(settings).write_text(json.dumps({"brokers": 3}))
    procs = [_fake_node(node, ignore_sigterm=node.node_id == 3) for node in cluster]
    time.sleep(0.5)  # the ignoring one has set its handler
    monkeypatch.setattr(kafka_broker, "QUORUM_GONE_GRACE_S", 0.5)
    started = time.monotonic()
    try:
        assert kafka_broker.down(settings, timeout_s=30)
        waited = time.monotonic() - started
    finally:
        for proc in procs:
            proc.kill()
    assert [proc.wait(5) for proc in procs] == [-signal.SIGTERM, -signal.SIGTERM, -signal.SIGKILL]
    assert waited < 10  # two of three gone: the last killed 0.5 s after, not at 30 s
    assert not [node for node in cluster if node.pid_file.exists()]
