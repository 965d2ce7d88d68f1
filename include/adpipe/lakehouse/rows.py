"""Union & Load, step 1's pure part: Kafka records (as DataFrames) shaped
into the rows of the three tables, ``ads.ad_events_raw``,
``ads.ad_minute_aggregates`` and ``ads.ad_events_quarantine``; late repeats
and cross-region copies marked. DataFrame in, DataFrame out: no I/O (the
reads and writes are in ``adpipe.lakehouse.load``)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from adpipe import raw_events
from adpipe import schemas as S
from adpipe.lakehouse import tables as T

log = logging.getLogger(__name__)


SOURCE_BAD_AGGREGATE = "bad_aggregate"


# The raw record a late copy lists ("topic/partition/offset"), beside the
# quarantine rows until mark_late_repeats has used it.
RAW_SOURCE = "__raw_source"


LISTED_WATERMARK = "__listed_watermark_ms"  # the watermark of the batch that listed a late copy


def _hour_of(ts: Column) -> Column:
    return F.date_trunc("hour", ts)


def _kafka_columns(region: str, loaded_at: datetime) -> list[Column]:
    return [
        F.lit(region).alias("region"),
        F.col("topic").alias("kafka_topic"),
        F.col("partition").cast("int").alias("kafka_partition"),
        F.col("offset").cast("long").alias("kafka_offset"),
        F.lit(loaded_at).cast("timestamp").alias("loaded_at"),
        F.lit(None).cast("long").alias("load_run"),  # set by the run that stages the rows
    ]


def _first_per_key(df: DataFrame, keys: list[str]) -> DataFrame:
    """One row per key, deterministically: the lowest (region, partition, offset)."""
    w = Window.partitionBy(*keys).orderBy("region", "kafka_topic", "kafka_partition", "kafka_offset")
    return df.withColumn("__n", F.row_number().over(w)).where(F.col("__n") == 1).drop("__n")


def _in_hour(hour: datetime | None) -> Column:
    """Rows of ``hour``; every row for None (a load files each row in its own hour)."""
    if hour is None:
        return F.lit(True)
    return F.col("event_hour") == F.lit(hour.astimezone(UTC)).cast("timestamp")


def raw_table_rows(
    kafka_df: DataFrame, region: str, hour: datetime | None, loaded_at: datetime, max_future_skew_ms: int
) -> DataFrame:
    """Raw Kafka rows -> ``ads.ad_events_raw`` rows (of ``hour`` only, unless
    None): valid events only, by the stream job's own reading of the contract."""
    parsed = raw_events.valid_events(raw_events.parse_raw_events(kafka_df, max_future_skew_ms))
    rows = parsed.select(
        "event_id",
        "ad_id",
        "campaign_id",
        "event_type",
        "event_time",
        _hour_of(F.col("event_time")).alias("event_hour"),
        *_kafka_columns(region, loaded_at),
    ).where(_in_hour(hour))
    return rows.select(*T.RAW_SCHEMA.fieldNames())


def with_aggregate_fields(kafka_df: DataFrame) -> DataFrame:
    """Aggregate records -> what both tables that read them need, parsed
    once: the record's JSON in ``a``, its window parsed (``window_start``,
    ``window_end``), ``aggregate_ok`` (every field of the contract there and
    readable), its Kafka position and time, and its bytes (``value``) only
    when it is not readable (the quarantine keeps those; the readable ones'
    bytes would only make the kept frame bigger). A frame that has them
    already is returned as it is."""
    if "aggregate_ok" in kafka_df.columns:
        return kafka_df
    body = F.from_json(F.col("value").cast("string"), S.AGGREGATE_RECORD)
    parsed = kafka_df.select("topic", "partition", "offset", "timestamp", "value", body.alias("a")).withColumns(
        # try_: an unreadable time makes the record unreadable (quarantined);
        # a plain cast fails the whole load under ANSI mode.
        {"window_start": F.try_to_timestamp("a.window_start"), "window_end": F.try_to_timestamp("a.window_end")}
    )
    a = F.col("a")
    ok = F.coalesce(
        a.record_uuid.isNotNull()
        & a.ad_id.isNotNull()
        & F.col("window_start").isNotNull()
        & F.col("window_end").isNotNull()
        & a.impressions.isNotNull()
        & a.clicks.isNotNull(),
        F.lit(False),
    )
    return parsed.withColumn("aggregate_ok", ok).withColumn("value", F.when(~F.col("aggregate_ok"), F.col("value")))


def aggregate_table_rows(kafka_df: DataFrame, region: str, hour: datetime | None, loaded_at: datetime) -> DataFrame:
    """Aggregate records -> ``ads.ad_minute_aggregates`` rows (of ``hour`` only, unless None)."""
    parsed = with_aggregate_fields(kafka_df).where(F.col("aggregate_ok"))
    rows = parsed.select(
        F.col("a.record_uuid").alias("record_uuid"),
        F.col("a.ad_id").alias("ad_id"),
        "window_start",
        "window_end",
        F.col("a.impressions").alias("impressions"),
        F.col("a.clicks").alias("clicks"),
        F.coalesce(F.col("a.revision"), F.lit(0).cast("long")).alias("revision"),  # absent: 0
        _hour_of(F.col("window_start")).alias("event_hour"),
        *_kafka_columns(region, loaded_at),
    ).where(_in_hour(hour))
    return rows.select(*T.AGGREGATES_SCHEMA.fieldNames())


def source_of_raw(df: DataFrame) -> Column:
    """A raw row's Kafka record as the DLQ's source header names it: ``topic/partition/offset``."""
    return F.concat_ws("/", df["kafka_topic"], df["kafka_partition"], df["kafka_offset"])


def dlq_sources(dlq_df: DataFrame, region: str) -> DataFrame:
    """DLQ records -> (``region``, ``event_key``): the raw record each one
    names (its source header), as the quarantine keys its row."""
    return dlq_df.select(F.lit(region).alias("region"), _header(S.HEADER_SOURCE).alias("event_key")).where(
        F.col("event_key").isNotNull()
    )


def without_dlq_copies(raw_df: DataFrame, listed_df: DataFrame) -> DataFrame:
    """Raw rows -> those whose Kafka record no DLQ record of their region
    names (``listed_df``: ``region``, ``event_key``). Every record the DLQ
    lists is a rejected one: a malformed record (never a raw row anyway) or
    a re-stamped retry, a later copy of an ``event_id`` with another
    ``event_time``, which the stream did not count (reason
    ``conflicting_duplicate``): the raw table holds the copy it counted."""
    listed = listed_df.select("region", F.col("event_key").alias("__listed")).distinct()
    joined = raw_df.join(
        F.broadcast(listed), (raw_df["region"] == listed["region"]) & (source_of_raw(raw_df) == listed["__listed"]),
        "left_anti",
    )
    return joined.select(*raw_df.columns)


def _header(name: str) -> Column:
    """A Kafka header's value as a string (Spark's includeHeaders array)."""
    match = F.filter(F.col("headers"), lambda h: h["key"] == name)
    return F.when(F.size(match) > 0, match[0]["value"].cast("string"))


def _with_event_fields(copies_df: DataFrame) -> DataFrame:
    """DLQ or late copies with the event fields read from their bytes (and
    ``reject_reason``), headers kept. No future-time rule: the job checked
    their source records."""
    parsed = raw_events.parse_raw_events(copies_df.drop("headers"), None).select(
        "event_id",
        "ad_id",
        "event_type",
        "event_time",
        "reject_reason",
        F.col("offset").alias("__offset"),
        F.col("partition").alias("__partition"),
    )
    joined = copies_df.join(
        parsed, (copies_df["offset"] == parsed["__offset"]) & (copies_df["partition"] == parsed["__partition"])
    )
    return joined.drop("__offset", "__partition")


def quarantine_table_rows(
    dlq_df: DataFrame,
    late_df: DataFrame,
    aggregates_df: DataFrame,
    region: str,
    hour: datetime | None,
    loaded_at: datetime,
) -> DataFrame:
    """DLQ records, late events and unreadable aggregate records ->
    ``ads.ad_events_quarantine`` rows (of ``hour`` only, unless None)."""
    # DLQ: the original bytes; an event time when one can be read from them,
    # else the hour the record reached the DLQ.
    dlq_rows = _with_event_fields(dlq_df).select(
        F.lit(T.SOURCE_DLQ).alias("source"),
        F.coalesce(_header(S.HEADER_SOURCE), F.concat_ws("/", "topic", "partition", "offset")).alias("event_key"),
        F.coalesce(_header(S.HEADER_REASON), F.lit("unknown")).alias("reason"),
        F.col("value").cast("binary").alias("raw_value"),
        "event_id",
        "ad_id",
        "event_type",
        "event_time",
        _hour_of(F.coalesce("event_time", "timestamp")).alias("event_hour"),
        *_kafka_columns(region, loaded_at),
    )
    # Late: the event the copy lists; one truncated as oversized names it in
    # its headers (its JSON is cut).
    late = _with_event_fields(late_df).withColumns(
        {
            "event_id": F.coalesce(_header(S.HEADER_EVENT_ID), "event_id"),
            "ad_id": F.coalesce("ad_id", F.col("key").cast("string")),
            "event_time": F.coalesce(
                "event_time", F.timestamp_millis(_header(S.HEADER_EVENT_TIME_MS).try_cast("long"))
            ),
        }
    )
    late_rows = late.where(F.col("reject_reason").isNull() | _header(S.HEADER_EVENT_ID).isNotNull()).select(
        _header(S.HEADER_SOURCE).alias(RAW_SOURCE),
        _header(S.HEADER_WATERMARK).try_cast("long").alias(LISTED_WATERMARK),
        F.lit(T.SOURCE_LATE).alias("source"),
        F.col("event_id").alias("event_key"),
        F.lit("late").alias("reason"),
        F.col("value").alias("raw_value"),
        "event_id",
        "ad_id",
        "event_type",
        "event_time",
        _hour_of(F.col("event_time")).alias("event_hour"),
        *_kafka_columns(region, loaded_at),
    )
    bad_aggregates = (
        with_aggregate_fields(aggregates_df)
        .where(~F.col("aggregate_ok"))
        .select(
            F.lit(SOURCE_BAD_AGGREGATE).alias("source"),
            F.concat_ws("/", "topic", "partition", "offset").alias("event_key"),
            F.lit("unreadable_aggregate").alias("reason"),
            F.col("value").cast("binary").alias("raw_value"),
            F.lit(None).cast("string").alias("event_id"),
            F.col("a.ad_id").alias("ad_id"),
            F.lit(None).cast("string").alias("event_type"),
            F.lit(None).cast("timestamp").alias("event_time"),
            _hour_of(F.col("timestamp")).alias("event_hour"),
            *_kafka_columns(region, loaded_at),
        )
    )
    names = T.QUARANTINE_SCHEMA.fieldNames()
    listing = [F.lit(None).cast("string").alias(RAW_SOURCE), F.lit(None).cast("long").alias(LISTED_WATERMARK)]
    return (
        dlq_rows.select(*names, *listing)
        .unionByName(late_rows.select(*names, RAW_SOURCE, LISTED_WATERMARK))
        .unionByName(bad_aggregates.select(*names, *listing))
        .where(_in_hour(hour))
    )


def mark_late_repeats(quarantine_df: DataFrame, first_raw_df: DataFrame, retention_ms: int) -> DataFrame:
    """Quarantine rows (with :data:`RAW_SOURCE` and :data:`LISTED_WATERMARK`)
    -> the same rows, each late listing whose raw record is not the event's
    first (``first_raw_df``: one raw row per ``event_id``, its Kafka
    position) and whose batch's watermark had passed the event's window end
    plus the dedupe retention (``retention_ms``) made a ``late_repeat``: a
    producer retry that came after the retention, listed late again though
    its first copy was counted or listed before. (Within the retention the
    stream still knew the id: that listing is the event's one.) Such a row
    is kept to be seen, and never counted as late (the gate and verify count
    ``late`` rows only). The two helper columns are dropped."""
    first = first_raw_df.select(
        "event_id", F.concat_ws("/", "kafka_topic", "kafka_partition", "kafka_offset").alias("__first_source")
    )
    window_end_ms = (F.floor(F.unix_millis("event_time") / 60_000) + 1) * 60_000
    repeat = (
        (F.col("source") == F.lit(T.SOURCE_LATE))
        & F.col(RAW_SOURCE).isNotNull()
        & F.col("__first_source").isNotNull()
        & (F.col("__first_source") != F.col(RAW_SOURCE))
        & F.coalesce(F.col(LISTED_WATERMARK) >= window_end_ms + F.lit(retention_ms), F.lit(False))
    )
    return (
        quarantine_df.join(first, "event_id", "left")
        .withColumns({
            "source": F.when(repeat, F.lit(T.SOURCE_LATE_REPEAT)).otherwise(F.col("source")),
            "reason": F.when(repeat, F.lit(T.SOURCE_LATE_REPEAT)).otherwise(F.col("reason")),
        })
        .select(*T.QUARANTINE_SCHEMA.fieldNames())
    )


def _ranked_raw(new_df: DataFrame, loaded_df: DataFrame) -> DataFrame:
    """Raw rows with ``__n``: 1 for the row of each event that counts as its
    first, the one an earlier run loaded before this run's (then the lowest
    region and Kafka position), and ``__first_region``, that row's region."""
    columns = T.RAW_SCHEMA.fieldNames()
    ranked = loaded_df.select(*columns).withColumn("__new", F.lit(1)).unionByName(
        new_df.select(*columns).withColumn("__new", F.lit(2))
    )
    w = Window.partitionBy("event_id").orderBy("__new", "region", "kafka_topic", "kafka_partition", "kafka_offset")
    return (
        ranked.withColumn("__n", F.row_number().over(w))
        .withColumn("__first_region", F.first("region").over(w))
        .drop("__new")
    )


def cross_region_copies(new_df: DataFrame, loaded_df: DataFrame, loaded_at: datetime) -> DataFrame:
    """Raw rows of this run (every region's, before the dedupe) and the rows
    earlier runs loaded of the same events -> a quarantine row
    (``cross_region``) for each copy of an event in a region other than the
    one whose row the raw table keeps: that region's stream counted it too,
    so the spend is charged twice (docs/design.md says what is done about it)."""
    regions = (
        new_df.select("event_id", "region").unionByName(loaded_df.select("event_id", "region"))
        .groupBy("event_id").agg(F.countDistinct("region").alias("__regions"))
        .where(F.col("__regions") > 1)
        .select("event_id")
    )
    copies = _ranked_raw(
        new_df.join(regions, "event_id", "left_semi"), loaded_df.join(regions, "event_id", "left_semi")
    ).where(F.col("region") != F.col("__first_region"))
    copies = _first_per_key(copies.drop("__n", "__first_region"), ["event_id", "region"])
    return copies.select(
        F.lit(T.SOURCE_CROSS_REGION).alias("source"),
        F.concat_ws("@", "event_id", "region").alias("event_key"),
        F.lit("cross_region_duplicate").alias("reason"),
        F.lit(None).cast("binary").alias("raw_value"),
        "event_id",
        "ad_id",
        "event_type",
        "event_time",
        "event_hour",
        "region",
        "kafka_topic",
        "kafka_partition",
        "kafka_offset",
        F.lit(loaded_at).cast("timestamp").alias("loaded_at"),
        F.lit(None).cast("long").alias("load_run"),
    )
