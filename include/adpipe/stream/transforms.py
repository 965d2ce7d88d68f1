"""Pure DataFrame -> DataFrame steps of the aggregation stream job
(:func:`minute_state_rows`), and Spark's own dedupe and minute windows
(:func:`count_minute_windows`), which the bench's Spark rows run as the
reference the job is measured against (``bench/spark_rows.py``, the
benchmark harness outside the package).

Each but :func:`minute_state_rows` (the job's stateful operator, streaming
only) works the same on a streaming and on a batch DataFrame, so the unit
tests run them on small local batch frames with explicit UTC times."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from adpipe.stream.minute_state import (
    ID_BUCKETS,
    INLINE_RECORD_BYTES,
    KEY_COLUMNS,
    KIND_AGGREGATE,
    KIND_LATE,
    KIND_MALFORMED,
    KIND_REPEAT,
    MALFORMED_KEY,
    MINUTE_MS,
    OUTPUT_SCHEMA,
    PACKED_SCHEMA,
    MinuteState,
    pack_by_key,
)

# The kinds of the query's output rows, all importable from here.
__all__ = [
    "KIND_AGGREGATE",
    "KIND_LATE",
    "KIND_MALFORMED",
    "KIND_REPEAT",
    "count_minute_windows",
    "event_time_watermark",
    "minute_state_rows",
    "window_totals",
    "minute_windows",
]


def event_time_watermark(valid_df: DataFrame, lateness_ms: int) -> DataFrame:
    return valid_df.withWatermark("event_time", f"{lateness_ms} milliseconds")


def count_minute_windows(valid_df: DataFrame, lateness_ms: int) -> DataFrame:
    """Distinct events per (ad_id, one-minute event-time window), by type."""
    return minute_windows(event_time_watermark(valid_df, lateness_ms))


def minute_windows(watermarked_df: DataFrame) -> DataFrame:
    """:func:`count_minute_windows` of a frame that has its watermark.

    Dedupe by ``event_id`` keeps state for an id until the watermark passes
    its event time; a retry arriving later is late anyway. In a streaming
    query the window is emitted once, when the watermark passes its end."""
    # Batch frames (tests, backfills) have no watermark: a plain dedupe.
    deduped_df = (
        watermarked_df.dropDuplicatesWithinWatermark(["event_id"])
        if watermarked_df.isStreaming
        else watermarked_df.dropDuplicates(["event_id"])
    )
    return (
        deduped_df.groupBy(F.window("event_time", "1 minute").alias("window"), "ad_id")
        .agg(
            F.sum(F.when(F.col("event_type") == "impression", 1).otherwise(0)).cast("long").alias("impressions"),
            F.sum(F.when(F.col("event_type") == "click", 1).otherwise(0)).cast("long").alias("clicks"),
        )
        .select(
            "ad_id",
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "impressions",
            "clicks",
        )
    )


def window_totals(parts: list[tuple[str, int, int, int]]) -> list[tuple[str, int, int, int]]:
    """The windows of :func:`minute_state_rows`' aggregate rows, given as
    (ad_id, window_start_ms, impressions, clicks) parts: the parts of one
    window added up, in (window_start_ms, ad_id) order."""
    totals: dict[tuple[int, str], list[int]] = {}
    for ad_id, start_ms, impressions, clicks in parts:
        total = totals.setdefault((start_ms, ad_id), [0, 0])
        total[0] += impressions
        total[1] += clicks
    return [(ad_id, start_ms, imp, clk) for (start_ms, ad_id), (imp, clk) in sorted(totals.items())]


def minute_state_rows(parsed_df: DataFrame, lateness_ms: int, retention_ms: int) -> DataFrame:
    """The stream job's one query over parsed rows (adpipe.raw_events), one
    stateful operator (adpipe.stream.minute_state): per micro-batch the
    closed windows (``kind`` aggregate; a window comes in up to
    ``ID_BUCKETS`` parts to add up, see :func:`window_totals`) and the
    position of every late, late-repeated and malformed row. Streaming only.

    Malformed rows go through the watermark at the epoch, which never moves
    it (Spark takes the largest event time). The event time is dropped from
    the operator's input so that Spark hands it the late rows too (it would
    drop them silently), while the watermark above still drives its timers.
    A small malformed row carries its key and value (``inline``): the driver
    copies it to the DLQ without reading it again from Kafka."""
    valid = F.col("reject_reason").isNull()
    record_bytes = F.coalesce(F.octet_length("key"), F.lit(0)) + F.coalesce(F.octet_length("value"), F.lit(0))
    inline = ~valid & (record_bytes <= INLINE_RECORD_BYTES)
    return (
        parsed_df.withColumn(
            "__watermark_time", F.when(valid, F.col("event_time")).otherwise(F.timestamp_millis(F.lit(0)))
        )
        .withWatermark("__watermark_time", f"{lateness_ms} milliseconds")
        .select(
            F.when(valid, F.floor(F.unix_millis("event_time") / MINUTE_MS))
            .otherwise(F.lit(MALFORMED_KEY))
            .alias("event_minute"),
            F.when(valid, F.pmod(F.xxhash64("event_id"), F.lit(ID_BUCKETS)))
            .otherwise(F.col("partition") % ID_BUCKETS)
            .cast("int")
            .alias("id_bucket"),
            F.col("partition").cast("int").alias("partition"),
            F.col("offset").cast("long").alias("offset"),
            "reject_reason",
            F.when(valid, F.col("event_id")).alias("event_id"),
            F.when(valid, F.col("ad_id")).alias("ad_id"),
            F.when(valid, F.col("event_type")).alias("event_type"),
            F.when(valid, F.unix_micros("event_time")).alias("event_us"),
            inline.alias("inline"),
            F.when(inline, F.col("key")).alias("key"),
            F.when(inline, F.col("value")).alias("value"),
        )
        .mapInArrow(pack_by_key, PACKED_SCHEMA)
        .groupBy(*KEY_COLUMNS)
        .transformWithStateInPandas(MinuteState(retention_ms), OUTPUT_SCHEMA, "Append", "EventTime")
    )
