"""Pure DataFrame -> DataFrame steps of the aggregation stream job.

Each but :func:`repeated_events` (a stateful operator of its own, streaming
only) works the same on a streaming and on a batch DataFrame, so the unit
tests run them on small local batch frames with explicit UTC times."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from adpipe.stream.late_dedupe import MINUTE_MS, REPEATS_SCHEMA, RepeatedEventIds

KIND_AGGREGATE = "aggregate"
KIND_REPEAT = "repeat"


def late_events(valid_df: DataFrame, late_watermark_ms: int) -> DataFrame:
    """Valid events Spark's stateful operators drop in a batch whose
    late-event watermark is ``late_watermark_ms`` (event time <= watermark;
    see stream.late_watermark_ms for why this is the same rule)."""
    return valid_df.where(F.col("event_time") <= F.timestamp_millis(F.lit(late_watermark_ms)))


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


def repeated_events(watermarked_df: DataFrame, retention_ms: int) -> DataFrame:
    """(``partition``, ``offset``) of every valid row whose ``event_id`` came
    before, late rows included (adpipe.stream.late_dedupe). Streaming only.

    The event time is dropped from the operator's input so that Spark hands
    it the late rows too, while the watermark above still drives its timers."""
    return (
        watermarked_df.select(
            F.floor(F.unix_millis("event_time") / MINUTE_MS).alias("event_minute"), "event_id", "partition", "offset"
        )
        .groupBy("event_minute")
        .transformWithStateInPandas(RepeatedEventIds(retention_ms), REPEATS_SCHEMA, "Append", "EventTime")
    )


def aggregates_and_repeats(valid_df: DataFrame, lateness_ms: int, retention_ms: int) -> DataFrame:
    """The stream job's one query: closed windows (``kind`` aggregate) and
    repeated rows (``kind`` repeat) of each micro-batch, under one watermark."""
    watermarked_df = event_time_watermark(valid_df, lateness_ms)
    return (
        minute_windows(watermarked_df)
        .withColumn("kind", F.lit(KIND_AGGREGATE))
        .unionByName(
            repeated_events(watermarked_df, retention_ms).withColumn("kind", F.lit(KIND_REPEAT)),
            allowMissingColumns=True,
        )
    )
