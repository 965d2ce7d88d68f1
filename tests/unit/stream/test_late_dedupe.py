"""Which rows repeat an event_id (adpipe.stream.late_dedupe): the pure
decision, then the stateful operator in a real streaming query with the
windows beside it, batch by batch, with its event-time retention."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path
from unittest.mock import ANY

import numpy as np
from adpipe.stream import transforms as T
from adpipe.stream.late_dedupe import DIGEST_DTYPE, digests, find_repeats
from pyspark.sql import SparkSession
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

# --- find_repeats -------------------------------------------------------------


def test_no_ids_no_repeats() -> None:
    seen = digests(["a"])
    repeats, after = find_repeats(seen, [])
    assert repeats.tolist() == [] and after.tolist() == seen.tolist()


def test_a_repeat_is_a_later_copy_in_the_batch_or_an_id_seen_before() -> None:
    seen = np.sort(digests(["old-1", "old-2"]))
    repeats, after = find_repeats(seen, ["new", "old-2", "new", "other", "new"])
    assert repeats.tolist() == [False, True, True, False, True]
    assert sorted(after.tolist()) == sorted(digests(["old-1", "old-2", "new", "other"]).tolist())
    assert after.tolist() == sorted(after.tolist())  # kept sorted for the next batch


def test_digests_round_trip_through_bytes_even_when_they_end_in_zero_bytes() -> None:
    ids = [f"id-{i}" for i in range(5000)]
    zero_ended = [e for e in ids if hashlib.blake2b(e.encode(), digest_size=16).digest().endswith(b"\0")]
    assert zero_ended  # about 1 in 256
    _, after = find_repeats(np.zeros(0, DIGEST_DTYPE), ids)
    reread = np.frombuffer(after.tobytes(), dtype=DIGEST_DTYPE)
    assert len(after.tobytes()) == 16 * len(ids)
    repeats, _ = find_repeats(reread, [*zero_ended, "never-seen"])
    assert repeats.tolist() == [True] * len(zero_ended) + [False]


def test_ids_that_are_not_plain_text_are_told_apart() -> None:
    repeats, _ = find_repeats(np.zeros(0, DIGEST_DTYPE), ["a\0b", "a", "a\0b", "é", "e\u0301", "\ud800"])
    assert repeats.tolist() == [False, False, True, False, False, False]


# --- the operator in a streaming query ----------------------------------------

ROWS = StructType(
    [
        StructField("event_id", StringType()),
        StructField("ad_id", StringType()),
        StructField("event_type", StringType()),
        StructField("event_time", TimestampType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("reject_reason", StringType()),
    ]
)


def at(minute: int, second: int = 0) -> datetime:
    return datetime(2026, 11, 22, 12, minute, second, tzinfo=UTC)


def run_batches(
    spark: SparkSession, tmp: Path, files: list[list[tuple]], lateness_ms: int, retention_ms: int
) -> dict[int, dict[str, list]]:
    """aggregates_and_repeats over ``files`` (one micro-batch each; a row
    without a reject reason is valid): per batch the (ad_id, window minute,
    impressions, clicks) emitted and the sorted (partition, offset) of the
    repeats, of the malformed rows and of the rows at or before the
    operator's watermark (with that watermark)."""
    for i, rows in enumerate(files):
        with_reasons = [r if len(r) == 7 else (*r, None) for r in rows]
        spark.createDataFrame(with_reasons, ROWS).coalesce(1).write.parquet(str(tmp / "in" / f"{i:03d}"))
    source = spark.readStream.option("maxFilesPerTrigger", 1).schema(ROWS).parquet(str(tmp / "in" / "*"))
    out: dict[int, dict[str, list]] = {}

    def collect(batch_df, batch_id: int) -> None:  # noqa: ANN001
        rows = batch_df.collect()
        out[batch_id] = {
            "windows": sorted(
                (r["ad_id"], r["window_start"].minute, r["impressions"], r["clicks"])
                for r in rows
                if r["kind"] == T.KIND_AGGREGATE
            ),
            "repeats": sorted((r["partition"], r["offset"]) for r in rows if r["kind"] == T.KIND_REPEAT),
            "malformed": sorted(
                (r["partition"], r["offset"], r["reject_reason"]) for r in rows if r["kind"] == T.KIND_MALFORMED
            ),
            "maybe_late": sorted(
                (r["partition"], r["offset"], r["event_id"], r["watermark_ms"])
                for r in rows
                if r["kind"] == T.KIND_MAYBE_LATE
            ),
        }

    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    query = (
        T.aggregates_and_repeats(source, lateness_ms, retention_ms)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(180)
        assert query.exception() is None
    finally:
        query.stop()
        spark.conf.set("spark.sql.shuffle.partitions", partitions)
    return out


def test_late_copies_of_counted_or_listed_events_are_repeats_until_the_retention(
    spark: SparkSession, tmp_path: Path
) -> None:
    files = [
        # batch 0: on time; "dup" twice (a producer retry in the same batch)
        [
            ("a", "ad-1", "impression", at(0, 10), 0, 0),
            ("dup", "ad-1", "click", at(0, 20), 1, 0),
            ("dup", "ad-1", "click", at(0, 20), 1, 1),
            ("b", "ad-1", "impression", at(5), 0, 1),  # watermark -> 12:04:30
        ],
        # batch 1: a retry of the counted "a"; "x" and its retry in the same
        # batch, where the retry comes first in (partition, offset) order
        [
            ("a", "ad-1", "impression", at(0, 10), 0, 2),
            ("x", "ad-1", "impression", at(1), 1, 2),
            ("x", "ad-1", "impression", at(1), 0, 3),
        ],
        # batch 2: "x" re-sent again, now late; "y" late and new
        [("x", "ad-1", "impression", at(1), 1, 3), ("y", "ad-1", "click", at(2), 1, 4)],
        # batch 3: the watermark moves to 12:13:10, past every minute up to
        # 12:05 plus 5 minutes' retention; their timers fire in batch 4. Two
        # malformed rows: one with no event time, one timed 12:59 (which
        # must not move the watermark: "far" would be forgotten in batch 5)
        [
            ("far", "ad-2", "impression", at(13, 40), 1, 5),
            ("m1", "ad-9", "impression", at(59), 0, 4, "future_event_time"),
            (None, None, None, None, 1, 6, "not_json"),
        ],
        [("filler", "ad-3", "impression", at(13, 30), 0, 5)],
        # batch 5: "a", "y" and "b" are forgotten; "far" (12:13) is not
        [
            ("a", "ad-1", "impression", at(0, 10), 0, 6),
            ("y", "ad-1", "click", at(2), 0, 7),
            ("b", "ad-1", "impression", at(5), 0, 8),
            ("far", "ad-2", "impression", at(13, 40), 1, 9),
        ],
    ]
    out = run_batches(spark, tmp_path, files, lateness_ms=30_000, retention_ms=300_000)
    assert {b: out[b]["repeats"] for b in out} == {
        0: [(1, 1)],
        1: [(0, 2), (1, 2)],  # a: counted before; x: (0, 3) came first
        2: [(1, 3)],
        3: [],
        4: [],
        5: [(1, 9)],
    }
    assert {b: out[b]["malformed"] for b in out if out[b]["malformed"]} == {
        3: [(0, 4, "future_event_time"), (1, 6, "not_json")]
    }
    # Rows at or before the operator's watermark (the batch's own, 12:04:30
    # from batch 1 on): the driver keeps those at or before the previous
    # batch's (none in batch 1, whose late-event watermark is 0).
    wm = int(at(4, 30).timestamp() * 1000)
    maybe_late = {b: out[b]["maybe_late"] for b in out if out[b]["maybe_late"]}
    assert maybe_late == {
        1: [(0, 2, "a", wm), (0, 3, "x", wm), (1, 2, "x", wm)],
        2: [(1, 3, "x", wm), (1, 4, "y", wm)],
        5: [(0, 6, "a", ANY), (0, 7, "y", ANY), (0, 8, "b", ANY)],
    }
    # The windows are Spark's own on-time dedupe, untouched: "a" and "dup"
    # once, "x" on time in batch 1 (batch 0's watermark is 0), late rows not.
    emitted = sorted(w for batch in out.values() for w in batch["windows"])
    assert emitted == [("ad-1", 0, 1, 1), ("ad-1", 1, 1, 0), ("ad-1", 5, 1, 0)]


def test_within_the_retention_a_late_retry_is_a_repeat(spark: SparkSession, tmp_path: Path) -> None:
    files = [
        [("a", "ad-1", "impression", at(0, 10), 0, 0), ("b", "ad-1", "impression", at(30), 0, 1)],
        [("c", "ad-1", "impression", at(59), 0, 2)],  # watermark -> 12:58:30
        [("a", "ad-1", "impression", at(0, 10), 0, 3)],  # 58 min late, retention 1 h: known
    ]
    out = run_batches(spark, tmp_path, files, lateness_ms=30_000, retention_ms=3_600_000)
    assert [out[b]["repeats"] for b in sorted(out) if out[b]["repeats"]] == [[(0, 3)]]
