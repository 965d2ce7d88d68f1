"""`adpipe kafka up --brokers 3`: three KRaft nodes, replication 3 with
min.insync.replicas 2; the stream sink's transactions through a paused
coordinator, and a load's wait for a batch whose partition leader is
paused."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from adpipe import kafka_io
from adpipe.local import kafka_broker
from adpipe.settings import Settings, load_settings
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from tests.conftest import JVM_OPTIONS, PORT_BASE, TEST_HOME

log = logging.getLogger(__name__)

# Its own ports (node k: these plus 100·(k-1)) and home: beside the session broker.
CLUSTER_ENV = {
    "ADPIPE_HOME": str(TEST_HOME / "cluster3"),
    "ADPIPE_KAFKA_BOOTSTRAP": f"127.0.0.1:{PORT_BASE + 30}",
    "ADPIPE_KAFKA_CONTROLLER_PORT": str(PORT_BASE + 31),
    "ADPIPE_JVM_OPTIONS": JVM_OPTIONS,
    # A follower that stops fetching leaves the ISR after 2 s (default 30):
    # before the controller fences its node (9 s), so a transaction can
    # commit while one of its partitions' leader is stopped (the last test).
    "ADPIPE_KAFKA_BROKER_PROPERTIES": "replica.lag.time.max.ms=2000",
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


def test_the_sink_replaces_a_producer_stuck_on_its_paused_ledger_coordinator(
    cluster: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """The stream job's transactional sink over three nodes: batch 0; then
    batch 1's records are produced and the node that coordinates the sink's
    ledger group is paused (SIGSTOP: a frozen host, a long GC) before the
    batch's offsets go into the transaction. send_offsets_to_transaction
    then waits on it at least the sink's socket timeout (10 s), longer than
    the call's deadline (5 s; a coordinator that died with its broker keeps
    librdkafka waiting for good: confluentinc/librdkafka#5511). Past the
    deadline the sink leaves that producer behind for a new one, in this
    process (the old code ended the process), and commits the batch once
    the group has a new coordinator. Batch 2 after the node is resumed. A
    read_committed consumer sees each batch's records once, and the ledger
    says batch 2."""
    from adpipe.stream.sink import OutRecord, TransactionalSink

    source, output = f"src-{uuid.uuid4().hex[:6]}", f"out-{uuid.uuid4().hex[:6]}"
    kafka_io.ensure_topics(cluster.kafka_bootstrap, [source, output], 4)
    group = kafka_io.ledger_group(f"coord-{uuid.uuid4().hex[:8]}")
    killed: list[int] = []

    class KilledBeforeOffsets(TransactionalSink):
        def _add_ledger_offsets(self, producer, batch_id, end_offsets, watermark_ms) -> None:  # noqa: ANN001
            if batch_id == 1 and not killed:
                # Batch 0 made the offsets log: its leader is the group's coordinator.
                victim = kafka_io.coordinator_node(cluster.kafka_bootstrap, group, kafka_io.CONSUMER_OFFSETS)
                assert victim is not None
                pid = kafka_broker.node_pid(cluster, victim)
                assert pid is not None
                os.kill(pid, signal.SIGSTOP)
                killed.append(pid)
            super()._add_ledger_offsets(producer, batch_id, end_offsets, watermark_ms)

    sink = KilledBeforeOffsets(cluster.kafka_bootstrap, f"sink-{uuid.uuid4().hex[:8]}", group, source, "q", 60_000)
    sent = []

    def batch(n: int) -> None:
        values = [f"{n}-{i}".encode() for i in range(50)]
        result = sink.commit_batch(n, {p: 10 * (n + 1) for p in range(4)},
                                   lambda: [OutRecord(output, str(i).encode(), v) for i, v in enumerate(values)], 50)
        assert not result.skipped and result.records == 50
        sent.extend(values)

    try:
        batch(0)
        started = time.monotonic()
        try:
            with caplog.at_level(logging.WARNING, logger="adpipe.stream.sink"):
                batch(1)  # two replicas of three remain: min.insync.replicas=2 holds
            log.info("batch 1 committed %.1f s after its coordinator was paused", time.monotonic() - started)
        finally:
            for pid in killed:
                os.kill(pid, signal.SIGCONT)
        assert killed
        assert "batch 1: offsets did not return within" in caplog.text
        assert "leaving that producer behind" in caplog.text
        batch(2)
    finally:
        sink.close()
    # The coordinator writes a transaction's commit markers after
    # commit_transaction returns: a reader sees the last one a moment later
    # (more so while the restarted node takes its partitions back).
    deadline = time.monotonic() + 60
    while True:
        seen = [r.value for r in kafka_io.read_topic(cluster.kafka_bootstrap, output, "read_committed")]
        if len(seen) >= len(sent) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert sorted(seen) == sorted(sent) and len(seen) == 150
    ledger = kafka_io.group_commits(cluster.kafka_bootstrap, group, source, 30)
    assert {p: offset for p, (offset, _meta) in ledger.items()} == {p: 30 for p in range(4)}
    assert all(json.loads(meta)["batch_id"] == 2 for _offset, meta in ledger.values())
    # The resumed node back in every ISR before the next test stops another.
    deadline = time.monotonic() + 120
    while not kafka_io.fully_replicated(cluster.kafka_bootstrap) and time.monotonic() < deadline:
        time.sleep(1)


def _quorum_leader(cluster: Settings) -> int:
    """The active KRaft controller, as the nodes recorded it."""
    for node in kafka_broker.nodes(cluster):
        state = node.directory / "data" / "__cluster_metadata-0" / "quorum-state"
        if state.exists() and json.loads(state.read_text()).get("leaderId", -1) > 0:
            return json.loads(state.read_text())["leaderId"]
    raise AssertionError("no node knows the quorum's leader")


def _leaders(cluster: Settings, topic: str) -> dict[int, int]:
    md = kafka_io.admin(cluster.kafka).list_topics(topic, timeout=30)
    return {p: meta.leader for p, meta in md.topics[topic].partitions.items()}


def _victim(cluster: Settings, aggregates: str) -> tuple[int, int, str, str] | None:
    """A node to stop, a partition of ``aggregates`` it leads, a transactional
    id and a job whose coordinators it is not, and which is not the quorum's
    leader: so that only the marker of that partition has to wait."""
    busy = {_quorum_leader(cluster)}
    tid, job = f"sink-{uuid.uuid4().hex[:8]}", f"paused-{uuid.uuid4().hex[:8]}"
    busy.add(kafka_io.coordinator_node(cluster.kafka_bootstrap, tid, kafka_io.TRANSACTION_STATE))
    busy.add(kafka_io.coordinator_node(cluster.kafka_bootstrap, kafka_io.ledger_group(job), kafka_io.CONSUMER_OFFSETS))
    for partition, leader in sorted(_leaders(cluster, aggregates).items()):
        if leader > 0 and leader not in busy:
            return leader, partition, tid, job
    return None


def _ledger(settings: Settings) -> dict[int, tuple[int, str]]:
    try:
        return kafka_io.stream_commits(settings, timeout_s=15)
    except KafkaException:  # asked of the stopped node first: not yet
        return {}


def test_a_load_waits_while_an_output_partitions_leader_is_stopped(cluster: Settings) -> None:
    """The ledger visible before a batch's output marker, for real: a batch
    (an aggregate and the ledger's offsets in one transaction, as the sink
    writes them) commits while the leader of the aggregate's partition is
    SIGSTOPped. The ledger's partition and the coordinators live on other
    nodes, so the commit and the ledger come through while the marker waits
    for the partition's leadership to move. A load's read of the region
    (region_ranges) as soon as the ledger is visible includes the aggregate:
    it waits for the marker (and for leaders that do not answer) instead of
    reading the raw records without their aggregate or failing. Measured
    here: the ledger 3 s after the stop, the aggregate readable at 34 s; how
    long the window stays open varies with which node the clients ask first
    (printed with -s)."""
    from adpipe.lakehouse.ranges import region_ranges
    from adpipe.settings import Topics
    from adpipe.stream.sink_ledger import ledger_metadata
    from confluent_kafka import Consumer, TopicPartition

    # A fresh aggregates topic; then a transactional id and a job (its ledger
    # group) are drawn until their coordinators and the quorum's leader are
    # on nodes other than the leader of one of its partitions.
    aggregates = f"paused-{uuid.uuid4().hex[:6]}-{Topics.aggregates}"
    env = {**CLUSTER_ENV, "ADPIPE_KAFKA_BOOTSTRAP": cluster.kafka_bootstrap, "ADPIPE_TOPIC_AGGREGATES": aggregates}
    kafka_io.ensure_pipeline_topics(load_settings(env))
    for _ in range(100):
        picked = _victim(cluster, aggregates)
        if picked is not None:
            break
        time.sleep(0.2)
    assert picked is not None, f"no node other than the coordinators leads a partition: {_leaders(cluster, aggregates)}"
    victim, partition, transactional_id, job = picked
    env = {**env, "ADPIPE_JOB_ID": job}
    settings = load_settings(env)

    producer = Producer(
        {
            "bootstrap.servers": cluster.kafka_bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 120_000,  # as the sink's
            # A request the client happens to send to the stopped node (a
            # coordinator lookup before EndTxn) is given up after 10 s, not
            # 60: the commit comes through seconds late, never aborted.
            "socket.timeout.ms": 10_000,
        }
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    written: list[int] = []
    producer.produce(
        aggregates, b'{"batch": 0}', b"ad-1", partition=partition, on_delivery=lambda _e, m: written.append(m.offset())
    )
    assert producer.flush(30) == 0 and written
    meta = ledger_metadata(0, None, 0, {(aggregates, partition): written[0] + 1})
    ledger = Consumer({"bootstrap.servers": cluster.kafka_bootstrap, "group.id": kafka_io.ledger_group(job)})
    producer.send_offsets_to_transaction(
        [TopicPartition(settings.topics.events, 0, 0, meta)], ledger.consumer_group_metadata(), 30
    )
    pid = kafka_broker.status(cluster).nodes[victim - 1].pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        commit_s: list[float | BaseException] = []

        def commit() -> None:
            try:
                producer.commit_transaction(90)
                commit_s.append(time.monotonic() - stopped)
            except BaseException as exc:  # noqa: BLE001 - reported by the asserts below
                commit_s.append(exc)

        committed = threading.Thread(target=commit)
        committed.start()
        while not _ledger(settings):
            assert time.monotonic() - stopped < 60, (
                f"the ledger never became visible; the commit: {commit_s}; node {victim} stopped, leading "
                f"{aggregates}[{partition}]; {transactional_id}, {job}"
            )
            time.sleep(0.2)
        ledger_after_s = time.monotonic() - stopped
        (region,) = settings.regions
        hour = datetime(2026, 11, 22, 12, tzinfo=UTC)
        # Patient: the partition's leadership moves, the marker is written,
        # and the load reads the aggregate.
        ranges = region_ranges(load_settings({**env, "ADPIPE_LOAD_OUTPUT_WAIT_S": "120"}), region, hour)
        readable_after_s = time.monotonic() - stopped
        log.info("node %d: ledger after %.1f s, aggregate %.1f s, %s", victim, ledger_after_s, readable_after_s,
                 commit_s)
        committed.join(60)
        assert ranges.aggregates.end[partition] >= written[0] + 1
    finally:
        os.kill(pid, signal.SIGCONT)
        ledger.close()
    # Committed once, whatever the failover did (the resumed node rejoins).
    deadline = time.monotonic() + 60
    while True:
        seen = [r.value for r in kafka_io.read_topic(cluster.kafka_bootstrap, aggregates, "read_committed")]
        if seen or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert seen == [b'{"batch": 0}']
