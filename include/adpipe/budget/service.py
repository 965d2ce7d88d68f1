"""The ad budget service: exactly-once spend from ``ad-aggregates`` into a
database, and a budget event once per ad and budget period.

It consumes the aggregates topic with ``isolation.level=read_committed``
(aborted output of the stream job is never seen), in a consumer group that
several instances share. The database, not Kafka, holds the consumer's
position: ``budget_offsets`` is written in the same transaction as the
ledger rows it covers, and every partition assignment starts from it.

Commit protocol for one batch (``BudgetService.apply``):

  Steps 1-6. In one database transaction: claim the partitions' offset rows
          (dropping partitions another instance moved), parse or quarantine,
          insert-only ledger rows, spend per (ad, period), pause rows for
          budgets reached, next offsets. See :mod:`adpipe.budget.batch`
          (``apply_batch``) for each step.
  Step 7. COMMIT: ledger, spend, pauses and offsets together, or nothing.
  Step 8. Commit the same offsets to Kafka (asynchronously; only for lag
          monitoring: nothing reads them back).
  Step 9. Publish the budget events of new pauses (``EventPublisher``; its
          publish round and its crash cases are in :mod:`adpipe.budget.events`).

If the process dies
  - before Step 7 completes: the transaction rolls back; the next owner of
    the partitions starts from the database's offsets and applies the batch;
  - between Steps 7 and 8 (``budget_after_db_commit``): Kafka's offsets are
    behind, but they are never used: the next assignment seeks to the
    database's offsets; a replay from older offsets would anyway only find
    record_uuids already in the ledger;
  - between 8 and 9: the pause rows wait in the outbox; every instance
    publishes pending rows at start, after batches and every few seconds.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import defaultdict

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition
from sqlalchemy.exc import DBAPIError

from adpipe import kafka_io
from adpipe.budget import db
from adpipe.budget.batch import BatchResult, apply_batch, stored_offsets
from adpipe.budget.events import EventPublisher
from adpipe.faults import BUDGET_AFTER_DB_COMMIT, BUDGET_BEFORE_DB_COMMIT, FaultPlan
from adpipe.money import format_micros
from adpipe.settings import Settings

# Named after the part: operators grep "adpipe.budget: batch N".
log = logging.getLogger("adpipe.budget")

PUBLISH_INTERVAL_S = 5.0
DB_ATTEMPTS = 5


class BudgetService:
    """One instance of ``adpipe budget``; see the module doc."""

    def __init__(self, settings: Settings, once: bool = False, fault: FaultPlan | None = None) -> None:
        self.settings = settings
        self.once = once
        self.fault = fault
        self.topic = settings.topics.aggregates
        self.stop = threading.Event()
        self.engine = db.make_engine(settings.budget_db)
        # partition -> the database offset this instance's reading started from
        self.started_from: dict[int, int | None] = {}
        self.at_eof: set[int] = set()
        self.batches = 0
        self.totals: dict[str, int] = defaultdict(int)
        self.consumer: Consumer | None = None
        # failed batches in a row (run() gives up at 10)
        self.failures = 0

    # on_assign: start every partition at the database's offset.
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        mine = [tp for tp in partitions if tp.topic == self.topic]
        with self.engine.connect() as conn:
            stored = stored_offsets(conn, self.settings.budget_group, self.topic, [tp.partition for tp in mine])
        for tp in mine:
            tp.offset = stored.get(tp.partition, OFFSET_BEGINNING)
            self.started_from[tp.partition] = stored.get(tp.partition)
            self.at_eof.discard(tp.partition)
        consumer.assign(partitions)
        log.info(
            "assigned partitions %s of %s at database offsets %s; assignment now %s",
            sorted(tp.partition for tp in mine),
            self.topic,
            {tp.partition: stored.get(tp.partition, "beginning") for tp in mine},
            sorted(self.started_from),
        )

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.started_from.pop(tp.partition, None)
            self.at_eof.discard(tp.partition)
        log.info(
            "revoked partitions %s; assignment now %s",
            sorted(tp.partition for tp in partitions),
            sorted(self.started_from),
        )

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.warning("partitions %s lost (session expired)", sorted(tp.partition for tp in partitions))
        self._on_revoke(consumer, partitions)

    def _seek(self, partition: int, offset: int | None) -> None:
        assert self.consumer is not None
        self.consumer.seek(TopicPartition(self.topic, partition, OFFSET_BEGINNING if offset is None else offset))
        self.started_from[partition] = offset
        self.at_eof.discard(partition)

    def apply(self, messages: list[Message]) -> BatchResult:
        """One batch: Steps 1-9 of the module doc, with retries of the
        database transaction (deadlocks, lost connections)."""
        self.batches += 1
        started = time.monotonic()
        result = self._commit_batch(messages)  # Steps 1-7
        if self.fault:
            self.fault.hit(BUDGET_AFTER_DB_COMMIT, self.batches, result.applied)
        self._after_commit(result)  # Step 8, and this instance's positions and totals
        self._log_batch(result, started)
        return result

    def _commit_batch(self, messages: list[Message]) -> BatchResult:
        """Steps 1-7: one database transaction, retried up to DB_ATTEMPTS
        times; the last failure propagates."""
        for attempt in range(1, DB_ATTEMPTS + 1):
            try:
                with self.engine.begin() as conn:
                    result = apply_batch(conn, self.settings, self.topic, messages, dict(self.started_from))
                    if self.fault:
                        self.fault.hit(BUDGET_BEFORE_DB_COMMIT, self.batches, result.applied)
                # Step 7 done: committed.
                return result
            except DBAPIError as exc:
                if attempt == DB_ATTEMPTS:
                    raise
                log.warning("batch %d: database transaction failed (attempt %d): %s", self.batches, attempt, exc)
                time.sleep(0.2 * attempt)
        raise AssertionError("unreachable: the last attempt re-raises")

    def _after_commit(self, result: BatchResult) -> None:
        """The committed offsets become this instance's starting points, stale
        partitions are re-sought, Step 8, and the totals."""
        for p, o in result.next_offsets.items():
            self.started_from[p] = o
        for p, o in result.stale_partitions.items():
            log.warning("partition %d: the database offset moved to %s (another instance applied it); re-seeking", p, o)
            self._seek(p, o)
        if result.next_offsets:  # Step 8
            self._commit_kafka_offsets(result.next_offsets)
        for name in ("records", "applied", "duplicates", "already_applied", "quarantined"):
            self.totals[name] += getattr(result, name)
        self.totals["paused"] += len(result.paused)

    def _commit_kafka_offsets(self, next_offsets: dict[int, int]) -> None:
        """Step 8: only for lag monitoring, so a failure is logged, not raised."""
        assert self.consumer is not None
        try:
            self.consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in sorted(next_offsets.items())],
                asynchronous=True,
            )
        except KafkaException as exc:
            log.info("kafka offset commit (monitoring only) failed: %s", exc)

    def _log_batch(self, result: BatchResult, started: float) -> None:
        log.info(
            "batch %d: %d records: %d applied (spend +%s), %d duplicate record_uuids skipped, %d already applied, "
            "%d quarantined, %d ads paused%s; offsets %s; %.0f ms",
            self.batches,
            result.records,
            result.applied,
            format_micros(result.spend_added_micros),
            result.duplicates,
            result.already_applied,
            result.quarantined,
            len(result.paused),
            (" (" + ", ".join(f"{a}@{p}" for a, p in result.paused[:10]) + ")") if result.paused else "",
            dict(sorted(result.next_offsets.items())),
            (time.monotonic() - started) * 1000,
        )

    def _consumer(self) -> Consumer:
        s = self.settings
        return Consumer(
            {
                "bootstrap.servers": s.kafka_bootstrap,
                "group.id": s.budget_group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,
                "session.timeout.ms": s.budget_session_timeout_ms,
                "heartbeat.interval.ms": max(1000, s.budget_session_timeout_ms // 5),
                "partition.assignment.strategy": "range",
            }
        )

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def _stop(signum: int, _frame: object) -> None:
            log.info("signal %d: stopping after the current batch", signum)
            self.stop.set()

        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)

    def run(self, once_timeout_s: float = 300.0) -> int:
        s = self.settings
        self._install_signals()
        kafka_io.ensure_topics(s.kafka_bootstrap, [self.topic, s.topics.budget_events], s.topic_partitions)
        publisher_id = db.ensure_schema(self.engine, s)
        publisher = EventPublisher(s, self.engine, publisher_id, self.fault)
        publisher.publish_pending()
        log.info(
            "budget service: group %s reading %s (read_committed) into %s; budget period %s; batch size %d",
            s.budget_group,
            self.topic,
            self.engine.url.render_as_string(hide_password=True),
            s.budget_period,
            s.budget_batch_size,
        )
        self.consumer = consumer = self._consumer()
        consumer.subscribe([self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost)
        deadline = time.monotonic() + once_timeout_s
        last_publish = time.monotonic()
        self.failures = 0
        try:
            while not self.stop.is_set():
                batch = self._poll(consumer)
                if batch:
                    result = self._apply_or_rewind(batch)
                    if result is None:  # rewound: read the batch again before anything else
                        continue
                    if result.paused:
                        publisher.publish_pending()
                        last_publish = time.monotonic()
                if time.monotonic() - last_publish > PUBLISH_INTERVAL_S:
                    publisher.publish_pending()
                    last_publish = time.monotonic()
                if self.once:
                    if self._drained():
                        log.info("--once: every assigned partition %s is drained", sorted(self.started_from))
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"--once: not drained within {once_timeout_s:.0f}s")
        finally:
            consumer.close()
            self.consumer = None
        publisher.publish_pending()
        log.info(
            "budget service stopped: %d batches, %s",
            self.batches,
            ", ".join(f"{k} {v}" for k, v in sorted(self.totals.items())),
        )
        self.engine.dispose()
        return 0

    def _poll(self, consumer: Consumer) -> list[Message]:
        """One consume call: the messages of partitions assigned to this
        instance. EOF marks a partition drained; a fatal error raises."""
        batch = []
        for msg in consumer.consume(self.settings.budget_batch_size, 1.0):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self.at_eof.add(msg.partition())
                elif err.fatal():
                    raise KafkaException(err)
                else:
                    log.warning("consumer: %s", err)
                continue
            # A message fetched before its partition was revoked is not ours to apply.
            if msg.partition() in self.started_from:
                self.at_eof.discard(msg.partition())
                batch.append(msg)
        return batch

    def _apply_or_rewind(self, batch: list[Message]) -> BatchResult | None:
        """``apply``; when its database transaction fails for good, seek the
        batch's partitions back to the database's offsets and back off
        (None). Ten failures in a row, or one under --once, raise."""
        try:
            result = self.apply(batch)
        except DBAPIError as exc:
            self.failures += 1
            log.error("batch failed, re-reading it from the database offsets (%d in a row): %s", self.failures, exc)
            for p in {m.partition() for m in batch}:
                if p in self.started_from:
                    self._seek(p, self.started_from[p])
            if self.failures >= 10 or self.once:
                raise
            time.sleep(min(30.0, 2.0 * self.failures))
            return None
        self.failures = 0
        return result

    def _drained(self) -> bool:
        """--once: every assigned partition has reached its end."""
        return bool(self.started_from) and set(self.started_from) <= self.at_eof
