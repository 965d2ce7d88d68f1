"""The transactional sink's Kafka clients and their lifecycle: Step 1 of the
commit protocol in :mod:`adpipe.stream.sink`.

The producer carries the sink's stable ``transactional.id``; its
``init_transactions``, once per process, fences every older producer with
that id (a zombie's later writes fail) and aborts its open transaction. The
ledger consumer is the one whose group is the sink's ledger (its group
metadata goes into each transaction). After an error the open transaction
is aborted; at the end every client is closed without raising. Here too:
how one producer call is retried, each attempt under a hard deadline."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, Producer

from adpipe.faults import FaultPlan
from adpipe.kafka_access import KafkaAccess
from adpipe.kafka_io import client_config
from adpipe.stream.deadline import call_with_deadline

# The sink's logger, whichever part of it logs: its lines read as before.
log = logging.getLogger("adpipe.stream.sink")

# Attempts of one retriable call (send_offsets_to_transaction, commit_transaction).
MAX_CALL_ATTEMPTS = 3
# Each such call's own timeout, and the deadline past which its producer is
# taken for stuck (adpipe.stream.deadline) and replaced. These calls take
# milliseconds; a coordinator that moves with its broker, about 10 s (the
# controller's broker session timeout). The deadline is shorter than the
# timeout: replacing the producer is always safe (the new one fences the old
# and the batch is checked against the ledger, then written again), and it
# is what ends librdkafka's wait on a coordinator that left (#5511), which
# no timeout ends: measured by `make bench ARGS="--failover --part broker"`.
CALL_TIMEOUT_S = 30
CALL_DEADLINE_S = 15.0
# send_offsets_to_transaction's deadline is shorter: its coordinator is the
# ledger group's, which Step 2 reached a moment before, so a call that takes
# seconds is a producer still waiting on a coordinator that moved (#5511).
OFFSETS_DEADLINE_S = 5.0
# A request to a broker that stopped answering with its socket still open (a
# paused process, a frozen host) is given up after this long and asked of
# the broker that leads or coordinates now (librdkafka's default is 60 s).
SOCKET_TIMEOUT_MS = 10_000


def retrying(call: Callable[[], None], what: str, deadline_s: float | None = None) -> None:
    """``call`` again on a retriable error (librdkafka allows it for
    ``send_offsets_to_transaction`` and ``commit_transaction``). Each call
    has a hard deadline, since librdkafka does not always keep its own
    timeout: past it (``deadline_s``, default :data:`CALL_DEADLINE_S`),
    :class:`~adpipe.stream.deadline.CallHung`."""
    for attempt in range(1, MAX_CALL_ATTEMPTS + 1):
        try:
            call_with_deadline(call, deadline_s or CALL_DEADLINE_S, what)
            return
        except KafkaException as exc:
            if not exc.args[0].retriable() or attempt == MAX_CALL_ATTEMPTS:
                raise
            log.warning("%s: retriable error (%s), trying again (%d of %d)", what, exc, attempt + 1, MAX_CALL_ATTEMPTS)


class SinkClients:
    """The sink's settings and Kafka clients: the first part of
    :class:`~adpipe.stream.sink.TransactionalSink`."""

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
                    # librdkafka refuses one above the transaction timeout.
                    "socket.timeout.ms": min(SOCKET_TIMEOUT_MS, self._timeout_ms),
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
            if self._ledger_consumer is None:
                self._ledger_consumer = Consumer(
                    {
                        **client_config(self._kafka),
                        "group.id": self.ledger_group,
                        "isolation.level": "read_committed",
                        "enable.auto.commit": False,
                        "socket.timeout.ms": SOCKET_TIMEOUT_MS,
                    }
                )
            self._producer = producer
        return self._producer

    def _replace_producer(self) -> None:
        """Leave a producer stuck in a call behind (its thread holds it until
        the call returns, if ever); the next :meth:`_ensure_producer` makes a
        new one, whose ``init_transactions`` fences it and aborts its open
        transaction."""
        self._producer = None

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
