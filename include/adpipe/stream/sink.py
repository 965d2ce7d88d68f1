"""The transactional Kafka sink of the aggregation stream job.

Spark's own Kafka sink is at-least-once: a micro-batch replayed after a
crash is written again. This sink makes each micro-batch one Kafka
transaction that holds the batch's aggregates, late and DLQ records *and*
the batch's input offsets (with the batch id) committed to a ledger
consumer group, so output and input progress commit together, and a replay
of a batch that was already committed is recognised and skipped.

Commit protocol for micro-batch N (``commit_batch``):

  Step 1. Once per process: ``init_transactions`` with the sink's stable
          ``transactional.id``. This fences every older producer with that
          id (a zombie's later writes fail) and aborts its open transaction.
  Step 2. Read the ledger: the offsets committed for the input topic by the
          ledger group, whose metadata carries the batch id. If it is >= N,
          batch N was committed by an earlier incarnation: skip to Step 6.
  Step 3. ``begin_transaction`` and produce every record of the batch.
  Step 4. ``send_offsets_to_transaction``: the batch's end offsets, with
          metadata ``{"batch_id": N, ...}``, into the same transaction.
  Step 5. ``commit_transaction``: records and ledger become visible at once.
  Step 6. Return; Spark then writes ``commits/N`` to its checkpoint.

If the process dies
  - before or during Step 3 or between 3 and 5: the transaction is open and
    invisible to read_committed consumers; the next incarnation's Step 1
    aborts it (or the broker does after ``transaction.timeout.ms``), Spark
    replays batch N with the same offsets and state, and Step 2 finds the
    ledger at N-1, so the batch is produced again, with the same record_uuids;
  - during Step 5: the coordinator either received the commit (it completes
    it alone; the replay finds the ledger at N and skips) or not (as above);
  - between 5 and 6: the ledger says N; the replay skips it.

Kafka errors in Steps 3-5, by kind:
  - abortable (``txn_requires_abort``: a record the broker rejected, a
    partition that moved in the middle of the transaction): abort, wait
    (1, 2, 4 s) and produce the whole batch again, up to
    ``MAX_BATCH_ATTEMPTS`` in all, then stop;
  - retriable on ``send_offsets_to_transaction`` or ``commit_transaction``
    (a request timed out): the same call again, up to ``MAX_CALL_ATTEMPTS``;
  - fenced: a newer instance took the transactional.id: stop, exit 4, never
    write again (``ProducerFencedError``);
  - the transaction was open longer than ``transaction.timeout.ms``: the
    broker aborted it and fenced this producer epoch, which librdkafka reports
    as "fenced" too; the sink tells them apart by how long the transaction
    was open and says "timed out" (``TransactionTimedOutError``). Nothing of
    it is visible; the job stops, and its restart replays the batch;
  - anything else: abort and stop. Spark replays the batch on restart."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from adpipe.faults import AFTER_COMMIT, AFTER_PRODUCE, DURING_COMMIT, FaultPlan
from adpipe.kafka_io import client_config, committed_offsets
from adpipe.settings import KafkaAccess
from adpipe.stream.deadline import call_with_deadline

log = logging.getLogger(__name__)


class ProducerFencedError(RuntimeError):
    """Another instance with the same transactional.id has taken over."""


class LedgerMismatchError(RuntimeError):
    """The sink's ledger was written by a different streaming query."""


class TransactionTimedOutError(RuntimeError):
    """The broker aborted a transaction open past transaction.timeout.ms."""


# Whole-batch attempts on abortable errors, and the waits between them.
MAX_BATCH_ATTEMPTS = 4
RETRY_BACKOFF_S = (1.0, 2.0, 4.0)
# Attempts of one retriable call (send_offsets_to_transaction, commit_transaction).
MAX_CALL_ATTEMPTS = 3
# Each such call's own timeout; past the deadline the process ends itself.
# Normally these calls take milliseconds, and a broker restart seconds.
CALL_TIMEOUT_S = 30
CALL_DEADLINE_S = 45.0


class _BatchAborted(Exception):
    """Steps 3-5 hit an abortable error; the transaction is aborted."""

    def __init__(self, cause: KafkaException) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(frozen=True)
class OutRecord:
    topic: str
    key: bytes | None
    value: bytes
    headers: Sequence[tuple[str, bytes]] = ()


@dataclass(frozen=True)
class LedgerEntry:
    batch_id: int
    query_id: str | None
    offsets: dict[int, int]
    watermark_ms: int = 0


@dataclass
class CommitResult:
    batch_id: int
    skipped: bool
    records: int
    duration_ms: float
    transactional_id: str
    by_topic: dict[str, int] = field(default_factory=dict)


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


def _fenced(exc: KafkaException) -> bool:
    err: KafkaError = exc.args[0]
    return err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH) or (
        err.fatal() and "fenc" in err.str().lower()
    )


def _retrying(call: Callable[[], None], what: str) -> None:
    """``call`` again on a retriable error (librdkafka allows it for
    ``send_offsets_to_transaction`` and ``commit_transaction``). Each call
    has a hard deadline beyond its own timeout, which librdkafka does
    not always keep (adpipe.stream.deadline)."""
    for attempt in range(1, MAX_CALL_ATTEMPTS + 1):
        try:
            call_with_deadline(call, CALL_DEADLINE_S, what)
            return
        except KafkaException as exc:
            if not exc.args[0].retriable() or attempt == MAX_CALL_ATTEMPTS:
                raise
            log.warning("%s: retriable error (%s), trying again (%d of %d)", what, exc, attempt + 1, MAX_CALL_ATTEMPTS)


class TransactionalSink:
    """One per running stream job; see the module doc for the protocol."""

    def __init__(
        self,
        kafka: KafkaAccess | str,
        transactional_id: str,
        ledger_group: str,
        input_topic: str,
        query_id: str | None,
        transaction_timeout_ms: int,
        fault: FaultPlan | None = None,
        message_max_bytes: int = 1_000_000,
    ) -> None:
        self.transactional_id = transactional_id
        self.ledger_group = ledger_group
        self.input_topic = input_topic
        self.query_id = query_id
        self.fault = fault
        self._kafka = kafka
        self._timeout_ms = transaction_timeout_ms
        self._message_max_bytes = message_max_bytes
        self._producer: Producer | None = None
        self._ledger_consumer: Consumer | None = None
        # Per output (topic, partition): at or past the offset after this
        # transaction's last record there (into the ledger, for loads).
        self._delivered: dict[tuple[str, int], int] = {}
        self._offsets_consumer: Consumer | None = None

    # Step 1
    def _ensure_producer(self) -> Producer:
        if self._producer is None:
            producer = Producer(
                {
                    **client_config(self._kafka),
                    "transactional.id": self.transactional_id,
                    "enable.idempotence": True,
                    "acks": "all",
                    "transaction.timeout.ms": self._timeout_ms,
                    "partitioner": "murmur2_random",  # same placement as Java clients
                    "linger.ms": 5,
                    # A raw record the broker took compressed is copied to the
                    # DLQ or late topic compressed too; the client checks the
                    # uncompressed size against message.max.bytes, the broker
                    # the compressed batch against the topic's limit.
                    "compression.type": "lz4",
                    "message.max.bytes": self._message_max_bytes,
                }
            )
            started = time.monotonic()
            try:
                producer.init_transactions(60)
            except KafkaException as exc:
                raise RuntimeError(f"init_transactions for {self.transactional_id} failed: {exc}") from exc
            log.info(
                "transactional producer %s ready in %.0f ms (older instances fenced, open transaction aborted)",
                self.transactional_id,
                (time.monotonic() - started) * 1000,
            )
            self._ledger_consumer = Consumer(
                {
                    **client_config(self._kafka),
                    "group.id": self.ledger_group,
                    "isolation.level": "read_committed",
                    "enable.auto.commit": False,
                }
            )
            self._producer = producer
        return self._producer

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
        producer = self._ensure_producer()
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
        producer.begin_transaction()
        self._add_ledger_offsets(producer, batch_id, end_offsets, watermark_ms)
        producer.commit_transaction(60)
        log.warning("empty ledger accepted: written again from the checkpoint's last batch %d", batch_id)
        return self.read_ledger()

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

    def commit_batch(
        self,
        batch_id: int,
        end_offsets: dict[int, int],
        records: Callable[[], Iterable[OutRecord]],
        aggregates: int,
        watermark_ms: int = 0,
    ) -> CommitResult:
        """Steps 1-6 of the module doc for micro-batch ``batch_id``.

        ``records()`` gives the batch's records, and is called once per
        attempt (never when the ledger shows the batch committed), so it may
        return a generator that streams the batch; ``aggregates`` is how many
        of them are aggregates (the crash points of the tests fire only in
        batches that carry some, unless told otherwise)."""
        started = time.monotonic()
        producer = self._ensure_producer()  # Step 1
        ledger = self.check_ledger_owner()  # Step 2
        if ledger is not None and ledger.batch_id == batch_id and ledger.offsets != dict(end_offsets):
            raise LedgerMismatchError(
                f"the ledger says batch {batch_id} ended at offsets {ledger.offsets}, the checkpoint says "
                f"{dict(end_offsets)}: they describe different batches, so skipping or writing it would be a "
                "guess. Restore the matching checkpoint, or start a new ADPIPE_JOB_ID."
            )
        if ledger is not None and ledger.batch_id >= batch_id:
            log.info(
                "batch %d already committed by an earlier run (ledger at batch %d): not producing it again",
                batch_id,
                ledger.batch_id,
            )
            return CommitResult(batch_id, True, 0, (time.monotonic() - started) * 1000, self.transactional_id)
        for attempt in range(1, MAX_BATCH_ATTEMPTS + 1):
            try:
                by_topic = self._transaction(producer, batch_id, records, end_offsets, aggregates, watermark_ms)
                break
            except _BatchAborted as aborted:
                if attempt == MAX_BATCH_ATTEMPTS:
                    raise RuntimeError(
                        f"batch {batch_id}: {MAX_BATCH_ATTEMPTS} transactions aborted, the last after: {aborted}"
                    ) from aborted.cause
                wait_s = RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S)) - 1]
                log.warning(
                    "batch %d: transaction aborted after an abortable error (%s); producing the batch again "
                    "in %.0f s (attempt %d of %d)",
                    batch_id,
                    aborted,
                    wait_s,
                    attempt + 1,
                    MAX_BATCH_ATTEMPTS,
                )
                time.sleep(wait_s)
        if self.fault:
            self.fault.hit(AFTER_COMMIT, batch_id, aggregates, sum(by_topic.values()))
        elapsed_ms = (time.monotonic() - started) * 1000
        return CommitResult(  # Step 6: the caller returns to Spark
            batch_id, False, sum(by_topic.values()), elapsed_ms, self.transactional_id, by_topic
        )

    def _transaction(
        self,
        producer: Producer,
        batch_id: int,
        records: Callable[[], Iterable[OutRecord]],
        end_offsets: dict[int, int],
        aggregates: int,
        watermark_ms: int,
    ) -> dict[str, int]:
        """Steps 3-5 once; a Kafka error is sorted by kind (module doc)."""
        opened = time.monotonic()
        try:
            by_topic = self._produce_batch(producer, batch_id, records(), aggregates)  # Step 3
            self._add_ledger_offsets(producer, batch_id, end_offsets, watermark_ms)  # Step 4
            self._commit(producer, batch_id, aggregates, sum(by_topic.values()))  # Step 5
            return by_topic
        except KafkaException as exc:
            open_ms = (time.monotonic() - opened) * 1000
            if _fenced(exc) and open_ms >= self._timeout_ms:
                raise TransactionTimedOutError(
                    f"the transaction of batch {batch_id} was open {open_ms / 1000:.1f} s, longer than "
                    f"transaction.timeout.ms ({self._timeout_ms / 1000:.0f} s): the broker aborted it and nothing of "
                    "it is visible. The batch is replayed when the job restarts; raise "
                    "ADPIPE_TRANSACTION_TIMEOUT_MS above the longest batch (or lower ADPIPE_MAX_OFFSETS_PER_TRIGGER)"
                ) from exc
            if _fenced(exc):
                raise ProducerFencedError(
                    f"producer {self.transactional_id} was fenced: another stream job instance with the same "
                    "transactional.id took over; this instance stops without writing anything more"
                ) from exc
            self._abort(exc)
            if exc.args[0].txn_requires_abort():
                raise _BatchAborted(exc) from exc
            raise
        except BaseException as exc:
            self._abort(exc)
            raise

    # Step 3
    def _produce_batch(
        self, producer: Producer, batch_id: int, records: Iterable[OutRecord], aggregates: int
    ) -> dict[str, int]:
        """Begin the transaction and produce every record; records per topic."""
        by_topic: dict[str, int] = {}
        producer.begin_transaction()
        for rec in records:
            self._produce(producer, rec)
            by_topic[rec.topic] = by_topic.get(rec.topic, 0) + 1
        undelivered = producer.flush(60)
        if undelivered:  # the commit would fail on them anyway: say why, then abort
            raise RuntimeError(f"{undelivered} records of batch {batch_id} not delivered within 60 s")
        self._delivered = self._written_through(by_topic)
        if self.fault:
            self.fault.hit(AFTER_PRODUCE, batch_id, aggregates, sum(by_topic.values()))
        return by_topic

    # Step 4
    def _add_ledger_offsets(
        self, producer: Producer, batch_id: int, end_offsets: dict[int, int], watermark_ms: int
    ) -> None:
        """The batch's input end offsets, with its id, into the transaction."""
        assert self._ledger_consumer is not None
        meta = ledger_metadata(batch_id, self.query_id, watermark_ms, self._delivered)
        offsets = [TopicPartition(self.input_topic, p, o, metadata=meta) for p, o in sorted(end_offsets.items())]
        group = self._ledger_consumer.consumer_group_metadata()
        _retrying(
            lambda: producer.send_offsets_to_transaction(offsets, group, CALL_TIMEOUT_S), f"batch {batch_id}: offsets"
        )

    # Step 5
    def _commit(self, producer: Producer, batch_id: int, aggregates: int, records: int) -> None:
        if self.fault and self.fault.armed(DURING_COMMIT, batch_id, aggregates, records):
            self.fault.run_and_kill(lambda: producer.commit_transaction(60))
        _retrying(lambda: producer.commit_transaction(CALL_TIMEOUT_S), f"batch {batch_id}: commit")

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

    @staticmethod
    def _produce(producer: Producer, rec: OutRecord) -> None:
        while True:
            try:
                producer.produce(rec.topic, rec.value, rec.key, headers=list(rec.headers))
                return
            except BufferError:
                producer.poll(0.1)

    def _abort(self, cause: BaseException) -> None:
        if self._producer is None:
            return
        try:
            self._producer.abort_transaction(30)
            log.error("transaction aborted after error: %s", cause)
        except KafkaException as exc:  # the cause is what matters
            log.error("abort after %r failed too: %s", cause, exc)

    def close(self) -> None:
        """Release the clients. Never raises: a fenced producer's flush
        fails, and the error that stopped the job is the one to report."""
        for close in (
            lambda: self._ledger_consumer and self._ledger_consumer.close(),
            lambda: self._offsets_consumer and self._offsets_consumer.close(),
            lambda: self._producer and self._producer.flush(10),
        ):
            try:
                close()
            except KafkaException as exc:
                log.debug("closing the sink: %s", exc)
