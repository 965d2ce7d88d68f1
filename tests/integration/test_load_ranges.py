"""Which offsets a load of one hour reads, on a real broker: from the first
record written at or after the hour's start less the slack (skew or
lateness), not from the beginning of the topic; the DLQ from its beginning."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from adpipe.lakehouse.load import read_since_ms, region_ranges
from confluent_kafka import Producer

from tests.integration.conftest import Pipeline

OLD = datetime(2026, 11, 19, 8, tzinfo=UTC)  # written three days before the hour below
HOUR = datetime(2026, 11, 22, 12, tzinfo=UTC)


def _write(pipeline: Pipeline, topic: str, stamps: list[datetime]) -> None:
    producer = Producer({"bootstrap.servers": pipeline.settings.kafka_bootstrap, "enable.idempotence": True})
    for i, at in enumerate(stamps):
        producer.produce(topic, b"{}", b"k", partition=0, timestamp=int(at.timestamp() * 1000) + i)
    assert producer.flush(30) == 0


def test_a_load_reads_from_the_hour_less_its_slack_and_the_dlq_from_its_start(pipeline: Pipeline) -> None:
    settings = pipeline.settings
    assert read_since_ms(settings, HOUR) == int(HOUR.timestamp() * 1000) - 300_000  # the skew (300 s) > lateness
    just_before = HOUR - timedelta(seconds=200)  # within the slack: may hold the hour's records
    stamps = [OLD] * 5 + [just_before] * 3 + [HOUR + timedelta(minutes=5)] * 4
    for topic in (settings.topics.late, settings.topics.aggregates, settings.topics.dlq):
        _write(pipeline, topic, stamps)

    (region,) = settings.regions
    ranges = region_ranges(settings, region, HOUR)
    for rng in (ranges.late, ranges.aggregates):
        assert (rng.start[0], rng.end[0]) == (5, 12), rng  # the five old records are skipped
    assert (ranges.dlq.start[0], ranges.dlq.end[0]) == (0, 12)
    # An hour after every record: nothing to read but the DLQ.
    later = region_ranges(settings, region, HOUR + timedelta(hours=5))
    assert later.late.records() == later.aggregates.records() == 0 and later.dlq.records() == 12
    # The old hour reads everything.
    assert region_ranges(settings, region, OLD).late.records() == 12
