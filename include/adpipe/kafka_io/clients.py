"""How adpipe's Kafka clients are configured, and whether the cluster lets them in.

Every client takes bootstrap and credentials from a :class:`KafkaAccess`
(``settings.kafka``, ``region.kafka``) or a bare ``host:port[,host:port]``
string, meaning a cluster without credentials (tests, local tools), and adds
its own settings; :func:`refusal` turns librdkafka's errors on connecting
into one line the CLI can print."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from adpipe.kafka_access import KafkaAccess

# The consumer groups of adpipe's short-lived probes and readers (offsets,
# times, retention, whole-topic reads): each only assigns partitions and
# never commits, but on a cluster with ACLs a principal needs Read on them.
PROBE_GROUPS = ("adpipe-offsets-probe", "adpipe-time-probe", "adpipe-retention-probe", "adpipe-reader")


def access(kafka: KafkaAccess | str) -> KafkaAccess:
    """The cluster as clients reach it (a bare bootstrap string: no credentials)."""
    return kafka if isinstance(kafka, KafkaAccess) else KafkaAccess(kafka)


def client_config(kafka: KafkaAccess | str, extra: dict | None = None) -> dict:
    """A confluent-kafka client's settings: bootstrap and credentials, then ``extra``."""
    return {**access(kafka).client_config(), **(extra or {})}


def admin(kafka: KafkaAccess | str) -> AdminClient:
    return AdminClient(client_config(kafka))


def refusal(kafka: KafkaAccess | str, timeout_s: float = 5.0) -> str | None:
    """Why the cluster does not let this client in, in one line (None: it
    answers): wrong credentials, a certificate the CA file does not verify,
    or a listener that wants TLS and SASL from a client that brings none.
    librdkafka reports these only as errors beside a request that then
    times out ("Broker transport failure"); the CLI adds this line."""
    acc = access(kafka)
    errors: list[KafkaError] = []
    consumer = Consumer(client_config(acc, {"group.id": PROBE_GROUPS[0], "error_cb": errors.append, "log_level": 0}))
    try:
        consumer.list_topics(timeout=timeout_s)
        return None
    except KafkaException:
        pass
    finally:
        consumer.poll(0)
        consumer.close()
    found = {e.code(): e.str() for e in errors}
    if KafkaError._AUTHENTICATION in found:
        return (
            f"Kafka at {acc.describe()} refused the credentials (wrong user name or password): "
            + found[KafkaError._AUTHENTICATION]
        )
    if KafkaError._SSL in found:
        return (
            f"TLS with Kafka at {acc.bootstrap} failed (is ADPIPE_KAFKA_CA_FILE the CA of its certificate?): "
            + found[KafkaError._SSL]
        )
    if not acc.secure:
        return (
            f"Kafka at {acc.bootstrap} did not answer a client without credentials: down, or a listener that "
            "wants SASL over TLS (ADPIPE_KAFKA_SECURITY=sasl_ssl, ADPIPE_KAFKA_USERNAME, ADPIPE_KAFKA_PASSWORD_FILE)"
        )
    return f"Kafka at {acc.describe()} did not answer: down, or not a SASL_SSL listener"


T = TypeVar("T")

# A partition's leadership or a topic's metadata still moving (a topic just
# created, a broker restarted or stopped): the client refreshes its
# metadata and asks again.
SETTLING = frozenset({
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._TRANSPORT,
    KafkaError._TIMED_OUT,
})


def retry_until(
    call: Callable[[float], T],
    retriable: Collection[int],
    deadline: float,
    pause_s: float,
    on_retry: Callable[[KafkaError], None] | None = None,
) -> T:
    """``call(timeout_s)`` with what is left of ``deadline`` (monotonic; at
    least 1 s), asked again ``pause_s`` later while it fails with one of the
    ``retriable`` error codes, until the deadline; ``on_retry`` hears of each."""
    while True:
        try:
            return call(max(1.0, deadline - time.monotonic()))
        except KafkaException as exc:
            if exc.args[0].code() not in retriable or time.monotonic() > deadline:
                raise
            if on_retry:
                on_retry(exc.args[0])
            time.sleep(pause_s)
