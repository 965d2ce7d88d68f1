"""``adpipe verify --hour``: the ``ads`` Delta tables of one hour against
Kafka, read independently of the loader.

Expected rows come from plain Kafka consumers and verify's own Python
reading of the raw events (adpipe.tools.verify.classify); only the range of raw
offsets is taken from the stream job's ledger (the loader lands exactly the
raw records the stream has committed, so the raw table is compared with the
same range). Actual rows come from the tables through Spark."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from adpipe import kafka_io
from adpipe.lakehouse import tables as T
from adpipe.settings import Settings
from adpipe.tools.verify import LIST_LIMIT, classify, classify_record


def _hour_of_ms(ms: int) -> datetime:
    return datetime.fromtimestamp(ms // 3_600_000 * 3600, UTC)


def expected_rows(settings: Settings, hour: datetime) -> dict[str, dict]:
    """Per table, what it must hold for the hour, keyed by its unique key."""
    aggregates: dict[str, tuple] = {}
    raw: set[str] = set()
    late: set[str] = set()
    for region in settings.regions:
        rs = settings.for_region(region)
        committed = kafka_io.stream_commits(rs)
        for rec in kafka_io.read_topic(rs.kafka_bootstrap, rs.topics.events):
            if rec.offset >= committed.get(rec.partition, (0, ""))[0]:
                continue  # not processed by the stream job yet: not loadable yet
            event = classify_record(rec.value, rec.timestamp_ms, rs.max_future_skew_ms)
            if not isinstance(event, str) and _hour_of_ms(event.event_ms) == hour:
                raw.add(event.event_id)
        for rec in kafka_io.read_topic(rs.kafka_bootstrap, rs.topics.aggregates):
            body = json.loads(rec.value)
            start = datetime.fromisoformat(body["window_start"].replace("Z", "+00:00"))
            if start.replace(minute=0, second=0) == hour:
                aggregates.setdefault(
                    body["record_uuid"], (body["ad_id"], body["window_start"], body["impressions"], body["clicks"])
                )
        for rec in kafka_io.read_topic(rs.kafka_bootstrap, rs.topics.late):
            event = classify(rec.value)
            if not isinstance(event, str) and _hour_of_ms(event.event_ms) == hour:
                late.add(event.event_id)
    return {"aggregates": aggregates, "raw": {e: () for e in raw}, "late": {e: () for e in late}}


def actual_rows(spark: SparkSession, hour: datetime, regions: list[str]) -> dict[str, list[tuple]]:
    """(key, value) rows of the hour and regions from each table; duplicates kept."""

    def of_hour(name: str):  # noqa: ANN202 - a DataFrame
        return spark.table(name).where((F.col("event_hour") == F.lit(hour)) & F.col("region").isin(regions))

    # Formatted by Spark in its session zone (UTC): a collected timestamp would
    # come back as a naive datetime in the host's zone.
    window_start = F.date_format("window_start", "yyyy-MM-dd'T'HH:mm:ss'Z'").alias("window_start")
    aggregates = [
        (r.record_uuid, (r.ad_id, r.window_start, r.impressions, r.clicks))
        for r in of_hour(T.AGGREGATES).select("record_uuid", "ad_id", window_start, "impressions", "clicks").collect()
    ]
    raw = [(r.event_id, ()) for r in of_hour(T.RAW).select("event_id").collect()]
    late = [
        (r.event_key, ())
        for r in of_hour(T.QUARANTINE).where(F.col("source") == T.SOURCE_LATE).select("event_key").collect()
    ]
    return {"aggregates": aggregates, "raw": raw, "late": late}


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


def retention_gaps(settings: Settings, hour: datetime) -> list[dict]:
    """The topics of each region that may no longer hold every record of the
    hour: the broker deleted records of a partition (its first offset is
    above 0) and the first record it still keeps is later than the earliest
    a record of the hour can have been written (the hour's start less the
    future skew an event may have over its record). Kafka cannot then prove
    the hour, so the check fails rather than passing on what is left."""
    earliest_ms = int(hour.timestamp() * 1000) - settings.max_future_skew_ms
    gaps = []
    for region in settings.regions:
        rs = settings.for_region(region)
        for topic in (rs.topics.events, rs.topics.aggregates, rs.topics.late, rs.topics.dlq):
            for partition, (low, first_ms) in sorted(kafka_io.first_retained(rs.kafka_bootstrap, topic).items()):
                if low > 0 and (first_ms is None or first_ms > earliest_ms):
                    gaps.append(
                        {"region": region.job_id, "topic": topic, "partition": partition, "first_offset": low,
                         "first_timestamp_ms": first_ms}
                    )
    return gaps


def check_hour(settings: Settings, hour: datetime, spark: SparkSession | None = None) -> dict:
    if spark is None:
        from adpipe.lakehouse.metastore import metastore_session

        spark = metastore_session(settings, "adpipe-verify-tables")
    regions = [r.job_id for r in settings.regions]
    report = compare(expected_rows(settings, hour), actual_rows(spark, hour, regions))
    report["hour"] = hour.strftime("%Y-%m-%dT%H")
    report["regions"] = regions
    gaps = retention_gaps(settings, hour)
    report["past_retention"] = gaps[:LIST_LIMIT]
    report["past_retention_count"] = len(gaps)
    if gaps:
        report["problems"] += len(gaps)
        report["ok"] = False
    return report
