"""Which broker coordinates a transactional id or a consumer group: Kafka
places each by Java's ``String.hashCode`` on a partition of an internal
topic, whose leader is the coordinator (the chaos run stops that broker on
purpose)."""

from __future__ import annotations

from adpipe.kafka_access import KafkaAccess
from adpipe.kafka_io.clients import admin


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (Kafka places a transactional id or a group by it)."""
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


TRANSACTION_STATE = "__transaction_state"
CONSUMER_OFFSETS = "__consumer_offsets"


def coordinator_partition(key: str, partitions: int) -> int:
    """The internal partition of a transactional id or group:
    ``Utils.abs(key.hashCode()) % partitions`` (Java's ``Math.abs``, 0 for
    the smallest int; not a mask: the two differ for a negative hash)."""
    h = java_string_hash(key)
    return (0 if h == -(2**31) else abs(h)) % partitions


def coordinator_node(kafka: KafkaAccess | str, key: str, internal_topic: str = TRANSACTION_STATE) -> int | None:
    """The broker that coordinates a transactional id (``__transaction_state``)
    or a consumer group (``__consumer_offsets``): the leader of the internal
    partition (:func:`coordinator_partition`), from metadata."""
    md = admin(kafka).list_topics(internal_topic, timeout=5)
    topic = md.topics.get(internal_topic)
    if topic is None or topic.error is not None or not topic.partitions:
        return None
    leader = topic.partitions[coordinator_partition(key, len(topic.partitions))].leader
    return leader if leader >= 0 else None
