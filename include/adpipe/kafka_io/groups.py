"""Consumer groups as adpipe reads them: a group's committed offsets and
their metadata (retried while its coordinator moves or loads, or while a
transactional commit is pending), and the group's state and live members."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from adpipe.kafka_access import KafkaAccess
from adpipe.kafka_io.clients import client_config, retry_until

# The package's one logger, as before it was split: its lines read the same.
log = logging.getLogger("adpipe.kafka_io")


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
    return retry_until(
        lambda left_s: consumer.committed(partitions, timeout=left_s),
        _RETRIABLE,
        time.monotonic() + timeout_s,
        0.5,
        lambda err: log.info("committed offsets not available yet (%s); retrying", err.str()),
    )


def group_commits(
    kafka: KafkaAccess | str, group: str, topic: str, timeout_s: float = 30.0
) -> dict[int, tuple[int, str]]:
    """A consumer group's committed (offset, metadata) per partition of
    ``topic``; partitions it never committed are left out. ``timeout_s``
    bounds the metadata request; the committed offsets get twice that (their
    coordinator may be loading right after a broker start)."""
    consumer = Consumer(
        client_config(kafka, {"group.id": group, "isolation.level": "read_committed", "enable.auto.commit": False})
    )
    try:
        md = consumer.list_topics(topic, timeout=timeout_s)
        if md.topics[topic].error is not None:
            raise KafkaException(md.topics[topic].error)
        parts = [TopicPartition(topic, p) for p in md.topics[topic].partitions]
        return {
            tp.partition: (tp.offset, tp.metadata or "")
            for tp in committed_offsets(consumer, parts, 2 * timeout_s)
            if tp.offset >= 0
        }
    finally:
        consumer.close()


@dataclass(frozen=True)
class GroupMember:
    """One consumer in a group, as the group coordinator describes it."""

    client_id: str
    host: str
    topics: tuple[str, ...]  # of the partitions assigned to it (none while a rebalance runs)


def group_members(kafka: KafkaAccess | str, group: str, timeout_s: float = 30.0) -> tuple[str, list[GroupMember]]:
    """A consumer group's state (``STABLE``, ``EMPTY``, ``DEAD`` for a group
    that does not exist, ...) and its live members."""
    # Kept referenced until the answer (a collected client never resolves
    # its futures); quiet about the events it drops when it closes.
    client = AdminClient(client_config(kafka, {"log_level": 4}))
    future = client.describe_consumer_groups([group], request_timeout=timeout_s)[group]
    described = future.result(timeout=timeout_s + 1)
    members = [
        GroupMember(
            m.client_id,
            m.host.lstrip("/"),
            tuple(sorted({tp.topic for tp in (m.assignment.topic_partitions if m.assignment else [])})),
        )
        for m in described.members
    ]
    return described.state.name, members


def configure_group_session(
    kafka: KafkaAccess | str, group: str, session_timeout_ms: int, heartbeat_interval_ms: int, timeout_s: float = 30.0
) -> None:
    """Set a consumer group's own session timeout and heartbeat interval:
    under KIP-848's consumer protocol these are the group's configs (within
    the broker's ``group.consumer.min/max.*`` bounds), not the client's.
    Raises :class:`KafkaException` when the broker refuses them."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    client = AdminClient(client_config(kafka, {"log_level": 4}))
    entries = [
        ConfigEntry(name, str(value), incremental_operation=AlterConfigOpType.SET)
        for name, value in (
            ("consumer.session.timeout.ms", session_timeout_ms),
            ("consumer.heartbeat.interval.ms", heartbeat_interval_ms),
        )
    ]
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=entries)
    for future in client.incremental_alter_configs([resource], request_timeout=timeout_s).values():
        future.result(timeout=timeout_s + 1)
