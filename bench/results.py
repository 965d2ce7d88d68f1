"""Judging and ranking the rows of ``make bench``: each engine's output is
read back with read_committed and held to the producer's own summary
(``adpipe.tools.chaos.check.check_events``); a row that counts wrong is
reported, not ranked. Steady state is records over the engine's processing
time (first record to output committed), start-up the rest of its wall
time, and each row's rate is a share of Spark's batch ceiling."""

from __future__ import annotations

import dataclasses
import json
import os

from adpipe import kafka_io
from adpipe.settings import Settings
from adpipe.tools.chaos import check as chaos_check

from bench.engines import BASELINE
from bench.processes import Measured

# --- Judging an output ------------------------------------------------------


def judge(
    summary: dict, aggregates: list[bytes], dlq_sources: list[str | None] | None, before: str | None = None
) -> dict:
    """An engine's output against the producer's summary (``check_events``):
    only the windows starting before ``before`` (a closer's own windows,
    which only some engines emit, are not judged); the DLQ is judged when
    the engine writes one (``dlq_sources`` not None)."""
    truth = chaos_check.Truth.from_summaries([summary], closed_before=before)
    if dlq_sources is None:
        truth = dataclasses.replace(truth, malformed=0)
    judged, unreadable = [], 0
    for value in aggregates:
        body = json.loads(value)
        if not all(isinstance(body.get(k), str) for k in ("ad_id", "window_start", "record_uuid")):
            unreadable += 1
        elif before is None or body["window_start"] < before:
            judged.append(value)
    result = chaos_check.check_events(truth, judged, [], dlq_sources or [])
    if unreadable:
        result["ok"] = False
        result["problems"].insert(0, f"{unreadable} aggregates without a string ad_id, window_start or record_uuid")
    result["dlq_judged"] = dlq_sources is not None
    return result


def dlq_source(record: kafka_io.Record) -> str | None:
    """Where a DLQ record came from: adpipe's header, or a peer's JSON value."""
    header = record.header("adpipe.source")
    if header is not None:
        return header
    try:
        return json.loads(record.value or b"{}").get("source")
    except ValueError:
        return None


def read_values(settings: Settings, topic: str) -> list[bytes]:
    return [r.value for r in kafka_io.read_topic(settings.kafka, topic, timeout_s=300) if r.value is not None]


def read_dlq(settings: Settings, topic: str) -> list[str | None]:
    return [dlq_source(r) for r in kafka_io.read_topic(settings.kafka, topic, timeout_s=300)]


# --- Rows and the table -----------------------------------------------------


def make_row(engine: str, messages: int, measured: Measured, processing_s: float | None, check: dict | None) -> dict:
    """One row of the table: steady-state events/s over the engine's own
    processing time, start-up the rest of its wall time, CPU seconds per
    million records, peak memory; ``counts`` exact, WRONG, or - (no output)."""
    processing = processing_s if processing_s else measured.wall_s
    failed = measured.returncode != 0
    return {
        "engine": engine,
        "messages": messages,
        "events_per_s": None if failed else round(messages / processing) if processing > 0 else None,
        "processing_s": processing,
        "startup_s": round(max(0.0, measured.wall_s - processing), 1),
        "wall_s": measured.wall_s,
        "cpu_s_per_million": round(measured.cpu_s * 1_000_000 / messages, 1) if messages else None,
        "peak_rss_mb": measured.peak_rss_mb,
        "returncode": measured.returncode,
        "counts": "FAILED" if failed else "-" if check is None else "exact" if check["ok"] else "WRONG",
        "check": check,
        "report": measured.report,
        "log": str(measured.log),
    }


def add_ratios(rows: list[dict], baseline: str = BASELINE) -> None:
    """Each row's events/s as a share of the baseline's (Spark's batch
    ceiling); a row that counts wrong or failed is not ranked."""
    base = next((r["events_per_s"] for r in rows if r["engine"] == baseline), None)
    for row in rows:
        ranked = row["counts"] in ("exact", "-") and row["events_per_s"] and base
        row["ratio_to_batch"] = round(row["events_per_s"] / base, 2) if ranked else None


def alignment_cost(result: dict) -> str | None:
    """adpipe's watermark waiting for the slowest partition against Spark's
    rule (the ``adpipe`` and ``adpipe_unaligned`` rows): events/s and, with
    --latency, p99; the goal is within 10 %."""
    rows = {r["engine"]: r for r in result.get("rows", [])}
    on, off = rows.get("adpipe"), rows.get("adpipe_unaligned")
    if not on or not off or not on.get("events_per_s") or not off.get("events_per_s"):
        return None
    parts = [f"watermark alignment: {on['events_per_s'] / off['events_per_s']:.2f} x the events/s without it"]
    latency = {r["engine"]: r for r in result.get("latency") or []}
    on_p99, off_p99 = (latency.get(e, {}).get("p99_s") for e in ("adpipe", "adpipe_unaligned"))
    if on_p99 is not None and off_p99:
        parts.append(f"{on_p99 / off_p99:.2f} x its p99 latency")
    return ", ".join(parts) + " (goal: within 10 %)"


def cell(value: object, spec: str = "") -> str:
    """A table cell: the value formatted, or - when there is none."""
    return "-" if value is None else format(value, spec)


def render_table(result: dict) -> str:
    """The rows as a plain-text table (and the latency rows, if any)."""
    lines = [
        f"bench {result['run_id']}: {result['messages']:,} messages ({result['events']:,} events over "
        f"{result['ads']:,} ads and {result['minutes']} minutes, {result['duplicates']:,} retries, "
        f"{result['malformed']:,} malformed), {os.cpu_count()} cores",
        "",
        f"{'engine':<15}{'events/s':>10}{'x batch':>9}{'start-up s':>12}{'wall s':>9}"
        f"{'CPU s/M':>9}{'peak MB':>9}  counts",
    ]
    for row in result["rows"]:
        lines.append(
            f"{row['engine']:<15}{cell(row['events_per_s'], ','):>10}{cell(row['ratio_to_batch'], '.2f'):>9}"
            f"{cell(row['startup_s'], '.1f'):>12}{cell(row['wall_s'], '.1f'):>9}"
            f"{cell(row['cpu_s_per_million'], '.0f'):>9}{cell(row['peak_rss_mb'], '.0f'):>9}  {row['counts']}"
        )
    for row in result["rows"]:
        check = row.get("check")
        if check and not check["ok"]:
            lines.append(f"  {row['engine']} counts WRONG (not ranked): {'; '.join(check['problems'][:3])}")
    alignment = alignment_cost(result)
    if alignment:
        lines += ["", alignment]
    if result.get("latency"):
        lines += [
            "",
            f"latency at {result['latency_rate']:,.0f} events/s for {result['latency_duration_s']:.0f} s, "
            "window close (end + watermark delay) -> visible to read_committed:",
            f"{'engine':<13}{'windows':>9}{'p50 s':>9}{'p99 s':>9}{'max s':>9}{'CPU s/min':>11}",
        ]
        for row in result["latency"]:
            lines.append(
                f"{row['engine']:<13}{row['windows']:>9}{cell(row['p50_s'], '.1f'):>9}"
                f"{cell(row['p99_s'], '.1f'):>9}{cell(row['max_s'], '.1f'):>9}"
                f"{cell(row.get('cpu_s_per_min'), '.1f'):>11}"
                + ("" if row.get("error") is None else f"  {row['error']}")
            )
    return "\n".join(lines)
