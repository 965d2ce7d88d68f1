"""Late events within the allowed lateness revise their window, exactly
once, with real processes: three rounds of late events, each read by a
batch that the stream job SIGKILLs at one of its commit points (after
producing into its transaction, during its commit, after it), then
restarts. Each round's window is emitted once more with its full corrected
counts, its retries make no revision, an event past the allowed lateness is
listed late, and ``adpipe verify`` agrees.

Expectations are the producer's summary plus this file's own count of the
late events it sent, never the job's code."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

from adpipe import kafka_io
from adpipe import schemas as S
from adpipe.faults import AFTER_COMMIT, AFTER_PRODUCE, DURING_COMMIT
from confluent_kafka import Producer

from tests.integration.helpers import assert_exactly_once, expected_windows

START = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
AD = "ad-000003"


def _late(pipeline, events: list[tuple[str, datetime]]) -> None:  # noqa: ANN001
    """Impressions of ``AD`` (event id, event time), sent in one transaction."""
    producer = Producer({"bootstrap.servers": pipeline.settings.kafka_bootstrap, "transactional.id": "late-sender"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for event_id, at in events:
        body = {"event_id": event_id, "ad_id": AD, "event_type": "impression", "event_time": at.isoformat()}
        producer.produce(pipeline.settings.topics.events, json.dumps(body).encode(), AD.encode())
    producer.commit_transaction(30)


def _last_batch(pipeline) -> int:  # noqa: ANN001
    commits = kafka_io.stream_commits(pipeline.settings)
    return max(json.loads(meta)["batch_id"] for _offset, meta in commits.values() if meta)


def test_late_events_within_the_lateness_revise_their_window_once_through_sigkills_at_each_commit_point(
    pipeline,  # noqa: ANN001
) -> None:
    summary = pipeline.produce(events=1200, seed=61, minutes=6, start=START, atomic=True)
    first = pipeline.stream(max_offsets=2000)
    assert first.returncode == 0, first.log[-3000:]
    # The watermark is about 12:05:30: 12:00 to 12:04 are closed, and within
    # their allowed lateness (five minutes) until it passes their end + 5 min.
    on_time = expected_windows(summary)
    minute_2, minute_3 = "2026-11-22T12:02:00Z", "2026-11-22T12:03:00Z"
    assert (AD, minute_2) in on_time and (AD, minute_3) in on_time  # the late events revise windows it has
    sent_late: Counter[str] = Counter()
    seen: set[str] = set()
    rounds = [
        (AFTER_PRODUCE, [("r1-a", START + timedelta(minutes=2, seconds=5)), ("r1-b", START + timedelta(minutes=2))]),
        (DURING_COMMIT, [("r2-a", START + timedelta(minutes=2, seconds=9)),
                         ("r1-a", START + timedelta(minutes=2, seconds=5))]),
        (AFTER_COMMIT, [("r3-a", START + timedelta(minutes=3, seconds=1)), ("gone", START - timedelta(minutes=9))]),
    ]
    for point, events in rounds:
        _late(pipeline, events)
        killed = pipeline.stream(
            max_offsets=2000, fault={"ADPIPE_FAULT": point, "ADPIPE_FAULT_BATCH": str(_last_batch(pipeline) + 1)}
        )
        assert killed.returncode == -9, killed.log[-3000:]
        restarted = pipeline.stream(max_offsets=2000)
        assert restarted.returncode == 0, restarted.log[-3000:]
        for event_id, at in events:
            if event_id not in seen and at >= START:  # new, within the lateness (12:00 on)
                sent_late[f"{at:%Y-%m-%dT%H:%M}:00Z"] += 1
            seen.add(event_id)

    aggregates = assert_exactly_once(pipeline, [summary, {"counts": [
        {"ad_id": AD, "window_start": w, "event_type": "impression", "events": n} for w, n in sent_late.items()
    ]}], min_windows=60)
    revisions = {(a["window_start"], a["revision"]): a["impressions"] for a in aggregates
                 if a["ad_id"] == AD and a.get("revision", 0) > 0}
    # One revision per round that brought a new event (r1-a's retry in round 2 brings none).
    assert revisions == {
        (minute_2, 1): on_time[(AD, minute_2)][0] + 2,
        (minute_2, 2): on_time[(AD, minute_2)][0] + 3,
        (minute_3, 1): on_time[(AD, minute_3)][0] + 1,
    }
    late = pipeline.read(pipeline.settings.topics.late)
    assert [r.header(S.HEADER_EVENT_ID) for r in late] == ["gone"]
