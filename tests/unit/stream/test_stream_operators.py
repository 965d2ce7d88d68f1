"""The stream job's two stateful operators (adpipe.spark.StreamOperators,
through adpipe.stream.transforms.stream_rows) in a real streaming query,
batch by batch, with the driver's watermark (adpipe.stream.watermark) as the
stream driver computes it: windows emitted when the watermark passes their
end and revised by late events within the allowed lateness, late events
listed once, repeats and conflicting copies of an event id, malformed rows
named, the event-time retention.

Expectations are worked out by hand from the rules, batch by batch."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from adpipe.stream import transforms as T
from adpipe.stream import watermark as W
from adpipe.stream.offset_log import LocalCheckpoint
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

ROWS = StructType(
    [
        StructField("event_id", StringType()),
        StructField("ad_id", StringType()),
        StructField("event_type", StringType()),
        StructField("event_time", TimestampType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("reject_reason", StringType()),
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("timestamp", TimestampType()),
    ]
)
# Every record's own timestamp unless a row gives one: (partition, offset) then decides the read order.
RECORD_TIME = datetime(2026, 11, 22, 14, 0, tzinfo=UTC)


def at(minute: int, second: int = 0) -> datetime:
    return datetime(2026, 11, 22, 12, minute, second, tzinfo=UTC)


def ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


@dataclass
class Run:
    """Per batch: what the operators emitted, and the watermark each ran with."""

    batches: dict[int, dict[str, list]] = field(default_factory=dict)

    def by_batch(self, what: str) -> dict[int, list]:
        return {b: self.batches[b][what] for b in sorted(self.batches) if self.batches[b][what]}


def _file_offset(checkpoint: LocalCheckpoint, batch_id: int) -> int | None:
    raw = checkpoint.read(f"offsets/{batch_id}")
    if raw is None:
        return None
    return json.loads(raw.decode().splitlines()[-1])["logOffset"]


def run_batches(
    spark: SparkSession,
    tmp: Path,
    files: list[list[tuple]],
    lateness_ms: int,
    retention_ms: int = 3_600_000,
    delay_ms: int = 30_000,
    aligned: bool = True,
) -> Run:
    """The operators over ``files`` (one micro-batch each; a row without a
    reject reason is valid; the partitions a file holds are the batch's
    waiting partitions, as the Kafka source's planned offsets say)."""
    for i, rows in enumerate(files):
        padded = [(*r, *[None] * (len(ROWS.fields) - len(r))) for r in rows]
        padded = [(*r[:-1], r[-1] or RECORD_TIME) for r in padded]
        spark.createDataFrame(padded, ROWS).coalesce(1).write.parquet(str(tmp / "in" / f"{i:03d}"))
    source = (
        spark.readStream.option("maxFilesPerTrigger", 1).schema(ROWS).parquet(str(tmp / "in" / "*"))
        .withColumn("topic", F.lit("ad-events"))
        .withColumn("campaign_id", F.lit(None).cast("string"))
    )
    checkpoint = LocalCheckpoint(tmp / "checkpoint")
    run = Run()
    progress: dict[str, W.Progress | None] = {"last": None}

    def collect(batch_df, batch_id: int) -> None:  # noqa: ANN001
        offset = _file_offset(checkpoint, batch_id)
        data = offset is not None and offset != (_file_offset(checkpoint, batch_id - 1) if batch_id else -1)
        waiting = sorted({r[4] for r in files[offset]}) if data else []
        previous = progress["last"]
        watermark = W.batch_watermark(previous, waiting, delay_ms, aligned)
        spark.sparkContext.setLocalProperty(T.WATERMARK_PROPERTY, str(watermark))
        try:
            rows = batch_df.collect()
        finally:
            spark.sparkContext.setLocalProperty(T.WATERMARK_PROPERTY, None)
        read: dict[int, int | None] = {}
        for r in rows:
            if r["kind"] == T.KIND_PROGRESS:
                known = read.get(r["partition"])
                read[r["partition"]] = r["progress_ms"] if known is None else max(known, r["progress_ms"] or known)
        progress["last"] = W.after_batch(previous, batch_id, watermark, waiting, read)
        base = ms(at(0))

        def named(kind: str) -> list:
            return sorted((r["partition"], r["offset"], r["event_id"]) for r in rows if r["kind"] == kind)

        run.batches[batch_id] = {
            "windows": sorted(
                (r["ad_id"], (r["window_start_ms"] - base) // 60_000, r["impressions"], r["clicks"], r["revision"])
                for r in rows
                if r["kind"] == T.KIND_AGGREGATE
            ),
            "late": named(T.KIND_LATE),
            "conflicts": sorted(
                (r["partition"], r["offset"], r["event_id"], (r["first_event_us"] // 1000 - base) // 1000)
                for r in rows
                if r["kind"] == T.KIND_CONFLICT
            ),
            "repeats": [(r["repeats"], r["late_repeats"]) for r in rows if r["kind"] == T.KIND_COUNTERS],
            "malformed": sorted(
                (r["partition"], r["offset"], r["reject_reason"]) for r in rows if r["kind"] == T.KIND_MALFORMED
            ),
            "carried": sorted((r["partition"], r["offset"], r["key"], r["value"]) for r in rows if r["inline"]),
            "payloads_of_others": [r for r in rows if not r["inline"] and (r["key"], r["value"]) != (None, None)],
            "watermark": [watermark] if rows else [],
            "ran_with": sorted({r["watermark_ms"] for r in rows}),
        }

    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    query = (
        T.stream_rows(source, lateness_ms, retention_ms)
        .writeStream.foreachBatch(collect)
        .option("checkpointLocation", str(tmp / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(180)
        assert query.exception() is None
        assert all(op["numRowsDroppedByWatermark"] == 0 for p in query.recentProgress for op in p["stateOperators"])
    finally:
        query.stop()
        spark.conf.set("spark.sql.shuffle.partitions", partitions)
    for batch in run.batches.values():
        assert batch["ran_with"] in ([], batch["watermark"])  # every row decided by the driver's watermark
    return run


def test_windows_late_rows_repeats_and_the_retention_batch_by_batch(spark: SparkSession, tmp_path: Path) -> None:
    files = [
        # batch 0 (watermark 0): on time; "dup" twice (a retry in the same batch)
        [
            ("a", "ad-1", "impression", at(0, 10), 0, 0),
            ("dup", "ad-1", "click", at(0, 20), 1, 0),
            ("dup", "ad-1", "click", at(0, 20), 1, 1),
            ("b", "ad-1", "impression", at(5), 0, 1),
        ],
        # batch 1 (partitions 0 and 1 waiting: 12:00:20 - 30 s = 11:59:50): nothing closes.
        [("a", "ad-1", "impression", at(0, 10), 0, 2), ("c", "ad-2", "click", at(1), 1, 2)],
        # batch 2, only partition 0 waiting: 12:05 - 30 s = 12:04:30 closes minutes 0 to 3 (12:00, 12:01 emitted).
        # "x" is new but its window 12:01 closed in this very batch: within the lateness of 0, late.
        [("x", "ad-1", "impression", at(1), 0, 3), ("x", "ad-1", "impression", at(1), 0, 4)],
        # batch 3: "far" on time; three malformed rows, one too large to carry its value.
        [
            ("far", "ad-2", "impression", at(13, 40), 1, 5, None, b"ad-2", b"far"),
            ("m1", "ad-9", "impression", at(59), 0, 5, "future_event_time", None, b"m1\0"),
            (None, None, None, None, 1, 6, "not_json", b"k\0", b"{"),
            (None, None, None, None, 1, 7, "not_json", b"k", b"x" * T.INLINE_RECORD_BYTES),
        ],
        # batch 4 (partition 1 waiting; its last read was at 12:13:40: 12:13:10): 12:05 emitted,
        # minutes 0 to 5 past the 5 minutes' retention, forgotten.
        [("filler", "ad-3", "impression", at(13, 30), 1, 8)],
        # batch 5: "a" and "b" are forgotten: late and listed again; "far" (12:13, open) is a repeat.
        [
            ("a", "ad-1", "impression", at(0, 10), 0, 6),
            ("b", "ad-1", "impression", at(5), 0, 7),
            ("far", "ad-2", "impression", at(13, 40), 1, 9),
        ],
        # batch 6: 12:20 read; a no-data batch 7 (nothing waiting: 12:19:30) emits 12:13.
        [("end", "ad-4", "impression", at(20), 0, 9)],
    ]
    run = run_batches(spark, tmp_path, files, lateness_ms=0, retention_ms=300_000)
    assert run.by_batch("windows") == {
        2: [("ad-1", 0, 1, 1, 0), ("ad-2", 1, 0, 1, 0)],
        4: [("ad-1", 5, 1, 0, 0)],
        7: [("ad-2", 13, 1, 0, 0), ("ad-3", 13, 1, 0, 0)],
    }
    assert run.by_batch("late") == {2: [(0, 3, "x")], 5: [(0, 6, "a"), (0, 7, "b")]}
    assert run.by_batch("repeats") == {0: [(1, 0)], 1: [(1, 0)], 2: [(1, 1)], 5: [(1, 0)]}
    assert run.by_batch("malformed") == {3: [(0, 5, "future_event_time"), (1, 6, "not_json"), (1, 7, "not_json")]}
    assert run.by_batch("carried") == {3: [(0, 5, None, b"m1\0"), (1, 6, b"k\0", b"{")]}
    assert run.by_batch("payloads_of_others") == {}
    first, second = ms(at(4, 30)), ms(at(13, 10))
    assert run.by_batch("watermark") == {
        0: [0], 1: [ms(at(0)) - 10_000], 2: [first], 3: [first], 4: [second], 5: [second], 6: [second],
        7: [ms(at(19, 30))],
    }


def test_a_late_event_within_the_lateness_revises_its_window_once_per_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    files = [
        [("a", "ad-1", "impression", at(0, 10), 0, 0), ("b", "ad-1", "click", at(0, 40), 0, 1),
         ("c", "ad-1", "impression", at(3), 0, 2)],
        [("filler", "ad-3", "impression", at(3, 10), 0, 3)],  # 12:02:30: 12:00 closes, emitted
        # Two late events for 12:00 and a retry of one of them: one revision, both counted.
        [("d", "ad-1", "impression", at(0, 5), 0, 4), ("e", "ad-1", "click", at(0, 6), 0, 5),
         ("d", "ad-1", "impression", at(0, 5), 0, 6)],
        # A retry of "e" alone (counted already): no revision. A late first event of ad-2 in 12:00: revision 0.
        [("e", "ad-1", "click", at(0, 6), 0, 7), ("f", "ad-2", "impression", at(0, 7), 0, 8)],
        [("h", "ad-1", "impression", at(8), 0, 9)],
        # 12:07:30 passes 12:00 + 5 minutes' lateness: "g" is late, listed; 12:03 closes.
        [("g", "ad-1", "impression", at(0, 8), 0, 10)],
    ]
    run = run_batches(spark, tmp_path, files, lateness_ms=300_000)
    assert run.by_batch("windows") == {
        1: [("ad-1", 0, 1, 1, 0)],
        2: [("ad-1", 0, 2, 2, 1)],
        3: [("ad-2", 0, 1, 0, 0)],
        5: [("ad-1", 3, 1, 0, 0), ("ad-3", 3, 1, 0, 0)],
    }
    assert run.by_batch("late") == {5: [(0, 10, "g")]}
    assert run.by_batch("repeats") == {2: [(1, 0)], 3: [(1, 0)]}


def test_the_first_copy_of_an_event_id_wins_whatever_its_event_time(spark: SparkSession, tmp_path: Path) -> None:
    files = [
        # "r" re-stamped two minutes later in the same batch and a later one (another partition):
        # the first copy read (record time, then partition, offset) counts.
        [("r", "ad-1", "impression", at(0, 10), 1, 0, None, None, None, datetime(2026, 11, 22, 13, tzinfo=UTC)),
         ("r", "ad-1", "impression", at(2, 10), 0, 0, None, None, None, datetime(2026, 11, 22, 13, 1, tzinfo=UTC)),
         ("s", "ad-1", "click", at(0, 20), 0, 1), ("t", "ad-2", "impression", at(0, 30), 0, 2)],
        [("r", "ad-1", "impression", at(1, 10), 1, 1), ("r", "ad-1", "impression", at(0, 10), 1, 2)],
        [("end", "ad-9", "impression", at(9), 0, 3), ("end2", "ad-9", "impression", at(9), 1, 3)],
    ]
    run = run_batches(spark, tmp_path, files, lateness_ms=0)
    # 3 events + "end"s: counted once each; "r" in 12:00, its copies in DLQ (another time) or repeats (same).
    assert run.by_batch("windows") == {3: [("ad-1", 0, 1, 1, 0), ("ad-2", 0, 1, 0, 0)]}
    assert run.by_batch("conflicts") == {0: [(0, 0, "r", 10)], 1: [(1, 1, "r", 10)]}
    assert run.by_batch("repeats") == {1: [(1, 0)]}


def test_the_watermark_waits_for_the_slowest_partition_with_records_waiting(
    spark: SparkSession, tmp_path: Path
) -> None:
    spike = [(f"s{i}", "ad-s", "impression", at(0, i % 60), 0, i) for i in range(40)]
    files = [
        # partition 1 races ahead (12:04); partition 0 is still in 12:00.
        [*spike[:20], ("t1", "ad-t", "impression", at(4), 1, 0)],
        [*spike[20:30], ("t2", "ad-t", "impression", at(9), 1, 1)],
        # Spike events still in 12:00: aligned, none is late.
        [*spike[30:]],
        [("end", "ad-s", "impression", at(12), 0, 99)],
    ]
    aligned = run_batches(spark, tmp_path / "on", files, lateness_ms=0)
    assert aligned.by_batch("late") == {}
    assert ("ad-s", 0, 40, 0, 0) in [w for ws in aligned.by_batch("windows").values() for w in ws]
    unaligned = run_batches(spark, tmp_path / "off", files, lateness_ms=0, aligned=False)
    # Spark's rule: the highest event time of all partitions (12:04, then 12:09) closes 12:00 under the spike.
    assert sum(len(v) for v in unaligned.by_batch("late").values()) == 20


def test_a_window_s_counts_from_every_id_bucket_come_whole(spark: SparkSession, tmp_path: Path) -> None:
    events = [(f"e{i}", "ad-1", "click" if i % 5 == 0 else "impression", at(0, i % 60), i % 3, i) for i in range(200)]
    retries = [(f"e{i}", "ad-1", "click" if i % 5 == 0 else "impression", at(0, i % 60), 3, i) for i in range(50)]
    files = [[*events, *retries], [("end", "ad-2", "impression", at(3), 0, 999)]]
    run = run_batches(spark, tmp_path, files, lateness_ms=0)
    # Batch 1 waits for partition 0 (12:00:59 read so far); the no-data batch 2, for none: 12:02:30.
    assert run.by_batch("windows") == {2: [("ad-1", 0, 160, 40, 0)]}


def test_ids_that_are_not_plain_text_are_told_apart(spark: SparkSession, tmp_path: Path) -> None:
    ids = ["a\0b", "a", "é", "e\u0301", "?", "x" * 200]
    files = [
        [(event_id, "ad-é\0", "impression", at(0, i), 0, i) for i, event_id in enumerate(ids)],
        [("end", "ad-2", "impression", at(3), 0, 99)],
    ]
    run = run_batches(spark, tmp_path, files, lateness_ms=0)
    assert run.by_batch("windows") == {2: [("ad-é\0", 0, len(ids), 0, 0)]}


@pytest.mark.parametrize("text", ["", "event-1", "é\0x", "e" * 300, "\U0001f600"])
def test_the_jvm_digest_is_blake2b_128(spark: SparkSession, text: str) -> None:
    digest = spark.sparkContext._jvm.adpipe.spark.Blake2b128.digestBytes(text)  # noqa: SLF001
    assert bytes(digest) == hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
