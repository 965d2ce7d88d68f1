"""The stream job's stateful operator (adpipe.stream.minute_state): the pure
decisions (repeats, counts), then the operator in a real streaming query,
batch by batch: windows emitted when the watermark reaches their end, late
rows listed once, malformed rows named, the event-time retention.

Expectations are worked out by hand from the rule, batch by batch."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
from adpipe.stream import transforms as T
from adpipe.stream.minute_state import (
    DIGEST_DTYPE,
    INLINE_RECORD_BYTES,
    KEY_COLUMNS,
    MALFORMED_KEY,
    add_counts,
    count_by_ad,
    counts_from_bytes,
    counts_to_bytes,
    digests,
    find_repeats,
    pack_by_key,
    unpack,
    within_budget,
)
from pyspark.sql import SparkSession
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType, TimestampType

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


def test_counts_by_ad_add_up_and_round_trip_hostile_ad_ids() -> None:
    ads = pd.Series(["ad-1", "a\0b", "ad-1", "é", "a\0b", "ad-1"])
    types = pd.Series(["impression", "click", "click", "impression", "click", "impression"])
    first = count_by_ad(ads, types)
    as_dict = {r.ad_id: (r.impressions, r.clicks) for r in first.itertuples()}
    assert as_dict == {"ad-1": (2, 1), "a\0b": (0, 2), "é": (1, 0)}
    reread = counts_from_bytes(counts_to_bytes(first))
    total = add_counts(reread, count_by_ad(pd.Series(["é", "new"]), pd.Series(["click", "click"])))
    as_dict = {r.ad_id: (int(r.impressions), int(r.clicks)) for r in total.itertuples()}
    assert as_dict == {"ad-1": (2, 1), "a\0b": (0, 2), "é": (1, 1), "new": (0, 1)}


def test_packed_rows_unpack_per_key_in_position_order() -> None:
    rows = [
        # (event_minute, id_bucket, partition, offset, event_id, ad_id)
        (5, 1, 1, 7, "b\0x", "ad-é"),
        (5, 0, 0, 3, "a", "ad-1"),
        (4, 1, 0, 9, "c", "ad-1"),
        (5, 1, 0, 8, "d", "ad-2"),
        (5, 1, 1, 2, "e", None),
    ]
    names = [*KEY_COLUMNS, "partition", "offset", "event_id", "ad_id"]
    types = [pa.int64(), pa.int32(), pa.int32(), pa.int64(), pa.string(), pa.string()]
    arrays = [pa.array([r[i] for r in rows], t) for i, t in enumerate(types)]
    schema = pa.schema(list(zip(names, types, strict=True)))
    batches = [pa.RecordBatch.from_arrays(arrays, schema=schema), pa.RecordBatch.from_arrays(
        [a.slice(0, 0) for a in arrays], schema=schema
    )]
    packed = pa.Table.from_batches(list(pack_by_key(iter(batches)))).to_pandas()
    keys = list(zip(packed["event_minute"], packed["id_bucket"], strict=True))
    assert keys == [(4, 1), (5, 0), (5, 1)]  # one packed row per key, none for the empty batch
    by_key = {k: unpack(iter([packed.iloc[[i]]])) for i, k in enumerate(keys)}
    assert by_key[(5, 1)][["partition", "offset", "event_id"]].values.tolist() == [
        [0, 8, "d"],
        [1, 2, "e"],
        [1, 7, "b\0x"],
    ]
    assert [None if pd.isna(v) else v for v in by_key[(5, 1)]["ad_id"]] == ["ad-2", None, "ad-é"]
    assert by_key[(4, 1)]["event_id"].tolist() == ["c"] and list(by_key[(4, 1)].columns) == names[2:]


def _payload_batch(rows: list[tuple]) -> pa.RecordBatch:
    """(event_minute, offset, inline, key, value) rows as pack_by_key's input."""
    names = [*KEY_COLUMNS, "partition", "offset", "inline", "key", "value"]
    columns = [[r[0] for r in rows], [0] * len(rows), [0] * len(rows), *([r[i] for r in rows] for i in range(1, 5))]
    types = [pa.int64(), pa.int32(), pa.int32(), pa.int64(), pa.bool_(), pa.binary(), pa.binary()]
    return pa.RecordBatch.from_arrays([pa.array(c, t) for c, t in zip(columns, types, strict=True)], names=names)


def test_malformed_rows_carry_their_payload_within_the_task_s_budget() -> None:
    # Two batches of one task, budget 10 bytes: 4 + 4 fit, the 3 after them
    # do not (nor anything after that in the batch), and the next batch has
    # 2 bytes left. An inline row with neither key nor value costs nothing.
    first = _payload_batch([
        (MALFORMED_KEY, 0, True, b"k", b"abc"),
        (MALFORMED_KEY, 1, True, None, b"wxyz"),
        (MALFORMED_KEY, 2, True, b"k", b"xy"),
        (MALFORMED_KEY, 3, True, None, None),
    ])
    table, spent = within_budget(pa.Table.from_batches([first]), 0, budget=10)
    assert table.column("inline").to_pylist() == [True, True, False, False]
    assert table.column("key").to_pylist() == [b"k", None, None, None]
    assert table.column("value").to_pylist() == [b"abc", b"wxyz", None, None]
    assert spent == 8
    second = _payload_batch([(MALFORMED_KEY, 4, True, None, b"xyz"), (MALFORMED_KEY, 5, True, b"", b"z")])
    table, spent = within_budget(pa.Table.from_batches([second]), spent, budget=10)
    assert table.column("inline").to_pylist() == [False, False] and spent == 8


def test_only_the_malformed_key_s_packed_rows_hold_payload_columns() -> None:
    batch = _payload_batch([(MALFORMED_KEY, 0, True, b"k", b"{"), (7, 1, False, None, None)])
    packed = pa.Table.from_batches(list(pack_by_key(iter([batch])))).to_pandas()
    by_minute = {m: unpack(iter([packed.iloc[[i]]])) for i, m in enumerate(packed["event_minute"])}
    assert list(by_minute[7].columns) == ["partition", "offset"]
    assert by_minute[MALFORMED_KEY][["offset", "inline", "key", "value"]].values.tolist() == [[0, True, b"k", b"{"]]


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
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
    ]
)


def at(minute: int, second: int = 0) -> datetime:
    return datetime(2026, 11, 22, 12, minute, second, tzinfo=UTC)


def ms(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def run_batches(
    spark: SparkSession, tmp: Path, files: list[list[tuple]], lateness_ms: int, retention_ms: int
) -> dict[int, dict[str, list]]:
    """minute_state_rows over ``files`` (one micro-batch each; a row without
    a reject reason is valid): per batch the (ad_id, window minute,
    impressions, clicks) emitted, the sorted (partition, offset, event_id)
    of the late rows, the (partition, offset) of the late repeats and of
    the malformed rows (with their reason, and their key and value when they
    carry them), and the watermarks the operator ran with."""
    for i, rows in enumerate(files):
        with_reasons = [(*r, *[None] * (len(ROWS.fields) - len(r))) for r in rows]
        spark.createDataFrame(with_reasons, ROWS).coalesce(1).write.parquet(str(tmp / "in" / f"{i:03d}"))
    source = spark.readStream.option("maxFilesPerTrigger", 1).schema(ROWS).parquet(str(tmp / "in" / "*"))
    out: dict[int, dict[str, list]] = {}

    def collect(batch_df, batch_id: int) -> None:  # noqa: ANN001
        rows = batch_df.collect()
        out[batch_id] = {
            "windows": sorted(
                (ad_id, (start_ms - ms(at(0))) // 60_000, impressions, clicks)
                for ad_id, start_ms, impressions, clicks in T.window_totals(
                    [
                        (r["ad_id"], r["window_start_ms"], r["impressions"], r["clicks"])
                        for r in rows
                        if r["kind"] == T.KIND_AGGREGATE
                    ]
                )
            ),
            "window_parts": sum(r["kind"] == T.KIND_AGGREGATE for r in rows),
            "late": sorted((r["partition"], r["offset"], r["event_id"]) for r in rows if r["kind"] == T.KIND_LATE),
            "repeats": sorted((r["partition"], r["offset"]) for r in rows if r["kind"] == T.KIND_REPEAT),
            "malformed": sorted(
                (r["partition"], r["offset"], r["reject_reason"]) for r in rows if r["kind"] == T.KIND_MALFORMED
            ),
            "carried": sorted(
                (r["partition"], r["offset"], r["key"], r["value"]) for r in rows if r["inline"]
            ),
            "payloads_of_others": [r for r in rows if not r["inline"] and (r["key"], r["value"]) != (None, None)],
            "watermarks": sorted({r["watermark_ms"] for r in rows}),
        }

    partitions = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "2")
    query = (
        T.minute_state_rows(source, lateness_ms, retention_ms)
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
    return out


def by_batch(out: dict[int, dict[str, list]], what: str) -> dict[int, list]:
    return {b: out[b][what] for b in sorted(out) if out[b][what]}


def test_windows_late_rows_repeats_and_the_retention_batch_by_batch(spark: SparkSession, tmp_path: Path) -> None:
    files = [
        # batch 0 (watermark 0): on time; "dup" twice (a retry in the same batch)
        [
            ("a", "ad-1", "impression", at(0, 10), 0, 0),
            ("dup", "ad-1", "click", at(0, 20), 1, 0),
            ("dup", "ad-1", "click", at(0, 20), 1, 1),
            ("b", "ad-1", "impression", at(5), 0, 1),  # watermark -> 12:04:30
        ],
        # batch 1: minutes 0 to 3 have closed. A retry of the counted "a";
        # "x" new but late, and its retry, which comes first in (partition,
        # offset) order. The 12:00 window is emitted.
        [
            ("a", "ad-1", "impression", at(0, 10), 0, 2),
            ("x", "ad-1", "impression", at(1), 1, 2),
            ("x", "ad-1", "impression", at(1), 0, 3),
        ],
        # batch 2: "x" re-sent again (listed before: a repeat); "y" late and new
        [("x", "ad-1", "impression", at(1), 1, 3), ("y", "ad-1", "click", at(2), 1, 4)],
        # batch 3: "far" on time; the watermark moves to 12:13:10 for batch 4,
        # past minutes 0 to 5 plus 5 minutes' retention. Three malformed rows:
        # one with no event time, one timed 12:59 (which must not move the
        # watermark: "far" would be forgotten in batch 5), one too large to
        # carry its value (named by position only). A key and value within
        # the limit come through as they were, NUL and all.
        [
            ("far", "ad-2", "impression", at(13, 40), 1, 5, None, b"ad-2", b"far"),
            ("m1", "ad-9", "impression", at(59), 0, 4, "future_event_time", None, b"m1\0"),
            (None, None, None, None, 1, 6, "not_json", b"k\0", b"{"),
            (None, None, None, None, 1, 7, "not_json", b"k", b"x" * INLINE_RECORD_BYTES),
        ],
        # batch 4: on time in 12:13; the 12:05 window is emitted, minutes 0 to 5 forgotten
        [("filler", "ad-3", "impression", at(13, 30), 0, 5)],
        # batch 5: "a", "y" and "b" are forgotten: late and listed again;
        # "far" (12:13, open) is a repeat on time: neither counted nor named
        [
            ("a", "ad-1", "impression", at(0, 10), 0, 6),
            ("y", "ad-1", "click", at(2), 0, 7),
            ("b", "ad-1", "impression", at(5), 0, 8),
            ("far", "ad-2", "impression", at(13, 40), 1, 9),
        ],
        # batch 6 moves the watermark to 12:19:30: a no-data batch 7 emits 12:13
        [("end", "ad-4", "impression", at(20), 0, 9)],
    ]
    out = run_batches(spark, tmp_path, files, lateness_ms=30_000, retention_ms=300_000)
    assert by_batch(out, "windows") == {
        1: [("ad-1", 0, 1, 1)],
        4: [("ad-1", 5, 1, 0)],
        7: [("ad-2", 13, 1, 0), ("ad-3", 13, 1, 0)],
    }
    assert by_batch(out, "late") == {
        1: [(0, 3, "x")],
        2: [(1, 4, "y")],
        5: [(0, 6, "a"), (0, 7, "y"), (0, 8, "b")],
    }
    assert by_batch(out, "repeats") == {1: [(0, 2), (1, 2)], 2: [(1, 3)]}
    assert by_batch(out, "malformed") == {3: [(0, 4, "future_event_time"), (1, 6, "not_json"), (1, 7, "not_json")]}
    assert by_batch(out, "carried") == {3: [(0, 4, None, b"m1\0"), (1, 6, b"k\0", b"{")]}
    assert by_batch(out, "payloads_of_others") == {}
    first, second, third = ms(at(4, 30)), ms(at(13, 10)), ms(at(19, 30))
    assert by_batch(out, "watermarks") == {1: [first], 2: [first], 3: [first], 4: [second], 5: [second], 7: [third]}


def test_a_window_s_parts_from_its_id_buckets_add_up_to_its_counts(spark: SparkSession, tmp_path: Path) -> None:
    events = [(f"e{i}", "ad-1", "click" if i % 5 == 0 else "impression", at(0, i % 60), i % 3, i) for i in range(200)]
    retries = [(f"e{i}", "ad-1", "click" if i % 5 == 0 else "impression", at(0, i % 60), 3, i) for i in range(50)]
    files = [[*events, *retries], [("end", "ad-2", "impression", at(3), 0, 999)]]
    out = run_batches(spark, tmp_path, files, lateness_ms=30_000, retention_ms=300_000)
    # Batch 1's event moves the watermark to 12:02:30: a no-data batch 2 emits 12:00.
    assert by_batch(out, "windows") == {2: [("ad-1", 0, 160, 40)]}
    assert out[2]["window_parts"] > 1  # the ids spread over several keys


def test_window_totals_add_up_parts_in_window_then_ad_order() -> None:
    parts = [("b", 60_000, 1, 0), ("a", 60_000, 2, 1), ("b", 60_000, 3, 4), ("z", 0, 1, 1)]
    assert T.window_totals(parts) == [("z", 0, 1, 1), ("a", 60_000, 2, 1), ("b", 60_000, 4, 4)]


def test_a_window_closes_when_the_watermark_reaches_its_end(spark: SparkSession, tmp_path: Path) -> None:
    files = [
        [("a", "ad-1", "impression", at(0, 10), 0, 0), ("b", "ad-1", "click", at(1, 30), 0, 1)],
        # The watermark is 12:01:00, the 12:00 window's end: it is emitted in
        # this batch, without "c", which arrived after it closed.
        [("c", "ad-1", "impression", at(0, 50), 0, 2), ("d", "ad-1", "impression", at(1, 0), 0, 3)],
    ]
    out = run_batches(spark, tmp_path, files, lateness_ms=30_000, retention_ms=300_000)
    assert by_batch(out, "windows") == {1: [("ad-1", 0, 1, 0)]}
    assert by_batch(out, "late") == {1: [(0, 2, "c")]}
    assert by_batch(out, "watermarks") == {1: [ms(at(1))]}


def test_within_the_retention_a_late_retry_is_a_repeat(spark: SparkSession, tmp_path: Path) -> None:
    files = [
        [("a", "ad-1", "impression", at(0, 10), 0, 0), ("b", "ad-1", "impression", at(30), 0, 1)],
        [("c", "ad-1", "impression", at(59), 0, 2)],  # watermark -> 12:58:30
        [("a", "ad-1", "impression", at(0, 10), 0, 3)],  # 58 min late, retention 1 h: known
    ]
    out = run_batches(spark, tmp_path, files, lateness_ms=30_000, retention_ms=3_600_000)
    assert by_batch(out, "repeats") == {2: [(0, 3)]}
    assert by_batch(out, "late") == {}
