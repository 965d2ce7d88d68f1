"""The raw topic as the verdict reads it, by the contract's rules alone:
valid events and their copies, the ledger's batch boundaries, the late
listings, and upper bounds on the watermark each batch ran with."""

from __future__ import annotations

import json
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from .events import MINUTE_MS, Key, minute_label, parse_event_ms

# The contract's one length limit of a string field (docs/design.md states it);
# an event over it is malformed.
MAX_FIELD_CHARS = 200
EVENT_TYPES = ("impression", "click")


@dataclass(frozen=True)
class StreamRules:
    """The contract's parameters the verdict applies, from the run's
    configuration (never from the job's code)."""

    lateness_ms: int  # the watermark delay: the watermark is at most the highest event time read less it
    max_future_skew_ms: int
    late_dedupe_retention_ms: int
    # How long after its close a window can be revised: an event is late
    # (listed) only once the watermark passes its window's end plus this.
    allowed_lateness_ms: int = 0


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
    event_ms = parse_event_ms(body.get("event_time"))
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
    at most the largest event time read in batches before it less the
    watermark delay (the slowest partition's, when it waits for one, is
    lower still), and watermarks never fall; when B-1's boundary was not
    seen, the next seen one (later end offsets) gives a looser bound that
    still holds."""

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
        """Whether the raw record at ``position`` was read while the
        watermark was certainly below ``window_end_ms`` (a window's end plus
        its allowed lateness: it could still be counted; False: cannot tell)."""
        partition, offset = position
        for boundary in self.boundaries:
            if offset < boundary.end_offsets.get(partition, -1):
                # Read in this batch or an earlier one: at most its watermark.
                return self.watermark_at_most(boundary.batch_id) < window_end_ms
        return False
