"""The transactional sink's Kafka errors by kind, on a real broker: a record
the broker rejects (abortable) aborts the transaction and the batch is
produced again; an error that stays makes the sink give up after its
attempts with nothing visible; a transaction held open past
``transaction.timeout.ms`` is reported as timed out, not as fenced."""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Iterator

import pytest
from adpipe import kafka_io
from adpipe.settings import Settings
from adpipe.stream import sink as sink_module
from adpipe.stream.sink import MAX_BATCH_ATTEMPTS, OutRecord, TransactionalSink, TransactionTimedOutError
from confluent_kafka.admin import NewTopic

TOPIC_LIMIT = 20_000  # the output topic's max.message.bytes


def _topics(settings: Settings) -> tuple[str, str]:
    """A small-limit output topic and an input topic, new for each test."""
    name = uuid.uuid4().hex[:8]
    output, source = f"sink-{name}-out", f"sink-{name}-in"
    admin = kafka_io.admin(settings.kafka_bootstrap)
    futures = admin.create_topics(
        [
            NewTopic(output, 1, 1, config={"max.message.bytes": str(TOPIC_LIMIT)}),
            NewTopic(source, 2, 1),
        ]
    )
    for future in futures.values():
        future.result(30)
    return output, source


def _sink(settings: Settings, source: str, timeout_ms: int = 60_000) -> TransactionalSink:
    return TransactionalSink(
        settings.kafka_bootstrap,
        f"sink-test-{uuid.uuid4().hex[:8]}",
        f"sink-test-ledger-{uuid.uuid4().hex[:8]}",
        source,
        "query-1",
        timeout_ms,
        message_max_bytes=1_000_000,  # the client lets a record through that the topic refuses
    )


def _values(settings: Settings, topic: str) -> list[bytes]:
    return [r.value for r in kafka_io.read_topic(settings.kafka_bootstrap, topic)]


@pytest.fixture
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sink_module, "RETRY_BACKOFF_S", (0.1,))


def test_a_record_the_broker_rejects_aborts_and_the_batch_is_produced_again(
    broker: Settings, no_backoff: None, caplog: pytest.LogCaptureFixture
) -> None:
    output, source = _topics(broker)
    attempts = []

    def records() -> Iterator[OutRecord]:
        attempts.append(len(attempts) + 1)
        yield OutRecord(output, b"k", f"good-{len(attempts)}".encode())
        if len(attempts) == 1:  # incompressible and over the topic's limit: the broker refuses it
            yield OutRecord(output, b"k", os.urandom(TOPIC_LIMIT * 2))

    sink = _sink(broker, source)
    try:
        with caplog.at_level(logging.WARNING):
            result = sink.commit_batch(0, {0: 5, 1: 7}, records, aggregates=1)
        # librdkafka may fail the next transaction too (a skipped sequence
        # number, until the abort's epoch bump): that is one more attempt.
        assert (result.skipped, result.records) == (False, 1) and 2 <= len(attempts) < MAX_BATCH_ATTEMPTS
        assert "producing the batch again" in caplog.text
        # Only the last attempt is visible: the first one's good record was aborted with the bad one.
        assert _values(broker, output) == [f"good-{len(attempts)}".encode()]
        assert sink.read_ledger().offsets == {0: 5, 1: 7}
    finally:
        sink.close()


def test_an_abortable_error_that_stays_gives_up_after_the_attempts_with_nothing_visible(
    broker: Settings, no_backoff: None
) -> None:
    output, source = _topics(broker)
    attempts = []

    def records() -> Iterator[OutRecord]:
        attempts.append(1)
        yield OutRecord(output, b"k", b"good")
        yield OutRecord(output, b"k", os.urandom(TOPIC_LIMIT * 2))

    sink = _sink(broker, source)
    try:
        with pytest.raises(RuntimeError, match=f"{MAX_BATCH_ATTEMPTS} transactions aborted"):
            sink.commit_batch(0, {0: 5, 1: 7}, records, aggregates=1)
        assert len(attempts) == MAX_BATCH_ATTEMPTS
        assert _values(broker, output) == []
        assert sink.read_ledger() is None
    finally:
        sink.close()


def test_a_transaction_open_past_its_timeout_says_timed_out_not_fenced(broker: Settings) -> None:
    output, source = _topics(broker)

    def slow_records() -> Iterator[OutRecord]:
        yield OutRecord(output, b"k", b"before the stall")
        # Past the 2 s timeout and the broker's next check (every second:
        # transaction.abort.timed.out.transaction.cleanup.interval.ms).
        time.sleep(5)
        yield OutRecord(output, b"k", b"after the stall")

    sink = _sink(broker, source, timeout_ms=2_000)
    try:
        with pytest.raises(TransactionTimedOutError, match=r"longer than transaction.timeout.ms \(2 s\)"):
            sink.commit_batch(0, {0: 5, 1: 7}, slow_records, aggregates=1)
        assert _values(broker, output) == []
    finally:
        sink.close()
    # The restart's producer (same transactional.id) commits the batch.
    again = TransactionalSink(
        broker.kafka_bootstrap, sink.transactional_id, sink.ledger_group, source, "query-1", 60_000
    )
    try:
        assert again.commit_batch(0, {0: 5, 1: 7}, lambda: [OutRecord(output, b"k", b"replayed")], 1).records == 1
        assert _values(broker, output) == [b"replayed"]
    finally:
        again.close()
