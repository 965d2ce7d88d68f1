"""Kafka clients as adpipe uses them: topic creation, client configs, a
bounded read of a whole topic (for verify and tests), and where a stream
job's committed input offsets are (its ledger group).

Every function here takes the cluster as a :class:`KafkaAccess`
(``settings.kafka``, ``region.kafka``: bootstrap and credentials, so the
same call works on a SASL/SCRAM over TLS cluster) or as a bare
``host:port[,host:port]`` string, which means a cluster without
credentials (tests, local tools)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from adpipe.settings import KafkaAccess, Region, Settings, Topics

log = logging.getLogger(__name__)

# The consumer groups of adpipe's short-lived probes and readers (offsets,
# times, retention, whole-topic reads): each only assigns partitions and
# never commits, but on a cluster with ACLs a principal needs Read on them.
PROBE_GROUPS = ("adpipe-offsets-probe", "adpipe-time-probe", "adpipe-retention-probe", "adpipe-reader")


def access(kafka: KafkaAccess | str) -> KafkaAccess:
    """The cluster as clients reach it (a bare bootstrap string: no credentials)."""
    return kafka if isinstance(kafka, KafkaAccess) else KafkaAccess(kafka)


def client_config(kafka: KafkaAccess | str, extra: dict | None = None) -> dict:
    """A confluent-kafka client's settings: bootstrap and credentials, then ``extra``."""
    return {**access(kafka).client_config(), **(extra or {})}


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


def admin(kafka: KafkaAccess | str) -> AdminClient:
    return AdminClient(client_config(kafka))


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
    try:
        entry = client.describe_configs([resource], request_timeout=timeout_s)[resource].result().get(TIMESTAMP_TYPE)
    except KafkaException as exc:
        log.debug("%s of %s: %s", TIMESTAMP_TYPE, topic, exc)
        return None
    return entry.value if entry is not None else None


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
    try:
        md = consumer.list_topics(topic, timeout=timeout_s)
        if md.topics[topic].error is not None:
            raise KafkaException(md.topics[topic].error)
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s, cached=False)
            for p in md.topics[topic].partitions
        }
    finally:
        consumer.close()


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


def committed_outputs(commits: dict[int, tuple[int, str]]) -> dict[str, dict[int, int]]:
    """Per output topic and partition, the offset after the last record of
    the last batch in a stream job's ledger commits (the ``out`` of its
    metadata, adpipe.stream.sink.ledger_metadata); empty when the ledger
    does not say."""
    entries = [json.loads(meta) for _offset, meta in commits.values() if meta]
    if not entries:
        return {}
    last = max(entries, key=lambda e: e.get("batch_id", -1))
    return {topic: {int(p): int(end) for p, end in ends.items()} for topic, ends in last.get("out", {}).items()}


def stream_commits(region: Settings | Region, timeout_s: float = 30.0) -> dict[int, tuple[int, str]]:
    """A region's stream job's committed (offset, metadata) per raw-topic
    partition (see :func:`ledger_group`)."""
    return group_commits(region.kafka, ledger_group(region.job_id), region.topics.events, timeout_s)


def stream_lag(
    region: Settings | Region, commits: dict[int, tuple[int, str]] | None = None, timeout_s: float = 30.0
) -> dict[int, int]:
    """Per partition of a region's raw topic: records its stream job has not
    committed yet (a partition it never committed counts from zero).
    ``commits``: its :func:`stream_commits`, when the caller has read them."""
    ends = end_offsets(region.kafka, region.topics.events, timeout_s=timeout_s)
    done = stream_commits(region, timeout_s) if commits is None else commits
    return {p: max(0, end - done.get(p, (0, ""))[0]) for p, end in sorted(ends.items())}


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


def _reader(kafka: KafkaAccess | str, isolation: str) -> Consumer:
    """A consumer that is assigned partitions (never joins its group) and
    commits nothing; its group is a probe group, which the secure broker's
    ACLs grant every principal (adpipe.local.kafka_security)."""
    return Consumer(
        client_config(
            kafka,
            {
                "group.id": "adpipe-reader",
                "isolation.level": isolation,
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                # A reader stops at an end it knows: the broker need not hold
                # a fetch at the end of a partition for the default 500 ms,
                # which delayed the next partition's first fetch as long.
                "fetch.wait.max.ms": 10,
            },
        )
    )


def _record(topic: str, msg: Message) -> Record:
    return Record(
        topic,
        msg.partition(),
        msg.offset(),
        msg.key(),
        msg.value(),
        dict(msg.headers() or []),
        msg.timestamp()[1],
    )


def read_topic(
    kafka: KafkaAccess | str, topic: str, isolation: str = "read_committed", timeout_s: float = 60.0
) -> Iterator[Record]:
    """Every readable record of ``topic`` from the beginning to its current end.

    Stops at the end offsets taken at the start, so it always terminates."""
    ends = end_offsets(kafka, topic, isolation)
    consumer = _reader(kafka, isolation)
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
            yield _record(topic, msg)
            if msg.offset() + 1 >= ends[msg.partition()]:
                pending.discard(msg.partition())
    finally:
        consumer.close()


def readable_records(
    kafka: KafkaAccess | str, topic: str, ranges: dict[int, tuple[int, int]], timeout_s: float = 30.0
) -> dict[int, int]:
    """Per partition: the records a read_committed consumer reads in
    [start, end). Fewer than ``end - start`` on a topic written in
    transactions: each commit or abort leaves a marker at an offset of its
    own, and aborted records are skipped."""
    counts = {p: 0 for p in ranges}
    pending = {p for p, (start, end) in ranges.items() if end > start}
    if not pending:
        return counts
    consumer = _reader(kafka, "read_committed")
    try:
        consumer.assign([TopicPartition(topic, p, ranges[p][0]) for p in sorted(pending)])
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"counting the records of {topic} in {ranges} took over {timeout_s}s")
            msg = consumer.poll(0.2)
            if msg is None or msg.partition() not in pending:
                continue
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(msg.error())
                pending.discard(msg.partition())
                continue
            end = ranges[msg.partition()][1]
            if msg.offset() < end:
                counts[msg.partition()] += 1
            if msg.offset() >= end - 1:
                pending.discard(msg.partition())
    finally:
        consumer.close()
    return counts


class MissingRecordError(RuntimeError):
    """A record asked for by position was not there (deleted, or aborted)."""


def read_positions(
    kafka: KafkaAccess | str, topic: str, wanted: dict[int, Sequence[int]], timeout_s: float = 300.0
) -> Iterator[Record]:
    """The records of ``topic`` at the given offsets (per partition, sorted),
    read_committed, in partition order and then offset order.

    Each partition is read once, from its first wanted offset to its last,
    keeping only the wanted ones; a wanted offset that is not there raises
    :class:`MissingRecordError` rather than being skipped."""
    consumer = _reader(kafka, "read_committed")
    try:
        for partition in sorted(wanted):
            offsets = wanted[partition]
            if not offsets:
                continue
            consumer.assign([TopicPartition(topic, partition, offsets[0])])
            deadline = time.monotonic() + timeout_s
            index, position = 0, offsets[0]
            while index < len(offsets):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading {topic}[{partition}] to offset {offsets[-1]} took over {timeout_s}s")
                # consume() waits for its whole count or its timeout: asking
                # for more records than are left to the last wanted offset
                # cost a second per partition near the end of a topic (the
                # stream job's last batch, and every batch of a live job).
                for msg in consumer.consume(max(1, min(1000, offsets[-1] - position + 1)), 1.0):
                    if msg.error():
                        if msg.error().code() == KafkaError._PARTITION_EOF and msg.partition() != partition:
                            continue
                        if msg.error().code() == KafkaError._PARTITION_EOF:
                            raise MissingRecordError(
                                f"{topic}[{partition}] ends before offset {offsets[index]} (read_committed)"
                            )
                        raise KafkaException(msg.error())
                    if msg.partition() != partition:
                        continue  # fetched before the previous partition was unassigned
                    position = msg.offset() + 1
                    if offsets[index] < msg.offset():
                        raise MissingRecordError(f"{topic}[{partition}] has no readable record at {offsets[index]}")
                    if msg.offset() == offsets[index]:
                        index += 1
                        yield _record(topic, msg)
                    if index == len(offsets):
                        break
            consumer.unassign()
    finally:
        consumer.close()


def refusal(kafka: KafkaAccess | str, timeout_s: float = 5.0) -> str | None:
    """Why the cluster does not let this client in, in one line (None: it
    answers): wrong credentials, a certificate the CA file does not verify,
    or a listener that wants TLS and SASL from a client that brings none.
    librdkafka reports these only as errors beside a request that then
    times out ("Broker transport failure"); the CLI adds this line."""
    acc = access(kafka)
    errors: list[KafkaError] = []
    consumer = Consumer(client_config(acc, {"group.id": PROBE_GROUPS[0], "error_cb": errors.append, "log_level": 0}))
    try:
        consumer.list_topics(timeout=timeout_s)
        return None
    except KafkaException:
        pass
    finally:
        consumer.poll(0)
        consumer.close()
    found = {e.code(): e.str() for e in errors}
    if KafkaError._AUTHENTICATION in found:
        return (
            f"Kafka at {acc.describe()} refused the credentials (wrong user name or password): "
            + found[KafkaError._AUTHENTICATION]
        )
    if KafkaError._SSL in found:
        return (
            f"TLS with Kafka at {acc.bootstrap} failed (is ADPIPE_KAFKA_CA_FILE the CA of its certificate?): "
            + found[KafkaError._SSL]
        )
    if not acc.secure:
        return (
            f"Kafka at {acc.bootstrap} did not answer a client without credentials: down, or a listener that "
            "wants SASL over TLS (ADPIPE_KAFKA_SECURITY=sasl_ssl, ADPIPE_KAFKA_USERNAME, ADPIPE_KAFKA_PASSWORD_FILE)"
        )
    return f"Kafka at {acc.describe()} did not answer: down, or not a SASL_SSL listener"
