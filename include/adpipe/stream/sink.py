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
  - a call that outlives its hard deadline (librdkafka waiting on a
    coordinator that died with its broker, :mod:`adpipe.stream.deadline`):
    that producer is left behind, a new one fences it (Step 1), and the
    batch starts again at Step 2, up to ``MAX_PRODUCER_REPLACEMENTS`` times;
    then the process ends, and its restart replays the batch;
  - fenced: a newer instance took the transactional.id: stop, exit 4, never
    write again (``ProducerFencedError``);
  - the transaction was open longer than ``transaction.timeout.ms``: the
    broker aborted it and fenced this producer epoch, which librdkafka reports
    as "fenced" too; the sink tells them apart by how long the transaction
    was open and says "timed out" (``TransactionTimedOutError``). Nothing of
    it is visible; the job stops, and its restart replays the batch;
  - anything else: abort and stop. Spark replays the batch on restart.

The sink is three parts, one module each: :mod:`~adpipe.stream.sink_clients`
(Step 1: the producer and its fencing, aborting, closing),
:mod:`~adpipe.stream.sink_ledger` (Steps 2 and 4: reading, checking,
recovering and writing the ledger) and this one (a batch: Steps 3, 5 and 6,
and the errors above)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException, Producer

from adpipe.faults import AFTER_COMMIT, AFTER_PRODUCE, DURING_COMMIT
from adpipe.stream.deadline import CallHung, end_process
from adpipe.stream.sink_clients import CALL_TIMEOUT_S, retrying
from adpipe.stream.sink_ledger import LedgerMismatchError, SinkLedger

log = logging.getLogger(__name__)


class ProducerFencedError(RuntimeError):
    """Another instance with the same transactional.id has taken over."""


class TransactionTimedOutError(RuntimeError):
    """The broker aborted a transaction open past transaction.timeout.ms."""


# Whole-batch attempts on abortable errors, and the waits between them.
MAX_BATCH_ATTEMPTS = 4
RETRY_BACKOFF_S = (1.0, 2.0, 4.0)
# New producers for one batch after calls that hung (adpipe.stream.deadline),
# before the process ends itself and leaves the batch to its restart.
MAX_PRODUCER_REPLACEMENTS = 5


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


@dataclass
class CommitResult:
    batch_id: int
    skipped: bool
    records: int
    duration_ms: float
    transactional_id: str
    by_topic: dict[str, int] = field(default_factory=dict)


def _fenced(exc: KafkaException) -> bool:
    err: KafkaError = exc.args[0]
    return err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH) or (
        err.fatal() and "fenc" in err.str().lower()
    )


class TransactionalSink(SinkLedger):
    """One per running stream job; see the module doc for the protocol.

    Its parts: :class:`~adpipe.stream.sink_clients.SinkClients` (Step 1,
    abort and close), :class:`~adpipe.stream.sink_ledger.SinkLedger` (Steps
    2 and 4, the ledger's owner, recovery at start) and, here, a batch's
    Steps 1-6 with Steps 3 and 5 and the retries by kind of error."""

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
        for replacement in range(MAX_PRODUCER_REPLACEMENTS + 1):
            try:
                return self._commit_once(batch_id, end_offsets, records, aggregates, watermark_ms, started)
            except CallHung as hung:
                if replacement == MAX_PRODUCER_REPLACEMENTS:
                    end_process(hung)
                log.warning(
                    "%s: leaving that producer behind; a new one with the same transactional.id fences it and "
                    "aborts its transaction, then batch %d is checked against the ledger and written again "
                    "(replacement %d of %d)",
                    hung,
                    batch_id,
                    replacement + 1,
                    MAX_PRODUCER_REPLACEMENTS,
                )
                self._replace_producer()
        raise AssertionError("unreachable")  # the loop returns or ends the process

    def _commit_once(
        self,
        batch_id: int,
        end_offsets: dict[int, int],
        records: Callable[[], Iterable[OutRecord]],
        aggregates: int,
        watermark_ms: int,
        started: float,
    ) -> CommitResult:
        """Steps 1-6 with one producer."""
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
        except CallHung:  # the producer is stuck in a call: never use it again, not even to abort
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

    # Step 5
    def _commit(self, producer: Producer, batch_id: int, aggregates: int, records: int) -> None:
        if self.fault and self.fault.armed(DURING_COMMIT, batch_id, aggregates, records):
            self.fault.run_and_kill(lambda: producer.commit_transaction(60))
        retrying(lambda: producer.commit_transaction(CALL_TIMEOUT_S), f"batch {batch_id}: commit")

    @staticmethod
    def _produce(producer: Producer, rec: OutRecord) -> None:
        while True:
            try:
                producer.produce(rec.topic, rec.value, rec.key, headers=list(rec.headers))
                return
            except BufferError:
                producer.poll(0.1)
