"""The Kafka side of a budget-event publish round
(:mod:`adpipe.budget.events`): a transactional producer whose
``transactional.id`` is stable per database (its ``init_transactions`` is
the fence of Step 2), and the publish ledger, the committed offset of a
ledger group on partition 0 of the budget-events topic: the last committed
round (Step 3). Step 5 is one Kafka transaction: a round's events and the
ledger offset of the round commit together, or neither."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from adpipe import kafka_io
from adpipe.settings import Settings

# Named after the part: operators grep "adpipe.budget: batch N".
log = logging.getLogger("adpipe.budget")


class RoundProducer:
    """The producer and the ledger-group consumer of one publisher; both
    None until :meth:`open` and after :meth:`drop`."""

    def __init__(self, settings: Settings, publisher_id: str) -> None:
        self.settings = settings
        self.topic = settings.topics.budget_events
        self.transactional_id = f"adpipe-budget-events-{publisher_id}"
        self.ledger_group = f"adpipe-budget-events-{publisher_id}"
        self.producer: Producer | None = None
        self.ledger_consumer: Consumer | None = None

    def open(self) -> None:
        """A fresh transactional producer (its ``init_transactions`` is the
        fence of Step 2) and a consumer of the ledger group (Steps 3 and 5)."""
        kafka = self.settings.kafka.client_config()
        producer = Producer(
            {
                **kafka,
                "transactional.id": self.transactional_id,
                "enable.idempotence": True,
                "acks": "all",
                "transaction.timeout.ms": 60_000,
                "partitioner": "murmur2_random",
            }
        )
        producer.init_transactions(60)
        log.info("budget events: a new transactional producer (%s); earlier publishers fenced", self.transactional_id)
        self.producer = producer
        self.ledger_consumer = Consumer(
            {
                **kafka,
                "group.id": self.ledger_group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )

    def drop(self) -> None:
        if self.ledger_consumer is not None:
            try:
                self.ledger_consumer.close()
            except (KafkaException, RuntimeError):
                pass
        if self.producer is not None:
            self.producer.flush(5)
        self.producer, self.ledger_consumer = None, None

    def last_round(self) -> int:
        """Step 3: the last committed round (0 before the first)."""
        assert self.ledger_consumer is not None
        (committed,) = kafka_io.committed_offsets(self.ledger_consumer, [TopicPartition(self.topic, 0)])
        return max(committed.offset, 0)

    def publish(self, messages: Sequence[tuple[bytes, bytes]], next_round: int) -> None:
        """Step 5, one Kafka transaction: ``messages`` (key, value) and the
        ledger offset ``next_round`` commit together, or neither (a Kafka
        error aborts the transaction and is raised)."""
        assert self.producer is not None and self.ledger_consumer is not None
        producer, ledger_consumer = self.producer, self.ledger_consumer
        try:
            producer.begin_transaction()
            for key, value in messages:
                producer.produce(self.topic, value, key)
            producer.flush(60)
            producer.send_offsets_to_transaction(
                [TopicPartition(self.topic, 0, next_round, json.dumps({"round": next_round}))],
                ledger_consumer.consumer_group_metadata(),
                60,
            )
            producer.commit_transaction(60)
        except KafkaException:
            try:
                producer.abort_transaction(10)
            except KafkaException:
                pass
            raise
