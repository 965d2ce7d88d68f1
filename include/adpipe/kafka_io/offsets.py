"""Where a topic's partitions begin and end: the first offset still kept,
the last readable (stable) one, the first at or after a time, and the
timestamp of the first record retention left. Each call is a short-lived
consumer in a probe group that only assigns partitions."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, KafkaException, TopicPartition

from adpipe.kafka_access import KafkaAccess
from adpipe.kafka_io.clients import SETTLING, client_config, retry_until


def offset_bounds(
    kafka: KafkaAccess | str, topic: str, isolation: str = "read_committed", timeout_s: float = 30.0
) -> dict[int, tuple[int, int]]:
    """Per partition: (the first offset still kept, the offset after the
    last readable record). With read_committed the latter is the last
    stable offset: records of open transactions lie beyond it."""
    consumer = Consumer(
        client_config(
            kafka, {"group.id": "adpipe-offsets-probe", "isolation.level": isolation, "enable.auto.commit": False}
        )
    )
    deadline = time.monotonic() + timeout_s
    try:
        md = consumer.list_topics(topic, timeout=timeout_s)
        if md.topics[topic].error is not None:
            raise KafkaException(md.topics[topic].error)
        return {p: _watermarks(consumer, TopicPartition(topic, p), deadline) for p in md.topics[topic].partitions}
    finally:
        consumer.close()


def _watermarks(consumer: Consumer, tp: TopicPartition, deadline: float) -> tuple[int, int]:
    """A partition's low and high watermarks, asked again while its
    leadership moves, until ``deadline`` (monotonic)."""
    return retry_until(
        lambda timeout_s: consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False),
        SETTLING,
        deadline,
        0.2,
    )


def offsets_for_times(kafka: KafkaAccess | str, topic: str, timestamp_ms: int) -> dict[int, int | None]:
    """Per partition: the first offset whose record timestamp is at or after
    ``timestamp_ms`` (every record before it is older); None when there is no
    such record yet."""
    consumer = Consumer(client_config(kafka, {"group.id": "adpipe-time-probe", "enable.auto.commit": False}))
    try:
        md = consumer.list_topics(topic, timeout=30)
        if md.topics[topic].error is not None:
            raise KafkaException(md.topics[topic].error)
        wanted = [TopicPartition(topic, p, timestamp_ms) for p in sorted(md.topics[topic].partitions)]
        found = consumer.offsets_for_times(wanted, timeout=30)
        return {tp.partition: (tp.offset if tp.offset >= 0 else None) for tp in found}
    finally:
        consumer.close()


def first_retained(kafka: KafkaAccess | str, topic: str, timeout_s: float = 30.0) -> dict[int, tuple[int, int | None]]:
    """Per partition: the first offset the broker still keeps, and the
    timestamp (ms) of the first record there (None for an empty partition)."""
    bounds = offset_bounds(kafka, topic, "read_uncommitted")
    first: dict[int, tuple[int, int | None]] = {p: (low, None) for p, (low, _high) in bounds.items()}
    pending = {p for p, (low, high) in bounds.items() if high > low}
    if not pending:
        return first
    consumer = Consumer(
        client_config(
            kafka,
            {"group.id": "adpipe-retention-probe", "enable.auto.commit": False, "isolation.level": "read_uncommitted"},
        )
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


def start_offsets(kafka: KafkaAccess | str, topic: str) -> dict[int, int]:
    """The log start offset of each partition (what retention has not deleted)."""
    return {p: low for p, (low, _high) in offset_bounds(kafka, topic).items()}


def end_offsets(
    kafka: KafkaAccess | str, topic: str, isolation: str = "read_committed", timeout_s: float = 30.0
) -> dict[int, int]:
    """The offset after the last readable record of each partition."""
    return {p: high for p, (_low, high) in offset_bounds(kafka, topic, isolation, timeout_s).items()}
