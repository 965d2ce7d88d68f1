"""Which offsets a load reads, on a real broker: a partition no load has
read starts at the first record written at or after the hour's start less
the slack (skew or lateness), not at the beginning of the topic; a partition
with coverage continues where the coverage ends; a read for an hour before
the coverage goes back to that hour; records deleted before any load read
them are counted as lost."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from adpipe import kafka_io
from adpipe.lakehouse.ranges import advance, read_since_ms, region_ranges
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from tests.integration.helpers import Pipeline, on_producers_clock

OLD = datetime(2026, 11, 19, 8, tzinfo=UTC)  # written three days before the hour below
HOUR = datetime(2026, 11, 22, 12, tzinfo=UTC)


def _write(pipeline: Pipeline, topic: str, stamps: list[datetime]) -> None:
    producer = Producer({"bootstrap.servers": pipeline.settings.kafka_bootstrap, "enable.idempotence": True})
    for i, at in enumerate(stamps):
        producer.produce(topic, b"{}", b"k", partition=0, timestamp=int(at.timestamp() * 1000) + i)
    assert producer.flush(30) == 0


def test_a_load_reads_from_the_hour_less_its_slack_then_from_where_it_stopped(pipeline: Pipeline) -> None:
    settings = pipeline.settings
    # The watermark delay plus the allowed lateness (30 + 300 s) is over the future skew (300 s).
    assert read_since_ms(settings, HOUR) == int(HOUR.timestamp() * 1000) - 330_000
    just_before = HOUR - timedelta(seconds=200)  # within the slack: may hold the hour's records
    stamps = [OLD] * 5 + [just_before] * 3 + [HOUR + timedelta(minutes=5)] * 4
    topics = (settings.topics.late, settings.topics.aggregates, settings.topics.dlq)
    for topic in topics:
        _write(pipeline, topic, stamps)

    (region,) = settings.regions
    ranges = region_ranges(settings, region, HOUR)
    for rng in (ranges.late, ranges.aggregates, ranges.dlq):
        assert (rng.start[0], rng.end[0]) == (5, 12), rng  # the five old records are skipped
    # An hour after every record, nothing loaded yet: nothing to read.
    later = region_ranges(settings, region, HOUR + timedelta(hours=5))
    assert later.late.records() == later.aggregates.records() == later.dlq.records() == 0

    # Once the first run is in the coverage, the next reads only what arrived since.
    coverage = advance({}, [ranges])[region.job_id]
    assert coverage[settings.topics.late]["0"] == [5, 12]
    assert region_ranges(settings, region, HOUR, coverage).late.records() == 0
    _write(pipeline, settings.topics.late, [HOUR + timedelta(hours=3)] * 2)  # two days late, say
    next_run = region_ranges(settings, region, HOUR + timedelta(hours=1), coverage)
    assert (next_run.late.start[0], next_run.late.end[0]) == (12, 14)
    # A backfill of an hour before the coverage goes back to that hour's records.
    assert region_ranges(settings, region, OLD, coverage).late.start[0] == 0


def test_records_deleted_before_any_load_read_them_are_counted_as_lost(pipeline: Pipeline) -> None:
    settings = pipeline.settings
    topic = settings.topics.dlq
    _write(pipeline, topic, [HOUR] * 6)
    (region,) = settings.regions
    coverage = advance({}, [region_ranges(settings, region, HOUR)])[region.job_id]
    coverage[topic]["0"] = [0, 2]  # a load read two records, then stopped for a long time
    admin = AdminClient({"bootstrap.servers": settings.kafka_bootstrap})
    done = admin.delete_records([TopicPartition(topic, 0, 4)])  # retention took offsets 0..3
    for future in done.values():
        future.result(30)
    assert kafka_io.offset_bounds(settings.kafka_bootstrap, topic)[0][0] == 4
    dlq = region_ranges(settings, region, HOUR, coverage).dlq
    assert (dlq.start[0], dlq.end[0]) == (4, 6)
    assert dlq.lost == {0: 2}


PROBE = r"""
import json, sys
from datetime import datetime
from adpipe.lakehouse.read import regions_with_events
from adpipe.settings import load_settings
from adpipe.spark import build_spark
settings = load_settings()
spark = build_spark(settings, "regions-probe")
print(json.dumps([regions_with_events(settings, spark, datetime.fromisoformat(h)) for h in sys.argv[1:]]))
"""


def test_a_region_has_input_for_an_hour_only_with_a_valid_event_of_it_written_then(pipeline: Pipeline) -> None:
    import json
    import subprocess
    import sys

    from confluent_kafka import Consumer

    settings = pipeline.settings
    topic = settings.topics.events

    def event(event_id: str, at: datetime) -> bytes:
        return json.dumps({"event_id": event_id, "ad_id": "ad-1", "event_type": "click",
                           "event_time": at.strftime("%Y-%m-%dT%H:%M:%SZ")}).encode()

    on_producers_clock(settings)  # the records below are written 'during' HOUR by their timestamps
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "enable.idempotence": True})
    # Written during HOUR: an event of HOUR, a replayed event of three days before, a malformed record.
    written_ms = int((HOUR + timedelta(minutes=8)).timestamp() * 1000)
    for value in (event("e1", HOUR + timedelta(minutes=7)), event("e2", OLD), b"{oops"):
        producer.produce(topic, value, b"ad-1", partition=0, timestamp=written_ms)
    # Written during the next hour: only a replay of HOUR - 1 h.
    producer.produce(topic, event("e3", HOUR - timedelta(minutes=30)), b"ad-1", partition=0,
                     timestamp=int((HOUR + timedelta(minutes=70)).timestamp() * 1000))
    assert producer.flush(30) == 0
    # The region's stream has committed all four records.
    group = kafka_io.ledger_group(settings.job_id)
    ledger = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": group})
    ledger.commit(offsets=[TopicPartition(topic, 0, 4, '{"watermark_ms": 0}')], asynchronous=False)
    ledger.close()

    hours = [HOUR, HOUR + timedelta(hours=1), HOUR - timedelta(hours=1)]
    done = subprocess.run([sys.executable, "-c", PROBE, *(h.isoformat() for h in hours)], env=pipeline.env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [[settings.job_id], [], []]


def test_a_load_waits_for_the_last_batchs_transaction_markers_then_fails_retriably(pipeline: Pipeline) -> None:
    """The ledger can be visible before an output partition's transaction
    marker (its leader failing over between the two writes): here a batch's
    aggregate stays in an open transaction while the ledger names it. A load
    waits for the marker, bounded, then fails retriably; once the marker is
    written it reads the batch's output."""
    import threading
    import uuid

    import pytest
    from adpipe.lakehouse.ranges import OutputNotStable
    from adpipe.settings import load_settings
    from adpipe.stream.sink_ledger import ledger_metadata
    from confluent_kafka import Consumer

    settings = pipeline.settings
    aggregates = settings.topics.aggregates
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "transactional.id": f"t-{uuid.uuid4()}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(aggregates, b'{"batch": 3}', b"ad-1", partition=2)
    assert producer.flush(30) == 0
    meta = ledger_metadata(3, None, 0, {(aggregates, 2): 1})  # the batch wrote offset 0 of partition 2
    group = kafka_io.ledger_group(settings.job_id)
    ledger = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": group})
    ledger.commit(offsets=[TopicPartition(settings.topics.events, 0, 0, meta)], asynchronous=False)
    ledger.close()
    (region,) = settings.regions

    impatient = load_settings({**pipeline.env, "ADPIPE_LOAD_OUTPUT_WAIT_S": "2"})
    with pytest.raises(OutputNotStable, match=rf"{aggregates}\[2\].*\(0, 1\).*run the load again"):
        region_ranges(impatient, region, HOUR)

    # The marker comes while the load waits: it reads the batch's aggregate.
    threading.Timer(2.0, lambda: producer.commit_transaction(30)).start()
    ranges = region_ranges(load_settings({**pipeline.env, "ADPIPE_LOAD_OUTPUT_WAIT_S": "60"}), region, HOUR)
    assert ranges.aggregates.end[2] >= 1 and ranges.aggregates.start[2] == 0
