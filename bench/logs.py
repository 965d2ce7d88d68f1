"""What the benchmark reads from adpipe's own log lines: the stream job's
batches (:func:`batch_stats`, :func:`adpipe_processing_s`) and the budget
service's (:func:`budget_log_stats`). Tolerant of a changed format: what is
not found is None or zero, never an error (a bench reports, a log line is
not a contract)."""

from __future__ import annotations

import re
import statistics
from datetime import datetime, timedelta

_LOG_TIME = re.compile(r"^(\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[,.]\d+)?)")
_BUDGET_BATCH = re.compile(r"adpipe\.budget: batch (\d+): (.*)$")
_MS = re.compile(r"(\d+(?:\.\d+)?)\s*ms\b")


def log_time(line: str) -> datetime | None:
    """The time a log line starts with (``%(asctime)s``), or None."""
    m = _LOG_TIME.match(line)
    if not m:
        return None
    try:
        return datetime.fromisoformat(m.group(1).replace(",", "."))
    except ValueError:
        return None


def _int_in(pattern: str, text: str) -> int | None:
    m = re.search(pattern, text)
    return int(m.group(1)) if m else None


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return None if start is None or end is None else round((end - start).total_seconds(), 3)


def budget_log_stats(log_text: str) -> dict:
    """From a budget service log: its batches (``adpipe.budget: batch N: R
    records: A applied ...; X ms``), the time spent in them, the time it
    took to drain the topic (from the first batch's start to the last one's
    end: start-up and group join excluded, and so is the wait before the
    last batch, a drained topic's last poll waiting out its timeout), its
    budget-event publish rounds, the batch size it announced and the totals
    of its ``budget service stopped: ...`` line. Tolerant of a changing
    format: what is not found is None, never an error."""
    batches: list[tuple[int, int | None, float | None, datetime | None]] = []
    started_at = stopped_at = None
    batch_size = stopped_batches = None
    totals: dict[str, int] | None = None
    published = [0, 0]  # publish rounds, budget events in them
    for line in log_text.splitlines():
        events = _int_in(r"adpipe\.budget: published (\d+) budget events", line)
        if events is not None:
            published[0] += 1
            published[1] += events
            continue
        if "budget service stopped" in line:
            stopped_at = log_time(line)
            rest = line.split("budget service stopped", 1)[1]
            stopped_batches = _int_in(r"(\d+) batches", rest)
            found = re.findall(r"([a-z_]+) (\d+)\b", rest.split("batches", 1)[-1])
            totals = {k: int(v) for k, v in found} or None
            continue
        if "adpipe.budget: budget service" in line:
            started_at = log_time(line)
            batch_size = _int_in(r"batch size (\d+)", line)
            continue
        m = _BUDGET_BATCH.search(line)
        if not m:
            continue
        rest = m.group(2)
        records = _int_in(r"^(\d+) records", rest)
        if records is None:  # "batch N: database transaction failed ..." and the like
            continue
        durations = _MS.findall(rest)
        duration = float(durations[-1]) if durations else None
        batches.append((records, _int_in(r"(\d+) applied", rest), duration, log_time(line)))

    stats: dict = {
        "batches": len(batches) or None,
        "records": sum(b[0] for b in batches) if batches else None,
        "applied": None,
        "batch_s": None,
        "mean_batch_ms": None,
        "max_batch_ms": None,
        "mean_batch_records": round(sum(b[0] for b in batches) / len(batches), 1) if batches else None,
        "drain_s": None,
        "drain_window": None,
        "service_s": _seconds(started_at, stopped_at),
        "batch_size_logged": batch_size,
        "publish_rounds": published[0],
        "events_published": published[1],
        "stopped_batches": stopped_batches,
        "totals": totals,
    }
    applied = [b[1] for b in batches if b[1] is not None]
    if batches and len(applied) == len(batches):
        stats["applied"] = sum(applied)
    ms = [b[2] for b in batches if b[2] is not None]
    if batches and len(ms) == len(batches):
        stats["batch_s"] = round(sum(ms) / 1000, 3)
        stats["mean_batch_ms"] = round(sum(ms) / len(ms), 1)
        stats["max_batch_ms"] = max(ms)
        ends = [b[3] for b in batches if b[3] is not None]
        if len(ends) == len(batches):
            # From the first batch's start to the last one's end, less the
            # wait before the last batch: a drained topic's last poll waits
            # out the consumer's timeout (idle, not work).
            first_start = ends[0] - timedelta(milliseconds=ms[0])
            before_last = (ends[-2] - first_start).total_seconds() if len(ends) > 1 else 0.0
            stats["drain_s"] = round(before_last + ms[-1] / 1000, 3)
            # For instances of one group run side by side: the span from the
            # first one's first batch to the last one's end.
            stats["drain_window"] = (first_start, first_start + timedelta(seconds=stats["drain_s"]))
    return stats


_BATCH_LINE = re.compile(r"adpipe\.stream: batch \d+: input offsets (\d+),.* in (\d+) ms \(batch (\d+) ms\)")


def batch_stats(log_text: str) -> dict:
    """From a stream log: how many batches, the largest input, the slowest
    batch and the slowest transaction; the first batch's time, and the
    median of the later ones with input (the steady state)."""
    found = [tuple(map(int, m.groups())) for m in _BATCH_LINE.finditer(log_text)]
    with_input = [f for f in found if f[0] > 0]
    steady = [f[2] for f in with_input[1:]]
    return {
        "batches": len(found),
        "batches_with_input": len(with_input),
        "max_batch_offsets": max((f[0] for f in found), default=0),
        "max_transaction_ms": max((f[1] for f in found), default=0),
        "max_batch_ms": max((f[2] for f in found), default=0),
        "first_batch_ms": found[0][2] if found else None,
        "median_steady_batch_ms": round(statistics.median(steady)) if steady else None,
    }


def adpipe_processing_s(log_text: str) -> float | None:
    """From ``adpipe stream`` output: from its ``stream job ... started``
    line to its last batch line (None when either is missing)."""
    started = last = None
    for line in log_text.splitlines():
        if "adpipe.stream: stream job" in line and " started" in line:
            started = log_time(line)
        elif "adpipe.stream: batch " in line:
            last = log_time(line) or last
    if started is None or last is None:
        return None
    return round((last - started).total_seconds(), 3)
