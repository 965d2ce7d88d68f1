"""Budget events: the outbox (``budget_pauses``, filled by Step 5 of
:mod:`adpipe.budget.batch`) published to the budget-events topic; Step 9 of
the service's protocol (:mod:`adpipe.budget.service`).

Budget events (``EventPublisher.publish_pending``) use a transactional
producer whose ``transactional.id`` is stable per database, so that "once"
holds for read_committed readers of ``ad-budget-events``. A publish round:

  Step 1. Take the publisher lock (a PostgreSQL advisory lock; SQLite runs
          one instance): one round at a time, across instances.
  Step 2. A fresh producer's ``init_transactions``: fences every earlier
          publisher and completes or aborts its open transaction.
  Step 3. Read the publish ledger: the last committed round R, kept as the
          committed offset of a ledger group in Kafka.
  Step 4. One database transaction: rows claimed by round R and not marked
          sent were published (R committed): mark them sent. Claim every
          other unsent row for round R+1. Commit.
  Step 5. One Kafka transaction: the events of round R+1 plus the ledger
          offset R+1 (``send_offsets_to_transaction``). Commit.
  Step 6. Mark round R+1 sent in the database; release the lock.

A death before Step 5's commit leaves round R+1 unpublished (aborted by the
next Step 2) and its rows unsent: the next round claims and publishes them.
A death after it (``budget_after_events_commit``) leaves the ledger at R+1:
the next round's Step 4 marks the rows sent without publishing them again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import sqlalchemy as sa
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from sqlalchemy.engine import Engine, RowMapping
from sqlalchemy.exc import DBAPIError

from adpipe import kafka_io
from adpipe.budget import db
from adpipe.faults import BUDGET_AFTER_EVENTS_COMMIT, FaultPlan
from adpipe.money import format_micros
from adpipe.settings import Settings

# Named after the part: operators grep "adpipe.budget: batch N".
log = logging.getLogger("adpipe.budget")


class EventPublisher:
    """Publishes the outbox (``budget_pauses``) to the budget-events topic;
    the protocol is in the module doc."""

    def __init__(self, settings: Settings, engine: Engine, publisher_id: str, fault: FaultPlan | None = None) -> None:
        self.settings = settings
        self.engine = engine
        self.topic = settings.topics.budget_events
        self.transactional_id = f"adpipe-budget-events-{publisher_id}"
        self.ledger_group = f"adpipe-budget-events-{publisher_id}"
        self.fault = fault
        self.rounds = 0

    def pending(self) -> int:
        with self.engine.connect() as conn:
            return conn.execute(
                sa.select(sa.func.count()).select_from(db.pauses).where(db.pauses.c.sent_at.is_(None))
            ).scalar_one()

    def publish_pending(self) -> int:
        """One publish round if anything is unsent; returns events published."""
        if self.pending() == 0:
            return 0
        lock_conn = self.engine.connect()
        try:
            if lock_conn.dialect.name == "postgresql":  # Step 1
                lock_conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": db.LOCK_PUBLISHER})
                lock_conn.commit()
            return self._round()
        finally:
            if lock_conn.dialect.name == "postgresql":
                try:
                    lock_conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": db.LOCK_PUBLISHER})
                    lock_conn.commit()
                except DBAPIError as exc:  # the session ends anyway, and with it the lock
                    log.debug("advisory unlock: %s", exc)
            lock_conn.close()

    def _round(self) -> int:
        """Steps 2-6 of one publish round (the caller holds Step 1's lock)."""
        producer, ledger_consumer = self._clients()
        try:
            producer.init_transactions(60)  # Step 2
            ledger_tp = TopicPartition(self.topic, 0)
            (committed,) = kafka_io.committed_offsets(ledger_consumer, [ledger_tp])  # Step 3
            last_round = max(committed.offset, 0)
            next_round = last_round + 1
            confirmed, rows = self._claim(last_round, next_round)  # Step 4
            if confirmed:
                log.info(
                    "round %d of budget events was published before a crash: %d marked sent", last_round, confirmed
                )
            if not rows:
                return 0
            self._publish(producer, ledger_consumer, rows, next_round)  # Step 5
            self.rounds += 1
            if self.fault:
                self.fault.hit(BUDGET_AFTER_EVENTS_COMMIT, self.rounds, len(rows))
            self._mark_sent(next_round)  # Step 6
            log.info(
                "published %d budget events (round %d) to %s: %s",
                len(rows),
                next_round,
                self.topic,
                ", ".join(f"{r['ad_id']}@{r['period']}" for r in rows[:20]) + (" ..." if len(rows) > 20 else ""),
            )
            return len(rows)
        except KafkaException as exc:
            log.error("publishing budget events failed (they stay in the outbox and are retried): %s", exc)
            try:
                producer.abort_transaction(10)
            except KafkaException:
                pass
            return 0
        finally:
            ledger_consumer.close()
            producer.flush(5)

    def _clients(self) -> tuple[Producer, Consumer]:
        """A fresh transactional producer (its ``init_transactions`` is the
        fence of Step 2) and a consumer of the ledger group (Steps 3 and 5)."""
        bootstrap = self.settings.kafka_bootstrap
        producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "transactional.id": self.transactional_id,
                "enable.idempotence": True,
                "acks": "all",
                "transaction.timeout.ms": 60_000,
                "partitioner": "murmur2_random",
            }
        )
        ledger_consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": self.ledger_group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        return producer, ledger_consumer

    def _claim(self, last_round: int, next_round: int) -> tuple[int, Sequence[RowMapping]]:
        """Step 4, one database transaction: returns how many rows of round
        ``last_round`` were confirmed sent, and the rows claimed for
        ``next_round``."""
        with self.engine.begin() as conn:
            confirmed = conn.execute(
                sa.update(db.pauses)
                .where(db.pauses.c.round == last_round, db.pauses.c.sent_at.is_(None))
                .values(sent_at=sa.func.now())
            ).rowcount
            conn.execute(sa.update(db.pauses).where(db.pauses.c.sent_at.is_(None)).values(round=next_round))
            rows = (
                conn.execute(
                    sa.select(db.pauses)
                    .where(db.pauses.c.round == next_round, db.pauses.c.sent_at.is_(None))
                    .order_by(db.pauses.c.ad_id, db.pauses.c.period)
                )
                .mappings()
                .all()
            )
        return confirmed, rows

    def _publish(
        self, producer: Producer, ledger_consumer: Consumer, rows: Sequence[RowMapping], next_round: int
    ) -> None:
        """Step 5, one Kafka transaction: the round's events and the ledger
        offset ``next_round`` commit together, or neither."""
        producer.begin_transaction()
        for row in rows:
            producer.produce(self.topic, json.dumps(self.event(row)).encode(), row["ad_id"].encode())
        producer.flush(60)
        producer.send_offsets_to_transaction(
            [TopicPartition(self.topic, 0, next_round, json.dumps({"round": next_round}))],
            ledger_consumer.consumer_group_metadata(),
            60,
        )
        producer.commit_transaction(60)

    def _mark_sent(self, next_round: int) -> None:
        """Step 6: the round is in Kafka; its outbox rows are done."""
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(db.pauses)
                .where(db.pauses.c.round == next_round, db.pauses.c.sent_at.is_(None))
                .values(sent_at=sa.func.now())
            )

    @staticmethod
    def event(row: dict) -> dict:
        return {
            "event_id": row["event_id"],
            "event_type": "ad_paused",
            "ad_id": row["ad_id"],
            "period": row["period"],
            "spend_micros": row["spend_micros"],
            "budget_micros": row["budget_micros"],
            "spend": format_micros(row["spend_micros"]),
            "budget": format_micros(row["budget_micros"]),
            "reached_by_record_uuid": row["record_uuid"],
            "window_start": row["window_start"],
        }
