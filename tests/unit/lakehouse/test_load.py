"""Union & Load's pure parts on small local DataFrames, and its settings."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from datetime import UTC, datetime

import pytest
from adpipe import schemas as S
from adpipe.lakehouse import load, merge, ranges
from adpipe.lakehouse import rows as R
from adpipe.lakehouse import tables as T
from adpipe.settings import SettingsError, load_settings
from pyspark.sql import DataFrame, SparkSession

HOUR = datetime(2026, 11, 22, 12, tzinfo=UTC)
LOADED = datetime(2026, 11, 23, 9, tzinfo=UTC)
KAFKA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string,value:binary>>"
)


def _kafka(spark: SparkSession, values: list[object], headers: list[dict] | None = None) -> DataFrame:
    rows = []
    for i, value in enumerate(values):
        body = value if isinstance(value, bytes) else json.dumps(value).encode()
        hdrs = [(k, v.encode()) for k, v in (headers[i] if headers else {}).items()]
        rows.append((None, body, "t", i % 2, i, datetime(2026, 11, 23, 8, 30), 0, hdrs))
    return spark.createDataFrame(rows, KAFKA)


def _event(event_id: str, minute: int, ad: str = "ad-1", kind: str = "impression", hour: int = 12) -> dict:
    return {"event_id": event_id, "ad_id": ad, "event_type": kind, "event_time": f"2026-11-22T{hour}:{minute:02d}:05Z"}


# --- hours -----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["2026-11-22T12", "2026-11-22T12:00:00Z", "2026-11-22T13:00+01:00"])
def test_parse_hour_accepts_the_hour_in_any_zone(text: str) -> None:
    assert load.parse_hour(text) == HOUR


@pytest.mark.parametrize("text", ["2026-11-22T12:30", "2026-11-22", "yesterday", "2026-11-22T25"])
def test_parse_hour_rejects_what_is_not_an_hour(text: str) -> None:
    with pytest.raises(ValueError, match="--hour"):
        load.parse_hour(text)


def test_hours_between_is_inclusive_and_ordered() -> None:
    hours = load.hours_between(HOUR, load.parse_hour("2026-11-22T14"))
    assert [load.hour_label(h) for h in hours] == ["2026-11-22T12", "2026-11-22T13", "2026-11-22T14"]
    assert load.hours_between(HOUR) == [HOUR]
    with pytest.raises(ValueError, match="before"):
        load.hours_between(HOUR, load.parse_hour("2026-11-22T11"))


def test_topic_range_options_read_exactly_the_non_empty_partitions() -> None:
    rng = load.TopicRange("t", {0: 5, 1: 3, 2: 0}, {0: 9, 1: 3, 2: 4})
    assert rng.partitions() == [0, 2]
    assert rng.records() == 8
    opts = rng.options()
    assert json.loads(opts["assign"]) == {"t": [0, 2]}
    assert json.loads(opts["startingOffsets"]) == {"t": {"0": 5, "2": 0}}
    assert json.loads(opts["endingOffsets"]) == {"t": {"0": 9, "2": 4}}


# --- rows ------------------------------------------------------------------------------------


def test_raw_rows_keep_valid_events_of_the_hour_only(spark: SparkSession) -> None:
    df = _kafka(spark, [_event("e1", 1), _event("e2", 59, kind="click"), _event("e3", 0, hour=13), b"{oops"])
    rows = R.raw_table_rows(df, "r1", HOUR, LOADED, 300_000).collect()
    assert sorted(r.event_id for r in rows) == ["e1", "e2"]
    assert {r.event_hour for r in rows} == {datetime(2026, 11, 22, 12)}
    assert {(r.region, r.kafka_topic) for r in rows} == {("r1", "t")}
    assert R.raw_table_rows(df, "r1", HOUR, LOADED, 300_000).schema.fieldNames() == T.RAW_SCHEMA.fieldNames()


def test_aggregate_rows_parse_the_contract_json_and_filter_the_hour(spark: SparkSession) -> None:
    good = {
        "record_uuid": "u1",
        "ad_id": "ad-1",
        "window_start": "2026-11-22T12:07:00Z",
        "window_end": "2026-11-22T12:08:00Z",
        "impressions": 4,
        "clicks": 1,
    }
    next_hour = {
        **good,
        "record_uuid": "u2",
        "window_start": "2026-11-22T13:00:00Z",
        "window_end": "2026-11-22T13:01:00Z",
    }
    broken = {"record_uuid": "u3", "ad_id": "ad-1"}
    bad_time = {**good, "record_uuid": "u4", "window_end": "yesterday"}
    df = _kafka(spark, [good, next_hour, broken, b"not json", bad_time])
    # As the load reads them: parsed once, kept, then shaped for both tables.
    for source in (df, R.with_aggregate_fields(df).localCheckpoint()):
        rows = R.aggregate_table_rows(source, "r1", HOUR, LOADED).collect()
        assert [(r.record_uuid, r.impressions, r.clicks, r.window_start, r.window_end) for r in rows] == [
            ("u1", 4, 1, datetime(2026, 11, 22, 12, 7), datetime(2026, 11, 22, 12, 8))
        ]
        # The unreadable ones are quarantined (by the hour they reached
        # Kafka) with their own bytes, not dropped.
        empty = _kafka(spark, [])
        q = R.quarantine_table_rows(empty, empty, source, "r1", datetime(2026, 11, 23, 8, tzinfo=UTC), LOADED)
        assert sorted((r.event_key, r.raw_value) for r in q.collect()) == [
            ("t/0/2", json.dumps(broken).encode()), ("t/0/4", json.dumps(bad_time).encode()), ("t/1/3", b"not json"),
        ]  # fmt: skip
        assert {r.source for r in q.collect()} == {R.SOURCE_BAD_AGGREGATE}


def test_quarantine_rows_carry_reason_and_key(spark: SparkSession) -> None:
    dlq = _kafka(
        spark,
        [{"event_id": "d1", "ad_id": "ad-1", "event_type": "view", "event_time": "2026-11-22T12:10:00Z"}, b"\x00"],
        [
            {S.HEADER_REASON: S.REASON_BAD_EVENT_TYPE, S.HEADER_SOURCE: "raw/3/17"},
            {S.HEADER_REASON: S.REASON_NOT_JSON, S.HEADER_SOURCE: "raw/1/4"},
        ],
    )
    # A late copy too large for its topic is cut: its headers name the event and its time.
    truncated = {S.HEADER_REASON: S.REASON_OVERSIZED, S.HEADER_EVENT_ID: "late-3"}
    truncated[S.HEADER_EVENT_TIME_MS] = str(1_795_348_800_000 + 40 * 60_000)  # 2026-11-22T12:40Z
    late = _kafka(
        spark,
        [_event("late-1", 30), _event("late-2", 30, hour=11), b'{"event_id":"late-3","ad_id":"ad-1","eve'],
        # A header that is no number is read as none (never a failed load).
        [{S.HEADER_WATERMARK: "junk"}, {}, truncated],
    )
    empty = _kafka(spark, [])
    rows = R.quarantine_table_rows(dlq, late, empty, "r1", HOUR, LOADED).collect()
    got = sorted((r.source, r.event_key, r.reason) for r in rows)
    # The unparseable DLQ record has no event time: it belongs to the hour it
    # reached the DLQ (2026-11-23T08), not to this one.
    assert got == [
        (T.SOURCE_DLQ, "raw/3/17", S.REASON_BAD_EVENT_TYPE),
        (T.SOURCE_LATE, "late-1", "late"),
        (T.SOURCE_LATE, "late-3", "late"),
    ]
    (cut,) = [r for r in rows if r.event_key == "late-3"]
    assert (cut.event_id, cut.event_time) == ("late-3", datetime(2026, 11, 22, 12, 40))


def test_first_per_key_is_deterministic_across_regions(spark: SparkSession) -> None:
    df = spark.createDataFrame(
        [("e1", "r2", "t", 0, 1), ("e1", "r1", "t", 3, 9), ("e1", "r1", "t", 3, 2), ("e2", "r2", "t", 1, 1)],
        "event_id string, region string, kafka_topic string, kafka_partition int, kafka_offset long",
    )
    kept = sorted((r.event_id, r.region, r.kafka_offset) for r in R._first_per_key(df, ["event_id"]).collect())
    assert kept == [("e1", "r1", 2), ("e2", "r2", 1)]


# --- regions -----------------------------------------------------------------------------------


def test_regions_default_to_this_job_and_parse_from_json() -> None:
    only = load_settings({"ADPIPE_JOB_ID": "eu"})
    assert [r.job_id for r in only.regions] == ["eu"]
    two = load_settings(
        {
            "ADPIPE_KAFKA_BOOTSTRAP": "k:1",
            "ADPIPE_REGIONS": json.dumps(
                [{"job_id": "eu", "aggregates": "eu-agg"}, {"job_id": "us", "kafka_bootstrap": "k2:2"}]
            ),
        }
    )
    eu, us = two.regions
    assert (eu.kafka_bootstrap, eu.topics.aggregates, eu.topics.events) == ("k:1", "eu-agg", "ad-events")
    assert (us.kafka_bootstrap, us.topics.aggregates) == ("k2:2", "ad-aggregates")
    assert two.for_region(us).job_id == "us" and two.for_region(us).kafka_bootstrap == "k2:2"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("{", "not a JSON list"),
        ('[{"aggregates": "x"}]', "job_id"),
        ('[{"job_id": "a", "colour": "x"}]', "unknown keys"),
        ('[{"job_id": "a"}, {"job_id": "a"}]', "distinct"),
    ],
)
def test_bad_regions_are_clear_errors(raw: str, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings({"ADPIPE_REGIONS": raw})


# --- concurrent MERGEs ---------------------------------------------------------


def test_two_merges_held_at_a_barrier_conflict_and_the_loser_retries(
    spark: SparkSession, caplog: pytest.LogCaptureFixture
) -> None:
    """Two loads of one hour read the same table version (both wait at a
    barrier just before their MERGE), so the second commit is a real Delta
    conflict: it must be retried, and the table ends with each key once."""
    table = f"default.conflict_{uuid.uuid4().hex[:8]}"
    spark.sql(
        f"CREATE TABLE {table} (k STRING, v BIGINT, event_hour TIMESTAMP) "
        "USING delta PARTITIONED BY (event_hour)"
    )
    schema = "k string, v bigint, event_hour timestamp"
    spark.createDataFrame([("seed", 0, HOUR)], schema).write.format("delta").mode("append").saveAsTable(table)
    barrier = threading.Barrier(2)
    held: set[str] = set()

    def hold_first_attempts_together() -> None:
        name = threading.current_thread().name
        if name not in held:
            held.add(name)
            barrier.wait(120)

    inserted: dict[str, int] = {}
    errors: list[BaseException] = []

    def load_rows(name: str, rows: list[tuple]) -> None:
        try:
            source = spark.createDataFrame(rows, schema)
            inserted[name] = load.merge_new_rows(spark, table, source, ("k",), HOUR, hold_first_attempts_together)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    loads = [
        threading.Thread(target=load_rows, name="a", args=("a", [("a1", 1, HOUR), ("both", 3, HOUR)])),
        threading.Thread(target=load_rows, name="b", args=("b", [("b1", 2, HOUR), ("both", 3, HOUR)])),
    ]
    with caplog.at_level(logging.WARNING, logger="adpipe.lakehouse.load"):
        for t in loads:
            t.start()
        for t in loads:
            t.join(300)
    assert errors == []
    conflicts = [r for r in caplog.records if "concurrent write conflict" in r.getMessage()]
    assert len(conflicts) == 1, caplog.text  # the loser, once
    assert "Concurrent" in conflicts[0].getMessage()  # a Delta conflict class, named
    assert sorted(inserted.values()) == [1, 2]  # the loser found "both" present on its retry
    rows = sorted((r["k"], r["v"]) for r in spark.table(table).collect())
    assert rows == [("a1", 1), ("b1", 2), ("both", 3), ("seed", 0)]


def test_a_merge_inserts_only_new_keys_and_one_with_nothing_new_writes_no_table_version(spark: SparkSession) -> None:
    from delta.tables import DeltaTable

    table = f"default.rerun_{uuid.uuid4().hex[:8]}"
    spark.sql(f"CREATE TABLE {table} (k STRING, v BIGINT, event_hour TIMESTAMP) USING delta")
    schema = "k string, v bigint, event_hour timestamp"
    other_hour = HOUR.replace(hour=HOUR.hour + 1)
    rows = [("a", 1, HOUR), ("b", 2, HOUR)]
    assert load.merge_new_rows(spark, table, spark.createDataFrame(rows, schema), ("k",), HOUR) == 2
    version = DeltaTable.forName(spark, table).history(1).first()["version"]
    again = spark.createDataFrame([*rows, ("c", 3, HOUR)], schema)
    assert load.merge_new_rows(spark, table, again, ("k",), HOUR) == 1
    assert DeltaTable.forName(spark, table).history(1).first()["version"] == version + 1
    # The same rows again: nothing new, no version. With the hour in the key,
    # a key seen in another hour is another row.
    assert load.merge_new_rows(spark, table, again, ("k",), HOUR) == 0
    assert DeltaTable.forName(spark, table).history(1).first()["version"] == version + 1
    other = spark.createDataFrame([("a", 9, other_hour)], schema)
    assert load.merge_new_rows(spark, table, other, ("event_hour", "k"), [HOUR, other_hour]) == 1
    got = sorted((r["k"], r["v"]) for r in spark.table(table).collect())
    assert got == [("a", 1), ("a", 9), ("b", 2), ("c", 3)]


def test_every_delta_conflict_class_is_a_write_conflict_and_nothing_else_is() -> None:
    from delta.exceptions import ConcurrentAppendException, ProtocolChangedException

    assert merge.is_write_conflict(ConcurrentAppendException("files added"))
    assert merge.is_write_conflict(ProtocolChangedException("protocol changed"))
    assert merge.is_write_conflict(RuntimeError("io.delta.exceptions.ConcurrentTransactionException: two writers"))
    assert not merge.is_write_conflict(RuntimeError("[DELTA_MISSING_COLUMN] no such column"))


# --- coverage and closed hours -------------------------------------------------------------


def _ranges(region: str, topic: str, start: dict[int, int], end: dict[int, int]) -> ranges.RegionRanges:
    empty = ranges.TopicRange("x", {}, {})
    return ranges.RegionRanges(region, "k:1", None, ranges.TopicRange(topic, start, end), empty, empty, empty)


def test_coverage_grows_contiguously_per_region_topic_and_partition() -> None:
    first = ranges.advance({}, [_ranges("eu", "raw", {0: 5, 1: 0}, {0: 9, 1: 0})])
    assert first["eu"]["raw"] == {"0": [5, 9], "1": [0, 0]}
    # The next run continues where the coverage ends; another region is kept apart.
    second = ranges.advance(
        first, [_ranges("eu", "raw", {0: 9, 1: 0}, {0: 12, 1: 3}), _ranges("us", "raw", {0: 0}, {0: 2})]
    )
    assert second["eu"]["raw"] == {"0": [5, 12], "1": [0, 3]}
    assert second["us"]["raw"] == {"0": [0, 2]}
    # A backfill of an earlier hour reads from before the coverage: the span grows down.
    third = ranges.advance(second, [_ranges("eu", "raw", {0: 1}, {0: 12})])
    assert third["eu"]["raw"]["0"] == [1, 12]
    assert first["eu"]["raw"] == {"0": [5, 9], "1": [0, 0]}, "advance must not change its input"


def test_closed_hours_stop_asking_once_an_hour_is_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[datetime] = []
    closed_up_to = HOUR + 2 * load.ONE_HOUR

    def fake_closed(_settings: object, hour: datetime, _now: object = None, streams: object = None) -> bool:
        asked.append(hour)
        return hour <= closed_up_to

    monkeypatch.setattr(ranges, "hour_closed", fake_closed)
    hours = [HOUR + i * load.ONE_HOUR for i in (4, 0, 2, 3, 1)]
    assert ranges.closed_hours(load_settings({}), hours) == [HOUR + i * load.ONE_HOUR for i in (0, 1, 2)]
    assert asked == [HOUR + i * load.ONE_HOUR for i in (4, 3, 2)]  # latest first; 2 closed closes 1 and 0
    assert ranges.closed_hours(load_settings({}), []) == []


def test_a_bisection_reads_each_regions_stream_state_from_kafka_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watermark closes hours up to 11:00 (its end 12:00, plus the
    allowed lateness); the region is not quiet (records arrived after every
    hour's end)."""
    from adpipe import kafka_io

    first = datetime(2026, 11, 22, 0, tzinfo=UTC)
    watermark_ms = int(datetime(2026, 11, 22, 12, 5, tzinfo=UTC).timestamp() * 1000)
    reads = {"commits": 0, "lag": 0, "arrived": 0}

    def commits(_rs: object) -> dict:
        reads["commits"] += 1
        return {"0": "batch"}

    def lag(_rs: object, _commits: object) -> dict:
        reads["lag"] += 1
        return {0: 5}

    def arrived(_kafka: object, _topic: str, _ms: int) -> dict:
        reads["arrived"] += 1
        return {0: 7}

    monkeypatch.setattr(kafka_io, "stream_commits", commits)
    monkeypatch.setattr(kafka_io, "committed_watermark", lambda _c: watermark_ms)
    monkeypatch.setattr(kafka_io, "stream_lag", lag)
    monkeypatch.setattr(kafka_io, "offsets_for_times", arrived)
    settings = load_settings({})
    assert ranges.closed_through(settings, first, first + 47 * load.ONE_HOUR) == first + 11 * load.ONE_HOUR
    assert reads["commits"] == reads["lag"] == 1 and reads["arrived"] >= 2  # each open hour asked looks at arrivals
    assert ranges.closed_hours(settings, [first + 13 * load.ONE_HOUR, first + 12 * load.ONE_HOUR, first]) == [first]
    assert reads["commits"] == 2  # one more read for the new series of questions
    assert not ranges.hour_closed(settings, first + 12 * load.ONE_HOUR)  # alone, it reads for itself
    assert reads["commits"] == 3


def test_an_hour_closes_once_the_watermark_is_past_its_end_plus_the_allowed_lateness(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past its end the hour's windows are emitted, but may still be revised
    until the watermark passes the end plus ADPIPE_ALLOWED_LATENESS_S."""
    from adpipe import kafka_io

    marks = {"ms": 0}
    monkeypatch.setattr(kafka_io, "stream_commits", lambda _rs: {0: (9, "{}")})
    monkeypatch.setattr(kafka_io, "committed_watermark", lambda _c: marks["ms"])
    monkeypatch.setattr(kafka_io, "stream_lag", lambda _rs, _c: {0: 0})
    monkeypatch.setattr(kafka_io, "offsets_for_times", lambda _k, _t, _ms: {0: 7})  # not quiet
    end_ms = int((HOUR + load.ONE_HOUR).timestamp() * 1000)
    for allowed_s, watermark_ms, closed in (
        (300, end_ms, False), (300, end_ms + 299_999, False), (300, end_ms + 300_000, True), (0, end_ms, True),
    ):
        marks["ms"] = watermark_ms
        settings = load_settings({"ADPIPE_ALLOWED_LATENESS_S": str(allowed_s)})
        assert ranges.hour_closed(settings, HOUR) is closed, (allowed_s, watermark_ms - end_ms)


def test_a_staged_run_survives_xcom() -> None:
    run = load.StagedRun(7, "load", "2026-11-22T12", ["2026-11-22T11", "2026-11-22T12"], {T.RAW: 3}, [{"r": 1}], 2)
    again = load.StagedRun.from_dict(json.loads(json.dumps(run.to_dict())))
    assert again == run
    assert again.hour_list() == [HOUR - load.ONE_HOUR, HOUR]


def test_closed_through_finds_the_latest_closed_hour_by_bisection(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    first = datetime(2026, 11, 22, 0, tzinfo=UTC)
    asked: list[datetime] = []

    def closed_until(horizon: datetime | None):  # noqa: ANN202
        def hour_closed(_settings: object, hour: datetime, _now: object = None, streams: object = None) -> bool:
            asked.append(hour)
            return horizon is not None and hour <= horizon

        return hour_closed

    settings = load_settings({})
    last = first + timedelta(hours=47)
    for horizon in (first, first + timedelta(hours=11), last):
        asked.clear()
        monkeypatch.setattr(ranges, "hour_closed", closed_until(horizon))
        assert ranges.closed_through(settings, first, last) == horizon
        assert len(asked) <= 8  # log2(48) + 2, not 48
    monkeypatch.setattr(ranges, "hour_closed", closed_until(None))
    assert ranges.closed_through(settings, first, last) is None
    assert ranges.closed_through(settings, last, first) is None


# --- late repeats and cross-region copies ----------------------------------------------------


def _raw_row(event_id: str, region: str, partition: int, offset: int, minute: int = 10) -> tuple:
    at = datetime(2026, 11, 22, 12, minute, 5)
    return (event_id, "ad-1", None, "impression", at, datetime(2026, 11, 22, 12), region, f"raw-{region}",
            partition, offset, datetime(2026, 11, 23, 9), None)


def _raw(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    return spark.createDataFrame(rows, T.RAW_SCHEMA)


def test_a_late_copy_of_a_records_that_is_not_the_events_first_is_a_late_repeat(spark: SparkSession) -> None:
    # late-1: listed by the copy of its first raw record (a late event);
    # again-1: the copy names a retry at offset 40, the event's first record is at offset 3.
    # soon-1: a copy other than the first, listed within the retention (the
    # stream still knew the id: the copies came in one batch, this one first by position).
    end_12_10 = int(datetime(2026, 11, 22, 12, 11, tzinfo=UTC).timestamp() * 1000)  # again-1's window end
    retention_ms = 60_000
    late = _kafka(
        spark, [_event("late-1", 30), _event("again-1", 10), _event("soon-1", 10)],
        [{S.HEADER_SOURCE: "raw-r1/0/7", S.HEADER_WATERMARK: str(end_12_10 + 30 * 60_000)},
         {S.HEADER_SOURCE: "raw-r1/1/40", S.HEADER_WATERMARK: str(end_12_10 + retention_ms)},
         {S.HEADER_SOURCE: "raw-r1/2/41", S.HEADER_WATERMARK: str(end_12_10 + retention_ms - 1)}],
    )
    empty = _kafka(spark, [])
    quarantine = R.quarantine_table_rows(empty, late, empty, "r1", HOUR, LOADED)
    first = _raw(spark, [_raw_row("late-1", "r1", 0, 7, 30), _raw_row("again-1", "r1", 1, 3),
                         _raw_row("soon-1", "r1", 3, 2)])
    marked = R.mark_late_repeats(quarantine, first, retention_ms)
    rows = {r.event_key: (r.source, r.reason) for r in marked.collect()}
    assert rows == {
        "late-1": (T.SOURCE_LATE, "late"),
        "again-1": (T.SOURCE_LATE_REPEAT, T.SOURCE_LATE_REPEAT),
        "soon-1": (T.SOURCE_LATE, "late"),
    }
    assert marked.columns == T.QUARANTINE_SCHEMA.fieldNames()


def test_copies_of_an_event_in_other_regions_are_listed_once_per_region(spark: SparkSession) -> None:
    new = _raw(spark, [
        _raw_row("both", "r1", 0, 5), _raw_row("both", "r2", 0, 2), _raw_row("both", "r2", 1, 9),  # r2 twice
        _raw_row("alone", "r2", 0, 3),
        _raw_row("earlier", "r1", 0, 6),  # r2 loaded it in an earlier run: r1's copy is the other one
    ])
    loaded = _raw(spark, [_raw_row("earlier", "r2", 0, 1)])
    rows = R.cross_region_copies(new, loaded, LOADED).collect()
    got = sorted((r.source, r.event_key, r.region, r.kafka_offset, r.reason) for r in rows)
    assert got == [
        (T.SOURCE_CROSS_REGION, "both@r2", "r2", 2, "cross_region_duplicate"),
        (T.SOURCE_CROSS_REGION, "earlier@r1", "r1", 6, "cross_region_duplicate"),
    ]
    assert R.cross_region_copies(new, loaded, LOADED).columns == T.QUARANTINE_SCHEMA.fieldNames()


def test_a_table_folder_left_by_a_killed_create_is_cleared_and_one_with_data_is_not(tmp_path) -> None:  # noqa: ANN001
    from types import SimpleNamespace

    from adpipe.lakehouse.metastore import _clear_unregistered

    spark = SimpleNamespace(conf=SimpleNamespace(get=lambda _key: f"file:{tmp_path}"))
    begun = tmp_path / "ads.db" / "ad_events_raw" / "_delta_log"
    (begun / "_staged_commits").mkdir(parents=True)
    (begun / "00000000000000000000.json").write_text("{}")
    assert _clear_unregistered(spark, "ads.ad_events_raw") and not begun.parent.exists()

    with_data = tmp_path / "ads.db" / "ad_minute_aggregates"
    (with_data / "_delta_log").mkdir(parents=True)
    (with_data / "event_hour=x").mkdir()
    (with_data / "event_hour=x" / "part-0.parquet").write_bytes(b"PAR1")
    assert not _clear_unregistered(spark, "ads.ad_minute_aggregates") and with_data.exists()
    committed = tmp_path / "ads.db" / "load_runs" / "_delta_log"
    committed.mkdir(parents=True)
    (committed / "00000000000000000001.json").write_text("{}")
    assert not _clear_unregistered(spark, "ads.load_runs") and committed.exists()


@pytest.mark.parametrize(
    ("files", "begun"),
    [
        ([], True),
        (["_delta_log/00000000000000000000.json", "_delta_log/_staged_commits/x.json"], True),
        (["_delta_log/00000000000000000000.json", "_delta_log/00000000000000000000.crc"], True),
        (["_delta_log/00000000000000000001.json"], False),  # a commit past the create
        (["_delta_log/00000000000000000000.json", "event_hour=x/part-0.parquet"], False),  # data
        (["part-0.parquet"], False),
    ],
)
def test_what_a_begun_create_leaves(files: list[str], begun: bool) -> None:
    """The same rule for a local warehouse and one on HDFS (the names as
    either lists them, relative to the table's folder)."""
    from adpipe.lakehouse.metastore import only_a_begun_create

    assert only_a_begun_create(files) is begun
