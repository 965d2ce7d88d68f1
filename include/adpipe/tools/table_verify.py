"""``adpipe verify --hour``: the ``ads`` Delta tables of one hour against
Kafka, read independently of the loader.

Expected rows come from plain Kafka consumers and verify's own Python
reading of the raw events (adpipe.tools.verify.classify); only the range of raw
offsets is taken from the stream job's ledger (the loader lands exactly the
raw records the stream has committed, so the raw table is compared with the
same range). Actual rows come from the tables through Spark: the published
ones, or (``staged_through``) the candidate a load run is about to publish.

Besides the rows by key, the minute counts are reconciled from the raw
records themselves: per (region, ad, minute) the distinct valid events of
each type minus those listed late must equal the aggregate's counts, so a
stream that agreed only with itself would fail here.

Revisions: ``ads.ad_minute_aggregates`` must hold each window's highest
revision in Kafka (by ``record_uuid``, with its counts), the revisions
table every revision, and no revision in the tables may count more
impressions or clicks than its window's latest. A re-stamped retry: the
raw table holds the copy the stream counted, never a copy the DLQ lists
(``conflicting_duplicate``), which is a quarantine row instead."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from adpipe import kafka_io
from adpipe import schemas as S
from adpipe.lakehouse import quality, retention
from adpipe.lakehouse import tables as T
from adpipe.lakehouse.ranges import retention_gaps
from adpipe.settings import Settings
from adpipe.tools.verify import LIST_LIMIT, FirstCopies, classify, classify_record, is_relisting


def _hour_of_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms // 3_600_000 * 3600, UTC)


def _dlq_listed(rs: Settings) -> tuple[set[str], dict[str, int]]:
    """The raw records the region's DLQ names (``topic/partition/offset``),
    and of them the conflicting copies of re-stamped events with each one's
    event time (epoch ms, from its headers)."""
    listed: set[str] = set()
    conflicting: dict[str, int] = {}
    for rec in kafka_io.read_topic(rs.kafka, rs.topics.dlq):
        source = rec.header(S.HEADER_SOURCE)
        if source is None:
            continue
        listed.add(source)
        if rec.header(S.HEADER_REASON) == S.REASON_CONFLICTING_DUPLICATE:
            conflicting[source] = int(rec.header(S.HEADER_EVENT_TIME_MS) or -1)
    return listed, conflicting


def _aggregate_rows(records: list[dict]) -> tuple[dict[str, tuple], dict[str, tuple]]:
    """Aggregate records (one region's) -> (latest, revisions): each
    window's highest revision and every revision, keyed by ``record_uuid``,
    valued (ad_id, window_start, impressions, clicks, revision)."""
    revisions: dict[str, tuple] = {}
    latest: dict[tuple, tuple] = {}
    for body in records:
        revision = int(body.get("revision") or 0)
        value = (body["ad_id"], body["window_start"], body["impressions"], body["clicks"], revision)
        revisions.setdefault(body["record_uuid"], value)
        window = (body["ad_id"], body["window_start"])
        if window not in latest or revision > latest[window][1][4]:
            latest[window] = (body["record_uuid"], value)
    return dict(latest.values()), revisions


def expected_rows(settings: Settings, hour: datetime) -> dict[str, dict]:
    """Per table, what it must hold for the hour, keyed by its unique key;
    ``minutes``: per (region, ad_id, window_start), the counts the raw
    records imply."""
    aggregates: dict[str, tuple] = {}
    revisions: dict[str, tuple] = {}
    raw: dict[str, int] = {}  # event_id -> the counted copy's event time
    conflicting: dict[str, tuple] = {}
    regions_of: dict[str, set[str]] = {}  # event_id -> the regions whose raw topic holds it
    late: set[str] = set()
    minutes: dict[tuple, tuple[int, int]] = {}
    for region in settings.regions:
        rs = settings.for_region(region)
        committed = kafka_io.stream_commits(rs)
        watermark = kafka_io.committed_watermark(committed)
        listed, region_conflicting = _dlq_listed(rs)
        conflicting.update({s: () for s, ms in region_conflicting.items() if _hour_of_ms(ms) == hour})
        events: dict[str, object] = {}
        firsts = FirstCopies()
        for rec in kafka_io.read_topic(rs.kafka, rs.topics.events):
            if rec.offset >= committed.get(rec.partition, (0, ""))[0]:
                continue  # not processed by the stream job yet: not loadable yet
            if f"{rec.topic}/{rec.partition}/{rec.offset}" in listed:
                continue  # a copy the stream did not count (a re-stamped retry's later copy)
            event = classify_record(rec.value, rec.timestamp_ms, rs.max_future_skew_ms)
            if not isinstance(event, str) and _hour_of_ms(event.event_ms) == hour:
                raw.setdefault(event.event_id, event.event_ms)
                events.setdefault(event.event_id, event)
                firsts.add(rec, event.event_id)
                regions_of.setdefault(event.event_id, set()).add(region.job_id)
        records = []
        for rec in kafka_io.read_topic(rs.kafka, rs.topics.aggregates):
            body = json.loads(rec.value)
            start = datetime.fromisoformat(body["window_start"].replace("Z", "+00:00"))
            if start.replace(minute=0, second=0) == hour:
                records.append(body)
        region_latest, region_revisions = _aggregate_rows(records)
        aggregates.update(region_latest)
        revisions.update(region_revisions)
        region_late: set[str] = set()
        for rec in kafka_io.read_topic(rs.kafka, rs.topics.late):
            event = classify(rec.value)
            # A retry listed again after the dedupe retention is no late event.
            if (
                not isinstance(event, str)
                and _hour_of_ms(event.event_ms) == hour
                and not is_relisting(firsts, event, rec, rs.late_dedupe_retention_s * 1000)
            ):
                region_late.add(event.event_id)
        late |= region_late
        counts: dict[tuple, list[int]] = {}
        for event_id, event in events.items():
            window_end_ms = (event.event_ms // 60_000 + 1) * 60_000  # type: ignore[attr-defined]
            if event_id in region_late or watermark is None or window_end_ms > watermark:
                continue  # late, or its window not closed by the stream yet (no aggregate to expect)
            key = (region.job_id, event.ad_id, event.window_start)  # type: ignore[attr-defined]
            counts.setdefault(key, [0, 0])[0 if event.event_type == "impression" else 1] += 1  # type: ignore[attr-defined]
        minutes.update({key: (n[0], n[1]) for key, n in counts.items()})
    return {
        "aggregates": aggregates,
        "revisions": revisions,
        "raw": raw,
        "late": {e: () for e in late},
        "minutes": minutes,
        # Events that reached more than one region (each region's stream counted them).
        "cross_region": {e: () for e, where in regions_of.items() if len(where) > 1},
        # Re-stamped retries' copies the stream did not count: quarantine rows, never raw ones.
        "conflicting": conflicting,
    }


def actual_rows(frames: quality.HourFrames, regions: list[str]) -> dict[str, list[tuple]]:
    """(key, value) rows of the hour and regions from each table's frame;
    duplicates kept."""

    def of_regions(df):  # noqa: ANN001, ANN202 - DataFrames
        return df.where(F.col("region").isin(regions))

    # Formatted by Spark in its session zone (UTC): a collected timestamp would
    # come back as a naive datetime in the host's zone.
    window_start = F.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_start")
    revision = F.coalesce("revision", F.lit(0).cast("long")).alias("revision")

    def aggregate_rows(df):  # noqa: ANN001, ANN202 - DataFrames
        return of_regions(df).select("record_uuid", "region", "ad_id", window_start, "impressions", "clicks",
                                     revision).collect()

    agg_rows = aggregate_rows(frames.aggregates_df)
    revision_rows = aggregate_rows(frames.revisions())
    aggregates = [(r.record_uuid, (r.ad_id, r.window_start, r.impressions, r.clicks, r.revision)) for r in agg_rows]
    revisions = [(r.record_uuid, (r.ad_id, r.window_start, r.impressions, r.clicks, r.revision))
                 for r in revision_rows]
    minutes = [((r.region, r.ad_id, r.window_start), (r.impressions, r.clicks)) for r in agg_rows]
    raw = [(r.event_id, r.ms) for r in of_regions(frames.raw_df).select(
        "event_id", F.unix_millis("event_time").alias("ms")).collect()]
    quarantine = of_regions(frames.quarantine_df)
    late = [(r.event_key, ()) for r in quarantine.where(F.col("source") == T.SOURCE_LATE).select("event_key").collect()]
    cross_region = {
        (r.event_id, ())
        for r in quarantine.where(F.col("source") == T.SOURCE_CROSS_REGION).select("event_id").collect()
    }
    conflicting = [
        (r.event_key, ())
        for r in quarantine.where(
            (F.col("source") == T.SOURCE_DLQ) & (F.col("reason") == S.REASON_CONFLICTING_DUPLICATE)
        ).select("event_key").collect()
    ]
    return {"aggregates": aggregates, "revisions": revisions, "raw": raw, "late": late, "minutes": minutes,
            "cross_region": list(cross_region), "conflicting": conflicting,
            "over_latest": revisions_over_latest(agg_rows, revision_rows)}


def revisions_over_latest(latest_rows: list, revision_rows: list) -> list[dict]:
    """The revisions in the tables (rows with region, ad_id, window_start,
    counts) that count more impressions or clicks than their window's
    latest row: a revision only ever adds events."""
    latest = {(r.region, r.ad_id, r.window_start): (r.impressions, r.clicks) for r in latest_rows}
    return [
        {"record_uuid": r.record_uuid, "region": r.region, "ad_id": r.ad_id, "window_start": r.window_start,
         "revision": r.revision, "counts": [r.impressions, r.clicks], "latest": list(counts)}
        for r in sorted(revision_rows, key=lambda r: r.record_uuid)
        if (counts := latest.get((r.region, r.ad_id, r.window_start))) is not None
        and (r.impressions > counts[0] or r.clicks > counts[1])
    ]


def compare(expected: dict[str, dict], actual: dict[str, list[tuple]]) -> dict:
    """Missing, unexpected, duplicated and wrong rows per table."""
    report: dict = {}
    problems = 0
    for name, want in expected.items():
        rows = actual[name]
        copies = Counter(key for key, _ in rows)
        got = dict(rows)
        missing = sorted(set(want) - set(got))
        unexpected = sorted(set(got) - set(want))
        duplicated = sorted(k for k, n in copies.items() if n > 1)
        wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        problems += len(missing) + len(unexpected) + len(duplicated) + len(wrong)
        report[name] = {
            "rows": len(rows),
            "expected": len(want),
            "missing_count": len(missing),
            "unexpected_count": len(unexpected),
            "duplicated_count": len(duplicated),
            "wrong_count": len(wrong),
            "missing": missing[:LIST_LIMIT],
            "unexpected": unexpected[:LIST_LIMIT],
            "duplicated": duplicated[:LIST_LIMIT],
            "wrong": [{"key": k, "expected": want[k], "table": got[k]} for k in wrong[:LIST_LIMIT]],
        }
    report["problems"] = problems
    report["ok"] = problems == 0
    return report


# ``verdict``: exactly-once holds for the hour, or not; or the hour is past
# Kafka's retention with nothing of it loaded (adpipe verify exits 5).
HOLDS = "holds"
BROKEN = "broken"


def check_hour(
    settings: Settings, hour: datetime, spark: SparkSession | None = None, staged_through: int | None = None
) -> dict:
    """The hour's tables (or, with ``staged_through``, the candidate of that
    load run) against Kafka; ``ok`` only when nothing differs and Kafka
    still holds the whole hour. ``verdict``: ``holds``, ``broken``, or
    ``past_retention`` when Kafka no longer holds the whole hour and nothing
    of it was ever loaded nor is in Kafka (``past_retention_report`` then
    says what Kafka keeps)."""
    if spark is None:
        from adpipe.lakehouse.metastore import metastore_session

        spark = metastore_session(settings, "adpipe-verify-tables")
    regions = [r.job_id for r in settings.regions]
    frames = quality.hour_frames(spark, hour, staged_through)
    actual = actual_rows(frames, regions)
    report = compare(expected_rows(settings, hour), actual)
    over = actual["over_latest"]
    report["revisions_over_latest_count"] = len(over)
    report["revisions_over_latest"] = over[:LIST_LIMIT]
    if over:
        report["problems"] += len(over)
        report["ok"] = False
    report["hour"] = hour.strftime("%Y-%m-%dT%H")
    report["regions"] = regions
    report["candidate_of_run"] = staged_through
    gaps = retention_gaps(settings, hour)
    report["past_retention"] = gaps[:LIST_LIMIT]
    report["past_retention_count"] = len(gaps)
    report["verdict"] = HOLDS if report["ok"] and not gaps else BROKEN
    if gaps:
        # Nothing of the hour in the tables (published or staged), and Kafka
        # holds nothing of it either: its records were deleted before any
        # load read them. Neither holds nor broken: past retention.
        if report["problems"] == 0 and not retention.hour_loaded(spark, hour):
            report["verdict"] = T.STEP_PAST_RETENTION
            report["past_retention_report"] = retention.PastRetention(hour, tuple(gaps)).describe()
        report["problems"] += len(gaps)
        report["ok"] = False
    return report


