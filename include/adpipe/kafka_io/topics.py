"""The pipeline's topics: created where missing (replicas by the cluster's
size, the raw events on the broker's clock), and read back: which clock a
topic's timestamps are, and the largest record batch each takes."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection, Sequence

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import NewTopic

from adpipe.kafka_access import KafkaAccess, Topics
from adpipe.kafka_io.clients import SETTLING, access, admin, retry_until
from adpipe.settings import Settings

# The package's one logger, as before it was split: its lines read the same.
log = logging.getLogger("adpipe.kafka_io")


# Kafka's answer to a client whose principal the ACLs do not allow an operation.
_NOT_AUTHORIZED = {
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.CLUSTER_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
}


# The raw topic's record timestamps are the broker's clock: the future-time
# rule compares an event's time with its record's timestamp, and a producer
# whose clock runs fast must not move the watermark (the contract).
TIMESTAMP_TYPE = "message.timestamp.type"
BROKER_TIME = "LogAppendTime"


def ensure_topics(
    kafka: KafkaAccess | str,
    topics: Sequence[str],
    partitions: int,
    timeout_s: float = 30.0,
    broker_time: Collection[str] = (),
) -> list[str]:
    """Create the topics that do not exist yet; return the ones created. Each
    gets three replicas where the cluster has three brokers or more (one
    per broker below that), and then needs two in sync to take a write;
    those named in ``broker_time`` take the broker's clock as their records'
    timestamps (``LogAppendTime``).

    On a cluster with ACLs a principal sees only the topics it may use, and
    creating the others is refused: those are left to the administrator who
    made them (``adpipe kafka up --secure`` creates every topic), logged,
    and a later use of a topic that really is missing fails there."""
    client = admin(kafka)
    metadata = client.list_topics(timeout=timeout_s)
    existing = set(metadata.topics)
    factor = min(3, max(1, len(metadata.brokers)))
    config = {"min.insync.replicas": "2"} if factor >= 3 else {}
    wanted = [
        NewTopic(
            t,
            num_partitions=partitions,
            replication_factor=factor,
            config={**config, TIMESTAMP_TYPE: BROKER_TIME} if t in broker_time else config,
        )
        for t in topics
        if t not in existing
    ]
    if not wanted:
        return []
    created = []
    for topic, future in client.create_topics(wanted, operation_timeout=timeout_s).items():
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() in _NOT_AUTHORIZED:
                log.info(
                    "topic %s: not visible to or creatable by %s; left to the cluster's administrator",
                    topic,
                    access(kafka).describe(),
                )
                continue
            if "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise
        log.info("created topic %s (%d partitions, %d replicas)", topic, partitions, factor)
        created.append(topic)
    return [t.topic for t in wanted if t.topic in created]


def ensure_pipeline_topics(settings: Settings, topics: Topics | None = None) -> list[str]:
    """:func:`ensure_topics` for a pipeline's topics (``settings.topics``
    unless given): the raw events' on the broker's clock."""
    topics = topics or settings.topics
    return ensure_topics(settings.kafka, topics.all(), settings.topic_partitions, broker_time=(topics.events,))


def timestamp_type(kafka: KafkaAccess | str, topic: str, timeout_s: float = 30.0) -> str | None:
    """A topic's ``message.timestamp.type`` (``CreateTime``: the producer's
    clock, ``LogAppendTime``: the broker's), None when it cannot be read."""
    from confluent_kafka.admin import ConfigResource

    client = admin(kafka)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)

    def describe(request_timeout_s: float) -> str:
        entry = client.describe_configs([resource], request_timeout=request_timeout_s)[resource].result().get(
            TIMESTAMP_TYPE
        )
        if entry is None:  # a broker that has not caught up with a topic just created
            raise KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, f"no {TIMESTAMP_TYPE} of {topic} yet"))
        return entry.value

    try:
        # Asked again while a topic just created is not known everywhere yet.
        return retry_until(describe, SETTLING, time.monotonic() + timeout_s, 0.2)
    except KafkaException as exc:
        log.debug("%s of %s: %s", TIMESTAMP_TYPE, topic, exc)
        return None


def check_broker_time(kafka: KafkaAccess | str, topic: str) -> bool:
    """Whether ``topic``'s records carry the broker's clock; a warning that
    says what follows and how to change it when they carry the producer's."""
    kind = timestamp_type(kafka, topic)
    if kind == BROKER_TIME:
        return True
    if kind is not None:
        log.warning(
            "topic %s keeps the producers' timestamps (%s=%s): the future-time rule (ADPIPE_MAX_FUTURE_SKEW_S) "
            "then trusts the producers' clocks, and one running fast moves the watermark. Set it to the "
            "broker's clock: kafka-configs.sh --bootstrap-server <broker> --alter --entity-type topics "
            "--entity-name %s --add-config %s=%s",
            topic, TIMESTAMP_TYPE, kind, topic, TIMESTAMP_TYPE, BROKER_TIME,
        )
    return False


# Kafka's default max.message.bytes of a topic (the broker's message.max.bytes).
DEFAULT_MAX_MESSAGE_BYTES = 1_048_588


def max_message_bytes(kafka: KafkaAccess | str, topics: Sequence[str], timeout_s: float = 30.0) -> dict[str, int]:
    """Each topic's ``max.message.bytes``: the largest record batch the broker
    takes for it (compressed size, headers included)."""
    from confluent_kafka.admin import ConfigResource

    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
    client = admin(kafka)  # held until the futures resolve: a collected client fails them
    limits = {}
    for resource, future in client.describe_configs(resources, request_timeout=timeout_s).items():
        entry = future.result().get("max.message.bytes")
        limits[resource.name] = int(entry.value) if entry is not None and entry.value else DEFAULT_MAX_MESSAGE_BYTES
    return limits


def retention_ms(kafka: KafkaAccess | str, topics: Sequence[str], timeout_s: float = 30.0) -> dict[str, int]:
    """Each topic's ``retention.ms`` (-1: kept for ever; Kafka's default, 7
    days, when the broker gives none)."""
    from confluent_kafka.admin import ConfigResource

    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in topics]
    client = admin(kafka)  # held until the futures resolve: a collected client fails them
    kept = {}
    for resource, future in client.describe_configs(resources, request_timeout=timeout_s).items():
        entry = future.result().get("retention.ms")
        kept[resource.name] = int(entry.value) if entry is not None and entry.value else 7 * 24 * 3600 * 1000
    return kept


def fully_replicated(kafka: KafkaAccess) -> bool:
    """Every partition of every topic has all its replicas in sync."""
    try:
        md = admin(kafka).list_topics(timeout=5)
    except Exception:  # noqa: BLE001 - not answering: not replicated
        return False
    return all(
        p.leader >= 0 and set(p.isrs) == set(p.replicas) for t in md.topics.values() for p in t.partitions.values()
    )
