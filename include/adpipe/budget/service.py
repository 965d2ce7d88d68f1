"""The ad budget service: exactly-once spend from ``ad-aggregates`` into a
database, and a budget event once per change of an ad's pause state.

It consumes the aggregates topic with ``isolation.level=read_committed``
(aborted output of the stream job is never seen), in a consumer group that
several instances share. The database, not Kafka, holds the consumer's
position: ``budget_offsets`` is written in the same transaction as the
ledger rows it covers, and every partition assignment starts from it.

This module is the consume loop (:class:`BudgetService`); its parts are
:mod:`~adpipe.budget.assignment` (the partitions held, where each reads
from, gaps), :mod:`~adpipe.budget.commit` (the commit protocol of one
batch, Steps 1-9, and what a crash leaves behind),
:mod:`~adpipe.budget.outage` (a database outage waited out),
:mod:`~adpipe.budget.stats` (metrics, batch log lines, totals) and
:mod:`~adpipe.budget.events` (the publisher thread).

Faults, by kind (``db.fault_kind``)
  - **data**: the database refuses something in the batch that validation
    let through. The batch is split in halves, each its own transaction,
    until the one record is found; it is quarantined as ``rejected`` with
    the database's reason and the rest is charged. Data never stops the
    service (:mod:`~adpipe.budget.commit`).
  - **transient** (connection lost or refused, serialization failure,
    deadlock, admin shutdown, statement timeout): consumption pauses (the
    consumer keeps polling, so the group does not rebalance) and the same
    batch is retried with backoff for up to ``ADPIPE_BUDGET_DB_OUTAGE_S``;
    then the service gives up (exit 1; its partitions move to the others)
    (:mod:`~adpipe.budget.outage`).
  - **fatal** (a missing table, a permission): retrying cannot help; the
    service stops with the error.

Gaps (offsets deleted by retention before they were charged) are recorded,
logged as an error and alerted, never skipped silently
(:mod:`~adpipe.budget.assignment`).
"""

from __future__ import annotations

import logging
import signal
import threading
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Message

from adpipe import kafka_io
from adpipe.budget import db, schema
from adpipe.budget.assignment import Assignment
from adpipe.budget.batch import stored_offsets
from adpipe.budget.commit import BatchCommitter
from adpipe.budget.events import EventPublisher
from adpipe.budget.outage import OutageGuard, StopRequested
from adpipe.budget.stats import ServiceStats
from adpipe.faults import FaultPlan
from adpipe.settings import Settings

# Named after the part: operators grep "adpipe.budget: batch N".
log = logging.getLogger("adpipe.budget")


class BudgetService:
    """One instance of ``adpipe budget``; see the module doc."""

    def __init__(self, settings: Settings, once: bool = False, fault: FaultPlan | None = None) -> None:
        self.settings = settings
        self.once = once
        self.fault = fault
        self.topic = settings.topics.aggregates
        self.stop = threading.Event()
        self.engine = db.make_engine(settings)
        self.assignment = Assignment(settings, self.engine)
        self.outage = OutageGuard(settings, self.stop, self.assignment)
        self.stats = ServiceStats(settings)
        self.committer = BatchCommitter(settings, self.engine, self.assignment, self.outage, self.stats, fault)
        self.publisher: EventPublisher | None = None

    def _consumer(self) -> Consumer:
        s = self.settings
        config = {
            **s.kafka.client_config(),
            "group.id": s.budget_group,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            # Positions come from the database; an out-of-range one is a
            # gap to report (see the module doc), never a silent jump.
            "auto.offset.reset": "error",
            "enable.partition.eof": True,
            "max.poll.interval.ms": max(s.budget_max_poll_interval_ms, s.budget_session_timeout_ms),
        }
        if s.budget_incremental:
            # The session and heartbeat are the group's (_configure_group).
            config["group.protocol"] = "consumer"
        else:
            config.update({
                "session.timeout.ms": s.budget_session_timeout_ms,
                "heartbeat.interval.ms": s.budget_heartbeat_interval_ms,
                "partition.assignment.strategy": "range",
            })
        return Consumer(config)

    def _configure_group(self) -> None:
        """Under the consumer protocol, the group's session timeout and
        heartbeat interval: set by each instance at start (the same values),
        as the broker allows. Refused, the broker's defaults hold (45 s, 5 s
        in Kafka 4), and a killed instance's partitions wait that long."""
        s = self.settings
        if not s.budget_incremental:
            return
        try:
            kafka_io.configure_group_session(
                s.kafka, s.budget_group, s.budget_session_timeout_ms, s.budget_heartbeat_interval_ms
            )
        except KafkaException as exc:
            log.warning(
                "group %s: the broker refused a session timeout of %d ms and a heartbeat of %d ms (%s); its own "
                "group.consumer.session.timeout.ms holds, and a killed instance's partitions move after it",
                s.budget_group, s.budget_session_timeout_ms, s.budget_heartbeat_interval_ms, exc.args[0].str(),
            )
            return
        log.info(
            "group %s (consumer protocol): session timeout %d ms, heartbeat %d ms",
            s.budget_group, s.budget_session_timeout_ms, s.budget_heartbeat_interval_ms,
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
        self.stats.serve()
        kafka_io.ensure_topics(s.kafka, [self.topic, s.topics.budget_events], s.topic_partitions)
        try:
            publisher_id = self.outage.with_db("start-up", lambda: schema.ensure_schema(self.engine, s))
        except StopRequested:
            return 0
        stop_publisher = threading.Event()
        self.publisher = self.committer.publisher = publisher = EventPublisher(
            s, self.engine, publisher_id, self.fault
        )
        publisher.start(stop_publisher)
        log.info(
            "budget service: group %s reading %s (read_committed) into %s; budget period %s; batch size %d",
            s.budget_group,
            self.topic,
            self.engine.url.render_as_string(hide_password=True),
            s.budget_period,
            s.budget_batch_size,
        )
        assignment = self.assignment
        self._configure_group()
        assignment.consumer = consumer = self._consumer()
        consumer.subscribe(
            [self.topic], on_assign=assignment.on_assign, on_revoke=assignment.on_revoke, on_lost=assignment.on_lost
        )
        deadline = time.monotonic() + once_timeout_s
        once_ends = kafka_io.end_offsets(s.kafka, self.topic, "read_committed") if self.once else {}
        next_check = 0.0
        try:
            while not self.stop.is_set():
                assignment.position_unpositioned()
                batch = self._poll(consumer)
                if batch:
                    self.committer.apply(batch)
                self.stats.positions(consumer, assignment)
                if self.once:
                    if assignment.drained() and time.monotonic() >= next_check:
                        next_check = time.monotonic() + 1.0
                        if self._charged_elsewhere(once_ends):
                            log.info("--once: every assigned partition %s is drained, and the rest of %s is "
                                     "charged to where it ended at the start", sorted(assignment.started_from),
                                     self.topic)
                            break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"--once: not drained within {once_timeout_s:.0f}s")
        except StopRequested as exc:
            log.info("%s", exc)
        finally:
            consumer.close()
            assignment.consumer = None
            stop_publisher.set()
            publisher.wake.set()
            publisher.join()
        self.stats.stopped(self.committer.batches)
        self.engine.dispose()
        return 0

    def _charged_elsewhere(self, ends: dict[int, int]) -> bool:
        """--once: whether the partitions this instance does not hold have no
        readable record below ``ends`` (where they ended at the start) past
        their database offsets. Another instance holds them, or a dead one
        does until its session expires (the consumer protocol then hands
        them to this one): --once waits for them, as for its own."""
        others = {p: end for p, end in ends.items() if end and p not in self.assignment.started_from}
        if not others:
            return True
        try:
            with self.engine.connect() as conn:
                stored = stored_offsets(conn, self.settings.budget_group, self.topic, sorted(others))
            ranges = {p: (stored.get(p, 0), end) for p, end in others.items()}
            return not kafka_io.readable_partitions(self.settings.kafka, self.topic, ranges)
        except Exception as exc:  # noqa: BLE001 - asked again a second later
            log.debug("--once: the other partitions' offsets: %s", exc)
            return False

    def _poll(self, consumer: Consumer) -> list[Message]:
        """One consume call: the messages of partitions positioned for this
        instance. EOF marks a partition drained; an out-of-range position
        is positioned again (a gap, reported); a fatal error raises."""
        assignment = self.assignment
        batch = []
        for msg in consumer.consume(self.settings.budget_batch_size, 1.0):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    assignment.at_eof.add(msg.partition())
                elif err.code() == KafkaError._AUTO_OFFSET_RESET:
                    assignment.out_of_range(msg.partition(), err)
                elif err.fatal():
                    if self.settings.budget_incremental:
                        log.error("consumer: fatal %s; a broker older than Kafka 4.0 has no consumer group "
                                  "protocol (KIP-848): ADPIPE_BUDGET_GROUP_PROTOCOL=classic", err)
                    raise KafkaException(err)
                else:
                    log.warning("consumer: %s", err)
                continue
            # A message fetched before its partition was revoked (or
            # re-positioned) is not ours to apply.
            if msg.partition() in assignment.started_from:
                assignment.at_eof.discard(msg.partition())
                batch.append(msg)
        return batch
