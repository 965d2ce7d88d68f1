"""The local broker: idempotent start, status, topics of the contract."""

from __future__ import annotations

import subprocess
import sys

from adpipe import kafka_io
from adpipe.local import kafka_broker
from confluent_kafka.admin import AdminClient, ConfigResource


def test_up_is_idempotent_and_status_answers(broker) -> None:  # noqa: ANN001
    first = kafka_broker.status(broker)
    again = kafka_broker.up(broker)
    assert first.running and first.answering
    assert again.pid == first.pid  # no second broker
    cli = subprocess.run(
        [sys.executable, "-m", "adpipe", "kafka", "status"],
        env=_env(broker),
        capture_output=True,
        text=True,
        check=False,
    )
    assert cli.returncode == 0 and f"pid {first.pid}" in cli.stdout


def test_contract_topics_get_the_configured_partitions(pipeline) -> None:  # noqa: ANN001
    md = kafka_io.admin(pipeline.settings.kafka_bootstrap).list_topics(timeout=30)
    for topic in pipeline.settings.topics.all():
        assert len(md.topics[topic].partitions) == 4
    assert kafka_io.ensure_topics(pipeline.settings.kafka_bootstrap, pipeline.settings.topics.all(), 4) == []


def test_the_raw_topic_takes_the_brokers_clock_and_a_producers_clock_is_named(pipeline, caplog) -> None:  # noqa: ANN001
    """The raw topic adpipe creates stamps records with the broker's clock:
    a producer that sets a timestamp an hour ahead gets the broker's time
    back; a raw topic on the producers' clock is warned about."""
    import time

    from confluent_kafka import Producer

    settings = pipeline.settings
    topics = settings.topics
    assert kafka_io.timestamp_type(settings.kafka, topics.events) == "LogAppendTime"
    assert kafka_io.timestamp_type(settings.kafka, topics.aggregates) == "CreateTime"
    assert kafka_io.check_broker_time(settings.kafka, topics.events)
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap})
    ahead_ms = int(time.time() * 1000) + 3_600_000
    producer.produce(topics.events, b"{}", b"k", partition=0, timestamp=ahead_ms)
    producer.produce(topics.aggregates, b"{}", b"k", partition=0, timestamp=ahead_ms)
    assert producer.flush(30) == 0
    (raw,) = pipeline.read(topics.events)
    (agg,) = pipeline.read(topics.aggregates)
    assert agg.timestamp_ms == ahead_ms  # the producer's clock where it does not matter
    assert raw.timestamp_ms < ahead_ms - 3_000_000  # the broker's: within the test's minutes of now
    with caplog.at_level("WARNING", logger="adpipe.kafka_io"):
        assert not kafka_io.check_broker_time(settings.kafka, topics.aggregates)
    assert "message.timestamp.type=LogAppendTime" in caplog.text and topics.aggregates in caplog.text


def test_broker_runs_with_transactions_on_one_node(broker) -> None:  # noqa: ANN001
    admin = AdminClient({"bootstrap.servers": broker.kafka_bootstrap})
    (future,) = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER, "1")]).values()
    config = {k: v.value for k, v in future.result(timeout=30).items()}
    assert config["transaction.state.log.replication.factor"] == "1"
    assert config["offsets.topic.replication.factor"] == "1"
    assert config["auto.create.topics.enable"] == "false"


def _env(settings) -> dict[str, str]:  # noqa: ANN001
    import os

    from tests.integration.helpers import BROKER_ENV

    return {**os.environ, **BROKER_ENV}
