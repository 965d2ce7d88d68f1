"""``adpipe verify``: reconcile the pipeline's output against the raw topic.

Deliberately independent of the stream job's code: the raw events are read
with a plain Kafka consumer and validated by this module's own reading of
the contract (in Python, not Spark), and the expected counts are recomputed
from them. Only the closing watermark (how far the job has got), which
events it listed as late and which copy of a re-stamped event it counted
(the first it read, which depends on its batches) are taken from the job's
own records, and each is cross-checked: a late listing after its window's
allowed lateness, every other copy of a re-stamped event in the DLQ, and
each window's latest revision equal to the recount, its revisions 0, 1, ...
each with more events than the one before."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
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


def _bad_characters(text: str) -> bool:
    """A C0 control character (NUL..U+001F) or an unpaired surrogate."""
    if any(ch < " " for ch in text):
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


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
    if any(_bad_characters(text) for text in fields):
        return S.REASON_BAD_CHARACTERS
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


@dataclass
class RawRead:
    """The raw topic as verify reads it: the first valid copy of each
    event, where each event's first copies are, the malformed messages
    ("topic/partition/offset" -> reason), and the events sent again with
    another event time (event id -> event time -> that time's first copy
    and the sources of all its copies)."""

    records: int = 0
    valid: dict[str, RawEvent] = field(default_factory=dict)
    firsts: FirstCopies = field(default_factory=FirstCopies)
    malformed: dict[str, str] = field(default_factory=dict)
    restamped: dict[str, dict[int, tuple[RawEvent, list[str]]]] = field(default_factory=dict)


def read_raw(settings: Settings) -> RawRead:
    raw = RawRead()
    times: dict[str, dict[int, tuple[RawEvent, list[str]]]] = {}
    for rec in kafka_io.read_topic(settings.kafka, settings.topics.events):
        raw.records += 1
        source = f"{rec.topic}/{rec.partition}/{rec.offset}"
        verdict = classify_record(rec.value, rec.timestamp_ms, settings.max_future_skew_ms)
        if isinstance(verdict, str):
            raw.malformed[source] = verdict
            continue
        raw.valid.setdefault(verdict.event_id, verdict)
        raw.firsts.add(rec, verdict.event_id)
        times.setdefault(verdict.event_id, {}).setdefault(verdict.event_ms, (verdict, []))[1].append(source)
    raw.restamped = {e: by_time for e, by_time in times.items() if len(by_time) > 1}
    return raw


def _conflict_section(settings: Settings, raw: RawRead) -> tuple[dict, dict[str, str]]:
    """The events sent again with another event time: the stream counts
    the copy it read first and sends every copy with another time to the DLQ
    (``conflicting_duplicate``). Which it read first depends on its batches,
    so the DLQ says which; here, for each such event, the copies it names
    must be exactly those of every time but one, never a copy of that one (a
    plain retry). ``raw.valid`` then holds the copy it counted. Returns the
    section and the DLQ copies it expects (source -> reason) beside the
    malformed ones."""
    listed: dict[str, set[str]] = {}
    for rec in kafka_io.read_topic(settings.kafka, settings.topics.dlq):
        reason = rec.header(S.HEADER_REASON)
        if reason == S.REASON_OVERSIZED:
            reason = rec.header(S.HEADER_ORIGINAL_REASON)
        if reason == S.REASON_CONFLICTING_DUPLICATE:
            listed.setdefault(rec.header(S.HEADER_EVENT_ID) or "?", set()).add(rec.header(S.HEADER_SOURCE) or "?")
    expected: dict[str, str] = {}
    wrong: list[dict] = []
    for event_id, by_time in raw.restamped.items():
        named = listed.get(event_id, set())
        kept = [t for t, (_event, sources) in by_time.items() if not set(sources) & named]
        others = [source for t, (_event, sources) in by_time.items() if t not in kept for source in sources]
        if len(kept) != 1 or set(others) != named:
            wrong.append({"event_id": event_id, "event_times_ms": sorted(by_time), "listed": sorted(named)})
            continue
        raw.valid[event_id] = by_time[kept[0]][0]
        expected.update(dict.fromkeys(others, S.REASON_CONFLICTING_DUPLICATE))
    unknown = sorted(set(listed) - set(raw.restamped))
    section = {
        "events": len(raw.restamped),
        "copies_listed": len(expected),
        "wrong": _limited(wrong),
        "listed_without_another_time": _limited(unknown),
    }
    return {**section, "problems": len(wrong) + len(unknown)}, expected


def _late_section(settings: Settings, raw: RawRead) -> tuple[dict, Counter[str]]:
    """The late topic: each listing a valid event's, after its batch's
    watermark, once per event (a retry listed again after the dedupe
    retention is counted apart); the report section and the listing counts."""
    late_counts: Counter[str] = Counter()
    relisted: Counter[str] = Counter()
    not_late: list[dict] = []
    retention_ms = settings.late_dedupe_retention_s * 1000
    for rec in kafka_io.read_topic(settings.kafka, settings.topics.late):
        verdict = _late_copy(rec, raw.valid)
        if isinstance(verdict, str):
            not_late.append({"source": rec.header(S.HEADER_SOURCE), "why": f"malformed: {verdict}"})
            continue
        cut = int(rec.header(S.HEADER_WATERMARK) or -1)
        window_end_ms = (verdict.event_ms // 60_000 + 1) * 60_000
        if window_end_ms + settings.allowed_lateness_s * 1000 > cut:
            why = f"its window's allowed lateness had not passed the watermark {cut}"
            not_late.append({"event_id": verdict.event_id, "why": why})
        if is_relisting(raw.firsts, verdict, rec, retention_ms):
            relisted[verdict.event_id] += 1
        else:
            late_counts[verdict.event_id] += 1
    section = {
        "records": sum(late_counts.values()) + sum(relisted.values()),
        "distinct_events": len(late_counts),
        "relisted_after_retention": sum(relisted.values()),
        "duplicated": _limited([e for e, n in late_counts.items() if n > 1]),
        "not_valid_raw": _limited([e for e in late_counts if e not in raw.valid]),
        "not_late": _limited(not_late),
    }
    problems = (
        sum(n > 1 for n in late_counts.values()) + sum(e not in raw.valid for e in late_counts) + len(not_late)
    )
    return {**section, "problems": problems}, late_counts


def _dlq_section(settings: Settings, raw: RawRead, conflicting: dict[str, str]) -> dict:
    """The DLQ: exactly the malformed messages and the conflicting copies
    of re-stamped events, once each, with their reasons."""
    dlq_counts: Counter[str] = Counter()
    mismatch: list[dict] = []
    expected = {**raw.malformed, **conflicting}
    for rec in kafka_io.read_topic(settings.kafka, settings.topics.dlq):
        source = rec.header(S.HEADER_SOURCE) or "?"
        dlq_counts[source] += 1
        expected_reason = expected.get(source)
        reason = rec.header(S.HEADER_REASON)
        if reason == S.REASON_OVERSIZED:  # truncated: the reason it had is kept beside
            reason = rec.header(S.HEADER_ORIGINAL_REASON)
        if expected_reason is not None and expected_reason != reason:
            mismatch.append({"source": source, "dlq": rec.header(S.HEADER_REASON), "expected": expected_reason})
    missing = sorted(set(expected) - set(dlq_counts))
    dups = [s for s, n in dlq_counts.items() if n > 1]
    unexpected = sorted(set(dlq_counts) - set(expected))
    return {
        "records": sum(dlq_counts.values()),
        "missing_count": len(missing),
        "missing": _limited(missing),
        "duplicated": _limited(dups),
        "unexpected": _limited(unexpected),
        "reason_mismatch": _limited(mismatch),
        "problems": len(missing) + len(dups) + len(unexpected) + len(mismatch),
    }


def expected_aggregates(
    raw: RawRead, late_ids: set[str], watermark: int | None
) -> dict[tuple[str, str], dict[str, int]]:
    """(ad_id, window_start) -> counts: the windows closed by the watermark,
    of the distinct valid events that were not listed late."""
    expected: dict[tuple[str, str], dict[str, int]] = defaultdict(lambda: {"impressions": 0, "clicks": 0})
    for event in raw.valid.values():
        if event.event_id in late_ids:
            continue
        window_end_ms = (event.event_ms // 60_000 + 1) * 60_000
        if watermark is not None and window_end_ms <= watermark:
            key = (event.ad_id, event.window_start)
            expected[key]["impressions" if event.event_type == "impression" else "clicks"] += 1
    return expected


def _aggregates_section(settings: Settings, expected: dict[tuple[str, str], dict[str, int]]) -> dict:
    """The aggregates read_committed against ``expected``: each window's
    latest revision with its counts, none missing or unexpected; each
    (window, revision) and each record_uuid once; a window's revisions 0, 1,
    ... with no gap, each counting more events than the one before (a
    revision comes only from late events not counted yet)."""
    copies: Counter[tuple[str, str, int]] = Counter()
    uuid_seen: Counter[str] = Counter()
    revisions: dict[tuple[str, str], dict[int, dict]] = defaultdict(dict)
    records = 0
    for rec in kafka_io.read_topic(settings.kafka, settings.topics.aggregates):
        records += 1
        body = json.loads(rec.value)
        key = (body["ad_id"], body["window_start"])
        revision = int(body.get("revision") or 0)
        copies[(*key, revision)] += 1
        uuid_seen[body["record_uuid"]] += 1
        revisions[key].setdefault(revision, body)
    actual = {key: by_revision[max(by_revision)] for key, by_revision in revisions.items()}
    missing = sorted(set(expected) - set(actual))
    unexpected = sorted(set(actual) - set(expected))
    wrong = [
        {
            "ad_id": k[0],
            "window_start": k[1],
            "expected": expected[k],
            "actual": {"impressions": actual[k]["impressions"], "clicks": actual[k]["clicks"],
                       "revision": int(actual[k].get("revision") or 0)},
        }
        for k in sorted(set(expected) & set(actual))
        if (actual[k]["impressions"], actual[k]["clicks"]) != (expected[k]["impressions"], expected[k]["clicks"])
    ]
    duplicated = [{"ad_id": k[0], "window_start": k[1], "revision": k[2], "copies": n}
                  for k, n in sorted(copies.items()) if n > 1]
    uuid_dups = [u for u, n in uuid_seen.items() if n > 1]
    unjustified = [
        {"ad_id": k[0], "window_start": k[1], "revisions": sorted(by_revision)}
        for k, by_revision in sorted(revisions.items())
        if not _revisions_add_events(by_revision)
    ]
    return {
        "records": records,
        "expected_windows": len(expected),
        "revisions": records - len(revisions),
        "missing_count": len(missing),
        "duplicated_count": len(duplicated),
        "wrong_count": len(wrong),
        "unexpected_count": len(unexpected),
        "record_uuid_duplicated_count": len(uuid_dups),
        "unjustified_revisions_count": len(unjustified),
        "missing": _limited([{"ad_id": a, "window_start": w} for a, w in missing]),
        "duplicated": _limited(duplicated),
        "wrong": _limited(wrong),
        "unexpected": _limited([{"ad_id": a, "window_start": w} for a, w in unexpected]),
        "unjustified_revisions": _limited(unjustified),
        "problems": len(missing) + len(unexpected) + len(wrong) + len(duplicated) + len(uuid_dups)
        + len(unjustified),
    }


def _revisions_add_events(by_revision: dict[int, dict]) -> bool:
    """Revisions 0..n, each with at least the counts of the one before and more events in all."""
    if sorted(by_revision) != list(range(len(by_revision))):
        return False
    counts = [(by_revision[r]["impressions"], by_revision[r]["clicks"]) for r in range(len(by_revision))]
    return all(
        imp >= prev_imp and clk >= prev_clk and imp + clk > prev_imp + prev_clk
        for (prev_imp, prev_clk), (imp, clk) in zip(counts, counts[1:], strict=False)
    )


def reconcile(settings: Settings, ledger_group: str) -> dict:
    """Exactly-once, checked from Kafka alone: every topic read again
    (read_committed) and recomputed with verify's own reading of the raw
    records (:func:`classify`, not the stream job's parser). The latest
    revision of each window the ledger's watermark closed equals the count
    of its distinct events not listed late, once each; every late listing
    is a valid event's, after its window's allowed lateness, once; the DLQ
    holds every malformed message and every other-time copy of a re-stamped
    event once; and the budget's spend matches the aggregates
    (``adpipe.budget.verify``).
    ``ok`` only when nothing is off and the job has committed a batch;
    ``problems`` counts what is off, each section lists up to LIST_LIMIT."""
    raw = read_raw(settings)
    watermark = ledger_watermark_ms(settings, ledger_group)
    conflicts, conflicting = _conflict_section(settings, raw)
    late, late_counts = _late_section(settings, raw)
    dlq = _dlq_section(settings, raw, conflicting)
    aggregates = _aggregates_section(settings, expected_aggregates(raw, set(late_counts), watermark))
    problems = (
        conflicts.pop("problems") + late.pop("problems") + dlq.pop("problems") + aggregates.pop("problems")
    )
    budget = budget_verify.check(settings)
    return {
        "ok": problems == 0 and watermark is not None and budget["ok"],
        "job_id": settings.job_id,
        "closed_through": None
        if watermark is None
        else datetime.fromtimestamp(watermark / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "raw": {"records": raw.records, "valid_distinct_events": len(raw.valid), "malformed": len(raw.malformed)},
        "aggregates": aggregates,
        "late": late,
        "dlq": dlq,
        "conflicting_copies": conflicts,
        "budget": budget,
        "problems": problems,
    }
