"""Synthetic raw ad events, seeded and reproducible, through an idempotent
producer. The summary it writes is the independent truth tests and the demo
compare the pipeline's output against."""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Producer

from adpipe import kafka_io
from adpipe.settings import KafkaAccess

log = logging.getLogger(__name__)

DEFAULT_START = "2026-11-22T12:00:00Z"
MALFORMED_KINDS = (
    "not_json",
    "not_object",
    "missing_event_id",
    "event_id_not_string",
    "unknown_event_type",
    "bad_event_time",
    "naive_event_time",
    "bool_event_time",
    "missing_ad_id",
)


@dataclass(frozen=True)
class ProduceSpec:
    """What to generate. Counts are exact; rates are fractions of ``events``."""

    events: int
    seed: int = 0
    ads: int = 20
    # Ad ids start here: regions (or tests) with disjoint ads use different offsets.
    ad_offset: int = 0
    campaigns: int = 5
    minutes: int = 5
    start: datetime = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    click_rate: float = 0.1
    duplicate_rate: float = 0.0
    late_rate: float = 0.0
    late_by_minutes: int = 5
    # Late events are timed at least this long before ``start``, so that
    # once a stream saw events up to ``start`` their window closed and its
    # allowed lateness (five minutes by default) passed too: they go to the
    # late topic (the window just before ``start`` may still be open:
    # watermark delay < 1 minute).
    late_gap_minutes: int = 7
    # Extra events timed 90 s to 4 min before the on-time event they are
    # sent beside: out of order by minutes, so a stream may read them after
    # their window closed but within its allowed lateness (a revision).
    revise_rate: float = 0.0
    malformed_rate: float = 0.0
    events_per_second: float = 0.0

    def __post_init__(self) -> None:
        if self.events < 0 or self.ads < 1 or self.minutes < 1 or self.campaigns < 1 or self.ad_offset < 0:
            raise ValueError("events and ad_offset must be >= 0; ads, campaigns and minutes >= 1")
        for name in ("click_rate", "duplicate_rate", "late_rate", "revise_rate", "malformed_rate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]")
        if self.start.tzinfo is None:
            raise ValueError("start must carry a time zone")


@dataclass
class Message:
    key: bytes | None
    value: bytes
    kind: str  # on_time | revising | duplicate | late | malformed:<reason>


@dataclass
class Plan:
    messages: list[Message] = field(default_factory=list)
    summary: dict = field(default_factory=dict)


def _iso(ts: datetime, rng: random.Random) -> str | int:
    """Mix the contract's accepted forms of event_time."""
    roll = rng.random()
    if roll < 0.2:
        return int(ts.timestamp() * 1000)
    if roll < 0.3:
        return ts.astimezone(timezone_plus_one()).isoformat(timespec="milliseconds")
    return ts.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts.microsecond // 1000:03d}Z"


def timezone_plus_one():  # noqa: ANN201 - tiny helper
    from datetime import timezone

    return timezone(timedelta(hours=1))


def _minute(ts: datetime) -> str:
    return ts.replace(second=0, microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")


def _event(rng: random.Random, spec: ProduceSpec, ts: datetime) -> dict:
    ad = spec.ad_offset + rng.randrange(spec.ads)
    return {
        "event_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        "ad_id": f"ad-{ad:06d}",
        "campaign_id": f"cmp-{ad % spec.campaigns:03d}",
        "event_type": "click" if rng.random() < spec.click_rate else "impression",
        "event_time": _iso(ts, rng),
        "_ts": ts,
    }


def _encode(event: dict) -> Message:
    body = {k: v for k, v in event.items() if not k.startswith("_")}
    return Message(event["ad_id"].encode(), json.dumps(body).encode(), "on_time")


def _malformed(rng: random.Random, spec: ProduceSpec, kind: str) -> Message:
    base = _event(rng, spec, spec.start)
    body = {k: v for k, v in base.items() if not k.startswith("_")}
    key = base["ad_id"].encode()
    if kind == "not_json":
        return Message(key, b"{not json " + str(rng.random()).encode(), f"malformed:{kind}")
    if kind == "not_object":
        return Message(key, json.dumps([body["event_id"], 1]).encode(), f"malformed:{kind}")
    if kind == "missing_event_id":
        del body["event_id"]
    elif kind == "event_id_not_string":
        body["event_id"] = rng.randrange(1, 10**9)
    elif kind == "unknown_event_type":
        body["event_type"] = "view"
    elif kind == "bad_event_time":
        body["event_time"] = "yesterday"
    elif kind == "naive_event_time":
        body["event_time"] = spec.start.strftime("%Y-%m-%dT%H:%M:%S")
    elif kind == "bool_event_time":
        body["event_time"] = True
    elif kind == "missing_ad_id":
        del body["ad_id"]
    return Message(key, json.dumps(body).encode(), f"malformed:{kind}")


def plan(spec: ProduceSpec) -> Plan:
    """Every message to send, in order, and the summary of what they mean.

    On-time events are spread over ``minutes`` from ``start`` in event-time
    order with a little jitter (out-of-order within seconds). A duplicate is
    a producer retry: the same bytes again, a few messages later. Revising
    events are timed 90 s to 4 minutes before the on-time event they follow
    (counted, perhaps in a revision of their window). Late events
    have event times before ``start`` and are sent last, so they are late for
    a stream whose watermark has already passed ``start - late_gap_minutes``
    (for example after an earlier run up to ``start`` was processed)."""
    rng = random.Random(spec.seed)
    span_ms = spec.minutes * 60_000
    offsets = sorted(rng.randrange(span_ms) for _ in range(spec.events))
    on_time = [_event(rng, spec, spec.start + timedelta(milliseconds=o)) for o in offsets]
    # Jitter: swap a few neighbours so arrival order is not event-time order.
    for i in range(0, len(on_time) - 1, 7):
        on_time[i], on_time[i + 1] = on_time[i + 1], on_time[i]

    messages: list[Message] = []
    for event in on_time:
        msg = _encode(event)
        messages.append(msg)
    revising = []
    for _ in range(round(spec.events * spec.revise_rate) if on_time else 0):
        i = rng.randrange(len(on_time))
        back = timedelta(milliseconds=90_000 + rng.randrange(150_000))
        revising.append((i, _event(rng, spec, max(spec.start, on_time[i]["_ts"] - back))))
    for i, event in sorted(revising, key=lambda r: r[0], reverse=True):
        msg = _encode(event)
        msg.kind = "revising"
        messages.insert(i + 1, msg)
    for _ in range(round(spec.events * spec.duplicate_rate)):
        if not on_time:
            break
        i = rng.randrange(len(messages))
        original = messages[i]
        if original.kind not in ("on_time", "revising"):
            continue
        messages.insert(
            min(len(messages), i + 1 + rng.randrange(5)), Message(original.key, original.value, "duplicate")
        )
    for _ in range(round(spec.events * spec.malformed_rate)):
        kind = MALFORMED_KINDS[rng.randrange(len(MALFORMED_KINDS))]
        messages.insert(rng.randrange(len(messages) + 1), _malformed(rng, spec, kind))
    late_span_ms = spec.late_by_minutes * 60_000
    late = [
        _event(
            rng,
            spec,
            spec.start - timedelta(minutes=spec.late_gap_minutes, milliseconds=1 + rng.randrange(late_span_ms)),
        )
        for _ in range(round(spec.events * spec.late_rate))
    ]
    for event in late:
        msg = _encode(event)
        msg.kind = "late"
        messages.append(msg)

    counted = [*on_time, *(event for _i, event in revising)]
    counts = Counter((e["ad_id"], _minute(e["_ts"]), e["event_type"]) for e in counted)
    kinds = Counter(m.kind for m in messages)
    summary = {
        "seed": spec.seed,
        "start": spec.start.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "minutes": spec.minutes,
        "messages": len(messages),
        "distinct_on_time": len(on_time),
        "revising": len(revising),
        "duplicates": kinds["duplicate"],
        "late": len(late),
        "malformed": sum(n for k, n in kinds.items() if k.startswith("malformed:")),
        "malformed_by_reason": {k.split(":", 1)[1]: n for k, n in sorted(kinds.items()) if k.startswith("malformed:")},
        "counts": [
            {"ad_id": ad, "window_start": minute, "event_type": etype, "events": n}
            for (ad, minute, etype), n in sorted(counts.items())
        ],
        "late_events": [
            {
                "event_id": e["event_id"],
                "ad_id": e["ad_id"],
                "event_type": e["event_type"],
                "window_start": _minute(e["_ts"]),
            }
            for e in late
        ],
    }
    return Plan(messages, summary)


def idempotent_producer(kafka: KafkaAccess | str) -> Producer:
    """The raw-event producer of the design: idempotent, every in-sync
    replica acknowledges (a broker of three may die without a loss)."""
    return Producer(
        {
            **kafka_io.client_config(kafka),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "compression.type": "lz4",
            # librdkafka's own lines (a retry while a fresh broker loads its
            # coordinator) through Python logging, served by poll(): the demo
            # keeps them in its log file.
            "logger": logging.getLogger("librdkafka"),
        }
    )


def send(
    kafka: KafkaAccess | str,
    topic: str,
    the_plan: Plan,
    events_per_second: float = 0.0,
    on_progress: Callable[[int, int], None] | None = None,
) -> int:
    """Send the plan's messages through an idempotent producer; return the
    number acknowledged. Raises if any message could not be delivered.
    ``on_progress(sent, total)`` is called every 1 % (a progress bar)."""
    producer = idempotent_producer(kafka)
    failures: list[str] = []
    delivered = 0

    def on_delivery(err, _msg) -> None:  # noqa: ANN001
        nonlocal delivered
        if err is not None:
            failures.append(str(err))
        else:
            delivered += 1

    total = len(the_plan.messages)
    started = time.monotonic()
    step = max(1, total // 10)
    tick = max(1, total // 100)
    for i, msg in enumerate(the_plan.messages, 1):
        while True:
            try:
                producer.produce(topic, msg.value, msg.key, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        if events_per_second > 0:
            ahead = i / events_per_second - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
        if i % step == 0 or i == total:
            log.info("produced %d/%d messages to %s", i, total, topic)
        if on_progress is not None and (i % tick == 0 or i == total):
            on_progress(i, total)
    remaining = producer.flush(60)
    if remaining or failures:
        raise RuntimeError(f"{remaining} messages undelivered, {len(failures)} failed: {failures[:3]}")
    return delivered


def write_summary(summary: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1) + "\n")


def parse_start(text: str) -> datetime:
    ts = datetime.fromisoformat(text)
    if ts.tzinfo is None:
        raise ValueError(f"--start {text!r} needs a zone, e.g. {DEFAULT_START}")
    return ts.astimezone(UTC)
