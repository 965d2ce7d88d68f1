"""Reading a topic's timestamp type while a topic just created settles
(adpipe.kafka_io.topics.timestamp_type), against a scripted admin client."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from adpipe.kafka_io import topics
from confluent_kafka import KafkaError, KafkaException


class _Entry:
    def __init__(self, value: str) -> None:
        self.value = value


class _Admin:
    """Answers describe_configs from a script: an error code, {} (no
    configs yet) or a timestamp type, one per call."""

    def __init__(self, script: list) -> None:
        self.script, self.calls = script, 0

    def describe_configs(self, resources, request_timeout):  # noqa: ANN001, ANN201
        answer = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        future: Future = Future()
        if isinstance(answer, int):
            future.set_exception(KafkaException(KafkaError(answer)))
        else:
            future.set_result({} if answer is None else {topics.TIMESTAMP_TYPE: _Entry(answer)})
        return {resources[0]: future}


def test_a_topic_just_created_is_asked_again_until_the_broker_knows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = _Admin([KafkaError.UNKNOWN_TOPIC_OR_PART, None, "LogAppendTime"])
    monkeypatch.setattr(topics, "admin", lambda _kafka: admin)
    assert topics.timestamp_type("127.0.0.1:9092", "raw", timeout_s=5) == "LogAppendTime"
    assert admin.calls == 3


def test_a_refusal_or_a_topic_that_never_appears_reads_as_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    refused = _Admin([KafkaError.TOPIC_AUTHORIZATION_FAILED])
    monkeypatch.setattr(topics, "admin", lambda _kafka: refused)
    assert topics.timestamp_type("127.0.0.1:9092", "raw", timeout_s=5) is None
    assert refused.calls == 1  # not retriable: no second ask
    missing = _Admin([KafkaError.UNKNOWN_TOPIC_OR_PART])
    monkeypatch.setattr(topics, "admin", lambda _kafka: missing)
    assert topics.timestamp_type("127.0.0.1:9092", "raw", timeout_s=0.5) is None
    assert missing.calls >= 2
