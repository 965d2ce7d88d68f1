"""``ad-events-late`` lists each late event once, with real processes (no
allowed lateness, so that every event of a closed window is late): late
copies of events already counted on time are duplicates, a new late event
and its retries (in the same batch, in a later run) are listed once, and a
batch SIGKILLed after producing its late copies is replayed from the same
state, so it lists them once, not zero times.

Expectations come from the producer's own summary and from this file's own
json reading of the raw records, never from the job's code."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

from adpipe import schemas as S
from adpipe.faults import AFTER_PRODUCE
from confluent_kafka import Producer

from tests.integration.helpers import assert_exactly_once, make_pipeline

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def _send(pipeline, values: list[bytes]) -> None:  # noqa: ANN001
    producer = Producer({"bootstrap.servers": pipeline.settings.kafka_bootstrap, "enable.idempotence": True})
    for value in values:
        producer.produce(pipeline.settings.topics.events, value)
    assert producer.flush(30) == 0


def _late_event(n: int) -> bytes:
    at = START + timedelta(seconds=30 + n)  # in the first minute: closed by the first run
    body = {"event_id": f"late-{n}", "ad_id": "ad-late", "event_type": "impression", "event_time": at.isoformat()}
    return json.dumps(body).encode()


def test_each_late_event_is_listed_once_through_retries_copies_of_counted_events_and_a_replay(broker, tmp_path) -> None:  # noqa: ANN001
    pipeline = make_pipeline(tmp_path, {"ADPIPE_ALLOWED_LATENESS_S": "0"})
    s1 = pipeline.produce(events=800, seed=41, minutes=4, start=START, duplicate_rate=0.03)
    first = pipeline.stream(max_offsets=300)
    assert first.returncode == 0, first.log[-3000:]

    # Copies of events counted on time in the first minute (closed): valid by
    # a plain json reading of what the producer sent.
    first_minute_end_ms = int((START + timedelta(minutes=1)).timestamp() * 1000)
    counted = []
    for rec in pipeline.read(pipeline.settings.topics.events):
        at = json.loads(rec.value)["event_time"]
        at_ms = at if isinstance(at, int) else int(datetime.fromisoformat(at).timestamp() * 1000)
        if at_ms < first_minute_end_ms:
            counted.append(rec.value)
    resent = list(dict.fromkeys(counted))[:15]
    assert len(resent) == 15
    late = [_late_event(n) for n in range(10)]
    # Each new late event twice in a row (a retry in the same batch), then on-time traffic.
    _send(pipeline, [*resent, *(v for value in late for v in (value, value))])
    s2 = pipeline.produce(events=300, seed=42, minutes=2, start=START + timedelta(minutes=4))

    # The batch that writes the late copies dies after producing them: its
    # transaction is aborted, and the state Spark saved for it is not used.
    killed = pipeline.stream(max_offsets=300, fault={"ADPIPE_FAULT": AFTER_PRODUCE, "ADPIPE_FAULT_ON": "records"})
    assert killed.returncode == -9, killed.log[-3000:]
    replayed = pipeline.stream(max_offsets=300)
    assert replayed.returncode == 0, replayed.log[-3000:]
    assert "late 10, repeats skipped 25 (late 25)" in replayed.log  # 15 copies of counted events, 10 retries

    # The same late events once more, in a later run.
    _send(pipeline, late)
    again = pipeline.stream(max_offsets=300)
    assert again.returncode == 0, again.log[-3000:]
    assert "late 0, repeats skipped 10 (late 10)" in again.log
    assert "Spark dropped" not in first.log + replayed.log + again.log

    listed = Counter(r.header(S.HEADER_EVENT_ID) for r in pipeline.read(pipeline.settings.topics.late))
    assert listed == Counter(f"late-{n}" for n in range(10))
    assert_exactly_once(pipeline, [s1, s2], min_windows=40)
