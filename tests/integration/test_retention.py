"""An hour Kafka no longer holds in full fails the check instead of passing
on what is left (adpipe.lakehouse.ranges.retention_gaps), with a real
broker deleting records as retention would."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from adpipe import kafka_io
from adpipe.lakehouse.ranges import retention_gaps
from confluent_kafka import TopicPartition

from tests.integration.helpers import Pipeline


def test_an_hour_whose_records_were_deleted_is_a_gap_a_later_hour_is_not(pipeline: Pipeline) -> None:
    settings = pipeline.settings
    sent_at = datetime.now(UTC)
    pipeline.produce(events=200, seed=61, minutes=2, start=datetime(2026, 11, 22, 12, tzinfo=UTC))
    this_hour = sent_at.replace(minute=0, second=0, microsecond=0)
    earlier_hour = this_hour - timedelta(hours=3)
    assert retention_gaps(settings, earlier_hour) == []  # nothing deleted: Kafka holds everything

    # Retention deletes the oldest records of one partition.
    topic = settings.topics.events
    (partition, end), *_ = sorted(kafka_io.end_offsets(settings.kafka_bootstrap, topic).items(), key=lambda x: -x[1])
    admin = kafka_io.admin(settings.kafka_bootstrap)
    futures = admin.delete_records([TopicPartition(topic, partition, end // 2)])
    for future in futures.values():
        future.result(30)

    gaps = retention_gaps(settings, earlier_hour)
    assert [(g["topic"], g["partition"], g["first_offset"]) for g in gaps] == [(topic, partition, end // 2)]
    # An hour that starts after the first kept record was written: nothing of it can be gone.
    assert retention_gaps(settings, this_hour + timedelta(hours=2)) == []
