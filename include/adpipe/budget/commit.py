"""The commit protocol of one batch of the budget service
(:meth:`BatchCommitter.apply`):

  Steps 1-6. In one database transaction: claim the partitions' offset rows
          (dropping partitions another instance moved), parse, validate or
          quarantine, each window's revisions charged against its base
          (``budget_windows``) as insert-only ledger rows, spend per (ad,
          period), pause transitions, next offsets by compare-and-set (never
          backwards). See :mod:`adpipe.budget.batch` (``apply_batch``) for
          each step.
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
    record_uuids already in the ledger and windows whose charged revision
    is at or above theirs;
  - between 8 and 9: the transitions wait in the outbox; every instance's
    publisher thread publishes pending rows every few seconds.

A **data** fault (``db.fault_kind``: the database refuses something in the
batch that validation let through): the batch is split in halves, each its
own transaction, until the one record is found; it is quarantined as
``rejected`` with the database's reason and the rest is charged. Data never
stops the service. Transient faults are waited out around each transaction
(:mod:`adpipe.budget.outage`).
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import KafkaException, Message, TopicPartition
from sqlalchemy.engine import Engine

from adpipe.budget import db
from adpipe.budget.assignment import Assignment
from adpipe.budget.batch import BatchResult, StaleOffsets, apply_batch, stored_offsets
from adpipe.budget.events import EventPublisher
from adpipe.budget.outage import OutageGuard
from adpipe.budget.stats import ServiceStats
from adpipe.faults import BUDGET_AFTER_DB_COMMIT, BUDGET_BEFORE_DB_COMMIT, BUDGET_BEFORE_DB_TRANSACTION, FaultPlan
from adpipe.settings import Settings

# Named after the part: operators grep "adpipe.budget: batch N".
log = logging.getLogger("adpipe.budget")


class BatchCommitter:
    """Applies the service's batches, Steps 1-9 of the module doc; numbers
    them (``batches``: 1, 2, ... in this process)."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        assignment: Assignment,
        outage: OutageGuard,
        stats: ServiceStats,
        fault: FaultPlan | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.topic = settings.topics.aggregates
        self.assignment = assignment
        self.outage = outage
        self.stats = stats
        self.fault = fault
        self.batches = 0
        self.publisher: EventPublisher | None = None  # woken by Step 9 once started

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
        self.stats.count(result)
        if result.transitions and self.publisher is not None:  # Step 9
            self.publisher.wake.set()
        self.stats.batch(self.batches, result, started)
        return result

    def _transaction(self, messages: list[Message], rejected: dict[tuple[int, int], str] | None = None) -> BatchResult:
        """Steps 1-7 for the messages of partitions still assigned."""
        started_from = self.assignment.started_from
        live = [m for m in messages if m.partition() in started_from]
        with self.engine.begin() as conn:
            result = apply_batch(conn, self.settings, self.topic, live, dict(started_from), rejected)
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
            result = self.outage.with_db(what, lambda: self._transaction(messages))
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
                result = self.outage.with_db(what, lambda: self._transaction(messages, rejected))
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

        stored = self.outage.with_db(f"batch {self.batches}", read_stored)
        log.warning("%s; nothing of this batch applied, re-reading partitions %s", exc, partitions)
        result = BatchResult(records=len(messages))
        started_from = self.assignment.started_from
        for p in partitions:
            if p in started_from:
                if stored.get(p) != started_from[p]:
                    result.stale_partitions[p] = stored.get(p)
                self.assignment.seek(p, stored.get(p))
        return result

    def _advance(self, result: BatchResult) -> None:
        """The committed offsets become this instance's starting points;
        stale partitions are re-sought."""
        started_from = self.assignment.started_from
        for p, o in result.next_offsets.items():
            if p in started_from:
                started_from[p] = o
        for p, o in result.stale_partitions.items():
            log.warning(
                "partition %d: the database offset moved to %s (another instance applied it); "
                "this instance's records of it refused, re-seeking",
                p,
                o,
            )
            if p in started_from:
                self.assignment.seek(p, o)

    def _commit_kafka_offsets(self, next_offsets: dict[int, int]) -> None:
        """Step 8: only for lag monitoring, so a failure is logged, not raised."""
        consumer = self.assignment.consumer
        assert consumer is not None
        try:
            consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in sorted(next_offsets.items())],
                asynchronous=True,
            )
        except KafkaException as exc:
            log.info("kafka offset commit (monitoring only) failed: %s", exc)


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc) or type(exc).__name__
    code = getattr(getattr(exc, "orig", None), "pgcode", None)
    return (f"SQLSTATE {code}: " if code else "") + text.strip().splitlines()[0]
