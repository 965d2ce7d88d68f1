"""Reading records back, bounded: a whole topic to the end offsets taken at
the start, the count of readable records in offset ranges, and the records
at given offsets (the raw records the stream job copies to the late and DLQ
topics). Verify, status, chaos and the tests read topics with these; each
read is a consumer that is assigned partitions and commits nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from adpipe.kafka_access import KafkaAccess
from adpipe.kafka_io.clients import client_config
from adpipe.kafka_io.offsets import end_offsets


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


def _count_readable(
    kafka: KafkaAccess | str, topic: str, ranges: dict[int, tuple[int, int]], timeout_s: float, first_only: bool
) -> dict[int, int]:
    """Per partition: the records a read_committed consumer reads in
    [start, end), or at most one of them with ``first_only``."""
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
                raise TimeoutError(f"reading the records of {topic} in {ranges} took over {timeout_s}s")
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
            if msg.offset() >= end - 1 or first_only:
                pending.discard(msg.partition())
    finally:
        consumer.close()
    return counts


def readable_records(
    kafka: KafkaAccess | str, topic: str, ranges: dict[int, tuple[int, int]], timeout_s: float = 30.0
) -> dict[int, int]:
    """Per partition: the records a read_committed consumer reads in
    [start, end). Fewer than ``end - start`` on a topic written in
    transactions: each commit or abort leaves a marker at an offset of its
    own, and aborted records are skipped."""
    return _count_readable(kafka, topic, ranges, timeout_s, first_only=False)


def readable_partitions(
    kafka: KafkaAccess | str, topic: str, ranges: dict[int, tuple[int, int]], timeout_s: float = 30.0
) -> set[int]:
    """The partitions with at least one record a read_committed consumer
    reads in [start, end); reads at most one record of each."""
    return {p for p, n in _count_readable(kafka, topic, ranges, timeout_s, first_only=True).items() if n}


def first_timestamps(
    kafka: KafkaAccess | str, topic: str, starts: dict[int, int], timeout_s: float = 30.0
) -> dict[int, int]:
    """Per partition: the timestamp (epoch ms) of the first record a
    read_committed consumer reads from ``starts[p]`` on; a partition with
    none there is absent."""
    found: dict[int, int] = {}
    pending = set(starts)
    if not pending:
        return found
    consumer = _reader(kafka, "read_committed")
    try:
        consumer.assign([TopicPartition(topic, p, starts[p]) for p in sorted(pending)])
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or msg.partition() not in pending:
                continue
            pending.discard(msg.partition())
            if msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(msg.error())
                continue
            found[msg.partition()] = msg.timestamp()[1]
    finally:
        consumer.close()
    return found


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
