"""The partitions a budget service instance holds and where each reads from.

The database, not Kafka, holds the consumer's position: every partition
assignment starts from ``budget_offsets`` (:func:`adpipe.budget.batch.stored_offsets`).
A partition whose offset cannot be read at assignment (the database or the
broker failed) is assigned paused and positioned once they answer; one that
a seek could not move is positioned again the same way.

Gaps: ``auto.offset.reset`` is ``error``. A partition whose database offset
(0 when it has no row) is below the log start offset lost records to
retention before they were charged: the gap is recorded in ``budget_gaps``
with the number of offsets lost, in the same transaction that moves the
offset to the log start, logged as an error and sent as an alert
(``adpipe.alerting``); ``verify`` fails while it is there. Never skipped
silently.

Pausing for a database outage (:mod:`adpipe.budget.outage`) is kept here
too, since it holds per partition across an assignment: a pause covers the
whole assignment, a partition assigned while paused stays paused, and the
resume re-seeks every positioned partition to its database offset. Every
other assignment resumes what it is given: librdkafka keeps a partition's
pause through a rebalance that takes it away and gives it back.

Under the consumer group protocol (KIP-848) an assignment changes by
increments: a callback names only the partitions added or taken away, and
the others keep being consumed through it; under the classic one it names
the whole new assignment.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from sqlalchemy.engine import Engine

from adpipe import alerting
from adpipe.budget.batch import record_gap, stored_offsets
from adpipe.settings import Settings

# Named after the part: operators grep "adpipe.budget: batch N".
log = logging.getLogger("adpipe.budget")


class Assignment:
    """This instance's partitions of the aggregates topic: ``started_from``
    (partition -> the database offset its reading started from; None: from
    the beginning), those not positioned yet, those read to the end; the
    consumer's rebalance callbacks; pause and resume."""

    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.topic = settings.topics.aggregates
        self.consumer: Consumer | None = None  # while the service consumes
        # partition -> the database offset this instance's reading started from
        self.started_from: dict[int, int | None] = {}
        # assigned partitions not positioned at their database offset yet
        # (the database or the broker failed at assignment): paused
        self.unpositioned: set[int] = set()
        self.at_eof: set[int] = set()
        self.paused_for_outage = False

    def _assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Add ``partitions`` (at their offsets) to the assignment: by
        increment under the consumer protocol, as the whole of it under the
        classic one."""
        if self.settings.budget_incremental:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)

    # ------------------------------------------------------------ rebalance callbacks

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
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
            self._assign(consumer, partitions)
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
        self._assign(consumer, partitions)
        # librdkafka keeps a partition's pause through its unassignment: one
        # paused before it was taken away (positions unreadable, a failed
        # seek) would come back paused and never be read again.
        if self.paused_for_outage:
            consumer.pause(mine)
        else:
            consumer.resume(mine)
        log.info(
            "assigned partitions %s of %s at database offsets %s; assignment now %s",
            sorted(tp.partition for tp in mine),
            self.topic,
            {tp.partition: "beginning" if starts[tp.partition] is None else starts[tp.partition] for tp in mine},
            sorted(self.started_from),
        )

    def on_revoke(self, _consumer: Consumer, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            self.started_from.pop(tp.partition, None)
            self.unpositioned.discard(tp.partition)
            self.at_eof.discard(tp.partition)
        log.info(
            "revoked partitions %s; assignment now %s",
            sorted(tp.partition for tp in partitions),
            sorted(self.started_from),
        )

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        log.warning("partitions %s lost (session expired)", sorted(tp.partition for tp in partitions))
        self.on_revoke(consumer, partitions)

    # ------------------------------------------------------------ positions

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
                alert_gap(self.settings, self.topic, p, expected or 0, low, lost)
                starts[p] = low
        return starts

    def position_unpositioned(self) -> None:
        """Position the partitions assignment could not, once the database
        (and broker) answer. They never started fetching (a seek would be
        refused), so they are assigned again with positions: by increment
        under the consumer protocol; under the classic one the whole
        assignment, the others at their database offsets, which is where
        they stand."""
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
        if self.settings.budget_incremental:  # only the pending ones are given again; the others read on
            assigned = [p for p in assigned if p in starts]
            if assigned:
                self.consumer.incremental_unassign([TopicPartition(self.topic, p) for p in assigned])
        self._assign(
            self.consumer,
            [
                TopicPartition(self.topic, p, OFFSET_BEGINNING if positions[p] is None else positions[p])
                for p in sorted(assigned)
                if p in positions
            ],
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

    def seek(self, partition: int, offset: int | None) -> bool:
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

    def out_of_range(self, partition: int, err: KafkaError) -> None:
        """The consumer's position of ``partition`` is out of range: position
        it again (a gap, reported) on the next loop."""
        if partition in self.started_from:
            log.error("partition %d: position out of range (%s); checking for a gap", partition, err)
            self.started_from.pop(partition, None)
            self.unpositioned.add(partition)
            assert self.consumer is not None
            self.consumer.pause([TopicPartition(self.topic, partition)])
        # else: not positioned yet (it has no position to reset): expected

    def drained(self) -> bool:
        """--once: every partition assigned (if any) has reached its end."""
        return not self.unpositioned and set(self.started_from) <= self.at_eof

    # ------------------------------------------------------------ outage pause

    def pause(self) -> None:
        self.paused_for_outage = True
        if self.consumer is not None:
            self.consumer.pause(self.consumer.assignment())

    def resume(self) -> None:
        """Resume and re-seek every positioned partition to its database
        offset: what was fetched before the pause was dropped."""
        self.paused_for_outage = False
        if self.consumer is None:
            return
        for p, offset in sorted(self.started_from.items()):
            self.seek(p, offset)
        self.consumer.resume([TopicPartition(self.topic, p) for p in self.started_from])


def alert_gap(settings: Settings, topic: str, partition: int, from_offset: int, to_offset: int, lost: int) -> None:
    """Log and alert a gap (:func:`adpipe.budget.batch.record_gap` recorded it)."""
    message = (
        f"budget: {topic}[{partition}] offsets {from_offset}..{to_offset - 1} were deleted by retention "
        f"before consumer group {settings.budget_group} charged them: {lost} offsets (records, or "
        "transaction markers) lost; recorded in budget_gaps; continuing from the log start"
    )
    log.error(message)
    alerting.send_alert(
        settings,
        {
            "at": datetime.now(UTC).isoformat(),
            "level": "service",
            "source": "adpipe.budget",
            # The keys every alert has (a DAG's alerts fill them).
            "dag_id": None,
            "run_id": None,
            "task_id": None,
            "kind": "offset_gap",
            "group": settings.budget_group,
            "topic": topic,
            "partition": partition,
            "from_offset": from_offset,
            "to_offset": to_offset,
            "lost_offsets": lost,
            "message": message,
        },
    )
