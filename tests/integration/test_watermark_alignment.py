"""A backlog read in capped batches never makes an on-time event late: the
watermark waits for the slowest partition that still has records waiting.

One partition holds a spike (many events in its first minute), another a
trickle, both produced before the job starts (a backlog, as after an
outage), and a closing event 30 minutes later on the trickle's partition.
Spark splits each capped batch's offsets by lag, so the trickle races ahead
in event time; with Spark's rule (the highest event time of all partitions)
the spike's windows close under it and its events turn late; aligned, none
is late and none of the spike's windows is revised.

Expectations are this file's own counts of what it sent."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from confluent_kafka import Producer

from tests.integration.helpers import latest_revisions, make_pipeline

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
SPIKE, TRICKLE = "ad-spike", "ad-trickle"


def _event(event_id: str, ad_id: str, at: datetime) -> bytes:
    return json.dumps({"event_id": event_id, "ad_id": ad_id, "event_type": "impression",
                       "event_time": at.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"}).encode()


def _minute(ad_id: str, minute: int, events: int) -> list[bytes]:
    """``events`` events of ``ad_id`` spread over one minute of event time."""
    start = START + timedelta(minutes=minute)
    step_us = 60_000_000 // events
    return [_event(f"{ad_id}-{minute}-{i}", ad_id, start + timedelta(microseconds=i * step_us)) for i in range(events)]


def send_backlog(pipeline, spike: list[int], trickle_per_minute: int) -> dict[tuple[str, str], int]:  # noqa: ANN001
    """The spike on partition 0 (``spike[m]`` events in minute m), the
    trickle on partition 1, the closing event 30 minutes later on partition
    1; returns the events per (ad, window start) that are on time."""
    producer = Producer({"bootstrap.servers": pipeline.settings.kafka_bootstrap, "enable.idempotence": True,
                         "linger.ms": 20, "compression.type": "lz4"})
    topic = pipeline.settings.topics.events
    sent: Counter[tuple[str, str]] = Counter()
    for partition, ad_id, per_minute in ((0, SPIKE, spike), (1, TRICKLE, [trickle_per_minute] * len(spike))):
        for minute, count in enumerate(per_minute):
            for value in _minute(ad_id, minute, count):
                while True:
                    try:
                        producer.produce(topic, value, ad_id.encode(), partition=partition)
                        break
                    except BufferError:
                        producer.poll(0.1)
            sent[(ad_id, f"{START + timedelta(minutes=minute):%Y-%m-%dT%H:%M:%SZ}")] += count
    producer.produce(topic, _event("closing", TRICKLE, START + timedelta(minutes=30)), TRICKLE.encode(), partition=1)
    assert producer.flush(120) == 0
    return dict(sent)


def _run(pipeline, max_offsets: int) -> dict:  # noqa: ANN001
    run = pipeline.stream(max_offsets=max_offsets, timeout=900)
    assert run.returncode == 0, run.log[-3000:]
    aggregates = pipeline.aggregates()
    return {
        "late": len(pipeline.read(pipeline.settings.topics.late)),
        "windows": {k: a["impressions"] for k, a in latest_revisions(aggregates).items()},
        "spike_revisions": sum(a.get("revision", 0) > 0 for a in aggregates if a["ad_id"] == SPIKE),
        "batches": len(run.batch_lines()),
    }


def test_a_spike_read_200_records_a_batch_is_never_late(broker, tmp_path) -> None:  # noqa: ANN001
    (tmp_path / "aligned").mkdir()
    (tmp_path / "spark").mkdir()
    aligned = make_pipeline(tmp_path / "aligned")
    sent = send_backlog(aligned, [3000, 100, 100, 100, 100], 20)
    out = _run(aligned, 200)
    assert out["batches"] > 15  # the backlog really came in capped batches
    assert (out["late"], out["spike_revisions"]) == (0, 0)
    assert out["windows"] == sent  # every window, whole, the 30-minute one still open
    report = aligned.verify()
    assert report["ok"], json.dumps(report, indent=1)

    # The same backlog by Spark's rule: the trickle's event time closes the
    # spike's windows early; their later events revise them (or are late).
    spark_rule = make_pipeline(tmp_path / "spark", {"ADPIPE_WATERMARK_ALIGNMENT": "off"})
    send_backlog(spark_rule, [3000, 100, 100, 100, 100], 20)
    unaligned = _run(spark_rule, 200)
    assert unaligned["late"] + unaligned["spike_revisions"] >= 5, unaligned


@pytest.mark.slow
def test_a_ten_minute_outage_s_spike_at_the_default_cap_is_never_late(broker, tmp_path) -> None:  # noqa: ANN001
    pipeline = make_pipeline(tmp_path)
    sent = send_backlog(pipeline, [600_000, 10_000, 10_000, 10_000, 10_000], 10_000)
    out = _run(pipeline, pipeline.settings.max_offsets_per_trigger)
    assert out["batches"] >= 2
    assert (out["late"], out["spike_revisions"]) == (0, 0)
    assert out["windows"] == sent
