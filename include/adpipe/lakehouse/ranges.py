"""Which Kafka offsets a load reads, and when an hour is closed.

Load by arrival, file by event time
-----------------------------------
Event time and Kafka position are unrelated (late events arrive hours or
days after their minute), so a load does not look for "the records of an
hour". Each run reads what arrived since the offsets the previous runs
loaded (the *coverage*, per region, topic and partition, kept in the
``ads.load_runs`` ledger) and files every row in the partition of its own
``event_hour``: a record that arrives two days late lands in its hour with
the next run.

- End of the raw topic: the offsets the region's stream job has committed
  in its ledger group (see the stream sink). Exactly the raw records whose
  outcome (an aggregate, a late listing or a DLQ entry) is committed, so the
  raw table never holds an event whose late/DLQ fate is still unknown.
- End of the aggregates, late and DLQ topics: their last stable offsets,
  read *after* the ledger, so every output of those batches is included.
  The ledger can be visible before an output partition's transaction marker
  (a partition leader failing over between the two): the ledger names the
  offsets the last batch wrote up to (``out``), and a load waits, bounded by
  ``ADPIPE_LOAD_OUTPUT_WAIT_S``, until every output partition's last stable
  offset has passed them, then fails with :class:`OutputNotStable` (retry
  later) rather than read a batch without its output.
- Start: where the coverage ends. The first run of a partition, or a run for
  an hour before the coverage (a first backfill), starts at the first record
  written at or after the hour's start less the larger of the future skew
  and the lateness (``offsets_for_times``): nothing of the hour is older (a
  valid event's ``event_time`` is at most the skew after its record's
  timestamp, else it is malformed; copies and aggregates are written after
  their raw record). Nothing re-reads the whole of what Kafka keeps.
- A partition whose coverage ends below the first offset the broker still
  keeps lost records to retention before any load read them: the run reads
  from the first kept offset and reports how many were lost.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from confluent_kafka import KafkaException

from adpipe import kafka_io
from adpipe.settings import KafkaAccess, Region, Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

ONE_HOUR = timedelta(hours=1)

# region -> topic -> partition (as a string, JSON's keys) -> [first, end)
Coverage = dict[str, dict[str, dict[str, list[int]]]]


# --- hours -----------------------------------------------------------------------------------


def parse_hour(text: str) -> datetime:
    """``YYYY-MM-DDTHH`` (also with ``:MM[:SS]`` and a zone) -> the UTC hour."""
    raw = text.strip()
    try:
        if len(raw) < 13:  # a bare date would silently mean its midnight
            raise ValueError(raw)
        if len(raw) == 13:
            ts = datetime.strptime(raw, "%Y-%m-%dT%H").replace(tzinfo=UTC)
        else:
            ts = datetime.fromisoformat(raw.replace("Z", "+00:00"))
            if ts.tzinfo is None:
                ts = ts.replace(tzinfo=UTC)
    except ValueError as exc:
        raise ValueError(f"--hour {text!r}: expected YYYY-MM-DDTHH (UTC), e.g. 2026-11-22T12") from exc
    ts = ts.astimezone(UTC)
    if (ts.minute, ts.second, ts.microsecond) != (0, 0, 0):
        raise ValueError(f"--hour {text!r} is not the start of an hour")
    return ts


def hours_between(first: datetime, last: datetime | None = None) -> list[datetime]:
    """Every hour from ``first`` to ``last`` inclusive (just ``first`` without ``last``)."""
    last = last or first
    if last < first:
        raise ValueError(f"--to-hour {hour_label(last)} is before --hour {hour_label(first)}")
    return [first + i * ONE_HOUR for i in range(int((last - first) / ONE_HOUR) + 1)]


def hour_label(hour: datetime) -> str:
    return hour.astimezone(UTC).strftime("%Y-%m-%dT%H")


def iso_ms(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def hour_ms(hour: datetime) -> int:
    return int(hour.timestamp() * 1000)


# --- offsets -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicRange:
    topic: str
    start: dict[int, int]
    end: dict[int, int]
    lost: dict[int, int] = field(default_factory=dict)  # records deleted by retention before any load read them

    def partitions(self) -> list[int]:
        return sorted(p for p in self.end if self.end[p] > self.start.get(p, 0))

    def records(self) -> int:
        return sum(self.end[p] - self.start[p] for p in self.partitions())

    def options(self) -> dict[str, str]:
        """Spark Kafka source options reading exactly this range."""
        parts = self.partitions()
        return {
            "assign": json.dumps({self.topic: parts}),
            "startingOffsets": json.dumps({self.topic: {str(p): self.start[p] for p in parts}}),
            "endingOffsets": json.dumps({self.topic: {str(p): self.end[p] for p in parts}}),
        }


@dataclass(frozen=True)
class RegionRanges:
    region: str
    bootstrap: str
    watermark_ms: int | None
    raw: TopicRange
    aggregates: TopicRange
    late: TopicRange
    dlq: TopicRange

    def topics(self) -> tuple[TopicRange, ...]:
        return (self.raw, self.aggregates, self.late, self.dlq)


def read_since_ms(settings: Settings, hour: datetime) -> int:
    """The earliest record timestamp a record of ``hour`` can have (module doc)."""
    return hour_ms(hour) - max(settings.max_future_skew_ms, settings.lateness_ms)


def _plan_topic(
    kafka: KafkaAccess,
    topic: str,
    end: dict[int, int],
    low: dict[int, int],
    since_ms: int,
    covered: dict[str, list[int]],
) -> TopicRange:
    """From the coverage's end (or the hour's first record) to ``end``."""
    firsts = kafka_io.offsets_for_times(kafka, topic, since_ms)
    start: dict[int, int] = {}
    lost: dict[int, int] = {}
    for p, stop in end.items():
        first = firsts.get(p)
        by_time = max(low[p], stop if first is None else min(first, stop))  # None: nothing that recent
        cov = covered.get(str(p))
        if cov is None:
            # A partition added after the coverage began holds only newer records: all of it.
            begin = low[p] if covered else by_time
        elif by_time < cov[0]:
            begin = by_time  # an hour before the coverage: read it (what is covered again is harmless)
        else:
            begin = cov[1]
        if begin < low[p]:
            lost[p] = low[p] - begin
            log.error(
                "%s[%d]: records %d..%d were deleted by retention before a load read them (%d lost)",
                topic, p, begin, low[p] - 1, low[p] - begin,
            )
            begin = low[p]
        start[p] = min(begin, stop)
    return TopicRange(topic, start, dict(end), lost)


class OutputNotStable(RuntimeError):
    """An output partition's last stable offset stays below what the
    stream's ledger says its last batch wrote (a transaction marker not
    written yet), or a partition's leader does not answer (failing over).
    Retriable: the next run finds it written, or the new leader."""


# How often the last stable offsets are read again while waiting, and how
# long one reading may take (a leader that does not answer is not waited on
# past the whole wait).
OUTPUT_POLL_S = 0.5
OUTPUT_QUERY_S = 10.0


def wait_for_outputs(
    kafka: KafkaAccess, outputs: dict[str, dict[int, int]], wait_s: float
) -> dict[str, dict[int, tuple[int, int]]]:
    """Each output topic's (low, last stable) offsets per partition, once
    every partition's last stable offset has reached ``outputs`` (the
    ledger's ``out``); :class:`OutputNotStable` past ``wait_s``."""
    deadline = time.monotonic() + wait_s
    waited = False
    while True:
        try:
            bounds = {topic: kafka_io.offset_bounds(kafka, topic, timeout_s=OUTPUT_QUERY_S) for topic in outputs}
            behind = {
                f"{topic}[{p}]": (bounds[topic].get(p, (0, 0))[1], end)
                for topic, ends in outputs.items()
                for p, end in ends.items()
                if bounds[topic].get(p, (0, 0))[1] < end
            }
        except KafkaException as exc:  # a partition leader not answering (failing over): not yet
            behind = {"offsets": str(exc)}
        if not behind:
            if waited:
                log.info("the stream's last batch's output is readable now")
            return bounds
        if time.monotonic() >= deadline:
            raise OutputNotStable(
                f"after {wait_s:.0f} s, output partitions are still below what the stream's last committed batch "
                f"wrote (last stable offset, needed): {behind}: its transaction markers are not written yet (a "
                "partition leader failing over?). Nothing was loaded; run the load again."
            )
        if not waited:
            log.warning("waiting up to %.0f s for the last batch's transaction markers: %s", wait_s, behind)
            waited = True
        time.sleep(OUTPUT_POLL_S)


def _answered(what: str, call: Callable[[], T], wait_s: float) -> T:
    """``call()``'s answer, asked again while a partition's leader does not
    answer (Kafka moves its leadership within seconds), up to ``wait_s``;
    then :class:`OutputNotStable`."""
    deadline = time.monotonic() + wait_s
    waited = False
    while True:
        try:
            answer = call()
        except KafkaException as exc:
            if time.monotonic() >= deadline:
                raise OutputNotStable(
                    f"after {wait_s:.0f} s, {what} still cannot be read ({exc}): a partition leader failing over? "
                    "Nothing was loaded; run the load again."
                ) from exc
            if not waited:
                log.warning("%s cannot be read (%s); asking again for up to %.0f s", what, exc, wait_s)
                waited = True
            time.sleep(OUTPUT_POLL_S)
        else:
            if waited:
                log.info("%s can be read now", what)
            return answer


def region_ranges(
    settings: Settings, region: Region, hour: datetime, coverage: dict[str, dict[str, list[int]]] | None = None
) -> RegionRanges:
    """The offsets one run reads from one region (see the module docstring);
    ``coverage``: the region's, per topic, from the loads' ledger."""
    rs = settings.for_region(region)
    since_ms = read_since_ms(settings, hour)
    coverage = coverage or {}
    commits = _answered("the stream's ledger", lambda: kafka_io.stream_commits(rs), settings.load_output_wait_s)

    def plan(topic: str, end_of: dict[int, tuple[int, int]], raw: bool = False) -> TopicRange:
        low = {p: lo for p, (lo, _hi) in end_of.items()}
        if raw:
            end = {p: max(lo, commits[p][0]) if p in commits else lo for p, (lo, _hi) in end_of.items()}
        else:
            end = {p: hi for p, (_lo, hi) in end_of.items()}
        return _plan_topic(rs.kafka, topic, end, low, since_ms, coverage.get(topic, {}))

    wait_s = settings.load_output_wait_s
    raw = _answered(
        f"{rs.topics.events}'s offsets",
        lambda: plan(
            rs.topics.events, kafka_io.offset_bounds(rs.kafka, rs.topics.events, timeout_s=OUTPUT_QUERY_S), raw=True
        ),
        wait_s,
    )
    # Read after the ledger: every output of the committed batches is below
    # these, once the last batch's markers are written.
    topics = (rs.topics.aggregates, rs.topics.late, rs.topics.dlq)
    written = kafka_io.committed_outputs(commits)
    bounds = wait_for_outputs(rs.kafka, {t: written.get(t, {}) for t in topics}, wait_s)
    outputs = _answered("the output topics' offsets", lambda: [plan(topic, bounds[topic]) for topic in topics], wait_s)
    return RegionRanges(region.job_id, rs.kafka_bootstrap, kafka_io.committed_watermark(commits), raw, *outputs)


def advance(coverage: Coverage, ranges: list[RegionRanges]) -> Coverage:
    """The coverage once ``ranges`` are loaded: each partition's span grows
    to include what was read (reads start where the coverage ends, or before
    it, so the span stays contiguous)."""
    out: Coverage = json.loads(json.dumps(coverage))
    for region in ranges:
        for rng in region.topics():
            spans = out.setdefault(region.region, {}).setdefault(rng.topic, {})
            for p, stop in rng.end.items():
                begin = rng.start.get(p, stop)
                old = spans.get(str(p))
                spans[str(p)] = [begin, stop] if old is None else [min(old[0], begin), max(old[1], stop)]
    return out


# --- hours closed ------------------------------------------------------------------------------


# How often the load DAG's trigger asks :func:`hour_closed` while it waits.
HOUR_CLOSED_POLL_S = 10.0


class StreamStates:
    """Each region's stream commits, watermark and lag, read from Kafka once
    for a series of :func:`hour_closed` questions (a bisection asks a dozen).
    An older read is conservative: a watermark only advances, and records
    that arrived since are seen by each question's own look at the raw topic."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._read: dict[str, tuple[int | None, int]] = {}

    def of(self, region: Region) -> tuple[int | None, int]:
        """The region's committed watermark (epoch ms, None before any) and
        its lag in records."""
        if region.job_id not in self._read:
            rs = self.settings.for_region(region)
            commits = kafka_io.stream_commits(rs)
            self._read[region.job_id] = (
                kafka_io.committed_watermark(commits),
                sum(kafka_io.stream_lag(rs, commits).values()),
            )
        return self._read[region.job_id]


def hour_closed(
    settings: Settings, hour: datetime, now: datetime | None = None, streams: StreamStates | None = None
) -> bool:
    """True when every region has closed the hour for good: its stream job
    committed a batch whose watermark is past the hour's end plus
    ``ADPIPE_ALLOWED_LATENESS_S``, so every window of the hour is emitted,
    and final: no late event can revise it any more (a window closes when
    the watermark passes its end, and is revised by events of it read until
    the watermark passes its end plus the allowed lateness); or the region
    is quiet: nothing reached its raw topic since the hour ended (no record
    timestamp at or after the end), its stream has committed every record
    (no lag), and the wall clock (``now``) is past the hour's end plus the
    lateness (watermark delay and allowed lateness). A quiet region's
    watermark stands still, so without this rule it would hold every hour
    open. Windows it has not emitted yet (its watermark short of their end)
    come with its next events, and a later load picks them up, as it picks
    up a revision of an hour loaded before it was closed (a late correction)."""
    end = hour + ONE_HOUR
    final_ms = hour_ms(end) + settings.allowed_lateness_s * 1000
    end_ms = hour_ms(end)
    now = now or datetime.now(UTC)
    streams = streams or StreamStates(settings)
    for region in settings.regions:
        rs = settings.for_region(region)
        watermark, lag = streams.of(region)
        if watermark is not None and watermark >= final_ms:
            continue
        arrived_since = kafka_io.offsets_for_times(rs.kafka, rs.topics.events, end_ms)
        quiet = lag == 0 and all(offset is None for offset in arrived_since.values())
        if quiet and now >= end + timedelta(milliseconds=settings.lateness_ms):
            log.info(
                "hour %s closed in quiet region %s: nothing arrived since its end, no lag, the clock past its end "
                "plus lateness",
                hour_label(hour),
                region.job_id,
            )
            continue
        log.info(
            "hour %s not closed in region %s (watermark %s, lag %d records, %s)",
            hour_label(hour),
            region.job_id,
            iso_ms(watermark) if watermark is not None else "none",
            lag,
            "quiet" if quiet else "records arrived since the hour's end",
        )
        return False
    return True


def closed_hours(settings: Settings, hours: list[datetime], now: datetime | None = None) -> list[datetime]:
    """The closed ones of ``hours``. Closing is monotonic in time (a region
    that closed an hour has closed every earlier one), so the hours are
    checked from the latest down and the first closed one closes the rest."""
    ordered = sorted(set(hours), reverse=True)
    streams = StreamStates(settings)
    for i, hour in enumerate(ordered):
        if hour_closed(settings, hour, now, streams):
            return sorted(ordered[i:])
    return []


def closed_through(settings: Settings, first: datetime, last: datetime) -> datetime | None:
    """The latest closed hour from ``first`` to ``last`` (every earlier hour
    is closed too: closing is monotonic), found by bisection; None when
    ``first`` is open."""
    streams = StreamStates(settings)
    if last < first or not hour_closed(settings, first, streams=streams):
        return None
    low, high = 0, int((last - first) / ONE_HOUR)  # hour ``low`` is closed
    while low < high:
        middle = (low + high + 1) // 2
        if hour_closed(settings, first + middle * ONE_HOUR, streams=streams):
            low = middle
        else:
            high = middle - 1
    return first + low * ONE_HOUR


# --- what Kafka can prove ----------------------------------------------------------------------


def may_have_lost(low: int, first_ms: int | None, earliest_ms: int, retention_ms: int, now_ms: int) -> bool:
    """Whether a partition whose first kept offset is ``low`` (its first
    kept record written at ``first_ms``; None: it keeps none) may have lost
    a record written at ``earliest_ms`` or later. A partition that keeps
    records lost one only if its first is later. One that retention emptied
    (a quiet DLQ partition, days after its last record) lost one only if
    time retention could have reached that far: records written within the
    last ``retention_ms`` are never deleted by time (-1: kept for ever, so
    something else emptied it: assume the worst)."""
    if low == 0:
        return False
    if first_ms is not None:
        return first_ms > earliest_ms
    return retention_ms < 0 or earliest_ms <= now_ms - retention_ms


def retention_gaps(settings: Settings, hour: datetime) -> list[dict]:
    """The topics of each region that may no longer hold every record of the
    hour: the broker deleted records of a partition (its first offset is
    above 0) and the first record it still keeps is later than the earliest
    a record of the hour can have been written (the hour's start less the
    future skew an event may have over its record). Kafka cannot then prove
    the hour, so a check fails rather than passing on what is left."""
    earliest_ms = hour_ms(hour) - settings.max_future_skew_ms
    now_ms = int(time.time() * 1000)
    gaps = []
    for region in settings.regions:
        rs = settings.for_region(region)
        topics = (rs.topics.events, rs.topics.aggregates, rs.topics.late, rs.topics.dlq)
        kept_ms = kafka_io.retention_ms(rs.kafka, topics)
        for topic in topics:
            for partition, (low, first_ms) in sorted(kafka_io.first_retained(rs.kafka, topic).items()):
                if may_have_lost(low, first_ms, earliest_ms, kept_ms[topic], now_ms):
                    gaps.append(
                        {"region": region.job_id, "topic": topic, "partition": partition, "first_offset": low,
                         "first_timestamp_ms": first_ms}
                    )
    return gaps


def stream_watermarks(settings: Settings) -> dict[str, int]:
    """Per region, the watermark (epoch ms) of the last batch its stream job
    committed; a region whose stream never committed is absent."""
    marks = {r.job_id: kafka_io.committed_watermark(kafka_io.stream_commits(settings.for_region(r)))
             for r in settings.regions}
    return {region: mark for region, mark in marks.items() if mark is not None}
