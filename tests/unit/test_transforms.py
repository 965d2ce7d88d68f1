"""The stream job's DataFrame steps on small local batch frames, and the
Python reading of the raw-event contract (verify.classify) against the
Spark one (transforms.parse_raw_events)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from adpipe import schemas as S
from adpipe import transforms as T
from adpipe.verify import RawEvent, classify
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType, TimestampType

# Kafka source rows as the stream job receives them (key and value binary).
RAW_KAFKA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", LongType()),
        StructField("offset", LongType()),
    ]
)

VALID_EVENTS = StructType(
    [
        StructField("event_id", StringType()),
        StructField("ad_id", StringType()),
        StructField("event_type", StringType()),
        StructField("event_time", TimestampType()),
    ]
)

BASE = {
    "event_id": "e-1",
    "ad_id": "ad-1",
    "campaign_id": "cmp-1",
    "event_type": "impression",
    "event_time": "2026-11-22T12:00:00.250Z",
}
DROP = object()


def body(**changes: object) -> bytes:
    """The valid base event with fields replaced (or removed with DROP)."""
    event = dict(BASE)
    for name, value in changes.items():
        if value is DROP:
            del event[name]
        else:
            event[name] = value
    return json.dumps(event).encode()


# id, raw value, expected reject_reason, expected event_time (naive UTC, as
# Spark returns it), expected epoch milliseconds (classify's reading).
CASES = [
    ("iso_z", body(), None, datetime(2026, 11, 22, 12, 0, 0, 250_000), 1_795_348_800_250),
    (
        "iso_plus_0100",
        body(event_time="2026-11-22T13:00:05+01:00"),
        None,
        datetime(2026, 11, 22, 12, 0, 5),
        1_795_348_805_000,
    ),
    (
        "iso_minus_0130_no_colon",
        body(event_time="2026-11-22T10:30:00.5-0130"),
        None,
        datetime(2026, 11, 22, 12, 0, 0, 500_000),
        1_795_348_800_500,
    ),
    (
        "epoch_ms",
        body(event_time=1_795_348_987_545),
        None,
        datetime(2026, 11, 22, 12, 3, 7, 545_000),
        1_795_348_987_545,
    ),
    ("epoch_zero", body(event_time=0), None, datetime(1970, 1, 1), 0),
    ("click", body(event_type="click"), None, datetime(2026, 11, 22, 12, 0, 0, 250_000), 1_795_348_800_250),
    ("not_json", b"{not json", S.REASON_NOT_JSON, None, None),
    ("empty_value", b"", S.REASON_NOT_JSON, None, None),
    ("not_utf8", b"\xff\xfe{}", S.REASON_NOT_JSON, None, None),
    ("json_array", b'["e-1", 1]', S.REASON_NOT_OBJECT, None, None),
    ("json_string", b'"e-1"', S.REASON_NOT_OBJECT, None, None),
    ("json_null", b"null", S.REASON_NOT_OBJECT, None, None),
    ("missing_event_id", body(event_id=DROP), S.REASON_BAD_EVENT_ID, None, None),
    ("event_id_number", body(event_id=42), S.REASON_BAD_EVENT_ID, None, None),
    ("event_id_empty", body(event_id=""), S.REASON_BAD_EVENT_ID, None, None),
    ("event_id_null", body(event_id=None), S.REASON_BAD_EVENT_ID, None, None),
    ("missing_ad_id", body(ad_id=DROP), S.REASON_BAD_AD_ID, None, None),
    ("ad_id_number", body(ad_id=7), S.REASON_BAD_AD_ID, None, None),
    ("event_type_view", body(event_type="view"), S.REASON_BAD_EVENT_TYPE, None, None),
    ("event_type_capitalised", body(event_type="Click"), S.REASON_BAD_EVENT_TYPE, None, None),
    ("event_type_missing", body(event_type=DROP), S.REASON_BAD_EVENT_TYPE, None, None),
    ("event_type_list", body(event_type=["click"]), S.REASON_BAD_EVENT_TYPE, None, None),
    ("event_time_yesterday", body(event_time="yesterday"), S.REASON_BAD_EVENT_TIME, None, None),
    ("event_time_now", body(event_time="now"), S.REASON_BAD_EVENT_TIME, None, None),
    ("event_time_naive", body(event_time="2026-11-22T12:00:00"), S.REASON_BAD_EVENT_TIME, None, None),
    ("event_time_true", body(event_time=True), S.REASON_BAD_EVENT_TIME, None, None),
    ("event_time_decimal", body(event_time=1.5), S.REASON_BAD_EVENT_TIME, None, None),
    ("event_time_integral_float", body(event_time=1_795_348_987_545.0), S.REASON_BAD_EVENT_TIME, None, None),
    ("event_time_negative_epoch", body(event_time=-1), S.REASON_BAD_EVENT_TIME, None, None),
    ("event_time_after_9999", body(event_time=253_402_300_800_000), S.REASON_BAD_EVENT_TIME, None, None),
    ("event_time_missing", body(event_time=DROP), S.REASON_BAD_EVENT_TIME, None, None),
    ("event_time_bad_offset", body(event_time="2026-11-22T12:00:00+25:00"), S.REASON_BAD_EVENT_TIME, None, None),
    ("event_time_bad_date", body(event_time="2026-02-30T12:00:00Z"), S.REASON_BAD_EVENT_TIME, None, None),
    # Several faults: the first in contract order is reported.
    ("first_reason_wins", body(event_id=DROP, ad_id=DROP, event_time="yesterday"), S.REASON_BAD_EVENT_ID, None, None),
]
CASE_IDS = [c[0] for c in CASES]
TOPIC = "ad-events"


def key_of(offset: int) -> bytes:
    # Not UTF-8 on purpose: keys must come back byte for byte.
    return b"\xff\x00k-" + str(offset).encode()


@pytest.fixture(scope="module")
def parsed(spark: SparkSession) -> dict[int, dict]:
    """The whole table parsed in one Spark job, by offset."""
    rows = [(key_of(i), value, TOPIC, i % 4, i) for i, (_, value, *_rest) in enumerate(CASES)]
    df = spark.createDataFrame(rows, RAW_KAFKA)
    return {r["offset"]: r.asDict() for r in T.parse_raw_events(df).collect()}


@pytest.mark.parametrize(("offset", "case"), list(enumerate(CASES)), ids=CASE_IDS)
def test_parse_raw_events_reason_and_time(parsed: dict[int, dict], offset: int, case: tuple) -> None:
    _, _, reason, event_time, _ = case
    row = parsed[offset]
    assert row["reject_reason"] == reason
    if reason is None:
        assert row["event_time"] == event_time
        assert row["event_id"] == json.loads(case[1])["event_id"]
        assert row["ad_id"] == "ad-1"
        assert row["event_type"] == json.loads(case[1])["event_type"]


def test_parse_raw_events_keeps_every_row_and_the_raw_bytes(parsed: dict[int, dict]) -> None:
    assert sorted(parsed) == list(range(len(CASES)))
    for offset, (_, value, *_rest) in enumerate(CASES):
        row = parsed[offset]
        assert bytes(row["key"]) == key_of(offset)
        assert bytes(row["value"]) == value
        assert (row["topic"], row["partition"]) == (TOPIC, offset % 4)


def test_parse_raw_events_output_schema(spark: SparkSession) -> None:
    df = T.parse_raw_events(spark.createDataFrame([], RAW_KAFKA))
    assert df.schema == S.PARSED_EVENT


def test_parse_raw_events_null_key_and_null_value(spark: SparkSession) -> None:
    df = spark.createDataFrame([(None, None, TOPIC, 0, 0)], RAW_KAFKA)
    (row,) = T.parse_raw_events(df).collect()
    assert (row["key"], row["value"], row["reject_reason"]) == (None, None, S.REASON_NOT_JSON)


@pytest.mark.parametrize(
    ("value", "campaign_id"),
    [
        (body(), "cmp-1"),
        (body(campaign_id=7), None),
        (body(campaign_id={"id": "cmp-1"}), None),
        (body(campaign_id=None), None),
        (body(campaign_id=DROP), None),
    ],
    ids=["string", "number", "object", "null", "missing"],
)
def test_campaign_id_is_null_unless_a_string(spark: SparkSession, value: bytes, campaign_id: str | None) -> None:
    df = spark.createDataFrame([(b"k", value, TOPIC, 0, 0)], RAW_KAFKA)
    (row,) = T.parse_raw_events(df).collect()
    # A bad campaign_id does not make the event malformed.
    assert (row["reject_reason"], row["campaign_id"]) == (None, campaign_id)


def test_valid_and_rejected_events_split_the_parsed_rows(parsed: dict[int, dict], spark: SparkSession) -> None:
    rows = [(key_of(i), value, TOPIC, 0, i) for i, (_, value, *_rest) in enumerate(CASES)]
    frame = T.parse_raw_events(spark.createDataFrame(rows, RAW_KAFKA))
    valid = sorted(r["offset"] for r in T.valid_events(frame).select("offset").collect())
    rejected = sorted(r["offset"] for r in T.rejected_events(frame).select("offset").collect())
    assert valid == [0, 1, 2, 3, 4, 5]
    assert rejected == list(range(6, len(CASES)))


# --- the Python reading of the contract (verify.classify) -------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_classify_gives_the_table_verdict(case: tuple) -> None:
    _, value, reason, _, event_ms = case
    verdict = classify(value)
    if reason is None:
        event = json.loads(value)
        assert verdict == RawEvent(event["event_id"], "ad-1", event["event_type"], event_ms)
    else:
        assert verdict == reason


def test_classify_none_is_not_json() -> None:
    assert classify(None) == S.REASON_NOT_JSON


def test_raw_event_window_start() -> None:
    assert RawEvent("e", "a", "click", 1_795_348_859_999).window_start == "2026-11-22T12:00:00Z"
    assert RawEvent("e", "a", "click", 1_795_348_860_000).window_start == "2026-11-22T12:01:00Z"


def spark_verdict(row: dict) -> str | tuple:
    if row["reject_reason"] is not None:
        return row["reject_reason"]
    return (row["event_id"], row["ad_id"], row["event_type"], row["event_ms"])


def python_verdict(value: bytes | None) -> str | tuple:
    verdict = classify(value)
    if isinstance(verdict, str):
        return verdict
    return (verdict.event_id, verdict.ad_id, verdict.event_type, verdict.event_ms)


def spark_verdicts(spark: SparkSession, values: list[bytes]) -> list[str | tuple]:
    df = spark.createDataFrame([(b"k", v, TOPIC, 0, i) for i, v in enumerate(values)], RAW_KAFKA)
    rows = (
        T.parse_raw_events(df)
        # Epoch millis, not the timestamp: Python cannot hold every time Spark can.
        .select(
            "offset", "event_id", "ad_id", "event_type", F.unix_millis("event_time").alias("event_ms"), "reject_reason"
        )
        .orderBy("offset")
        .collect()
    )
    return [spark_verdict(r.asDict()) for r in rows]


def test_spark_and_python_readings_agree_on_the_table(spark: SparkSession) -> None:
    values = [c[1] for c in CASES]
    assert spark_verdicts(spark, values) == [python_verdict(v) for v in values]


def _edge(case_id: str, value: bytes, bug: str | None = None) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=bug)] if bug else []
    return pytest.param(value, id=case_id, marks=marks)


def _edge_value(param: object) -> bytes:
    return param.values[0]  # type: ignore[attr-defined]


# Inputs at the edges of the contract. Where the two readings disagree the
# stream job and `adpipe verify` disagree on the same message (a DLQ record
# verify calls unexpected, or an aggregate it calls missing).
EDGE_CASES = [
    _edge("iso_fraction_9_digits", body(event_time="2026-11-22T12:00:59.999999999Z")),
    _edge("iso_space_separator", body(event_time="2026-11-22 12:00:00Z")),
    _edge("iso_plus_hh_only", body(event_time="2026-11-22T13:00:00+01")),
    _edge("iso_before_1970", body(event_time="1969-12-31T23:59:59Z")),
    _edge("json_padded_with_spaces", b'  {"event_id":"e","ad_id":"a","event_type":"click","event_time":1}  '),
    _edge("json_with_bom", b'\xef\xbb\xbf{"event_id":"e","ad_id":"a","event_type":"click","event_time":1}'),
    _edge("event_time_huge_integer", body(event_time=12_345_678_901_234_567_890)),
    _edge("event_time_exponent", b'{"event_id":"e","ad_id":"a","event_type":"click","event_time":1e3}'),
    _edge("iso_without_seconds", body(event_time="2026-11-22T12:00Z")),
    _edge("iso_without_seconds_with_offset", body(event_time="2026-11-22T13:00+01:00")),
    _edge("iso_without_seconds_with_short_offset", body(event_time="2026-11-22T13:00+01")),
    _edge("iso_trailing_newline", body(event_time="2026-11-22T12:00:00Z\n")),
    _edge("iso_trailing_crlf", body(event_time="2026-11-22T12:00:00Z\r\n")),
    _edge("iso_year_zero", body(event_time="0000-01-01T00:00:00Z")),
    _edge(
        "json_trailing_garbage",
        b'{"event_id":"e","ad_id":"a","event_type":"click","event_time":1} x',
        "try_parse_json ignores text after the first JSON value: Spark accepts it as a valid event, "
        "classify says not_json",
    ),
    _edge("json_duplicate_key", b'{"event_id":"e","ad_id":"a","event_type":"click","event_time":1,"event_id":"f"}'),
    _edge("json_nan", b'{"event_id":"e","ad_id":"a","event_type":"click","event_time":NaN}'),
    _edge("invalid_utf8_in_string", b'{"event_id":"\xe9","ad_id":"a","event_type":"click","event_time":1}'),
]


@pytest.fixture(scope="module")
def edge_verdicts(spark: SparkSession) -> dict[bytes, str | tuple]:
    values = [_edge_value(p) for p in EDGE_CASES]
    return dict(zip(values, spark_verdicts(spark, values)))


@pytest.mark.parametrize("value", EDGE_CASES)
def test_spark_and_python_readings_agree_at_the_edges(edge_verdicts: dict, value: bytes) -> None:
    assert edge_verdicts[value] == python_verdict(value)


# --- count_minute_windows ----------------------------------------------------
#
# The job runs it on a streaming frame (dropDuplicatesWithinWatermark, state,
# watermark): those tests stream small parquet files through an available-now
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
    dropped_by_batch: dict[int, int]
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
        dropped = {
            p["batchId"]: sum(op["numRowsDroppedByWatermark"] for op in p["stateOperators"])
            for p in query.recentProgress
        }
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
    return StreamRun(output, dropped, watermarks)


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


def test_late_rows_spark_drops_are_those_late_events_selects(spark: SparkSession, tmp_path: Path) -> None:
    """The rule stream.py routes late events by: in batch N the stateful
    operators drop rows with event time <= the watermark of offsets/N-1."""
    files = [
        [("a", "ad-1", "impression", utc(12, 0)), ("b", "ad-1", "impression", utc(12, 5))],
        # offsets/0's watermark is 0: nothing is late in batch 1, not even 12:01.
        [("c", "ad-1", "click", utc(12, 4, 40)), ("old", "ad-1", "impression", utc(12, 1))],
        [
            ("at_mark", "ad-1", "impression", utc(12, 4, 30)),  # == watermark 12:04:30: dropped
            ("after_mark", "ad-1", "impression", utc(12, 4, 30, us=1)),
            ("before_mark", "ad-1", "click", utc(12, 3)),  # dropped
            ("c", "ad-1", "click", utc(12, 4, 40)),  # retry of c: deduplicated
        ],
        [("sentinel", "ad-9", "click", utc(13, 0))],
    ]
    run = stream_counts(spark, tmp_path, files, 30_000)
    assert run.watermark_by_batch == {
        0: 0,
        1: 1_795_349_070_000,
        2: 1_795_349_070_000,
        3: 1_795_349_070_000,
        4: 1_795_352_370_000,
    }
    assert run.dropped_by_batch == {0: 0, 1: 0, 2: 2, 3: 0, 4: 0}
    for batch in (1, 2, 3):
        late = T.late_events(valid_frame(spark, files[batch]), run.watermark_by_batch[batch - 1])
        assert late.count() == run.dropped_by_batch[batch]
    assert run.output == [
        ("ad-1", naive(12, 0), naive(12, 1), 1, 0),
        ("ad-1", naive(12, 1), naive(12, 2), 1, 0),
        ("ad-1", naive(12, 4), naive(12, 5), 1, 1),
        ("ad-1", naive(12, 5), naive(12, 6), 1, 0),
    ]


def test_raw_messages_to_minute_counts(spark: SparkSession) -> None:
    """The job's chain on raw bytes: parse, keep the valid, count."""
    retry = body(event_id="r-1", event_type="click", event_time="2026-11-22T12:04:59.999Z")
    values = [
        body(event_id="a", event_time="2026-11-22T12:04:00Z"),
        body(event_id="b", event_time=1_795_349_040_000),  # 12:04:00.000Z as epoch ms
        retry,
        body(event_id="c", event_time="2026-11-22T13:05:00+01:00"),  # 12:05Z
        b"{not json",
        body(event_id="d", event_type="view"),
        retry,
    ]
    raw = spark.createDataFrame([(b"k", v, TOPIC, 0, i) for i, v in enumerate(values)], RAW_KAFKA)
    valid = raw.transform(T.parse_raw_events).transform(T.valid_events).select(*VALID_EVENTS.fieldNames())
    assert rows_of(valid) == [
        ("a", "ad-1", "impression", naive(12, 4)),
        ("b", "ad-1", "impression", naive(12, 4)),
        ("c", "ad-1", "impression", naive(12, 5)),
        ("r-1", "ad-1", "click", datetime(2026, 11, 22, 12, 4, 59, 999_000)),
        ("r-1", "ad-1", "click", datetime(2026, 11, 22, 12, 4, 59, 999_000)),
    ]
    assert rows_of(T.count_minute_windows(valid, 30_000)) == [
        ("ad-1", naive(12, 4), naive(12, 5), 2, 1),
        ("ad-1", naive(12, 5), naive(12, 6), 1, 0),
    ]


# --- late_events -------------------------------------------------------------

WATERMARK_MS = 1_795_348_860_000  # 2026-11-22T12:01:00.000Z


def test_late_events_boundary_is_inclusive(spark: SparkSession) -> None:
    events = valid_frame(
        spark,
        [
            ("older", "ad-1", "impression", utc(11, 0)),
            ("just_before", "ad-1", "impression", utc(12, 0, 59, 999)),
            ("at_watermark", "ad-1", "impression", utc(12, 1, 0, 0)),
            ("one_micro_after", "ad-1", "impression", datetime(2026, 11, 22, 12, 1, 0, 1, tzinfo=UTC)),
            ("one_ms_after", "ad-1", "impression", utc(12, 1, 0, 1)),
            ("much_later", "ad-1", "click", utc(12, 5)),
        ],
    )
    late = sorted(r["event_id"] for r in T.late_events(events, WATERMARK_MS).collect())
    assert late == ["at_watermark", "just_before", "older"]


def test_late_events_with_the_first_batch_watermark(spark: SparkSession) -> None:
    events = valid_frame(spark, [("e1", "ad-1", "impression", utc(12, 0)), ("e2", "ad-1", "click", utc(12, 1))])
    assert T.late_events(events, 0).collect() == []
