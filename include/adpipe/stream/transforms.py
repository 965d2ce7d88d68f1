"""Pure DataFrame -> DataFrame steps of the aggregation stream job.

Each works the same on a streaming and on a batch DataFrame, so the unit
tests run them on small local batch frames with explicit UTC times."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def late_events(valid_df: DataFrame, late_watermark_ms: int) -> DataFrame:
    """Valid events Spark's stateful operators drop in a batch whose
    late-event watermark is ``late_watermark_ms`` (event time <= watermark;
    see stream.late_watermark_ms for why this is the same rule)."""
    return valid_df.where(F.col("event_time") <= F.timestamp_millis(F.lit(late_watermark_ms)))


def count_minute_windows(valid_df: DataFrame, lateness_ms: int) -> DataFrame:
    """Distinct events per (ad_id, one-minute event-time window), by type.

    Dedupe by ``event_id`` keeps state for an id until the watermark passes
    its event time; a retry arriving later is late anyway. In a streaming
    query the window is emitted once, when the watermark passes its end."""
    watermarked_df = valid_df.withWatermark("event_time", f"{lateness_ms} milliseconds")
    # Batch frames (tests, backfills) have no watermark: a plain dedupe.
    deduped_df = (
        watermarked_df.dropDuplicatesWithinWatermark(["event_id"])
        if valid_df.isStreaming
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
