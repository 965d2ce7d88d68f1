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


def test_broker_runs_with_transactions_on_one_node(broker) -> None:  # noqa: ANN001
    admin = AdminClient({"bootstrap.servers": broker.kafka_bootstrap})
    (future,) = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER, "1")]).values()
    config = {k: v.value for k, v in future.result(timeout=30).items()}
    assert config["transaction.state.log.replication.factor"] == "1"
    assert config["offsets.topic.replication.factor"] == "1"
    assert config["auto.create.topics.enable"] == "false"


def _env(settings) -> dict[str, str]:  # noqa: ANN001
    import os

    from tests.integration.conftest import BROKER_ENV

    return {**os.environ, **BROKER_ENV}
