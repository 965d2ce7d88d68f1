"""The ad budget service: exactly-once spend from ``ad-aggregates`` into a
database, and a budget event once per change of an ad's pause state.

It consumes the aggregates topic with ``isolation.level=read_committed``
(aborted output of the stream job is never seen), in a consumer group that
several instances share. The database, not Kafka, holds the consumer's
position: ``budget_offsets`` is written in the same transaction as the
ledger rows it covers, and every partition assignment starts from it.

Commit protocol for one batch (``BudgetService.apply``):

  Steps 1-6. In one database transaction: claim the partitions' offset rows
          (dropping partitions another instance moved), parse, validate or
          quarantine, insert-only ledger rows, spend per (ad, period), pause
          transitions, next offsets by compare-and-set. See
          :mod:`adpipe.budget.batch` (``apply_batch``) for each step.
  Step 7. COMMIT: ledger, spend, pauses and offsets together, or nothing.
  Step 8. Commit the same offsets to Kafka (asynchronously; only for lag
          monitoring: nothing reads them back).
  Step 9. Wake the publisher thread (:mod:`adpipe.budget.events`), which
          publishes the outbox on its own thread.

If the process dies
  - before Step 7 completes: the transaction rolls back; the next owner of
    the partitions starts from the database's offsets and applies the batch;
  - between Steps 7 and 8 (``budget_after_db_commit``): Kafka's offsets are
    behind, but they are never used: the next assignment seeks to the
    database's offsets; a replay from older offsets would anyway only find
    record_uuids already in the ledger;
  - between 8 and 9: the transitions wait in the outbox; every instance's
    publisher thread publishes pending rows every few seconds.

Faults, by kind (``db.fault_kind``)
  - **data**: the database refuses something in the batch that validation
    let through. The batch is split in halves, each its own transaction,
    until the one record is found; it is quarantined as ``rejected`` with
    the database's reason and the rest is charged. Data never stops the
    service.
  - **transient** (connection lost or refused, serialization failure,
    deadlock, admin shutdown, statement timeout): consumption pauses (the
    consumer keeps polling, so the group does not rebalance) and the same
    batch is retried with backoff for up to ``ADPIPE_BUDGET_DB_OUTAGE_S``;
    then the service gives up (exit 1; its partitions move to the others).
  - **fatal** (a missing table, a permission): retrying cannot help; the
    service stops with the error.

Gaps: ``auto.offset.reset`` is ``error``. A partition whose database offset
(0 when it has no row) is below the log start offset lost records to
retention before they were charged: the gap is recorded in ``budget_gaps``
with the number of offsets lost, in the same transaction that moves the
offset to the log start, logged as an error and sent as an alert
(``adpipe.alerting``); ``verify`` fails while it is there. Never skipped
silently.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition

from adpipe import alerting, kafka_io, metrics
from adpipe.budget import db
from adpipe.budget.batch import BatchResult, StaleOffsets, apply_batch, record_gap, stored_offsets
from adpipe.budget.events import EventPublisher
from adpipe.faults import BUDGET_AFTER_DB_COMMIT, BUDGET_BEFORE_DB_COMMIT, BUDGET_BEFORE_DB_TRANSACTION, FaultPlan
from adpipe.money import format_micros
from adpipe.settings import Settings

# Named after the part: operators grep "adpipe.budget: batch N".
log = logging.getLogger("adpipe.budget")

T = TypeVar("T")
MAX_BACKOFF_S = 15.0


class DatabaseOutage(RuntimeError):
    """The database stayed unavailable longer than ADPIPE_BUDGET_DB_OUTAGE_S."""


class StopRequested(RuntimeError):
    """SIGTERM while waiting out an outage: stop without applying."""


class BudgetService:
    """One instance of ``adpipe budget``; see the module doc."""

    def __init__(self, settings: Settings, once: bool = False, fault: FaultPlan | None = None) -> None:
        self.settings = settings
        self.once = once
        self.fault = fault
        self.topic = settings.topics.aggregates
        self.stop = threading.Event()
        self.engine = db.make_engine(settings)
        # partition -> the database offset this instance's reading started from
        self.started_from: dict[int, int | None] = {}
        # assigned partitions not positioned at their database offset yet
        # (the database or the broker failed at assignment): paused
        self.unpositioned: set[int] = set()
        self.at_eof: set[int] = set()
        self.batches = 0
        self.totals: dict[str, int] = defaultdict(int)
        self.consumer: Consumer | None = None
        self.publisher: EventPublisher | None = None
        self.paused_for_outage = False
        self.metrics = metrics.budget(settings)

    # ------------------------------------------------------------ assignment

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        mine = [tp for tp in partitions if tp.topic == self.topic]
        try:
            starts = self._positions([tp.partition for tp in mine])
        except Exception as exc:  # noqa: BLE001 - never fail a rebalance: position them later
            log.warning(
                "assigned partitions %s, but their database offsets cannot be read now (%s); "
                "they stay paused until they can",
                sorted(tp.partition for tp in mine),
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            consumer.assign(partitions)
            consumer.pause(mine)
            for tp in mine:
                self.started_from.pop(tp.partition, None)
                self.unpositioned.add(tp.partition)
                self.at_eof.discard(tp.partition)
            return
        for tp in mine:
            tp.offset = OFFSET_BEGINNING if starts[tp.partition] is None else starts[tp.partition]
            self.started_from[tp.partition] = starts[tp.partition]
            self.unpositioned.discard(tp.partition)
            self.at_eof.discard(tp.partition)
        consumer.assign(partitions)
        if self.paused_for_outage:
            consumer.pause(mine)
        log.info(
            "assigned partitions %s of %s at database offsets %s; assignment now %s",
            sorted(tp.partition for tp in mine),
            self.topic,
            {tp.partition: "beginning" if starts[tp.partition] is None else starts[tp.partition] for tp in mine},
            sorted(self.started_from),
        )

    def _on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.started_from.pop(tp.partition, None)
            self.unpositioned.discard(tp.partition)
            self.at_eof.discard(tp.partition)
        log.info(
            "revoked partitions %s; assignment now %s",
            sorted(tp.partition for tp in partitions),
            sorted(self.started_from),
        )

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.warning("partitions %s lost (session expired)", sorted(tp.partition for tp in partitions))
        self._on_revoke(consumer, partitions)

    def _positions(self, partitions: list[int]) -> dict[int, int | None]:
        """Where each partition starts: its database offset, moved to the log
        start (and the gap recorded and alerted) when retention deleted
        records it had not charged."""
        with self.engine.connect() as conn:
            stored = stored_offsets(conn, self.settings.budget_group, self.topic, partitions)
        starts: dict[int, int | None] = {p: stored.get(p) for p in partitions}
        assert self.consumer is not None
        for p in partitions:
            low, _high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10, cached=False)
            expected = stored.get(p)
            if (expected or 0) < low:
                with self.engine.begin() as conn:
                    lost = record_gap(conn, self.settings.budget_group, self.topic, p, expected, low)
                self._alert_gap(p, expected or 0, low, lost)
                starts[p] = low
        return starts

    def _alert_gap(self, partition: int, from_offset: int, to_offset: int, lost: int) -> None:
        message = (
            f"budget: {self.topic}[{partition}] offsets {from_offset}..{to_offset - 1} were deleted by retention "
            f"before consumer group {self.settings.budget_group} charged them: {lost} offsets (records, or "
            "transaction markers) lost; recorded in budget_gaps; continuing from the log start"
        )
        log.error(message)
        alerting.send_alert(
            self.settings,
            {
                "at": datetime.now(UTC).isoformat(),
                "level": "service",
                "source": "adpipe.budget",
                # The keys every alert has (a DAG's alerts fill them).
                "dag_id": None,
                "run_id": None,
                "task_id": None,
                "kind": "offset_gap",
                "group": self.settings.budget_group,
                "topic": self.topic,
                "partition": partition,
                "from_offset": from_offset,
                "to_offset": to_offset,
                "lost_offsets": lost,
                "message": message,
            },
        )

    def _position_unpositioned(self) -> None:
        """Position the partitions assignment could not, once the database
        (and broker) answer. They never started fetching (a seek would be
        refused), so the whole assignment is given again with positions: the
        others at their database offsets, which is where they stand."""
        if not self.unpositioned or self.consumer is None:
            return
        pending = sorted(self.unpositioned)
        try:
            starts = self._positions(pending)
        except Exception as exc:  # noqa: BLE001 - retried on the next loop
            log.debug("positioning %s: %s", pending, exc)
            return
        positions = {**{p: o for p, o in self.started_from.items()}, **starts}
        assigned = [tp.partition for tp in self.consumer.assignment() if tp.topic == self.topic]
        self.consumer.assign(
            [
                TopicPartition(self.topic, p, OFFSET_BEGINNING if positions[p] is None else positions[p])
                for p in sorted(assigned)
                if p in positions
            ]
        )
        for p in assigned:
            if p in positions:
                self.started_from[p] = positions[p]
                self.unpositioned.discard(p)
                self.at_eof.discard(p)
        # Pausing is kept per partition across assign(): set it either way.
        if self.paused_for_outage:
            self.consumer.pause(self.consumer.assignment())
        else:
            self.consumer.resume(self.consumer.assignment())
        for p in pending:
            log.info("partition %d positioned at database offset %s", p, starts[p])

    def _seek(self, partition: int, offset: int | None) -> bool:
        assert self.consumer is not None
        tp = TopicPartition(self.topic, partition, OFFSET_BEGINNING if offset is None else offset)
        try:
            self.consumer.seek(tp)
        except KafkaException as exc:  # e.g. not fetching yet: position it again on the next loop
            log.warning("partition %d: seek to %s failed (%s); retrying", partition, offset, exc)
            self.started_from.pop(partition, None)
            self.unpositioned.add(partition)
            self.consumer.pause([TopicPartition(self.topic, partition)])
            return False
        self.started_from[partition] = offset
        self.at_eof.discard(partition)
        return True

    # ------------------------------------------------------------ database faults

    def _with_db(self, what: str, action: Callable[[], T]) -> T:
        """``action`` (a database transaction), retried while the fault is
        transient, for up to ADPIPE_BUDGET_DB_OUTAGE_S, with consumption
        paused; other faults propagate."""
        deadline: float | None = None
        attempt = 0
        while True:
            try:
                result = action()
            except Exception as exc:
                if db.fault_kind(exc) != db.TRANSIENT:
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.settings.budget_db_outage_s
                    log.error(
                        "%s: database unavailable (%s); %s, retrying for up to %d s",
                        what,
                        str(exc).splitlines()[0],
                        "consumption paused" if self.consumer is not None else "not consuming yet",
                        self.settings.budget_db_outage_s,
                    )
                    self._pause_consumption()
                if now >= deadline:
                    raise DatabaseOutage(
                        f"{what}: the database was unavailable for more than {self.settings.budget_db_outage_s} s "
                        f"(ADPIPE_BUDGET_DB_OUTAGE_S): {str(exc).splitlines()[0]}"
                    ) from exc
                attempt += 1
                wait = min(MAX_BACKOFF_S, 0.5 * 2**attempt, max(0.0, deadline - now))
                log.warning("%s: attempt %d failed (%s); next in %.1f s", what, attempt, type(exc).__name__, wait)
                self._idle(wait)
                continue
            if deadline is not None:
                log.info("%s: the database answers again after %d attempts; consumption resumes", what, attempt + 1)
                self._resume_consumption()
            return result

    def _pause_consumption(self) -> None:
        self.paused_for_outage = True
        if self.consumer is not None:
            self.consumer.pause(self.consumer.assignment())

    def _resume_consumption(self) -> None:
        """Resume and re-seek every positioned partition to its database
        offset: what was fetched before the pause was dropped."""
        self.paused_for_outage = False
        if self.consumer is None:
            return
        for p, offset in sorted(self.started_from.items()):
            self._seek(p, offset)
        self.consumer.resume([TopicPartition(self.topic, p) for p in self.started_from])

    def _idle(self, seconds: float) -> None:
        """Wait, polling the (paused) consumer so the group keeps this member;
        whatever it returns is dropped (re-read after the resume)."""
        end = time.monotonic() + seconds
        while True:
            if self.stop.is_set():
                raise StopRequested("stop requested while the database was unavailable")
            left = end - time.monotonic()
            if left <= 0:
                return
            if self.consumer is not None:
                self.consumer.consume(100, min(1.0, left))
            else:
                time.sleep(min(1.0, left))

    # ------------------------------------------------------------ one batch

    def apply(self, messages: list[Message]) -> BatchResult:
        """One batch: Steps 1-9 of the module doc."""
        self.batches += 1
        started = time.monotonic()
        if self.fault:
            self.fault.hit(BUDGET_BEFORE_DB_TRANSACTION, self.batches, len(messages))
        result = self._commit_or_split(messages)  # Steps 1-7
        if self.fault:
            self.fault.hit(BUDGET_AFTER_DB_COMMIT, self.batches, result.applied)
        if result.next_offsets:  # Step 8
            self._commit_kafka_offsets(result.next_offsets)
        for name in ("records", "applied", "duplicates", "already_applied", "quarantined", "conflicts", "rejected"):
            self.totals[name] += getattr(result, name)
        self.totals["paused"] += len(result.paused)
        self.totals["resumed"] += len(result.transitions) - len(result.paused)
        if result.transitions and self.publisher is not None:  # Step 9
            self.publisher.wake.set()
        self.metrics.batch_applied(result, time.monotonic() - started)
        self._log_batch(result, started)
        return result

    def _transaction(self, messages: list[Message], rejected: dict[tuple[int, int], str] | None = None) -> BatchResult:
        """Steps 1-7 for the messages of partitions still assigned."""
        live = [m for m in messages if m.partition() in self.started_from]
        with self.engine.begin() as conn:
            result = apply_batch(conn, self.settings, self.topic, live, dict(self.started_from), rejected)
            result.records = len(messages)
            if self.fault:
                self.fault.hit(BUDGET_BEFORE_DB_COMMIT, self.batches, result.applied)
        return result

    def _commit_or_split(self, messages: list[Message]) -> BatchResult:
        """Commit the batch; when the database refuses its data, split it in
        halves until the record it refuses is alone, and quarantine that
        one. Each committed piece moves this instance's positions."""
        what = f"batch {self.batches}"
        try:
            result = self._with_db(what, lambda: self._transaction(messages))
        except StaleOffsets as exc:
            return self._rewind(messages, exc)
        except Exception as exc:
            if db.fault_kind(exc) != db.DATA:
                raise
            reason = _first_line(exc)
            if len(messages) == 1:
                msg = messages[0]
                log.error(
                    "%s: the database refused %s/%d/%d: %s; quarantined",
                    what,
                    self.topic,
                    msg.partition(),
                    msg.offset(),
                    reason,
                )
                rejected = {(msg.partition(), msg.offset()): f"the database refused it: {reason}"}
                result = self._with_db(what, lambda: self._transaction(messages, rejected))
            else:
                log.warning(
                    "%s: the database refused a record of %d (%s); splitting the batch to find it",
                    what,
                    len(messages),
                    reason,
                )
                half = len(messages) // 2
                first = self._commit_or_split(messages[:half])
                rest = [m for m in messages[half:] if m.partition() not in first.stale_partitions]
                second = self._commit_or_split(rest) if rest else BatchResult()
                merged = first.merge(second)
                merged.records = len(messages)
                return merged
        self._advance(result)
        return result

    def _rewind(self, messages: list[Message], exc: StaleOffsets) -> BatchResult:
        """Step 6 met an offsets row another instance created: nothing was
        committed; every partition of the batch goes back to its database
        offset."""
        partitions = sorted({m.partition() for m in messages})

        def read_stored() -> dict[int, int]:
            with self.engine.connect() as conn:
                return stored_offsets(conn, self.settings.budget_group, self.topic, partitions)

        stored = self._with_db(f"batch {self.batches}", read_stored)
        log.warning("%s; nothing of this batch applied, re-reading partitions %s", exc, partitions)
        result = BatchResult(records=len(messages))
        for p in partitions:
            if p in self.started_from:
                if stored.get(p) != self.started_from[p]:
                    result.stale_partitions[p] = stored.get(p)
                self._seek(p, stored.get(p))
        return result

    def _advance(self, result: BatchResult) -> None:
        """The committed offsets become this instance's starting points;
        stale partitions are re-sought."""
        for p, o in result.next_offsets.items():
            if p in self.started_from:
                self.started_from[p] = o
        for p, o in result.stale_partitions.items():
            log.warning(
                "partition %d: the database offset moved to %s (another instance applied it); "
                "this instance's records of it refused, re-seeking",
                p,
                o,
            )
            if p in self.started_from:
                self._seek(p, o)

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
            "%d quarantined (%d malformed, %d rejected, %d conflicts), %d ads paused%s, %d resumed; offsets %s; "
            "%.0f ms",
            self.batches,
            result.records,
            result.applied,
            format_micros(result.spend_added_micros),
            result.duplicates,
            result.already_applied,
            result.quarantined,
            result.malformed,
            result.rejected,
            result.conflicts,
            len(result.paused),
            (" (" + ", ".join(f"{a}@{p}" for a, p in result.paused[:10]) + ")") if result.paused else "",
            len(result.transitions) - len(result.paused),
            dict(sorted(result.next_offsets.items())),
            (time.monotonic() - started) * 1000,
        )

    # ------------------------------------------------------------ the loop

    def _consumer(self) -> Consumer:
        s = self.settings
        return Consumer(
            {
                **s.kafka.client_config(),
                "group.id": s.budget_group,
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                # Positions come from the database; an out-of-range one is a
                # gap to report (see the module doc), never a silent jump.
                "auto.offset.reset": "error",
                "enable.partition.eof": True,
                "session.timeout.ms": s.budget_session_timeout_ms,
                "max.poll.interval.ms": max(s.budget_max_poll_interval_ms, s.budget_session_timeout_ms),
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
        metrics.serve(metrics.BUDGET, s)
        kafka_io.ensure_topics(s.kafka, [self.topic, s.topics.budget_events], s.topic_partitions)
        try:
            publisher_id = self._with_db("start-up", lambda: db.ensure_schema(self.engine, s))
        except StopRequested:
            return 0
        stop_publisher = threading.Event()
        self.publisher = publisher = EventPublisher(s, self.engine, publisher_id, self.fault)
        publisher.start(stop_publisher)
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
        try:
            while not self.stop.is_set():
                self._position_unpositioned()
                batch = self._poll(consumer)
                if batch:
                    self.apply(batch)
                self.metrics.positions(consumer, self.topic, self.started_from, self.at_eof)
                if self.once:
                    if self._drained():
                        log.info("--once: every assigned partition %s is drained", sorted(self.started_from))
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"--once: not drained within {once_timeout_s:.0f}s")
        except StopRequested as exc:
            log.info("%s", exc)
        finally:
            consumer.close()
            self.consumer = None
            stop_publisher.set()
            publisher.wake.set()
            publisher.join()
        log.info(
            "budget service stopped: %d batches, %s",
            self.batches,
            ", ".join(f"{k} {v}" for k, v in sorted(self.totals.items())),
        )
        self.engine.dispose()
        return 0

    def _poll(self, consumer: Consumer) -> list[Message]:
        """One consume call: the messages of partitions positioned for this
        instance. EOF marks a partition drained; an out-of-range position
        is positioned again (a gap, reported); a fatal error raises."""
        batch = []
        for msg in consumer.consume(self.settings.budget_batch_size, 1.0):
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    self.at_eof.add(msg.partition())
                elif err.code() == KafkaError._AUTO_OFFSET_RESET:
                    if msg.partition() in self.started_from:
                        log.error("partition %d: position out of range (%s); checking for a gap", msg.partition(), err)
                        self.started_from.pop(msg.partition(), None)
                        self.unpositioned.add(msg.partition())
                        consumer.pause([TopicPartition(self.topic, msg.partition())])
                    # else: not positioned yet (it has no position to reset): expected
                elif err.fatal():
                    raise KafkaException(err)
                else:
                    log.warning("consumer: %s", err)
                continue
            # A message fetched before its partition was revoked (or
            # re-positioned) is not ours to apply.
            if msg.partition() in self.started_from:
                self.at_eof.discard(msg.partition())
                batch.append(msg)
        return batch

    def _drained(self) -> bool:
        """--once: every assigned partition has reached its end."""
        return bool(self.started_from) and not self.unpositioned and set(self.started_from) <= self.at_eof


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc) or type(exc).__name__
    code = getattr(getattr(exc, "orig", None), "pgcode", None)
    return (f"SQLSTATE {code}: " if code else "") + text.strip().splitlines()[0]
