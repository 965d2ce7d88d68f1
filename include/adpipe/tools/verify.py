"""``adpipe verify``: reconcile the pipeline's output against the raw topic.

Deliberately independent of the stream job's code: the raw events are read
with a plain Kafka consumer and validated by this module's own reading of
the contract (in Python, not Spark), and the expected counts are recomputed
from them. Only the closing watermark (how far the job has got) and which
events it listed as late are taken from the job's own records, and both are
cross-checked."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from adpipe import kafka_io
from adpipe import schemas as S
from adpipe.budget import verify as budget_verify
from adpipe.settings import Settings

LIST_LIMIT = 50
_ISO = re.compile(S.ISO_WITH_ZONE)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)


@dataclass(frozen=True)
class RawEvent:
    event_id: str
    ad_id: str
    event_type: str
    event_ms: int

    @property
    def window_start(self) -> str:
        return _iso_minute(self.event_ms)


def _iso_minute(ms: int) -> str:
    return datetime.fromtimestamp((ms // 60_000) * 60, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _not_json(token: str) -> None:
    """NaN and Infinity: Python's json accepts them, JSON (and Spark) do not."""
    raise ValueError(f"{token} is not JSON")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A repeated key: Python's json keeps the last, Spark's parser rejects it."""
    keys = [k for k, _ in pairs]
    if len(keys) != len(set(keys)):
        raise ValueError("duplicate key")
    return dict(pairs)


def classify(value: bytes | None) -> RawEvent | str:
    """A valid event, or the reason the message is malformed."""
    try:
        body = (
            json.loads(value.decode("utf-8"), parse_constant=_not_json, object_pairs_hook=_unique_keys)
            if value is not None
            else None
        )
    except (UnicodeDecodeError, ValueError):  # JSONDecodeError is a ValueError
        return S.REASON_NOT_JSON
    if value is None:
        return S.REASON_NOT_JSON
    if not isinstance(body, dict):
        return S.REASON_NOT_OBJECT
    for name, reason in (("event_id", S.REASON_BAD_EVENT_ID), ("ad_id", S.REASON_BAD_AD_ID)):
        if not isinstance(body.get(name), str) or not body[name]:
            return reason
    if body.get("event_type") not in S.EVENT_TYPES:
        return S.REASON_BAD_EVENT_TYPE
    campaign_id = body.get("campaign_id")
    fields = (body["event_id"], body["ad_id"], campaign_id if isinstance(campaign_id, str) else "")
    if any(len(text) > S.MAX_FIELD_CHARS for text in fields):
        return S.REASON_FIELD_TOO_LONG
    raw_time = body.get("event_time")
    event_ms: int | None = None
    if isinstance(raw_time, int) and not isinstance(raw_time, bool):
        event_ms = raw_time if 0 <= raw_time <= S.EPOCH_MS_MAX else None
    elif isinstance(raw_time, str) and _ISO.match(raw_time):
        try:
            ts = datetime.fromisoformat(raw_time)
            # Exact and floored, as Spark's unix_millis: no float, no rounding toward zero.
            event_ms = (ts - _EPOCH) // _ONE_MS if ts.tzinfo is not None else None
        except ValueError:
            event_ms = None
    if event_ms is None:
        return S.REASON_BAD_EVENT_TIME
    return RawEvent(body["event_id"], body["ad_id"], body["event_type"], event_ms)


def classify_record(value: bytes | None, record_ms: int, max_future_skew_ms: int) -> RawEvent | str:
    """:func:`classify`, then the contract's rule on the Kafka record's own
    timestamp: an event time more than the skew after it is malformed."""
    verdict = classify(value)
    if isinstance(verdict, RawEvent) and verdict.event_ms > record_ms + max_future_skew_ms:
        return S.REASON_FUTURE_EVENT_TIME
    return verdict


def _late_copy(rec: kafka_io.Record, valid: dict[str, RawEvent]) -> RawEvent | str:
    """The event a late record lists: its own reading, or for a copy
    truncated as oversized, the raw event its header names."""
    if rec.header(S.HEADER_REASON) != S.REASON_OVERSIZED:
        return classify(rec.value)  # a copy: its source record was checked with the raw topic
    event = valid.get(rec.header(S.HEADER_EVENT_ID) or "")
    return event if event is not None else "oversized copy of no valid raw event"


class FirstCopies:
    """The first raw copy of each valid event: the lowest (record
    timestamp, partition, offset). The stream counts or lists that copy; a
    late listing of another copy is a producer retry that came after the
    dedupe retention, listed late again (the contract allows it), and must
    not be taken for the event being late."""

    def __init__(self) -> None:
        self._first: dict[str, tuple[tuple[int, int, int], str]] = {}

    def add(self, rec: kafka_io.Record, event_id: str) -> None:
        order = (rec.timestamp_ms, rec.partition, rec.offset)
        known = self._first.get(event_id)
        if known is None or order < known[0]:
            self._first[event_id] = (order, f"{rec.topic}/{rec.partition}/{rec.offset}")

    def lists_first(self, event_id: str, source: str | None) -> bool:
        """Whether a late copy whose header names ``source`` lists the
        event's first copy (an unknown event or source: taken as first)."""
        known = self._first.get(event_id)
        return known is None or source is None or known[1] == source


def is_relisting(firsts: FirstCopies, event: RawEvent, late_copy: kafka_io.Record, retention_ms: int) -> bool:
    """Whether a late copy lists a producer retry that came after the dedupe
    retention (its event was counted or listed before): it names another
    raw record than the event's first, and its batch's watermark had passed
    the event's window end plus the retention. Within the retention the
    stream still knew the id, so a listing then is the event's one listing
    (whichever of its copies in that batch came first by position)."""
    window_end_ms = (event.event_ms // 60_000 + 1) * 60_000
    watermark_ms = int(late_copy.header(S.HEADER_WATERMARK) or -1)
    return watermark_ms >= window_end_ms + retention_ms and not firsts.lists_first(
        event.event_id, late_copy.header(S.HEADER_SOURCE)
    )


def ledger_watermark_ms(settings: Settings, group: str) -> int | None:
    """The watermark of the last batch the stream job committed."""
    return kafka_io.committed_watermark(kafka_io.group_commits(settings.kafka, group, settings.topics.events))


def _limited(items: list) -> list:
    return items[:LIST_LIMIT]


def reconcile(settings: Settings, ledger_group: str) -> dict:
    topics = settings.topics
    kafka = settings.kafka

    # Raw events: distinct valid events and malformed messages.
    valid: dict[str, RawEvent] = {}
    firsts = FirstCopies()
    malformed: dict[str, str] = {}  # "topic/partition/offset" -> reason
    raw_records = 0
    for rec in kafka_io.read_topic(kafka, topics.events):
        raw_records += 1
        verdict = classify_record(rec.value, rec.timestamp_ms, settings.max_future_skew_ms)
        if isinstance(verdict, str):
            malformed[f"{rec.topic}/{rec.partition}/{rec.offset}"] = verdict
        else:
            valid.setdefault(verdict.event_id, verdict)
            firsts.add(rec, verdict.event_id)

    watermark = ledger_watermark_ms(settings, ledger_group)

    # Late events listed by the job.
    late_counts: Counter[str] = Counter()
    relisted: Counter[str] = Counter()  # retries listed again after the dedupe retention
    not_late: list[dict] = []
    retention_ms = settings.late_dedupe_retention_s * 1000
    for rec in kafka_io.read_topic(kafka, topics.late):
        verdict = _late_copy(rec, valid)
        if isinstance(verdict, str):
            not_late.append({"source": rec.header(S.HEADER_SOURCE), "why": f"malformed: {verdict}"})
            continue
        cut = int(rec.header(S.HEADER_WATERMARK) or -1)
        if verdict.event_ms > cut:
            not_late.append({"event_id": verdict.event_id, "why": f"event time after the watermark {cut}"})
        if is_relisting(firsts, verdict, rec, retention_ms):
            relisted[verdict.event_id] += 1
        else:
            late_counts[verdict.event_id] += 1
    late_ids = set(late_counts)

    # DLQ: exactly the malformed messages, once each.
    dlq_counts: Counter[str] = Counter()
    dlq_reason_mismatch: list[dict] = []
    for rec in kafka_io.read_topic(kafka, topics.dlq):
        source = rec.header(S.HEADER_SOURCE) or "?"
        dlq_counts[source] += 1
        expected_reason = malformed.get(source)
        reason = rec.header(S.HEADER_REASON)
        if reason == S.REASON_OVERSIZED:  # truncated: the reason it had is kept beside
            reason = rec.header(S.HEADER_ORIGINAL_REASON)
        if expected_reason is not None and expected_reason != reason:
            dlq_reason_mismatch.append(
                {"source": source, "dlq": rec.header(S.HEADER_REASON), "expected": expected_reason}
            )

    # Expected aggregates: closed windows of on-time distinct events.
    expected: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: {"impressions": 0, "clicks": 0})
    for event in valid.values():
        if event.event_id in late_ids:
            continue
        window_end_ms = (event.event_ms // 60_000 + 1) * 60_000
        if watermark is not None and window_end_ms <= watermark:
            key = (event.ad_id, event.window_start)
            expected[key]["impressions" if event.event_type == "impression" else "clicks"] += 1

    # Actual aggregates, read_committed.
    seen: Counter[tuple[str, str]] = Counter()
    uuid_seen: Counter[str] = Counter()
    actual: dict[tuple[str, str], dict] = {}
    agg_records = 0
    for rec in kafka_io.read_topic(kafka, topics.aggregates):
        agg_records += 1
        body = json.loads(rec.value)
        key = (body["ad_id"], body["window_start"])
        seen[key] += 1
        uuid_seen[body["record_uuid"]] += 1
        actual.setdefault(key, body)

    missing = sorted(set(expected) - set(actual))
    unexpected = sorted(set(actual) - set(expected))
    wrong = [
        {
            "ad_id": k[0],
            "window_start": k[1],
            "expected": expected[k],
            "actual": {"impressions": actual[k]["impressions"], "clicks": actual[k]["clicks"]},
        }
        for k in sorted(set(expected) & set(actual))
        if (actual[k]["impressions"], actual[k]["clicks"]) != (expected[k]["impressions"], expected[k]["clicks"])
    ]
    duplicated = [{"ad_id": k[0], "window_start": k[1], "copies": n} for k, n in sorted(seen.items()) if n > 1]
    uuid_dups = [u for u, n in uuid_seen.items() if n > 1]
    late_dups = [e for e, n in late_counts.items() if n > 1]
    late_unknown = [e for e in late_ids if e not in valid]
    dlq_missing = sorted(set(malformed) - set(dlq_counts))
    dlq_dups = [s for s, n in dlq_counts.items() if n > 1]
    dlq_unexpected = sorted(set(dlq_counts) - set(malformed))

    problems = (
        len(missing)
        + len(unexpected)
        + len(wrong)
        + len(duplicated)
        + len(uuid_dups)
        + len(late_dups)
        + len(late_unknown)
        + len(not_late)
        + len(dlq_missing)
        + len(dlq_dups)
        + len(dlq_unexpected)
        + len(dlq_reason_mismatch)
    )
    budget = budget_verify.check(settings)
    return {
        "ok": problems == 0 and watermark is not None and budget["ok"],
        "job_id": settings.job_id,
        "closed_through": None
        if watermark is None
        else datetime.fromtimestamp(watermark / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "raw": {"records": raw_records, "valid_distinct_events": len(valid), "malformed": len(malformed)},
        "aggregates": {
            "records": agg_records,
            "expected_windows": len(expected),
            "missing_count": len(missing),
            "duplicated_count": len(duplicated),
            "wrong_count": len(wrong),
            "unexpected_count": len(unexpected),
            "record_uuid_duplicated_count": len(uuid_dups),
            "missing": _limited([{"ad_id": a, "window_start": w} for a, w in missing]),
            "duplicated": _limited(duplicated),
            "wrong": _limited(wrong),
            "unexpected": _limited([{"ad_id": a, "window_start": w} for a, w in unexpected]),
        },
        "late": {
            "records": sum(late_counts.values()) + sum(relisted.values()),
            "distinct_events": len(late_ids),
            "relisted_after_retention": sum(relisted.values()),
            "duplicated": _limited(late_dups),
            "not_valid_raw": _limited(late_unknown),
            "not_late": _limited(not_late),
        },
        "dlq": {
            "records": sum(dlq_counts.values()),
            "missing_count": len(dlq_missing),
            "missing": _limited(dlq_missing),
            "duplicated": _limited(dlq_dups),
            "unexpected": _limited(dlq_unexpected),
            "reason_mismatch": _limited(dlq_reason_mismatch),
        },
        "budget": budget,
        "problems": problems,
    }
