"""The two Spark rows of ``make bench``, run by the driver as ``python -m
bench.spark_rows batch|alo`` (a process of their own, so the driver
measures the whole process tree, JVM included; :mod:`bench.engines` puts
the project root on its PYTHONPATH):

* ``batch``: Spark's batch ceiling. adpipe's own transforms
  (``parse_raw_events``, ``valid_events``, ``minute_windows``) as a batch
  query over the whole topic (``spark.read.format("kafka")``); the windows
  are collected and written to ``aggregates.jsonl`` in ``--work``.
* ``alo``: Spark's at-least-once Kafka sink. The same transforms as a
  streaming query under the job's watermark, written with Spark's own
  ``format("kafka")`` sink, ``trigger(availableNow=True)`` (or, with
  ``--continuous``, the job's processing-time trigger until SIGTERM); the
  malformed rows go to a DLQ topic in the same query.

Both end with one ``BENCH-REPORT {json}`` line, as the peer programs do."""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from pathlib import Path

from adpipe.raw_events import parse_raw_events, valid_events
from adpipe.settings import Settings, load_settings
from adpipe.spark import build_spark
from adpipe.stream.transforms import minute_windows
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.peers.peer_common import READY_LINE, REPORT_PREFIX

ISO_Z = "yyyy-MM-dd'T'HH:mm:ss'Z'"


def _report(started: float, first: float, **extra: object) -> None:
    done = time.time()
    body = {"startup_s": round(first - started, 3), "processing_s": round(done - first, 3), **extra}
    print(REPORT_PREFIX + json.dumps(body), flush=True)


def _kafka(reader, settings: Settings, topic: str):  # noqa: ANN001, ANN202 - DataFrameReader or DataStreamReader
    return (
        reader.format("kafka")
        .options(**settings.kafka.spark_options())
        .option("subscribe", topic)
        .option("kafka.isolation.level", "read_committed")
        .option("startingOffsets", "earliest")
    )


def _record_uuid(job_id: str) -> Column:
    """A deterministic id of (job, ad, window) shaped as a uuid (md5, as
    Spark has no uuid5): the idempotency key a consumer of this sink needs."""
    h = F.md5(F.concat_ws("|", F.lit(job_id), "ad_id", F.date_format("window_start", ISO_Z)))
    return F.concat_ws("-", *(F.substring(h, a, n) for a, n in ((1, 8), (9, 4), (13, 4), (17, 4), (21, 12))))


def aggregate_values(windows_df: DataFrame, job_id: str) -> DataFrame:
    """Windows -> (key, value) rows of the contract's minute aggregate."""
    value = F.to_json(
        F.struct(
            _record_uuid(job_id).alias("record_uuid"),
            "ad_id",
            F.date_format("window_start", ISO_Z).alias("window_start"),
            F.date_format("window_end", ISO_Z).alias("window_end"),
            "impressions",
            "clicks",
        )
    )
    return windows_df.select(F.col("ad_id").cast("binary").alias("key"), value.cast("binary").alias("value"))


def batch(spark: SparkSession, settings: Settings, args: argparse.Namespace, started: float) -> None:
    print(READY_LINE, flush=True)
    first = time.time()
    raw_df = _kafka(spark.read, settings, args.input).option("endingOffsets", "latest").load()
    windows_df = minute_windows(valid_events(parse_raw_events(raw_df, settings.max_future_skew_ms)))
    rows = aggregate_values(windows_df, args.job_id).select(F.col("value").cast("string")).collect()
    _report(started, first, windows=len(rows))
    out = Path(args.work) / "aggregates.jsonl"
    out.write_text("".join(r[0] + "\n" for r in rows))


def alo_query_df(spark: SparkSession, settings: Settings, args: argparse.Namespace) -> DataFrame:
    """Closed windows and malformed rows of one streaming query, as
    (topic, key, value) rows for Spark's Kafka sink."""
    reader = _kafka(spark.readStream, settings, args.input).option("failOnDataLoss", "true")
    if settings.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", settings.max_offsets_per_trigger)
    parsed_df = parse_raw_events(reader.load(), settings.max_future_skew_ms)
    watermarked_df = valid_events(parsed_df).withWatermark("event_time", f"{settings.watermark_delay_s} seconds")
    windows_df = aggregate_values(minute_windows(watermarked_df), args.job_id).withColumn(
        "topic", F.lit(args.aggregates)
    )
    source = F.concat_ws("/", "topic", "partition", "offset")
    dlq_df = parsed_df.where(F.col("reject_reason").isNotNull()).select(
        F.lit(args.dlq).alias("topic"),
        "key",
        F.to_json(F.struct(F.col("reject_reason").alias("reason"), source.alias("source")))
        .cast("binary")
        .alias("value"),
    )
    return windows_df.unionByName(dlq_df)


def alo(spark: SparkSession, settings: Settings, args: argparse.Namespace, started: float) -> None:
    writer = (
        alo_query_df(spark, settings, args)
        .writeStream.format("kafka")
        .options(**settings.kafka.spark_options())
        .option("checkpointLocation", str(Path(args.work) / "checkpoint"))
        .outputMode("append")
    )
    if args.continuous:
        writer = writer.trigger(processingTime=f"{settings.trigger_interval_s} seconds")
    else:
        writer = writer.trigger(availableNow=True)
    first = time.time()
    query = writer.start()
    print(READY_LINE, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while query.isActive and not stop.is_set():
        query.awaitTermination(0.5)
    if query.isActive:
        query.stop()
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()).splitlines()[0])
    progress = query.recentProgress
    _report(started, first, batches=len(progress))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=("batch", "alo"))
    p.add_argument("--input", required=True)
    p.add_argument("--aggregates", default="")
    p.add_argument("--dlq", default="")
    p.add_argument("--job-id", default="bench")
    p.add_argument("--work", required=True)
    p.add_argument("--continuous", action="store_true", help="alo: until SIGTERM, the job's processing-time trigger")
    args = p.parse_args()
    started = time.time()
    settings = load_settings()
    spark = build_spark(settings, f"adpipe-bench-{args.mode}")
    try:
        (batch if args.mode == "batch" else alo)(spark, settings, args, started)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
