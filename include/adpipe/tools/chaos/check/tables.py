"""The Delta tables read with delta-rs (not the loader's Spark code) and
compared with Kafka."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from .raw import LateListing, RawTopic, minute_label

# The Delta tables read with delta-rs, not the loader's Spark code. Pin:
# ``deltalake==1.6.6`` (installs beside pyarrow 26 with arro3-core only).
# delta-rs cannot read deletion vectors (delta-rs#1094): the tables keep them off.
DELTA_TABLES = ("ad_minute_aggregates", "ad_minute_aggregate_revisions", "ad_events_raw", "ad_events_quarantine")
AGGREGATE_COLUMNS = ["record_uuid", "ad_id", "window_start", "impressions", "clicks"]


def read_delta_tables(database_dir: Path) -> dict[str, list[dict]] | str:
    """The rows of the four tables under ``database_dir`` (the warehouse's
    ``ads.db``), or why they cannot be read this way."""
    try:
        from deltalake import DeltaTable
    except ImportError:
        return "deltalake is not installed (pin deltalake==1.6.6)"
    columns = {
        "ad_minute_aggregates": AGGREGATE_COLUMNS,
        "ad_minute_aggregate_revisions": AGGREGATE_COLUMNS,
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
    aggregate once with its counts in the revisions table, each window's
    latest revision once in the aggregates table, each valid raw event once,
    each late listing and DLQ record once in the quarantine."""
    wrong: list[str] = []

    def compare(table: str, want: Counter, got: Counter) -> None:
        for key in sorted(set(want) | set(got), key=str):
            if want[key] != got[key]:
                wrong.append(f"{table} {key}: expected {want[key]}, found {got[key]}")

    every: Counter = Counter()
    latest: dict[tuple[str, str], tuple[int, tuple]] = {}  # (ad, window) -> (revision, row)
    seen_uuids: set[str] = set()
    for value in aggregates:
        body = json.loads(value)
        if body["window_start"][:13] in hours and body["record_uuid"] not in seen_uuids:
            seen_uuids.add(body["record_uuid"])
            row = (body["record_uuid"], body["ad_id"], body["window_start"], body["impressions"], body["clicks"])
            every[row] += 1
            revision = body.get("revision") or 0
            window = (body["ad_id"], body["window_start"])
            if window not in latest or revision > latest[window][0]:
                latest[window] = (revision, row)

    def aggregate_rows(table: str) -> Counter:
        return Counter(
            (r["record_uuid"], r["ad_id"], _utc_minute(r["window_start"]), r["impressions"], r["clicks"])
            for r in rows[table]
        )

    compare("ad_minute_aggregates", Counter(row for _, row in latest.values()), aggregate_rows("ad_minute_aggregates"))
    compare("ad_minute_aggregate_revisions", every, aggregate_rows("ad_minute_aggregate_revisions"))
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
