"""The transactional sink's ledger: each committed batch's input end
offsets, with the batch id, query id, watermark and output ends as metadata,
committed for the ledger consumer group inside the batch's own transaction
(the protocol in :mod:`adpipe.stream.sink`).

Here: reading it (Step 2: the last committed batch), checking that it is
this checkpoint's query's, recovering at start when the checkpoint has
batches and the ledger none (offsets expired, or another cluster), writing
it (Step 4), and the output partitions' ends a load waits for."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition

from adpipe.kafka_io import client_config, committed_offsets
from adpipe.stream.sink_clients import (
    CALL_TIMEOUT_S,
    OFFSETS_DEADLINE_S,
    SOCKET_TIMEOUT_MS,
    SinkClients,
    retrying,
)

# The sink's logger, whichever part of it logs: its lines read as before.
log = logging.getLogger("adpipe.stream.sink")


class LedgerMismatchError(RuntimeError):
    """The sink's ledger was written by a different streaming query."""


@dataclass(frozen=True)
class LedgerEntry:
    batch_id: int
    query_id: str | None
    offsets: dict[int, int]
    watermark_ms: int = 0


# Kafka's offset.metadata.max.bytes is 4096 by default: a ledger entry
# stays well under it, or goes without its output offsets.
MAX_LEDGER_METADATA_BYTES = 3_000


def ledger_metadata(
    batch_id: int, query_id: str | None, watermark_ms: int, outputs: dict[tuple[str, int], int] | None = None
) -> str:
    """The ledger's metadata of a batch: its id, query and watermark, and
    (``out``) per output topic and partition the offset after the batch's
    last record there. A load reads raw records up to the ledger and waits
    until the output partitions' last stable offsets pass ``out``: the
    ledger can be visible before a partition's transaction marker (its
    leader failing over), and the batch's output is then not readable yet.
    Without room for them (thousands of output partitions) ``out`` is left
    out, and loads do not wait."""
    meta: dict[str, object] = {"batch_id": batch_id, "query_id": query_id, "watermark_ms": watermark_ms}
    if outputs:
        out: dict[str, dict[str, int]] = {}
        for (topic, partition), end in sorted(outputs.items()):
            out.setdefault(topic, {})[str(partition)] = end
        with_out = json.dumps({**meta, "out": out}, separators=(",", ":"))
        if len(with_out.encode()) <= MAX_LEDGER_METADATA_BYTES:
            return with_out
        log.warning("batch %d: its output offsets do not fit the ledger's metadata; loads will not wait for them",
                    batch_id)
    return json.dumps(meta)


class SinkLedger(SinkClients):
    """The sink's ledger: the second part of
    :class:`~adpipe.stream.sink.TransactionalSink`, on its clients."""

    # Step 2
    def read_ledger(self) -> LedgerEntry | None:
        """The last committed batch of this sink, or None before the first."""
        self._ensure_producer()
        assert self._ledger_consumer is not None
        md = self._ledger_consumer.list_topics(self.input_topic, timeout=30)
        partitions = [TopicPartition(self.input_topic, p) for p in md.topics[self.input_topic].partitions]
        committed = committed_offsets(self._ledger_consumer, partitions)
        entries = []
        for tp in committed:
            if tp.offset < 0 or not tp.metadata:
                continue
            meta = json.loads(tp.metadata)
            entries.append(
                (int(meta["batch_id"]), meta.get("query_id"), tp.partition, tp.offset, int(meta.get("watermark_ms", 0)))
            )
        if not entries:
            return None
        batch_id = max(e[0] for e in entries)
        last = [e for e in entries if e[0] == batch_id]
        return LedgerEntry(batch_id, last[0][1], {e[2]: e[3] for e in last}, last[0][4])

    def start(
        self, checkpointed: tuple[int, dict[int, int], int] | None, accept_empty_ledger: bool = False
    ) -> LedgerEntry | None:
        """Before the query starts: Step 1 (fence older instances), and the
        ledger must fit the checkpoint, whose last committed batch is
        ``checkpointed`` (id, end offsets, watermark). A checkpoint with
        committed batches and no ledger means the ledger's offsets expired (a
        group idle past the cluster's ``offsets.retention.minutes``) or this
        is another cluster: a replay would then be produced twice, so the job
        refuses; told to accept it, it writes the checkpoint's last batch to
        the ledger again, so that the next start finds them in step."""
        self._ensure_producer()  # Step 1: fence older instances
        ledger = self.check_ledger_owner()
        if ledger is not None or checkpointed is None:
            return ledger
        batch_id, end_offsets, watermark_ms = checkpointed
        if not accept_empty_ledger:
            raise LedgerMismatchError(
                f"the checkpoint has committed batches up to {batch_id} but the ledger group "
                f"{self.ledger_group} holds no offsets for {self.input_topic}: they expired (raise the "
                "cluster's offsets.retention.minutes) or this is another cluster. A replayed batch could be "
                "written twice. Pass --accept-empty-ledger to go on if you know no batch is in doubt."
            )
        self.write_entry(batch_id, end_offsets, watermark_ms)
        log.warning("empty ledger accepted: written again from the checkpoint's last batch %d", batch_id)
        return self.read_ledger()

    def write_entry(self, batch_id: int, end_offsets: dict[int, int], watermark_ms: int) -> None:
        """A ledger entry of its own, in a transaction of the sink's
        ``transactional.id`` (which fences older producers first): a
        checkpoint's last batch written again (an accepted empty ledger), or
        an upgraded checkpoint's start (batch -1)."""
        producer = self._ensure_producer()
        producer.begin_transaction()
        self._add_ledger_offsets(producer, batch_id, end_offsets, watermark_ms)
        producer.commit_transaction(60)

    def check_ledger_owner(self) -> LedgerEntry | None:
        entry = self.read_ledger()
        if entry is not None and self.query_id and entry.query_id and entry.query_id != self.query_id:
            raise LedgerMismatchError(
                f"the ledger of {self.ledger_group} was written by streaming query {entry.query_id}, "
                f"but this checkpoint is query {self.query_id}: the checkpoint was replaced. "
                "Replaying into the same sink would duplicate aggregates; use a new ADPIPE_JOB_ID "
                "(new sink and record_uuid namespace) or restore the checkpoint."
            )
        return entry

    # Step 4
    def _add_ledger_offsets(
        self, producer: Producer, batch_id: int, end_offsets: dict[int, int], watermark_ms: int
    ) -> None:
        """The batch's input end offsets, with its id, into the transaction."""
        assert self._ledger_consumer is not None
        meta = ledger_metadata(batch_id, self.query_id, watermark_ms, self._delivered)
        offsets = [TopicPartition(self.input_topic, p, o, metadata=meta) for p, o in sorted(end_offsets.items())]
        group = self._ledger_consumer.consumer_group_metadata()
        retrying(
            lambda: producer.send_offsets_to_transaction(offsets, group, CALL_TIMEOUT_S),
            f"batch {batch_id}: offsets",
            OFFSETS_DEADLINE_S,
        )

    def _written_through(self, by_topic: dict[str, int]) -> dict[tuple[str, int], int]:
        """Per partition of the topics the batch wrote: the high watermark
        once its records are delivered, so at or past its last record there
        (this job is the topics' one writer, and its previous transaction
        was complete before this one could add a partition). Per-record
        delivery callbacks would say it exactly, but a callback that runs
        while librdkafka reports a fatal error replaces that error."""
        if self._offsets_consumer is None:
            # read_uncommitted: the high watermark, not the last stable
            # offset (which this open transaction holds back).
            self._offsets_consumer = Consumer(
                client_config(
                    self._kafka,
                    {
                        "group.id": "adpipe-offsets-probe",
                        "isolation.level": "read_uncommitted",
                        "enable.auto.commit": False,
                        "socket.timeout.ms": SOCKET_TIMEOUT_MS,
                    },
                )
            )
        ends: dict[tuple[str, int], int] = {}
        for topic in sorted(t for t, n in by_topic.items() if n):
            partitions = self._offsets_consumer.list_topics(topic, timeout=CALL_TIMEOUT_S).topics[topic].partitions
            for partition in sorted(partitions):
                _low, high = self._offsets_consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=CALL_TIMEOUT_S, cached=False
                )
                ends[(topic, partition)] = high
        return ends
