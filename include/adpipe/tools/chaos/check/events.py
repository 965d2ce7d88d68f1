"""The output counted against what was sent: the producer's truth, a
verdict that adds up what was lost and doubled, and the check by sums
(:func:`check_events`) for an output without late listings."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

Key = tuple[str, str, str]  # (ad_id, window_start, event_type)


MINUTE_MS = 60_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_event_ms(event_time: object) -> int | None:
    """An event_time as the contract allows it (epoch ms, or ISO-8601 with a
    zone) in epoch milliseconds, or None when it is neither."""
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


def minute_label(epoch_ms: int) -> str:
    """The UTC minute of an instant, as aggregates name their window."""
    return datetime.fromtimestamp(epoch_ms // MINUTE_MS * 60, UTC).strftime("%Y-%m-%dT%H:%M:00Z")


def _minute_of(event_time: object) -> str | None:
    ms = parse_event_ms(event_time)
    return None if ms is None else minute_label(ms)


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

    def report(self, **counts: int) -> dict:
        """The check's result: the verdict with the check's own ``counts``."""
        return {"ok": self.ok, "lost": self.lost, "duplicated": self.duplicated, **counts, "problems": self.problems}


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
    observed = check_aggregates(aggregates, verdict)
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
    check_dlq(truth.malformed, dlq_sources, verdict)
    return verdict.report(
        aggregates=len(aggregates),
        events_counted=sum(observed.values()),
        late_listed=len(late_ids),
        dlq=len(dlq_sources),
    )


def check_aggregates(aggregates: list[bytes], verdict: Verdict) -> Counter[Key]:
    """The events counted per key: each window's latest revision (the
    contract: counted means in the latest revision), every copy of it (a
    revision written twice counts twice). A (window, revision) or
    record_uuid on more than one aggregate is a problem, and so is a
    revision that is not justified by late events: revisions 0, 1, ... with
    no gap, each with at least the counts of the one before and more events."""
    revisions: dict[tuple[str, str], dict[int, list[tuple[int, int]]]] = {}
    uuids: Counter[str] = Counter()
    for value in aggregates:
        body = json.loads(value)
        window = (body["ad_id"], body["window_start"])
        revision = int(body.get("revision") or 0)
        revisions.setdefault(window, {}).setdefault(revision, []).append((body["impressions"], body["clicks"]))
        uuids[body["record_uuid"]] += 1
    counted: Counter[Key] = Counter()
    for (ad, window), by_revision in revisions.items():
        for revision, copies in sorted(by_revision.items()):
            if len(copies) > 1:
                written = f"aggregate ({ad}, {window}) revision {revision} written {len(copies)} times"
                verdict.add(0, len(copies) - 1, written)
        latest = by_revision[max(by_revision)]
        for impressions, clicks in latest:
            counted[(ad, window, "impression")] += impressions
            counted[(ad, window, "click")] += clicks
        why = _unjustified_revisions({r: copies[0] for r, copies in by_revision.items()})
        if why:
            verdict.add(0, 0, f"aggregate ({ad}, {window}): {why}")
    for record_uuid, n in uuids.items():
        if n > 1:
            verdict.add(0, 0, f"record_uuid {record_uuid} on {n} aggregates")
    return +counted  # zero counts (an ad without clicks) are no key


def _unjustified_revisions(counts: dict[int, tuple[int, int]]) -> str | None:
    """Why a window's revisions are not justified by late events (None: they are)."""
    if sorted(counts) != list(range(len(counts))):
        return f"revisions {sorted(counts)}, not 0..{len(counts) - 1}"
    for revision in range(1, len(counts)):
        (imp0, clk0), (imp, clk) = counts[revision - 1], counts[revision]
        if imp < imp0 or clk < clk0 or imp + clk <= imp0 + clk0:
            return f"revision {revision} ({imp}, {clk}) adds no event to revision {revision - 1} ({imp0}, {clk0})"
    return None


def check_dlq(malformed: int, dlq_sources: list[str | None], verdict: Verdict) -> None:
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
