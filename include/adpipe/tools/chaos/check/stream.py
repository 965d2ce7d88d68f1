"""The chaos verdict on the stream job's output (:func:`check_stream_output`):
on-time and late output judged apart, so that a loss in one cannot be
made up by a surplus in the other (the package's docstring says how)."""

from __future__ import annotations

from collections import Counter

from .events import Key, Truth, Verdict, check_aggregates, check_dlq
from .raw import LateListing, RawEvent, RawTopic, StreamRules, WatermarkBounds


def check_stream_output(
    truth: Truth,
    raw: RawTopic,
    bounds: WatermarkBounds,
    aggregates: list[bytes],
    late: list[LateListing],
    dlq_sources: list[str | None],
    rules: StreamRules,
    closed_before: str | None = None,
) -> dict:
    """The chaos verdict on the stream job's output (see the package's
    docstring): the producer's record against the raw topic, each late
    listing on its own, then per key the aggregates against the events sent
    less the justified listings, then the DLQ."""
    verdict = Verdict()
    raw_per_key = raw.per_key(closed_before)

    # 1. The raw topic holds what the producer sent (a loss before the job).
    for key in sorted(set(truth.expected) | set(raw_per_key)):
        sent, held = truth.expected.get(key, 0), raw_per_key.get(key, 0)
        if sent != held:
            verdict.add(max(0, sent - held), max(0, held - sent), f"{key}: sent {sent}, the raw topic holds {held}")

    # 2. Each late listing on its own.
    justified_late: Counter[Key] = Counter()
    listed_at: dict[str, int] = {}  # event id -> watermark of its justified listing
    unjustified = doubles = 0
    for listing in late:
        event = raw.events.get(listing.event_id or "")
        if event is None:
            verdict.add(0, 1, f"late listing of {listing.event_id!r}: no such valid event in the raw topic")
            unjustified += 1
            continue
        if closed_before is not None and event.key[1] >= closed_before:
            continue
        why_not = _unjustified(listing, event, raw, bounds, rules.allowed_lateness_ms)
        if why_not:
            # Its event belonged in an aggregate: a listing too many, and if
            # the aggregate lacks it, the per-key count below says lost.
            verdict.add(0, 1, f"late listing of {event.event_id} {event.key}: {why_not}")
            unjustified += 1
            continue
        watermark = listing.watermark_ms or 0
        relisting_allowed = watermark >= event.window_end_ms + rules.late_dedupe_retention_ms
        if event.event_id in listed_at and not relisting_allowed:
            verdict.add(0, 1, f"late event {event.event_id} listed again at watermark {watermark}")
            doubles += 1
            continue
        counted_copy = next(
            (
                pos
                for pos in raw.copies[event.event_id]
                if pos != listing.source and bounds.certainly_open(pos, event.window_end_ms + rules.allowed_lateness_ms)
            ),
            None,
        )
        if counted_copy is not None and not relisting_allowed:
            verdict.add(
                0,
                1,
                f"late event {event.event_id} {event.key}: its copy at {counted_copy} was read while its "
                "window could still be revised (counted), and it is listed too",
            )
            doubles += 1
            continue
        if event.event_id not in listed_at:
            justified_late[event.key] += 1
        listed_at[event.event_id] = watermark

    # 3. Aggregates: each window once, each key the events sent less the
    # justified listings.
    counted = check_aggregates(aggregates, verdict)
    for key in sorted(set(raw_per_key) | set(counted)):
        want = raw_per_key.get(key, 0) - justified_late.get(key, 0)
        got = counted.get(key, 0)
        if want != got:
            verdict.add(
                max(0, want - got), max(0, got - want),
                f"{key}: {raw_per_key.get(key, 0)} events less {justified_late.get(key, 0)} justified late, "
                f"counted {got}",
            )  # fmt: skip

    # 4. The DLQ.
    check_dlq(truth.malformed, dlq_sources, verdict)
    return verdict.report(
        aggregates=len(aggregates),
        events_counted=sum(counted.values()),
        late_listed=len(late),
        late_justified=sum(justified_late.values()),
        late_unjustified=unjustified,
        late_doubles=doubles,
        raw_valid_events=sum(raw_per_key.values()),
        ledger_batches_seen=len(bounds.boundaries),
        dlq=len(dlq_sources),
    )


def _unjustified(
    listing: LateListing, event: RawEvent, raw: RawTopic, bounds: WatermarkBounds, allowed_lateness_ms: int
) -> str | None:
    """Why a listing is not justified by the watermark of its batch (None: it is)."""
    if listing.watermark_ms is None or listing.batch_id is None or listing.source is None:
        return "no watermark, batch or source header"
    if listing.source not in raw.copies[event.event_id]:
        return f"its source {listing.source} is not a copy of the event"
    final_ms = event.window_end_ms + allowed_lateness_ms
    if final_ms > listing.watermark_ms:
        return (
            f"its window ends at {event.window_end_ms} and can be revised until {final_ms}, after its batch's "
            f"watermark {listing.watermark_ms}"
        )
    highest = bounds.watermark_at_most(listing.batch_id)
    if listing.watermark_ms > highest:
        return (
            f"batch {listing.batch_id}'s watermark {listing.watermark_ms} is above what the raw records before it "
            f"allow ({highest})"
        )
    if bounds.certainly_open(listing.source, final_ms):
        return f"its copy at {listing.source} was read while its window could still be revised"
    return None
