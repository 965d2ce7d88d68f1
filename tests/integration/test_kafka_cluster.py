"""`adpipe kafka up --brokers 3`: three KRaft nodes, replication 3 with
min.insync.replicas 2, and transactions that survive a node's SIGKILL."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from adpipe import kafka_io
from adpipe.local import kafka_broker
from adpipe.settings import Settings, load_settings
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from tests.conftest import JVM_OPTIONS, PORT_BASE, TEST_HOME

# Its own ports (node k: these plus 100·(k-1)) and home: beside the session broker.
CLUSTER_ENV = {
    "ADPIPE_HOME": str(TEST_HOME / "cluster3"),
    "ADPIPE_KAFKA_BOOTSTRAP": f"127.0.0.1:{PORT_BASE + 30}",
    "ADPIPE_KAFKA_CONTROLLER_PORT": str(PORT_BASE + 31),
    "ADPIPE_JVM_OPTIONS": JVM_OPTIONS,
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[Settings]:
    settings = load_settings(CLUSTER_ENV)
    kafka_broker.down(settings)
    shutil.rmtree(settings.home, ignore_errors=True)
    cli = subprocess.run(
        [sys.executable, "-m", "adpipe", "kafka", "up", "--brokers", "3"],
        env={**os.environ, **CLUSTER_ENV},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    try:
        assert cli.returncode == 0, cli.stdout + cli.stderr
        bootstrap = ",".join(f"127.0.0.1:{PORT_BASE + 30 + 100 * k}" for k in range(3))
        assert f"export ADPIPE_KAFKA_BOOTSTRAP={bootstrap}" in cli.stdout
        yield load_settings({**CLUSTER_ENV, "ADPIPE_KAFKA_BOOTSTRAP": bootstrap})
    finally:
        kafka_broker.down(settings)


def test_three_nodes_replicate_topics_and_internal_logs(cluster: Settings) -> None:
    st = kafka_broker.status(cluster)
    assert [n.node_id for n in st.nodes] == [1, 2, 3] and st.running and st.answering
    admin = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap})
    md = admin.list_topics(timeout=30)
    assert sorted(md.brokers) == [1, 2, 3]
    for topic in cluster.topics.all():
        partitions = md.topics[topic].partitions.values()
        assert len(partitions) == 4
        assert all(sorted(p.replicas) == [1, 2, 3] for p in partitions), topic
    (topic_config,) = admin.describe_configs(
        [ConfigResource(ConfigResource.Type.TOPIC, cluster.topics.events)]
    ).values()
    assert topic_config.result(timeout=30)["min.insync.replicas"].value == "2"
    for node_id in (1, 2, 3):
        (future,) = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER, str(node_id))]).values()
        config = {k: v.value for k, v in future.result(timeout=30).items()}
        assert config["transaction.state.log.replication.factor"] == "3"
        assert config["transaction.state.log.min.isr"] == "2"
        assert config["offsets.topic.replication.factor"] == "3"
        assert config["min.insync.replicas"] == "2"
    # `kafka status` shows each node and exits 0.
    cli = subprocess.run(
        [sys.executable, "-m", "adpipe", "kafka", "status"],
        env={**os.environ, **CLUSTER_ENV},
        capture_output=True,
        text=True,
        check=False,
    )
    assert cli.returncode == 0
    assert all(f"node {k}: kafka up: pid {st.nodes[k - 1].pid}" in cli.stdout for k in (1, 2, 3))


def test_transactions_commit_while_a_node_is_killed_and_back(cluster: Settings) -> None:
    """A transactional producer commits before, during and after a SIGKILL of
    one node (the leader of partition 0 of its topic); a read_committed
    consumer then sees each record once."""
    topic = cluster.topics.late
    producer = Producer(
        {"bootstrap.servers": cluster.kafka_bootstrap, "transactional.id": "cluster-test", "enable.idempotence": True}
    )
    producer.init_transactions(60)
    sent = []

    def commit(batch: int) -> None:
        producer.begin_transaction()
        for i in range(50):
            value = f"{batch}-{i}".encode()
            producer.produce(topic, value, partition=i % 4)
            sent.append(value)
        producer.commit_transaction(60)

    commit(0)
    leader = AdminClient({"bootstrap.servers": cluster.kafka_bootstrap}).list_topics(timeout=30)
    victim = leader.topics[topic].partitions[0].leader
    assert kafka_broker.stop_node(cluster, victim, signal.SIGKILL)
    try:
        commit(1)  # two replicas of three remain: min.insync.replicas=2 holds
    finally:
        kafka_broker.start_node(cluster, victim)
    commit(2)
    producer.flush(30)
    # The coordinator writes a transaction's commit markers after
    # commit_transaction returns: a reader sees the last one a moment later
    # (more so while the restarted node takes its partitions back).
    deadline = time.monotonic() + 60
    while True:
        seen = [r.value for r in kafka_io.read_topic(cluster.kafka_bootstrap, topic, "read_committed")]
        if len(seen) >= len(sent) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert sorted(seen) == sorted(sent) and len(seen) == 150
