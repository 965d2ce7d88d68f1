"""Spark's own minute windows and dedupe (adpipe.stream.transforms, what the
bench's Spark rows run beside the job's operator) on small local frames."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

from adpipe import schemas as S
from adpipe.stream import transforms as T
from pyspark.sql import DataFrame, SparkSession

from tests.unit.helpers import VALID_EVENTS

# --- count_minute_windows ----------------------------------------------------
#
# The bench's at-least-once row runs it on a streaming frame
# (dropDuplicatesWithinWatermark, state, watermark): those tests stream small parquet files through an available-now
# query into the memory sink. On a batch frame it is a plain dedupe.


def utc(hour: int, minute: int, second: int = 0, ms: int = 0, us: int = 0) -> datetime:
    return datetime(2026, 11, 22, hour, minute, second, ms * 1000 + us, tzinfo=UTC)


def naive(hour: int, minute: int) -> datetime:
    return datetime(2026, 11, 22, hour, minute)


def valid_frame(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    return spark.createDataFrame(rows, VALID_EVENTS)


def rows_of(df: DataFrame) -> list[tuple]:
    return sorted(tuple(r) for r in df.collect())


@dataclass
class StreamRun:
    output: list[tuple]
    watermark_by_batch: dict[int, int]  # batchWatermarkMs of offsets/N


def stream_counts(spark: SparkSession, tmp: Path, files: list[list[tuple]], lateness_ms: int) -> StreamRun:
    """count_minute_windows over ``files`` (one micro-batch each), append mode."""
    for i, rows in enumerate(files):
        valid_frame(spark, rows).coalesce(1).write.parquet(str(tmp / "in" / f"{i:03d}"))
    name = f"counts_{tmp.name}".replace("-", "_")
    # One state partition instead of four: the same semantics, a faster test.
    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    source = spark.readStream.option("maxFilesPerTrigger", 1).schema(VALID_EVENTS).parquet(str(tmp / "in" / "*"))
    query = (
        T.count_minute_windows(source, lateness_ms)
        .writeStream.format("memory")
        .queryName(name)
        .outputMode("append")
        .option("checkpointLocation", str(tmp / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(120)
        assert query.exception() is None
        output = rows_of(spark.table(name))
    finally:
        query.stop()
        spark.catalog.dropTempView(name)
        spark.conf.set("spark.sql.shuffle.partitions", partitions)
    offsets = tmp / "checkpoint" / "offsets"
    watermarks = {
        int(f.name): json.loads(f.read_text().splitlines()[1])["batchWatermarkMs"]
        for f in offsets.iterdir()
        if f.name.isdigit()
    }
    return StreamRun(output, watermarks)


WINDOW_EVENTS = [
    ("e1", "ad-1", "impression", utc(12, 0, 0, 0)),
    ("e2", "ad-1", "click", utc(12, 0, 59, 999)),
    ("e3", "ad-1", "impression", utc(12, 1, 0, 0)),  # on the boundary: the 12:01 window
    ("e4", "ad-1", "impression", utc(12, 0, 30)),  # arrives after a later event
    ("e5", "ad-1", "click", datetime(2026, 11, 22, 13, 2, 10, tzinfo=timezone(timedelta(hours=1)))),  # 12:02:10Z
    ("e6", "ad-2", "impression", utc(12, 0, 45)),
    ("e7", "ad-2", "impression", utc(11, 59, 59, 999)),
    ("e8", "ad-2", "click", utc(12, 1, 30)),
    ("e1", "ad-1", "impression", utc(12, 0, 0, 0)),  # a producer retry of e1
    ("e8", "ad-2", "click", utc(12, 1, 30)),  # and of e8
]
WINDOW_COUNTS = [
    ("ad-1", naive(12, 0), naive(12, 1), 2, 1),
    ("ad-1", naive(12, 1), naive(12, 2), 1, 0),
    ("ad-1", naive(12, 2), naive(12, 3), 0, 1),
    ("ad-2", naive(11, 59), naive(12, 0), 1, 0),
    ("ad-2", naive(12, 0), naive(12, 1), 1, 0),
    ("ad-2", naive(12, 1), naive(12, 2), 0, 1),
]


def test_count_minute_windows_on_a_batch_frame(spark: SparkSession) -> None:
    result = T.count_minute_windows(valid_frame(spark, WINDOW_EVENTS), 30_000)
    assert result.isStreaming is False
    assert rows_of(result) == WINDOW_COUNTS


def test_count_minute_windows_on_a_stream(spark: SparkSession, tmp_path: Path) -> None:
    # The sentinel moves the watermark to 12:59:30 so every window above closes.
    events = [*WINDOW_EVENTS, ("sentinel", "ad-9", "click", utc(13, 0))]
    run = stream_counts(spark, tmp_path, [events], 30_000)
    assert run.output == WINDOW_COUNTS
    # The watermark is max event time - lateness, in the offset log of the no-data batch.
    assert run.watermark_by_batch == {0: 0, 1: 1_795_352_370_000}


def test_count_minute_windows_output_schema(spark: SparkSession, tmp_path: Path) -> None:
    source = spark.readStream.schema(VALID_EVENTS).parquet(str(tmp_path))
    result = T.count_minute_windows(source, 30_000)
    assert result.columns == ["ad_id", "window_start", "window_end", "impressions", "clicks"]
    assert [f.dataType for f in result.schema.fields] == [f.dataType for f in S.MINUTE_AGGREGATE.fields]


