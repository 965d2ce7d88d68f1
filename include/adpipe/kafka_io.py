"""Kafka clients as adpipe uses them: topic creation, client configs, a
bounded read of a whole topic (for verify and tests), and where a stream
job's committed input offsets are (its ledger group)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from adpipe.settings import Region, Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Record:
    """One Kafka record, as read back."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]
    timestamp_ms: int = -1  # the record's own timestamp (-1: none)

    def header(self, name: str) -> str | None:
        raw = self.headers.get(name)
        return None if raw is None else raw.decode()


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def ensure_topics(bootstrap: str, topics: Sequence[str], partitions: int, timeout_s: float = 30.0) -> list[str]:
    """Create the topics that do not exist yet; return the ones created. Each
    gets three replicas where the cluster has three brokers or more (one
    per broker below that), and then needs two in sync to take a write."""
    client = admin(bootstrap)
    metadata = client.list_topics(timeout=timeout_s)
    existing = set(metadata.topics)
    factor = min(3, max(1, len(metadata.brokers)))
    config = {"min.insync.replicas": "2"} if factor >= 3 else {}
    wanted = [
        NewTopic(t, num_partitions=partitions, replication_factor=factor, config=config)
        for t in topics
        if t not in existing
    ]
    if not wanted:
        return []
    for topic, future in client.create_topics(wanted, operation_timeout=timeout_s).items():
        try:
            future.result()
        except KafkaException as exc:
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
        log.info("created topic %s (%d partitions, %d replicas)", topic, partitions, factor)
    return [t.topic for t in wanted]


# Kafka's default max.message.bytes of a topic (the broker's message.max.bytes).
DEFAULT_MAX_MESSAGE_BYTES = 1_048_588


def max_message_bytes(bootstrap: str, topics: Sequence[str], timeout_s: float = 30.0) -> dict[str, int]:
    """Each topic's ``max.message.bytes``: the largest record batch the broker
    takes for it (compressed size, headers included)."""
    from confluent_kafka.admin import ConfigResource

    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
    client = admin(bootstrap)  # held until the futures resolve: a collected client fails them
    limits = {}
    for resource, future in client.describe_configs(resources, request_timeout=timeout_s).items():
        entry = future.result().get("max.message.bytes")
        limits[resource.name] = int(entry.value) if entry is not None and entry.value else DEFAULT_MAX_MESSAGE_BYTES
    return limits


_RETRIABLE = {
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.UNSTABLE_OFFSET_COMMIT,
    KafkaError._TIMED_OUT,
    KafkaError.REQUEST_TIMED_OUT,
}


def committed_offsets(
    consumer: Consumer, partitions: list[TopicPartition], timeout_s: float = 60.0
) -> list[TopicPartition]:
    """A group's committed offsets, retrying while the group coordinator is
    moving or loading (normal right after a broker start) or while a
    transactional offset commit is still pending."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return consumer.committed(partitions, timeout=max(1.0, deadline - time.monotonic()))
        except KafkaException as exc:
            if exc.args[0].code() not in _RETRIABLE or time.monotonic() > deadline:
                raise
            log.info("committed offsets not available yet (%s); retrying", exc.args[0].str())
            time.sleep(0.5)


def offset_bounds(bootstrap: str, topic: str, isolation: str = "read_committed") -> dict[int, tuple[int, int]]:
    """Per partition: (the first offset still kept, the offset after the
    last readable record). With read_committed the latter is the last
    stable offset: records of open transactions lie beyond it."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "adpipe-offsets-probe",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    try:
        md = consumer.list_topics(topic, timeout=30)
        if md.topics[topic].error is not None:
            raise KafkaException(md.topics[topic].error)
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)
            for p in md.topics[topic].partitions
        }
    finally:
        consumer.close()


def offsets_for_times(bootstrap: str, topic: str, timestamp_ms: int) -> dict[int, int | None]:
    """Per partition: the first offset whose record timestamp is at or after
    ``timestamp_ms`` (every record before it is older); None when there is no
    such record yet."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "adpipe-time-probe", "enable.auto.commit": False})
    try:
        md = consumer.list_topics(topic, timeout=30)
        if md.topics[topic].error is not None:
            raise KafkaException(md.topics[topic].error)
        wanted = [TopicPartition(topic, p, timestamp_ms) for p in sorted(md.topics[topic].partitions)]
        found = consumer.offsets_for_times(wanted, timeout=30)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in found}
    finally:
        consumer.close()


def first_retained(bootstrap: str, topic: str, timeout_s: float = 30.0) -> dict[int, tuple[int, int | None]]:
    """Per partition: the first offset the broker still keeps, and the
    timestamp (ms) of the first record there (None for an empty partition)."""
    bounds = offset_bounds(bootstrap, topic, "read_uncommitted")
    first: dict[int, tuple[int, int | None]] = {p: (low, None) for p, (low, _high) in bounds.items()}
    pending = {p for p, (low, high) in bounds.items() if high > low}
    if not pending:
        return first
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "adpipe-retention-probe",
            "enable.auto.commit": False,
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, bounds[p][0]) for p in sorted(pending)])
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() or msg.partition() not in pending:
                continue
            first[msg.partition()] = (bounds[msg.partition()][0], msg.timestamp()[1])
            pending.discard(msg.partition())
            consumer.pause([TopicPartition(topic, msg.partition())])
    finally:
        consumer.close()
    return first


def start_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    """The log start offset of each partition (what retention has not deleted)."""
    return {p: low for p, (low, _high) in offset_bounds(bootstrap, topic).items()}


def end_offsets(bootstrap: str, topic: str, isolation: str = "read_committed") -> dict[int, int]:
    """The offset after the last readable record of each partition."""
    return {p: high for p, (_low, high) in offset_bounds(bootstrap, topic, isolation).items()}


def group_commits(bootstrap: str, group: str, topic: str) -> dict[int, tuple[int, str]]:
    """A consumer group's committed (offset, metadata) per partition of
    ``topic``; partitions it never committed are left out."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        md = consumer.list_topics(topic, timeout=30)
        if md.topics[topic].error is not None:
            raise KafkaException(md.topics[topic].error)
        parts = [TopicPartition(topic, p) for p in md.topics[topic].partitions]
        return {
            tp.partition: (tp.offset, tp.metadata or "") for tp in committed_offsets(consumer, parts) if tp.offset >= 0
        }
    finally:
        consumer.close()


def ledger_group(job_id: str) -> str:
    """The consumer group a stream job commits each micro-batch's input
    offsets to, inside the batch's output transaction: its readers take the
    raw records below these offsets as final (counted, late or in the DLQ)."""
    return f"adpipe-agg-{job_id}"


def committed_watermark(commits: dict[int, tuple[int, str]]) -> int | None:
    """The watermark (epoch ms) of the last batch in a stream job's ledger
    commits (:func:`stream_commits`; each carries its batch's metadata), or
    None when it has committed nothing."""
    marks = [json.loads(meta).get("watermark_ms", 0) for _offset, meta in commits.values() if meta]
    return max(marks) if marks else None


def stream_commits(region: Settings | Region) -> dict[int, tuple[int, str]]:
    """A region's stream job's committed (offset, metadata) per raw-topic
    partition (see :func:`ledger_group`)."""
    return group_commits(region.kafka_bootstrap, ledger_group(region.job_id), region.topics.events)


def stream_lag(region: Settings | Region, commits: dict[int, tuple[int, str]] | None = None) -> dict[int, int]:
    """Per partition of a region's raw topic: records its stream job has not
    committed yet (a partition it never committed counts from zero).
    ``commits``: its :func:`stream_commits`, when the caller has read them."""
    ends = end_offsets(region.kafka_bootstrap, region.topics.events)
    done = stream_commits(region) if commits is None else commits
    return {p: max(0, end - done.get(p, (0, ""))[0]) for p, end in sorted(ends.items())}


def read_topic(
    bootstrap: str, topic: str, isolation: str = "read_committed", timeout_s: float = 60.0
) -> Iterator[Record]:
    """Every readable record of ``topic`` from the beginning to its current end.

    Stops at the end offsets taken at the start, so it always terminates."""
    ends = end_offsets(bootstrap, topic, isolation)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "adpipe-reader",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        pending = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in pending])
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} did not reach its end offsets {ends} in {timeout_s}s")
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == -191:  # _PARTITION_EOF
                    pending.discard(msg.partition())
                    continue
                raise KafkaException(msg.error())
            if msg.offset() >= ends[msg.partition()]:
                pending.discard(msg.partition())
                continue
            yield Record(
                topic,
                msg.partition(),
                msg.offset(),
                msg.key(),
                msg.value(),
                dict((k, v) for k, v in (msg.headers() or [])),
                msg.timestamp()[1],
            )
            if msg.offset() + 1 >= ends[msg.partition()]:
                pending.discard(msg.partition())
    finally:
        consumer.close()
