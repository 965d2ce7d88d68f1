"""Pure DataFrame -> DataFrame steps of the aggregation stream job
(:func:`stream_rows`, its two stateful operators in the JVM), and Spark's
own dedupe and minute windows (:func:`count_minute_windows`), which the
bench's Spark rows run as the reference the job is measured against
(``bench/spark_rows.py``, the benchmark harness outside the package).

Each but :func:`stream_rows` (streaming only) works the same on a streaming
and on a batch DataFrame, so the unit tests run them on small local batch
frames with explicit UTC times."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

# What the stream job's query emits (adpipe.spark.StreamOperators, the same names).
KIND_AGGREGATE = "aggregate"
KIND_LATE = "late"
KIND_MALFORMED = "malformed"
KIND_CONFLICT = "conflict"
KIND_PROGRESS = "progress"
KIND_COUNTERS = "counters"
MINUTE_MS = 60_000
# The local property that gives a batch's job its event-time watermark.
WATERMARK_PROPERTY = "adpipe.watermark_ms"
# A malformed record whose key and value together are at most this many bytes
# comes through the query with them (within INLINE_BUDGET_BYTES a task); the
# driver reads the others again from Kafka by position.
INLINE_RECORD_BYTES = 4096
INLINE_BUDGET_BYTES = 4 << 20

__all__ = [
    "KIND_AGGREGATE",
    "KIND_CONFLICT",
    "KIND_COUNTERS",
    "KIND_LATE",
    "KIND_MALFORMED",
    "KIND_PROGRESS",
    "count_minute_windows",
    "event_time_watermark",
    "minute_windows",
    "stream_rows",
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


def stream_rows(
    parsed_df: DataFrame,
    lateness_ms: int,
    retention_ms: int,
    initial: tuple[DataFrame, DataFrame] | None = None,
) -> DataFrame:
    """The stream job's query over parsed rows (adpipe.raw_events): its two
    stateful operators, ``adpipe.spark.StreamOperators`` in adpipe's jar
    (why the JVM: the dedupe of event ids across minutes needs a lookup per
    event, which a Python operator pays for in calls to its state). Per
    micro-batch: the windows emitted or revised (``kind`` aggregate, with its
    ``revision``), the late, malformed and conflicting records by position,
    each partition's highest event time and records read (``progress``) and
    the repeats skipped (``counters``). Its jobs need the local property
    :data:`WATERMARK_PROPERTY` (the driver's, adpipe.stream.watermark).
    ``initial``: an upgraded checkpoint's initial states (ids, windows;
    adpipe.stream.upgrade), for its first start. Streaming only."""
    spark = parsed_df.sparkSession
    operators = spark._jvm.adpipe.spark.StreamOperators  # noqa: SLF001 - py4j gateway
    if initial is None:
        return DataFrame(operators.apply(parsed_df._jdf, lateness_ms, retention_ms), spark)  # noqa: SLF001
    ids, windows = initial
    query = operators.apply(parsed_df._jdf, lateness_ms, retention_ms, ids._jdf, windows._jdf)  # noqa: SLF001
    return DataFrame(query, spark)
