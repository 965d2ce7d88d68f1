"""The independent check and the report of ``adpipe chaos``.

Nothing here uses the stream job's or the budget service's code: the truth
is the producer's own record of what it sent (its plan summary), the output
is read back with plain Kafka consumers and SQL, and the arithmetic is plain
Python. A valid event must be counted in exactly one aggregate or listed once
in the late topic; a malformed message must be in the DLQ once; the spend of
each ad must be the sum of its aggregates' charges to the micro-unit."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal

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
    """Every valid event counted once or listed late once; every malformed
    message in the DLQ once. ``aggregates`` and ``late`` are record values
    as read with read_committed; ``dlq_sources`` the DLQ records' source
    (topic/partition/offset) headers."""
    verdict = Verdict()
    observed: Counter[Key] = Counter()
    windows: Counter[tuple[str, str]] = Counter()
    uuids: Counter[str] = Counter()
    for value in aggregates:
        body = json.loads(value)
        windows[(body["ad_id"], body["window_start"])] += 1
        uuids[body["record_uuid"]] += 1
        observed[(body["ad_id"], body["window_start"], "impression")] += body["impressions"]
        observed[(body["ad_id"], body["window_start"], "click")] += body["clicks"]
    for (ad, window), n in windows.items():
        if n > 1:
            verdict.add(0, n - 1, f"aggregate ({ad}, {window}) written {n} times")
    for record_uuid, n in uuids.items():
        if n > 1:
            verdict.add(0, 0, f"record_uuid {record_uuid} on {n} aggregates")
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
    sources = Counter(dlq_sources)
    dlq_distinct = len(sources)
    if dlq_distinct != truth.malformed:
        verdict.add(
            max(0, truth.malformed - dlq_distinct),
            max(0, dlq_distinct - truth.malformed),
            f"DLQ holds {dlq_distinct} malformed messages, {truth.malformed} were sent",
        )
    dlq_copies = sum(n - 1 for n in sources.values() if n > 1)
    if dlq_copies:
        verdict.add(0, dlq_copies, f"{dlq_copies} DLQ records repeat a source offset")
    return {
        "ok": verdict.ok,
        "lost": verdict.lost,
        "duplicated": verdict.duplicated,
        "aggregates": len(aggregates),
        "events_counted": sum(v for (_, _, t), v in observed.items()),
        "late_listed": len(late_ids),
        "dlq": len(dlq_sources),
        "problems": verdict.problems,
    }


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


def summarize_faults(faults: list[dict]) -> dict[str, dict]:
    """Per kind: how many were injected, how many recovered, and recovery
    seconds p50/p99/max."""
    kinds: dict[str, dict] = {}
    for kind in sorted({f["kind"] for f in faults}):
        of_kind = [f for f in faults if f["kind"] == kind]
        times = [f["recovery_s"] for f in of_kind if f.get("recovery_s") is not None]
        kinds[kind] = {
            "injected": len(of_kind),
            "recovered": len(times),
            "recovery_p50_s": percentile(times, 0.5),
            "recovery_p99_s": percentile(times, 0.99),
            "recovery_max_s": max(times) if times else None,
        }
    return kinds


def render_table(report: dict) -> str:
    """The report as a plain-text table for the terminal and the README."""

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    lines = [
        f"chaos run {report['run_id']} (seed {report['seed']}): {report['events']['sent_messages']} messages "
        f"({report['events']['distinct_events']} distinct valid events, {report['events']['malformed']} malformed) "
        f"on {report['brokers']} broker(s), Spark {report['spark_master']}, {report['duration_s']:.0f} s",
        "",
        f"{'fault':<22}{'injected':>9}{'recovered':>10}{'p50 s':>8}{'p99 s':>8}{'max s':>8}",
    ]
    for kind, row in report["faults"].items():
        lines.append(
            f"{kind:<22}{row['injected']:>9}{row['recovered']:>10}{secs(row['recovery_p50_s']):>8}"
            f"{secs(row['recovery_p99_s']):>8}{secs(row['recovery_max_s']):>8}"
        )
    total = sum(r["injected"] for r in report["faults"].values())
    lines += [
        f"{'total':<22}{total:>9}",
        "",
        "restarts: " + ", ".join(f"{k} {v}" for k, v in sorted(report["restarts"].items())),
        f"max stream lag: {report['max_stream_lag']} records; stalled stream jobs killed: "
        f"{report['stream_stalls_killed']}; drain: {secs(report['drain_s'])} s",
        f"events: lost {report['check']['lost']}, duplicated {report['check']['duplicated']}; "
        f"{report['check']['aggregates']} aggregates, {report['check']['late_listed']} late, "
        f"{report['check']['dlq']} in the DLQ",
        f"tables: {'match Kafka' if report['tables']['ok'] else 'DO NOT match'} "
        f"({', '.join(report['tables']['hours']) or 'no hour'}); budgets: "
        f"{'exact' if report['spend']['ok'] else 'WRONG'} ({report['spend']['actual_micros']} micro-units)",
        f"verdict: {report['verdict']}",
    ]
    return "\n".join(lines)
