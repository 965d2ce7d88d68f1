"""Hostile input on a host that is not on UTC: an event dated 2099, records
of 1.5 MB the broker took compressed (valid, malformed and late ones), a
daylight-saving change in the middle of the data, a SIGKILL after a commit
and the restart on a host in another zone, then partitions added to the raw
topic and a run in a third zone.

Expectations come from the producer's own summaries and from this file's
reading of the contract (window starts in UTC, record_uuid = uuid5 of job,
ad and that UTC start), never from the job's code."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

from adpipe import kafka_io
from adpipe import schemas as S
from adpipe.faults import AFTER_COMMIT
from adpipe.stream.job import RECORD_UUID_NAMESPACE
from confluent_kafka import Producer
from confluent_kafka.admin import NewPartitions

from tests.corpus import bad_raw_values
from tests.integration.helpers import assert_exactly_once

CORPUS = bad_raw_values()

# US daylight saving time ends on 2026-11-01 at 06:00 UTC (02:00 EDT -> 01:00 EST).
START = datetime(2026, 11, 1, 5, 57, tzinfo=UTC)
BIG = 1_500_000  # bytes of padding: over the topics' 1 MiB limit unless compressed
LONG_ID = 600_000  # characters of an identifier: the value fits 1 MiB, with its key it does not


def _event(event_id: str, ad_id: str, event_type: str, event_time: str, pad: int = 0) -> bytes:
    body = {"event_id": event_id, "ad_id": ad_id, "event_type": event_type, "event_time": event_time}
    if pad:
        body["pad"] = "x" * pad
    return json.dumps(body).encode()


def _send_compressed(pipeline, values: list[bytes | tuple]) -> None:  # noqa: ANN001
    """As a producer of large records does: lz4, a client limit above 1 MiB
    (each value alone, or (key, value[, timestamp ms])). Spread over the
    partitions in turn: micro-batches take the same share of each
    partition's backlog, so extra records at the head of one partition would
    hold its events back and make some late by the others' watermark."""
    producer = Producer(
        {
            "bootstrap.servers": pipeline.settings.kafka_bootstrap,
            "enable.idempotence": True,
            "compression.type": "lz4",
            "message.max.bytes": 4_000_000,
        }
    )
    errors = []
    for n, item in enumerate(values):
        key, value, *stamp = item if isinstance(item, tuple) else (None, item)
        producer.produce(
            pipeline.settings.topics.events,
            value,
            key,
            partition=n % pipeline.settings.topic_partitions,
            timestamp=stamp[0] if stamp else 0,
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )
    assert producer.flush(60) == 0 and errors == []


def test_hostile_input_on_a_non_utc_host_killed_then_partitions_added_and_restarted_in_another_zone(pipeline) -> None:  # noqa: ANN001
    # First in the topic: the 1.5 MB event is on time, and had the 2099 event
    # moved the watermark, every event after it would be late. (Its time
    # moves the watermark to 05:57:00, which closes no window of the events
    # produced after it.)
    big_valid = _event("big-valid", "ad-big", "click", "2026-11-01T05:57:30Z", pad=BIG)
    big_malformed = _event("big-bad", "ad-big", "view", "2026-11-01T05:58:30Z", pad=BIG)
    # 600 KB identifiers, keyed by them as the contract keys raw events: the
    # broker takes each record (key and value together about 1.2 MB) compressed.
    long_ad = _event("long-ad", "a" * LONG_ID, "impression", "2026-11-01T05:57:40Z")
    long_bad = _event("long-bad", "b" * LONG_ID, "view", "2026-11-01T05:57:40Z")
    long_campaign = json.dumps({**json.loads(_event("long-cmp", "ad-c", "click", "2026-11-01T05:57:40Z")),
                                "campaign_id": "c" * LONG_ID}).encode()
    # A producer whose clock runs 50 minutes fast stamps its record so; the
    # broker's clock is the record's timestamp, so its event is in the future
    # and moves no watermark.
    fast_ms = int(time.time() * 1000) + 50 * 60_000
    fast_time = f"{datetime.fromtimestamp(fast_ms / 1000, UTC):%Y-%m-%dT%H:%M:%SZ}"
    fast_clock = _event("fast-clock", "ad-000001", "impression", fast_time)
    _send_compressed(
        pipeline,
        [
            big_valid,
            _event("future-1", "ad-000001", "impression", "2099-01-01T00:00:00Z"),  # the clock of a broken device
            big_malformed,
            (b"a" * LONG_ID, long_ad),
            (b"b" * LONG_ID, long_bad),
            (b"ad-c", long_campaign),
            (b"ad-000001", fast_clock, fast_ms),
            *(value for _case, _reason, value in CORPUS),  # every bad value of the committed corpus
        ],
    )
    s1 = pipeline.produce(events=900, seed=31, minutes=5, start=START, duplicate_rate=0.03, malformed_rate=0.02)
    killed = pipeline.stream(
        max_offsets=250,
        fault={"ADPIPE_FAULT": AFTER_COMMIT, "ADPIPE_FAULT_BATCH": "1"},
        env={"TZ": "America/New_York"},
    )
    assert killed.returncode == -9, killed.log[-3000:]
    assert f"fault injection: SIGKILL at {AFTER_COMMIT}" in killed.log

    restarted = pipeline.stream(max_offsets=250, env={"TZ": "Asia/Kolkata"})
    assert restarted.returncode == 0, restarted.log[-3000:]
    assert "already committed by an earlier run" in restarted.log

    # Partitions are added while the job is down; the next run finds them.
    topic = pipeline.settings.topics.events
    admin = kafka_io.admin(pipeline.settings.kafka_bootstrap)
    admin.create_partitions([NewPartitions(topic, 6)])[topic].result()
    # After the 2099 event: on-time events go on being counted, late ones listed.
    s2 = pipeline.produce(events=300, seed=32, minutes=2, start=START + timedelta(minutes=5), late_rate=0.05)
    # Late past the allowed lateness (five minutes): listed in the late topic.
    long_late = _event("l" * LONG_ID, "ad-000001", "impression", "2026-11-01T05:50:10Z")  # its window closed
    _send_compressed(
        pipeline,
        [_event("big-late", "ad-big", "impression", "2026-11-01T05:50:00Z", pad=BIG), (b"ad-000001", long_late)],
    )
    ends = kafka_io.end_offsets(pipeline.settings.kafka_bootstrap, topic)
    assert len(ends) == 6 and ends[4] > 0 and ends[5] > 0
    after = pipeline.stream(max_offsets=250, env={"TZ": "Europe/Berlin"})
    assert after.returncode == 0, after.log[-3000:]

    big_click = {"ad_id": "ad-big", "window_start": "2026-11-01T05:57:00Z", "event_type": "click", "events": 1}
    aggregates = assert_exactly_once(pipeline, [s1, s2, {"counts": [big_click]}], min_windows=100)
    job = pipeline.settings.job_id
    for a in aggregates:  # what a UTC host gives: UTC minute starts, keys from them
        assert a["window_start"].endswith(":00Z") and a["window_end"].endswith(":00Z")
        assert a["record_uuid"] == str(uuid.uuid5(RECORD_UUID_NAMESPACE, f"{job}|{a['ad_id']}|{a['window_start']}"))
    starts = {a["window_start"] for a in aggregates}
    assert {"2026-11-01T05:59:00Z", "2026-11-01T06:00:00Z", "2026-11-01T06:02:00Z"} <= starts  # across the change
    assert {(a["ad_id"], a["window_start"], a["clicks"]) for a in aggregates if a["ad_id"] == "ad-big"} == {
        ("ad-big", "2026-11-01T05:57:00Z", 1)
    }

    dlq = pipeline.read(pipeline.settings.topics.dlq)
    (future,) = [r for r in dlq if b'"future-1"' in (r.value or b"")]
    assert future.header(S.HEADER_REASON) == S.REASON_FUTURE_EVENT_TIME
    cut = [r for r in dlq if r.header(S.HEADER_REASON) == S.REASON_OVERSIZED]
    (big_cut,) = [r for r in cut if r.header(S.HEADER_ORIGINAL_SIZE) == str(len(big_malformed))]
    assert big_cut.header(S.HEADER_ORIGINAL_REASON) == S.REASON_BAD_EVENT_TYPE
    assert len(big_cut.value) < len(big_malformed) and big_malformed.startswith(big_cut.value)
    # A 600 KB identifier is never a key or a header: the event is malformed
    # (field_too_long); a copy whose key and value together pass the topic's
    # limit keeps its value and 1 KiB of its key.
    by_value = {r.value: r for r in dlq}
    for value, reason in ((long_ad, S.REASON_FIELD_TOO_LONG), (long_bad, S.REASON_BAD_EVENT_TYPE)):
        copy = by_value[value]
        assert (copy.header(S.HEADER_REASON), copy.header(S.HEADER_ORIGINAL_REASON)) == (S.REASON_OVERSIZED, reason)
        assert copy.key == value.split(b'"ad_id": "')[1][:1024]
    for value in (long_campaign, long_late):
        assert by_value[value].header(S.HEADER_REASON) == S.REASON_FIELD_TOO_LONG
    assert len(cut) == 3
    reasons_of_value: dict[bytes, set[str]] = {}
    for r in dlq:
        reasons_of_value.setdefault(r.value or b"", set()).add(r.header(S.HEADER_REASON))
    for case, reason, value in CORPUS:
        assert reason in reasons_of_value.get(value, set()), case
    assert by_value[fast_clock].header(S.HEADER_REASON) == S.REASON_FUTURE_EVENT_TIME
    assert Counter(r.header(S.HEADER_REASON) for r in dlq)[S.REASON_FUTURE_EVENT_TIME] == 3  # 2099 twice, fast clock

    late = pipeline.read(pipeline.settings.topics.late)
    late_ids = Counter(r.header(S.HEADER_EVENT_ID) for r in late)
    assert late_ids == Counter([*(e["event_id"] for e in s2["late_events"]), "big-late"])
    (big_late,) = [r for r in late if r.header(S.HEADER_EVENT_ID) == "big-late"]
    assert (big_late.header(S.HEADER_REASON), big_late.header(S.HEADER_ORIGINAL_REASON)) == (S.REASON_OVERSIZED, "late")
