"""The independent check and the report of ``adpipe chaos``.

Nothing here uses the stream job's, the loader's or the budget service's
code: the truth is the producer's own record of what it sent (its plan
summary) and the raw topic as the broker holds it; the output is read back
with plain Kafka consumers and SQL, and the arithmetic is plain Python.

On-time and late output are judged apart, so that a loss in one cannot be
made up by a surplus in the other (:func:`check_stream_output`):

- every late listing must be justified: its window had closed by the
  watermark its batch ran with (the ``adpipe.watermark_ms`` header), and
  that watermark is no higher than the raw records allow (the largest valid
  event time read before the batch, less the allowed lateness; the batch
  boundaries come from the ledger's commits, sampled during the run);
- an event is never counted and listed: a listing of an event one of whose
  copies was read while its window was certainly open is a double;
- per (ad, minute, type) the aggregates count exactly the events sent less
  the justified listings; a lost and a doubled event cannot cancel, since
  each listing is judged on its own before the counts are compared.

A malformed message must be in the DLQ once; the spend of each ad must be
the sum of its aggregates' charges to the micro-unit."""

from __future__ import annotations

import json
import math
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

Key = tuple[str, str, str]  # (ad_id, window_start, event_type)


def _minute_of(event_time: object) -> str | None:
    """The UTC minute of an event_time as the contract allows it (epoch ms
    or ISO-8601 with a zone), or None when it is neither."""
    if isinstance(event_time, int) and not isinstance(event_time, bool):
        ts = datetime.fromtimestamp(event_time / 1000, UTC)
    elif isinstance(event_time, str):
        try:
            ts = datetime.fromisoformat(event_time)
        except ValueError:
            return None
        if ts.tzinfo is None:
            return None
    else:
        return None
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:00Z")


@dataclass
class Truth:
    """What the producer sent, from its plan summaries."""

    expected: Counter[Key] = field(default_factory=Counter)  # on-time plus planned-late events per key
    malformed: int = 0
    distinct_events: int = 0
    messages: int = 0

    @classmethod
    def from_summaries(cls, summaries: Iterable[dict], closed_before: str | None = None) -> Truth:
        """``closed_before``: only windows starting before this minute (the
        closer's own windows stay open and are not judged)."""
        truth = cls()
        for summary in summaries:
            truth.messages += summary["messages"]
            truth.malformed += summary["malformed"]
            for row in summary["counts"]:
                if closed_before is None or row["window_start"] < closed_before:
                    truth.expected[(row["ad_id"], row["window_start"], row["event_type"])] += row["events"]
                    truth.distinct_events += row["events"]
            for late in summary["late_events"]:
                truth.expected[(late["ad_id"], late["window_start"], late["event_type"])] += 1
                truth.distinct_events += 1
        return truth


@dataclass
class Verdict:
    """The outcome of one check: what was lost, what was doubled, and why."""

    lost: int = 0
    duplicated: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, lost: int, duplicated: int, problem: str | None) -> None:
        self.lost += lost
        self.duplicated += duplicated
        if problem and len(self.problems) < 50:
            self.problems.append(problem)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and not self.problems


def check_events(truth: Truth, aggregates: list[bytes], late: list[bytes], dlq_sources: list[str | None]) -> dict:
    """Per key, the aggregates' counts plus the first late listing of each
    event against what was sent; every malformed message in the DLQ once.
    ``aggregates`` and ``late`` are record values as read with
    read_committed; ``dlq_sources`` the DLQ records' source
    (topic/partition/offset) headers.

    For an output without late listings (``make bench``'s rows). With
    late listings the sum can cancel out (an event lost from an aggregate,
    another listed late as well as counted): the chaos verdict uses
    :func:`check_stream_output`, which judges each listing on its own."""
    verdict = Verdict()
    observed = _check_aggregates(aggregates, verdict)
    late_ids: Counter[str] = Counter()
    for value in late:
        body = json.loads(value)
        late_ids[body["event_id"]] += 1
        if late_ids[body["event_id"]] == 1:
            observed[(body["ad_id"], _minute_of(body["event_time"]) or "?", body["event_type"])] += 1
    for event_id, n in late_ids.items():
        if n > 1:
            verdict.add(0, n - 1, f"late event {event_id} listed {n} times")
    for key in sorted(set(truth.expected) | set(observed)):
        want, got = truth.expected.get(key, 0), observed.get(key, 0)
        if want != got:
            verdict.add(max(0, want - got), max(0, got - want), f"{key}: sent {want}, counted or listed late {got}")
    _check_dlq(truth.malformed, dlq_sources, verdict)
    return {
        "ok": verdict.ok,
        "lost": verdict.lost,
        "duplicated": verdict.duplicated,
        "aggregates": len(aggregates),
        "events_counted": sum(observed.values()),
        "late_listed": len(late_ids),
        "dlq": len(dlq_sources),
        "problems": verdict.problems,
    }


def _check_aggregates(aggregates: list[bytes], verdict: Verdict) -> Counter[Key]:
    """The events counted per key (every copy: a window written twice counts
    twice); a window or record_uuid on more than one aggregate is a problem."""
    counted: Counter[Key] = Counter()
    windows: Counter[tuple[str, str]] = Counter()
    uuids: Counter[str] = Counter()
    for value in aggregates:
        body = json.loads(value)
        windows[(body["ad_id"], body["window_start"])] += 1
        uuids[body["record_uuid"]] += 1
        counted[(body["ad_id"], body["window_start"], "impression")] += body["impressions"]
        counted[(body["ad_id"], body["window_start"], "click")] += body["clicks"]
    for (ad, window), n in windows.items():
        if n > 1:
            verdict.add(0, n - 1, f"aggregate ({ad}, {window}) written {n} times")
    for record_uuid, n in uuids.items():
        if n > 1:
            verdict.add(0, 0, f"record_uuid {record_uuid} on {n} aggregates")
    return +counted  # zero counts (an ad without clicks) are no key


def _check_dlq(malformed: int, dlq_sources: list[str | None], verdict: Verdict) -> None:
    """Each malformed message in the DLQ once (one record per source offset)."""
    sources = Counter(dlq_sources)
    if len(sources) != malformed:
        verdict.add(
            max(0, malformed - len(sources)),
            max(0, len(sources) - malformed),
            f"DLQ holds {len(sources)} malformed messages, {malformed} were sent",
        )
    copies = sum(n - 1 for n in sources.values() if n > 1)
    if copies:
        verdict.add(0, copies, f"{copies} DLQ records repeat a source offset")


# The contract's one length limit of a string field (docs/design.md states it);
# an event over it is malformed.
MAX_FIELD_CHARS = 200
MINUTE_MS = 60_000
EVENT_TYPES = ("impression", "click")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class StreamRules:
    """The contract's parameters the verdict applies, from the run's
    configuration (never from the job's code)."""

    lateness_ms: int  # watermark delay plus allowed lateness
    max_future_skew_ms: int
    late_dedupe_retention_ms: int


@dataclass(frozen=True)
class RawRecord:
    """One record of the raw topic, as a plain consumer reads it."""

    partition: int
    offset: int
    timestamp_ms: int  # the broker's
    value: bytes | None


@dataclass(frozen=True)
class RawEvent:
    event_id: str
    ad_id: str
    event_type: str
    event_ms: int

    @property
    def key(self) -> Key:
        return (self.ad_id, minute_label(self.event_ms), self.event_type)

    @property
    def window_end_ms(self) -> int:
        return (self.event_ms // MINUTE_MS + 1) * MINUTE_MS


def minute_label(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms // MINUTE_MS * 60, UTC).strftime("%Y-%m-%dT%H:%M:00Z")


def _event_ms(event_time: object) -> int | None:
    if isinstance(event_time, int) and not isinstance(event_time, bool):
        return event_time
    if not isinstance(event_time, str):
        return None
    try:
        ts = datetime.fromisoformat(event_time)
    except ValueError:
        return None
    if ts.tzinfo is None:
        return None
    return (ts - _EPOCH) // timedelta(milliseconds=1)


def parse_event(value: bytes | None, timestamp_ms: int, max_future_skew_ms: int) -> RawEvent | None:
    """The valid event a raw record holds, by the contract's rules, or None
    when it is malformed."""
    try:
        body = json.loads(value or b"")
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(body, dict):
        return None
    event_id, ad_id, event_type = body.get("event_id"), body.get("ad_id"), body.get("event_type")
    campaign_id = body.get("campaign_id")
    if not (isinstance(event_id, str) and isinstance(ad_id, str)) or event_type not in EVENT_TYPES:
        return None
    if any(isinstance(f, str) and len(f) > MAX_FIELD_CHARS for f in (event_id, ad_id, campaign_id)):
        return None
    event_ms = _event_ms(body.get("event_time"))
    if event_ms is None or (timestamp_ms >= 0 and event_ms > timestamp_ms + max_future_skew_ms):
        return None
    return RawEvent(event_id, ad_id, event_type, event_ms)


@dataclass(frozen=True)
class LedgerBoundary:
    """A committed batch as the ledger group showed it: its id and the input
    end offsets per partition."""

    batch_id: int
    end_offsets: dict[int, int]


def ledger_boundary(commits: dict[int, tuple[int, str]]) -> LedgerBoundary | None:
    """The last batch in a ledger group's committed (offset, metadata) per
    partition (each metadata is JSON with the batch id), None before any."""
    by_partition = {}
    for partition, (offset, metadata) in commits.items():
        try:
            batch_id = int(json.loads(metadata)["batch_id"])
        except (ValueError, TypeError, KeyError):
            continue
        by_partition[partition] = (batch_id, offset)
    if not by_partition:
        return None
    last = max(batch_id for batch_id, _ in by_partition.values())
    return LedgerBoundary(last, {p: o for p, (b, o) in by_partition.items() if b == last})


@dataclass(frozen=True)
class LateListing:
    """One record of the late topic: the event it lists and its batch's
    watermark, from its headers (a truncated copy keeps them whole)."""

    event_id: str | None
    source: tuple[int, int] | None  # raw (partition, offset)
    watermark_ms: int | None
    batch_id: int | None

    @classmethod
    def from_record(cls, value: bytes | None, headers: dict[str, str | None]) -> LateListing:
        event_id = headers.get("adpipe.event_id")
        if event_id is None:
            try:
                event_id = json.loads(value or b"").get("event_id")
            except (ValueError, AttributeError, UnicodeDecodeError):
                event_id = None
        source = None
        if headers.get("adpipe.source"):
            _topic, partition, offset = str(headers["adpipe.source"]).rsplit("/", 2)
            source = (int(partition), int(offset))
        return cls(
            event_id,
            source,
            _int_or_none(headers.get("adpipe.watermark_ms")),
            _int_or_none(headers.get("adpipe.batch")),
        )


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


class RawTopic:
    """The raw topic as the verdict sees it: each valid event and the
    positions of its copies, the malformed records, and per partition the
    running maximum of valid event times by offset (what a watermark can
    have been computed from)."""

    def __init__(self, records: Iterable[RawRecord], rules: StreamRules) -> None:
        self.events: dict[str, RawEvent] = {}
        self.copies: dict[str, list[tuple[int, int]]] = {}
        self.malformed = 0
        by_partition: dict[int, list[tuple[int, int | None]]] = {}
        for record in records:
            event = parse_event(record.value, record.timestamp_ms, rules.max_future_skew_ms)
            by_partition.setdefault(record.partition, []).append((record.offset, event and event.event_ms))
            if event is None:
                self.malformed += 1
                continue
            self.events.setdefault(event.event_id, event)
            self.copies.setdefault(event.event_id, []).append((record.partition, record.offset))
        self._offsets: dict[int, list[int]] = {}
        self._running_max: dict[int, list[int]] = {}
        for partition, rows in by_partition.items():
            rows.sort()
            highest, running = 0, []
            for _, event_ms in rows:
                highest = max(highest, event_ms or 0)
                running.append(highest)
            self._offsets[partition] = [offset for offset, _ in rows]
            self._running_max[partition] = running

    def max_event_ms_below(self, end_offsets: dict[int, int] | None) -> int:
        """The largest valid event time of the records below ``end_offsets``
        (None, or a partition it leaves out: the whole partition)."""
        highest = 0
        for partition, offsets in self._offsets.items():
            end = None if end_offsets is None else end_offsets.get(partition)
            n = len(offsets) if end is None else bisect_left(offsets, end)
            if n:
                highest = max(highest, self._running_max[partition][n - 1])
        return highest

    def per_key(self, closed_before: str | None) -> Counter[Key]:
        keys = (e.key for e in self.events.values())
        return Counter(k for k in keys if closed_before is None or k[1] < closed_before)


class WatermarkBounds:
    """Upper bounds on the watermark each batch ran with, from the raw
    records and the batch boundaries seen in the ledger. Batch B runs with
    the largest event time read in batches before it less the lateness, and
    watermarks never fall; when B-1's boundary was not seen, the next seen
    one (later end offsets) gives a looser bound that still holds."""

    def __init__(self, raw: RawTopic, boundaries: Iterable[LedgerBoundary], lateness_ms: int) -> None:
        self.raw, self.lateness_ms = raw, lateness_ms
        self.boundaries = sorted({b.batch_id: b for b in boundaries}.values(), key=lambda b: b.batch_id)

    def watermark_at_most(self, batch_id: int) -> int:
        if batch_id <= 0:
            return 0  # Spark's first batch runs with the epoch
        later = [b for b in self.boundaries if b.batch_id >= batch_id - 1]
        end = later[0].end_offsets if later else None
        return max(0, self.raw.max_event_ms_below(end) - self.lateness_ms)

    def certainly_open(self, position: tuple[int, int], window_end_ms: int) -> bool:
        """Whether the raw record at ``position`` was read while a window
        ending at ``window_end_ms`` was still open (False: cannot tell)."""
        partition, offset = position
        for boundary in self.boundaries:
            if offset < boundary.end_offsets.get(partition, -1):
                # Read in this batch or an earlier one: at most its watermark.
                return self.watermark_at_most(boundary.batch_id) < window_end_ms
        return False


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
    """The chaos verdict on the stream job's output (see the module's
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
        why_not = _unjustified(listing, event, raw, bounds)
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
                if pos != listing.source and bounds.certainly_open(pos, event.window_end_ms)
            ),
            None,
        )
        if counted_copy is not None and not relisting_allowed:
            verdict.add(
                0,
                1,
                f"late event {event.event_id} {event.key}: its copy at {counted_copy} was read while its "
                "window was open (counted), and it is listed too",
            )
            doubles += 1
            continue
        if event.event_id not in listed_at:
            justified_late[event.key] += 1
        listed_at[event.event_id] = watermark

    # 3. Aggregates: each window once, each key the events sent less the
    # justified listings.
    counted = _check_aggregates(aggregates, verdict)
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
    _check_dlq(truth.malformed, dlq_sources, verdict)
    return {
        "ok": verdict.ok,
        "lost": verdict.lost,
        "duplicated": verdict.duplicated,
        "aggregates": len(aggregates),
        "events_counted": sum(counted.values()),
        "late_listed": len(late),
        "late_justified": sum(justified_late.values()),
        "late_unjustified": unjustified,
        "late_doubles": doubles,
        "raw_valid_events": sum(raw_per_key.values()),
        "ledger_batches_seen": len(bounds.boundaries),
        "dlq": len(dlq_sources),
        "problems": verdict.problems,
    }


def _unjustified(listing: LateListing, event: RawEvent, raw: RawTopic, bounds: WatermarkBounds) -> str | None:
    """Why a listing is not justified by the watermark of its batch (None: it is)."""
    if listing.watermark_ms is None or listing.batch_id is None or listing.source is None:
        return "no watermark, batch or source header"
    if listing.source not in raw.copies[event.event_id]:
        return f"its source {listing.source} is not a copy of the event"
    if event.window_end_ms > listing.watermark_ms:
        return f"its window ends at {event.window_end_ms}, after its batch's watermark {listing.watermark_ms}"
    highest = bounds.watermark_at_most(listing.batch_id)
    if listing.watermark_ms > highest:
        return (
            f"batch {listing.batch_id}'s watermark {listing.watermark_ms} is above what the raw records before it "
            f"allow ({highest})"
        )
    if bounds.certainly_open(listing.source, event.window_end_ms):
        return f"its copy at {listing.source} was read while its window was open"
    return None


# The Delta tables read with delta-rs, not the loader's Spark code. Pin:
# ``deltalake==1.6.6`` (installs beside pyarrow 26 with arro3-core only).
# delta-rs cannot read deletion vectors (delta-rs#1094): the tables keep them off.
DELTA_TABLES = ("ad_minute_aggregates", "ad_events_raw", "ad_events_quarantine")


def read_delta_tables(database_dir: Path) -> dict[str, list[dict]] | str:
    """The rows of the three tables under ``database_dir`` (the warehouse's
    ``ads.db``), or why they cannot be read this way."""
    try:
        from deltalake import DeltaTable
    except ImportError:
        return "deltalake is not installed (pin deltalake==1.6.6)"
    columns = {
        "ad_minute_aggregates": ["record_uuid", "ad_id", "window_start", "impressions", "clicks"],
        "ad_events_raw": ["event_id"],
        "ad_events_quarantine": ["source", "event_key"],
    }
    try:
        return {
            name: DeltaTable(str(database_dir / name)).to_pyarrow_table(columns=columns[name]).to_pylist()
            for name in DELTA_TABLES
        }
    except Exception as exc:  # noqa: BLE001 - a table delta-rs cannot read (deletion vectors): reported
        return f"delta-rs could not read the tables: {exc}"


def compare_tables(
    rows: dict[str, list[dict]],
    aggregates: list[bytes],
    raw: RawTopic,
    late: list[LateListing],
    dlq_sources: list[str | None],
    hours: set[str],
) -> dict:
    """The tables of ``hours`` (``YYYY-MM-DDTHH``) against Kafka: each
    aggregate once with its counts, each valid raw event once, each late
    listing and DLQ record once in the quarantine."""
    wrong: list[str] = []

    def compare(table: str, want: Counter, got: Counter) -> None:
        for key in sorted(set(want) | set(got), key=str):
            if want[key] != got[key]:
                wrong.append(f"{table} {key}: expected {want[key]}, found {got[key]}")

    want_aggregates: Counter = Counter()
    seen_uuids: set[str] = set()
    for value in aggregates:
        body = json.loads(value)
        if body["window_start"][:13] in hours and body["record_uuid"] not in seen_uuids:
            seen_uuids.add(body["record_uuid"])
            want_aggregates[
                (body["record_uuid"], body["ad_id"], body["window_start"], body["impressions"], body["clicks"])
            ] += 1
    got_aggregates = Counter(
        (r["record_uuid"], r["ad_id"], _utc_minute(r["window_start"]), r["impressions"], r["clicks"])
        for r in rows["ad_minute_aggregates"]
    )
    compare("ad_minute_aggregates", want_aggregates, got_aggregates)
    want_raw = Counter(e.event_id for e in raw.events.values() if minute_label(e.event_ms)[:13] in hours)
    compare("ad_events_raw", want_raw, Counter(r["event_id"] for r in rows["ad_events_raw"]))
    want_late = {
        listing.event_id
        for listing in late
        if listing.event_id in raw.events and minute_label(raw.events[listing.event_id].event_ms)[:13] in hours
    }
    got_quarantine = Counter((r["source"], r["event_key"]) for r in rows["ad_events_quarantine"])
    compare(
        "ad_events_quarantine (late)",
        Counter(("late", event_id) for event_id in want_late),
        Counter({k: n for k, n in got_quarantine.items() if k[0] == "late"}),
    )
    # The DLQ's hours are the records' own: checked as a whole, not per hour.
    got_dlq = Counter({k: n for k, n in got_quarantine.items() if k[0] == "dlq"})
    if any(n > 1 for n in got_dlq.values()) or not set(got_dlq) <= {("dlq", s) for s in dlq_sources}:
        wrong.append("ad_events_quarantine (dlq): a row twice, or one no DLQ record names")
    return {"ok": not wrong, "reader": "delta-rs", "wrong": wrong[:50]}


def _utc_minute(value: datetime) -> str:
    aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return aware.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:00Z")


def charge_micros(impressions: int, clicks: int, cpm_micros: int, cpc_micros: int) -> int:
    """One aggregate's charge: impressions at the CPM (per thousand, rounded
    half to even to the micro-unit) plus clicks at the CPC, in Decimal."""
    per_impressions = (Decimal(impressions) * Decimal(cpm_micros) / Decimal(1000)).quantize(
        Decimal(1), rounding=ROUND_HALF_EVEN
    )
    return int(per_impressions) + clicks * cpc_micros


def check_spend(aggregates: list[bytes], spend_rows: list[tuple[str, str, int, int]], prices: tuple[int, int]) -> dict:
    """``spend_rows``: (ad_id, period, spend_micros, records) from the budget
    database; the period is the aggregate's UTC day. One charge per
    record_uuid (the first copy, as the consumer is idempotent by it)."""
    cpm, cpc = prices
    expected: Counter[tuple[str, str]] = Counter()
    records: Counter[tuple[str, str]] = Counter()
    seen: set[str] = set()
    for value in aggregates:
        body = json.loads(value)
        if body["record_uuid"] in seen:
            continue
        seen.add(body["record_uuid"])
        key = (body["ad_id"], body["window_start"][:10])
        expected[key] += charge_micros(body["impressions"], body["clicks"], cpm, cpc)
        records[key] += 1
    actual = {(ad, period): (micros, n) for ad, period, micros, n in spend_rows}
    wrong = [
        f"{ad} {period}: spend {actual.get((ad, period), (0, 0))[0]} micro-units over "
        f"{actual.get((ad, period), (0, 0))[1]} aggregates, expected {expected[(ad, period)]} over "
        f"{records[(ad, period)]}"
        for ad, period in sorted(set(expected) | set(actual))
        if actual.get((ad, period), (0, 0)) != (expected[(ad, period)], records[(ad, period)])
    ]
    return {
        "ok": not wrong,
        "ads": len({ad for ad, _ in expected}),
        "expected_micros": sum(expected.values()),
        "actual_micros": sum(m for m, _ in actual.values()),
        "wrong": wrong[:50],
    }


def percentile(values: list[float], share: float) -> float | None:
    """Nearest-rank percentile (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def summarize_faults(faults: list[dict], planned: dict[str, int] | None = None) -> dict[str, dict]:
    """Per kind: how many the schedule planned, how many were injected (a
    fault whose target was gone when it came is not), how many recovered,
    and recovery seconds p50/p99/max."""
    planned = planned or {}
    kinds: dict[str, dict] = {}
    for kind in sorted({f["kind"] for f in faults} | set(planned)):
        of_kind = [f for f in faults if f["kind"] == kind and f.get("injected", True)]
        times = [f["recovery_s"] for f in of_kind if f.get("recovery_s") is not None]
        kinds[kind] = {
            "planned": planned.get(kind, len(of_kind)),
            "injected": len(of_kind),
            "recovered": len(times),
            "recovery_p50_s": percentile(times, 0.5),
            "recovery_p99_s": percentile(times, 0.99),
            "recovery_max_s": max(times) if times else None,
        }
    return kinds


def run_verdict(
    data_ok: dict[str, bool], faults: dict[str, dict], parts_down: list[str], stalls: int
) -> tuple[str, list[str]]:
    """``PASS``, ``SHORT`` (the output is right, but the run did not do what
    it set out to: a planned fault not injected, a part left down, a stalled
    job) or ``FAIL`` (``data_ok`` names a check that failed), and why."""
    failed = [name for name, ok in data_ok.items() if not ok]
    if failed:
        return "FAIL", [f"{name} check failed" for name in failed]
    short = [
        f"{kind}: injected {row['injected']} of {row['planned']} planned"
        for kind, row in faults.items()
        if row["injected"] < row["planned"]
    ]
    short += [f"left down: {part}" for part in parts_down]
    if stalls:
        short.append(f"the stream job stalled {stalls} time(s) and was killed")
    return ("SHORT", short) if short else ("PASS", [])


def render_table(report: dict) -> str:
    """The report as a plain-text table for the terminal and docs/operations.md."""

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    lines = [
        f"chaos run {report['run_id']} (seed {report['seed']}): {report['events']['sent_messages']} messages "
        f"({report['events']['distinct_events']} distinct valid events, {report['events']['malformed']} malformed) "
        f"on {report['brokers']} broker(s), Spark {report['spark_master']}, {report['duration_s']:.0f} s",
        "",
        f"{'fault':<22}{'planned':>8}{'injected':>9}{'recovered':>10}{'p50 s':>8}{'p99 s':>8}{'max s':>8}",
    ]
    for kind, row in report["faults"].items():
        lines.append(
            f"{kind:<22}{row.get('planned', row['injected']):>8}{row['injected']:>9}{row['recovered']:>10}"
            f"{secs(row['recovery_p50_s']):>8}{secs(row['recovery_p99_s']):>8}{secs(row['recovery_max_s']):>8}"
        )
    total = sum(r["injected"] for r in report["faults"].values())
    planned = sum(r.get("planned", r["injected"]) for r in report["faults"].values())
    in_drain = sum(f.get("phase") == "drain" and f.get("injected", True) for f in report.get("fault_log", []))
    lines += [
        f"{'total':<22}{planned:>8}{total:>9}",
        *([f"(of which {in_drain} load kill(s) in the drain: no hour closed in the window)"] if in_drain else []),
        "",
        "restarts: " + ", ".join(f"{k} {v}" for k, v in sorted(report["restarts"].items())),
        f"max stream lag: {report['max_stream_lag']} records; stalled stream jobs killed: "
        f"{report['stream_stalls_killed']}; drain: {secs(report['drain_s'])} s",
        f"events: lost {report['check']['lost']}, duplicated {report['check']['duplicated']}; "
        f"{report['check']['aggregates']} aggregates, {report['check']['late_listed']} late "
        f"({report['check'].get('late_justified', '-')} justified), "
        f"{report['check']['dlq']} in the DLQ",
        f"tables: {'match Kafka' if report['tables']['ok'] else 'DO NOT match'} "
        f"({', '.join(report['tables']['hours']) or 'no hour'}); budgets: "
        f"{'exact' if report['spend']['ok'] else 'WRONG'} ({report['spend']['actual_micros']} micro-units)",
        *(f"left down: {part}" for part in report.get("parts_down", [])),
        f"verdict: {report['verdict']}",
    ]
    return "\n".join(lines)
