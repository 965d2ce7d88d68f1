"""The ad budget service: exactly-once spend from ``ad-aggregates`` into a
database, and a budget event once per ad and budget period.

It consumes the aggregates topic with ``isolation.level=read_committed``
(aborted output of the stream job is never seen), in a consumer group that
several instances share. The database, not Kafka, holds the consumer's
position: ``budget_offsets`` is written in the same transaction as the
ledger rows it covers, and every partition assignment starts from it.

Commit protocol for one batch (``BudgetService.apply``):

  Step 1. Lock this batch's partitions' rows of ``budget_offsets``
          (``SELECT ... FOR UPDATE``) and compare each with the offset this
          instance started the partition from. A partition whose row moved
          (another instance applied it meanwhile: a rebalance this instance
          has not seen yet, or it is a zombie) is dropped from the batch and
          re-sought after the transaction: nothing is applied twice, nothing
          is skipped.
  Step 2. Parse; an aggregate that is not valid JSON of the contract goes to
          ``budget_quarantine`` with the reason (and its offset is consumed).
  Step 3. Insert the ledger rows, insert-only by ``record_uuid``
          (``ON CONFLICT DO NOTHING RETURNING``): a record_uuid seen before, in
          this batch or any earlier one, is a no-op. The charge of each new
          row is priced now (money.spend_micros) and stored with it.
  Step 4. Add the new rows' charges to ``budget_spend`` per (ad, period).
  Step 5. For each (ad, period) whose new spend reached its budget, insert a
          ``budget_pauses`` row (primary key (ad_id, period): once).
  Step 6. Write the partitions' next offsets to ``budget_offsets``.
  Step 7. COMMIT: ledger, spend, pauses and offsets together, or nothing.
  Step 8. Commit the same offsets to Kafka (asynchronously; only for lag
          monitoring: nothing reads them back).
  Step 9. Publish the budget events of new pauses (``EventPublisher``).

If the process dies
  - before Step 7 completes: the transaction rolls back; the next owner of
    the partitions starts from the database's offsets and applies the batch;
  - between Steps 7 and 8 (``budget_after_db_commit``): Kafka's offsets are
    behind, but they are never used: the next assignment seeks to the
    database's offsets; a replay from older offsets would anyway only find
    record_uuids already in the ledger;
  - between 8 and 9: the pause rows wait in the outbox; every instance
    publishes pending rows at start, after batches and every few seconds.

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
import signal
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError

from adpipe import kafka_io
from adpipe.budget import db
from adpipe.budget.money import BadAggregate, parse_aggregate, period_of, spend_micros
from adpipe.faults import BUDGET_AFTER_DB_COMMIT, BUDGET_AFTER_EVENTS_COMMIT, BUDGET_BEFORE_DB_COMMIT, FaultPlan
from adpipe.money import format_micros
from adpipe.settings import Settings

# Named after the part: operators grep "adpipe.budget: batch N".
log = logging.getLogger("adpipe.budget")

PUBLISH_INTERVAL_S = 5.0
DB_ATTEMPTS = 5
EVENT_NAMESPACE = uuid.UUID("4d1f5b8e-5a39-4d0b-9a52-2f0c7f3b9e10")


def event_id(ad_id: str, period: str) -> str:
    """The budget event's id: the same for the same (ad, period), always."""
    return str(uuid.uuid5(EVENT_NAMESPACE, f"{ad_id}|{period}"))


@dataclass
class BatchResult:
    records: int = 0
    applied: int = 0
    duplicates: int = 0
    already_applied: int = 0
    quarantined: int = 0
    stale_partitions: dict[int, int | None] = field(default_factory=dict)
    spend_added_micros: int = 0
    paused: list[tuple[str, str]] = field(default_factory=list)
    next_offsets: dict[int, int] = field(default_factory=dict)


# ------------------------------------------------------------------ the batch


def apply_batch(
    conn: Connection,
    settings: Settings,
    topic: str,
    messages: Sequence[Message],
    started_from: dict[int, int | None],
) -> BatchResult:
    """Steps 1-6 of the module doc, inside the caller's transaction.

    ``started_from``: per partition, the offset this instance's consumption
    started from (the database's value when it was assigned or last applied;
    None: no row, read from the beginning)."""
    group = settings.budget_group
    result = BatchResult(records=len(messages))
    by_partition: dict[int, list[Message]] = defaultdict(list)
    for msg in messages:
        by_partition[msg.partition()].append(msg)

    # Step 1
    stored_rows = conn.execute(
        sa.select(db.offsets.c.kafka_partition, db.offsets.c.next_offset)
        .where(
            db.offsets.c.group_id == group,
            db.offsets.c.topic == topic,
            db.offsets.c.kafka_partition.in_(sorted(by_partition)),
        )
        .order_by(db.offsets.c.kafka_partition)
        .with_for_update()
    ).all()
    stored: dict[int, int] = {p: o for p, o in stored_rows}
    usable: list[Message] = []
    for p in sorted(by_partition):
        if stored.get(p) != started_from.get(p):
            result.stale_partitions[p] = stored.get(p)
            continue
        start = stored.get(p, -1)
        for msg in by_partition[p]:
            if msg.offset() < start:
                result.already_applied += 1
            else:
                usable.append(msg)
        result.next_offsets[p] = by_partition[p][-1].offset() + 1

    # Step 2
    parsed = []
    bad = []
    for msg in usable:
        try:
            parsed.append((parse_aggregate(msg.value()), msg))
        except BadAggregate as exc:
            raw = msg.value()
            bad.append(
                {
                    "kafka_topic": topic,
                    "kafka_partition": msg.partition(),
                    "kafka_offset": msg.offset(),
                    "group_id": group,
                    "reason": str(exc)[:500],
                    "value": None if raw is None else raw[:4000].decode("utf-8", "replace"),
                }
            )
    if bad:
        conn.execute(
            db.insert(conn, db.quarantine).on_conflict_do_nothing(
                index_elements=["kafka_topic", "kafka_partition", "kafka_offset"]
            ),
            bad,
        )
        result.quarantined = len(bad)
        for row in bad:
            log.warning("quarantined %s/%d/%d: %s", topic, row["kafka_partition"], row["kafka_offset"], row["reason"])

    # Step 3: dedupe in the batch first, then insert-only on the key.
    firsts: dict[str, tuple] = {}
    for agg, msg in parsed:
        if agg.record_uuid in firsts:
            result.duplicates += 1
        else:
            firsts[agg.record_uuid] = (agg, msg)
    prices = db.resolve_prices(conn, (agg.ad_id for agg, _ in firsts.values())) if firsts else {}
    rows = []
    for record_uuid in sorted(firsts):
        agg, msg = firsts[record_uuid]
        price = prices[agg.ad_id]
        rows.append(
            {
                "record_uuid": record_uuid,
                "ad_id": agg.ad_id,
                "window_start": agg.window_start,
                "period": period_of(agg.window_start, settings.budget_period),
                "impressions": agg.impressions,
                "clicks": agg.clicks,
                "cpm_micros": price.cpm_micros,
                "cpc_micros": price.cpc_micros,
                "spend_micros": spend_micros(agg.impressions, agg.clicks, price),
                "kafka_topic": topic,
                "kafka_partition": msg.partition(),
                "kafka_offset": msg.offset(),
            }
        )
    inserted: set[str] = set()
    if rows:
        stmt = (
            db.insert(conn, db.ledger)
            .on_conflict_do_nothing(index_elements=["record_uuid"])
            .returning(db.ledger.c.record_uuid)
        )
        inserted = {r[0] for r in conn.execute(stmt, rows)}
    result.applied = len(inserted)
    result.duplicates += len(rows) - len(inserted)

    # Step 4
    delta: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0])
    crossing_record: dict[tuple[str, str], dict] = {}
    for row in rows:
        if row["record_uuid"] in inserted:
            key = (row["ad_id"], row["period"])
            delta[key][0] += row["spend_micros"]
            delta[key][1] += 1
            crossing_record[key] = row
    new_spend: dict[tuple[str, str], int] = {}
    if delta:
        up = db.insert(conn, db.spend)
        up = up.on_conflict_do_update(
            index_elements=["ad_id", "period"],
            set_={
                "spend_micros": db.spend.c.spend_micros + up.excluded.spend_micros,
                "records": db.spend.c.records + up.excluded.records,
                "updated_at": sa.func.now(),
            },
        ).returning(db.spend.c.ad_id, db.spend.c.period, db.spend.c.spend_micros)
        values = [
            {"ad_id": a, "period": p, "spend_micros": d[0], "records": d[1]} for (a, p), d in sorted(delta.items())
        ]
        new_spend = {(a, p): s for a, p, s in conn.execute(up, values)}
        result.spend_added_micros = sum(d[0] for d in delta.values())

    # Step 5
    reached = []
    for key in sorted(new_spend):
        budget = prices[key[0]].budget_micros
        if budget is not None and new_spend[key] >= budget:
            row = crossing_record[key]
            reached.append(
                {
                    "ad_id": key[0],
                    "period": key[1],
                    "event_id": event_id(*key),
                    "spend_micros": new_spend[key],
                    "budget_micros": budget,
                    "record_uuid": row["record_uuid"],
                    "window_start": row["window_start"],
                }
            )
    if reached:
        stmt = (
            db.insert(conn, db.pauses)
            .on_conflict_do_nothing(index_elements=["ad_id", "period"])
            .returning(db.pauses.c.ad_id, db.pauses.c.period)
        )
        result.paused = sorted((a, p) for a, p in conn.execute(stmt, reached))

    # Step 6
    if result.next_offsets:
        up = db.insert(conn, db.offsets)
        up = up.on_conflict_do_update(
            index_elements=["group_id", "topic", "kafka_partition"],
            set_={"next_offset": up.excluded.next_offset, "updated_at": sa.func.now()},
        )
        conn.execute(
            up,
            [
                {"group_id": group, "topic": topic, "kafka_partition": p, "next_offset": o}
                for p, o in sorted(result.next_offsets.items())
            ],
        )
    return result


def stored_offsets(conn: Connection, group: str, topic: str, partitions: Sequence[int]) -> dict[int, int]:
    rows = conn.execute(
        sa.select(db.offsets.c.kafka_partition, db.offsets.c.next_offset).where(
            db.offsets.c.group_id == group,
            db.offsets.c.topic == topic,
            db.offsets.c.kafka_partition.in_(list(partitions)),
        )
    ).all()
    return {p: o for p, o in rows}


# ------------------------------------------------------------ budget events


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
        try:
            producer.init_transactions(60)  # Step 2
            ledger_tp = TopicPartition(self.topic, 0)
            (committed,) = kafka_io.committed_offsets(ledger_consumer, [ledger_tp])  # Step 3
            last_round = max(committed.offset, 0)
            next_round = last_round + 1
            with self.engine.begin() as conn:  # Step 4
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
            if confirmed:
                log.info(
                    "round %d of budget events was published before a crash: %d marked sent", last_round, confirmed
                )
            if not rows:
                return 0
            producer.begin_transaction()  # Step 5
            for row in rows:
                producer.produce(self.topic, json.dumps(self.event(row)).encode(), row["ad_id"].encode())
            producer.flush(60)
            producer.send_offsets_to_transaction(
                [TopicPartition(self.topic, 0, next_round, json.dumps({"round": next_round}))],
                ledger_consumer.consumer_group_metadata(),
                60,
            )
            producer.commit_transaction(60)
            self.rounds += 1
            if self.fault:
                self.fault.hit(BUDGET_AFTER_EVENTS_COMMIT, self.rounds, len(rows))
            with self.engine.begin() as conn:  # Step 6
                conn.execute(
                    sa.update(db.pauses)
                    .where(db.pauses.c.round == next_round, db.pauses.c.sent_at.is_(None))
                    .values(sent_at=sa.func.now())
                )
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


# --------------------------------------------------------------- the service


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
        for attempt in range(1, DB_ATTEMPTS + 1):
            try:
                with self.engine.begin() as conn:
                    result = apply_batch(conn, self.settings, self.topic, messages, dict(self.started_from))
                    if self.fault:
                        self.fault.hit(BUDGET_BEFORE_DB_COMMIT, self.batches, result.applied)
                # Step 7 done: committed.
                break
            except DBAPIError as exc:
                if attempt == DB_ATTEMPTS:
                    raise
                log.warning("batch %d: database transaction failed (attempt %d): %s", self.batches, attempt, exc)
                time.sleep(0.2 * attempt)
        if self.fault:
            self.fault.hit(BUDGET_AFTER_DB_COMMIT, self.batches, result.applied)
        for p, o in result.next_offsets.items():
            self.started_from[p] = o
        for p, o in result.stale_partitions.items():
            log.warning("partition %d: the database offset moved to %s (another instance applied it); re-seeking", p, o)
            self._seek(p, o)
        if result.next_offsets:  # Step 8
            assert self.consumer is not None
            try:
                self.consumer.commit(
                    offsets=[TopicPartition(self.topic, p, o) for p, o in sorted(result.next_offsets.items())],
                    asynchronous=True,
                )
            except KafkaException as exc:
                log.info("kafka offset commit (monitoring only) failed: %s", exc)
        for name in ("records", "applied", "duplicates", "already_applied", "quarantined"):
            self.totals[name] += getattr(result, name)
        self.totals["paused"] += len(result.paused)
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
        return result

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
        failures = 0
        try:
            while not self.stop.is_set():
                batch = []
                for msg in consumer.consume(s.budget_batch_size, 1.0):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            self.at_eof.add(msg.partition())
                        elif err.fatal():
                            raise KafkaException(err)
                        else:
                            log.warning("consumer: %s", err)
                        continue
                    if msg.partition() in self.started_from:
                        self.at_eof.discard(msg.partition())
                        batch.append(msg)
                if batch:
                    try:
                        result = self.apply(batch)
                        failures = 0
                    except DBAPIError as exc:
                        failures += 1
                        log.error(
                            "batch failed, re-reading it from the database offsets (%d in a row): %s", failures, exc
                        )
                        for p in {m.partition() for m in batch}:
                            if p in self.started_from:
                                self._seek(p, self.started_from[p])
                        if failures >= 10 or self.once:
                            raise
                        time.sleep(min(30.0, 2.0 * failures))
                        continue
                    if result.paused:
                        publisher.publish_pending()
                        last_publish = time.monotonic()
                if time.monotonic() - last_publish > PUBLISH_INTERVAL_S:
                    publisher.publish_pending()
                    last_publish = time.monotonic()
                if self.once:
                    if self.started_from and set(self.started_from) <= self.at_eof:
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


# ------------------------------------------------------------------ report


@dataclass(frozen=True)
class ReportRow:
    ad_id: str
    period: str
    spend_micros: int
    budget_micros: int | None
    records: int
    status: str


def report(settings: Settings) -> list[ReportRow] | None:
    """Spend, budget and status per ad and period; read-only. None when
    there is no budget database (or it has no tables) yet."""
    url = settings.budget_db
    if url.startswith("sqlite"):
        path = sa.engine.make_url(url).database
        if not path or not Path(path).exists():
            return None
    engine = db.make_engine(url)
    try:
        if not db.has_schema(engine):
            return None
        with engine.connect() as conn:
            spend_rows = conn.execute(
                sa.select(db.spend.c.ad_id, db.spend.c.period, db.spend.c.spend_micros, db.spend.c.records).order_by(
                    db.spend.c.ad_id, db.spend.c.period
                )
            ).all()
            paused = {(a, p) for a, p in conn.execute(sa.select(db.pauses.c.ad_id, db.pauses.c.period))}
            prices = db.resolve_prices(conn, {r[0] for r in spend_rows})
        return [
            ReportRow(a, p, s, prices[a].budget_micros, n, "paused" if (a, p) in paused else "active")
            for a, p, s, n in spend_rows
        ]
    finally:
        engine.dispose()


def format_report(rows: list[ReportRow]) -> str:
    lines = [f"{'ad_id':<20} {'period':<13} {'spend':>16} {'budget':>16} {'records':>8} status"]
    for r in rows:
        lines.append(
            f"{r.ad_id:<20} {r.period:<13} {format_micros(r.spend_micros):>16} {format_micros(r.budget_micros):>16} "
            f"{r.records:>8} {r.status}"
        )
    total = sum(r.spend_micros for r in rows)
    lines.append(
        f"{len({r.ad_id for r in rows})} ads, {sum(r.status == 'paused' for r in rows)} paused, "
        f"total spend {format_micros(total)}"
    )
    return "\n".join(lines)
