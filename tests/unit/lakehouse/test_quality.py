"""Great Expectations hour checks (adpipe.lakehouse.quality) on small local DataFrames
built with the schemas of adpipe.lakehouse.tables: a consistent hour passes; each
defect fails with the expectation that catches it named."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from adpipe.lakehouse import quality as Q
from adpipe.lakehouse import tables
from adpipe.settings import load_settings
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

HOUR = datetime(2026, 11, 22, 12, tzinfo=UTC)
LOADED = datetime(2026, 11, 22, 13, 5, tzinfo=UTC)
MIN = timedelta(minutes=1)


def at(minute: int, second: int = 0) -> datetime:
    return HOUR + timedelta(minutes=minute, seconds=second)


def kafka(offset: int, region: str = "region-local") -> tuple:
    return (region, "t", 0, offset, LOADED, None)


def raw(
    event_id: str, ad_id: str, event_type: str, event_time: datetime, offset: int = 0, region: str = "region-local"
) -> tuple:
    hour = event_time.replace(minute=0, second=0, microsecond=0)
    return (event_id, ad_id, "cmp-1", event_type, event_time, hour, *kafka(offset, region))


def agg(
    record_uuid: str,
    ad_id: str,
    window_start: datetime,
    impressions: int,
    clicks: int,
    window_end: datetime | None = None,
    region: str = "region-local",
    revision: int = 0,
) -> tuple:
    hour = window_start.replace(minute=0, second=0, microsecond=0)
    end = window_end or window_start + MIN
    return (record_uuid, ad_id, window_start, end, impressions, clicks, hour, *kafka(0, region), revision)


def late(event_id: str, ad_id: str, event_type: str, event_time: datetime) -> tuple:
    hour = event_time.replace(minute=0, second=0, microsecond=0)
    return (tables.SOURCE_LATE, event_id, "late", None, event_id, ad_id, event_type, event_time, hour, *kafka(0))


def dlq(key: str) -> tuple:
    return (tables.SOURCE_DLQ, key, "not_json", b"{", None, None, None, None, HOUR, *kafka(0))


# A consistent hour: ad-1 at 12:00 has two impressions and one click; ad-2
# at 12:01 one impression; e5 (ad-1, 12:02) arrived late and is quarantined,
# so it has no aggregate; the quarantine also holds a DLQ record.
RAW_ROWS = [
    raw("e1", "ad-1", "impression", at(0, 5)),
    raw("e2", "ad-1", "impression", at(0, 40)),
    raw("e3", "ad-1", "click", at(0, 59)),
    raw("e4", "ad-2", "impression", at(1, 10)),
    raw("e5", "ad-1", "impression", at(2, 1)),
]
QUARANTINE_ROWS = [late("e5", "ad-1", "impression", at(2, 1)), dlq("ad-events/0/17")]
AGG_ROWS = [agg("u1", "ad-1", at(0), 2, 1), agg("u2", "ad-2", at(1), 1, 0)]


@pytest.fixture
def settings(tmp_path: Path):
    # The fixture hour has one late event of five: the late-share gate is
    # tested on its own, with the default.
    return load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_MAX_LATE_SHARE": "0.25"})


def frames(
    spark: SparkSession,
    raw_rows: list[tuple] = RAW_ROWS,
    quarantine_rows: list[tuple] = QUARANTINE_ROWS,
    agg_rows: list[tuple] = AGG_ROWS,
) -> Q.HourFrames:
    return Q.HourFrames(
        raw_df=spark.createDataFrame(raw_rows, tables.RAW_SCHEMA),
        quarantine_df=spark.createDataFrame(quarantine_rows, tables.QUARANTINE_SCHEMA),
        aggregates_df=spark.createDataFrame(agg_rows, tables.AGGREGATES_SCHEMA),
    )


def failed_with(result: Q.QualityResult, *fragments: str) -> list[str]:
    """The failure lines containing every fragment (at least one must)."""
    lines = [line for line in result.failed if all(f in line for f in fragments)]
    assert lines, f"no failure with {fragments!r} in:\n{result.describe()}"
    return lines


# ---------------------------------------------------------------------------
# reconciliation_frame: pure


RECON_SCHEMA = StructType(
    [StructField(name, StringType()) for name in ("region", "ad_id")]
    + [StructField("window_start", TimestampType())]
    + [StructField(name, LongType()) for name in (
        "expected_impressions", "expected_clicks", "actual_impressions", "actual_clicks", "aggregate_rows",
        "impressions_diff", "clicks_diff", "revision_gap", "revisions_over_latest", "duplicated_revisions",
    )]
)


def assert_frame(got: DataFrame, expected: DataFrame) -> None:
    """Same columns and types, same rows in any order. (pyspark's
    assertDataFrameEqual imports pyspark.pandas, which fails with pandas 3.)"""
    assert [(f.name, f.dataType) for f in got.schema] == [(f.name, f.dataType) for f in expected.schema]

    def rows(df: DataFrame) -> list[tuple]:
        return sorted((tuple(r) for r in df.collect()), key=lambda t: [(v is None, v) for v in t])

    assert rows(got) == rows(expected)


def test_reconciliation_frame_consistent_hour(spark: SparkSession) -> None:
    f = frames(spark)
    got = Q.reconciliation_frame(f.raw_df, f.quarantine_df, f.aggregates_df)
    expected = spark.createDataFrame(
        [
            ("region-local", "ad-1", at(0), 2, 1, 2, 1, 1, 0, 0, 0, 0, 0),
            ("region-local", "ad-2", at(1), 1, 0, 1, 0, 1, 0, 0, 0, 0, 0),
        ],
        RECON_SCHEMA,
    )
    assert_frame(got, expected)


def test_reconciliation_frame_shows_every_kind_of_difference(spark: SparkSession) -> None:
    raw_rows = [
        raw("e1", "ad-1", "impression", at(0, 5)),
        raw("e3", "ad-1", "click", at(0, 59)),
        raw("e4", "ad-2", "impression", at(1, 10)),  # no aggregate: missing
        raw("e5", "ad-3", "click", at(2, 0)),  # late, quarantined: not expected
        raw("e6", "ad-4", "click", at(3, 0)),  # late, but the late record is from the DLQ side: still expected
    ]
    quarantine_rows = [
        late("e5", "ad-3", "click", at(2, 0)),
        (tables.SOURCE_DLQ, "ad-events/0/3", "bad", b"x", "e6", None, None, None, HOUR, *kafka(0)),
    ]
    agg_rows = [
        agg("u1", "ad-1", at(0), 2, 1),  # one impression too many
        agg("u9", "ad-9", at(5), 1, 0),  # no raw events: unexpected
        agg("u4a", "ad-4", at(3), 0, 1),
        agg("u4b", "ad-4", at(3), 0, 1),  # duplicated aggregate: summed, shows as over-count
    ]
    f = frames(spark, raw_rows, quarantine_rows, agg_rows)
    got = Q.reconciliation_frame(f.raw_df, f.quarantine_df, f.aggregates_df)
    expected = spark.createDataFrame(
        [
            ("region-local", "ad-1", at(0), 1, 1, 2, 1, 1, 1, 0, 0, 0, 0),
            ("region-local", "ad-2", at(1), 1, 0, None, None, None, None, None, 0, 0, 0),
            # The duplicate is a revision 0 twice (the aggregates stand in for their revisions here).
            ("region-local", "ad-4", at(3), 0, 1, 0, 2, 2, 0, 1, 0, 0, 1),
            ("region-local", "ad-9", at(5), None, None, 1, 0, 1, None, None, 0, 0, 0),
        ],
        RECON_SCHEMA,
    )
    assert_frame(got, expected)


def test_each_region_is_reconciled_with_its_own_copy_of_an_event_that_reached_two(spark: SparkSession) -> None:
    """e1 reached regions a and b: the raw table keeps a's row, the
    quarantine lists b's copy; each region's aggregate counted it. A
    late_repeat (a retry listed again after the retention) is no late event."""
    raw_rows = [raw("e1", "ad-1", "impression", at(0, 5), region="a"), raw("e2", "ad-1", "click", at(0, 9), region="b")]
    copy = (tables.SOURCE_CROSS_REGION, "e1@b", "cross_region_duplicate", None, "e1", "ad-1", "impression", at(0, 5),
            HOUR, *kafka(3, "b"))
    repeat = (tables.SOURCE_LATE_REPEAT, "e2", "late_repeat", None, "e2", "ad-1", "click", at(0, 9), HOUR,
              *kafka(4, "b"))
    agg_rows = [agg("ua", "ad-1", at(0), 1, 0, region="a"), agg("ub", "ad-1", at(0), 1, 1, region="b")]
    f = frames(spark, raw_rows, [copy, repeat], agg_rows)
    got = Q.reconciliation_frame(f.raw_df, f.quarantine_df, f.aggregates_df)
    expected = spark.createDataFrame(
        [("a", "ad-1", at(0), 1, 0, 1, 0, 1, 0, 0, 0, 0, 0), ("b", "ad-1", at(0), 1, 1, 1, 1, 1, 0, 0, 0, 0, 0)],
        RECON_SCHEMA,
    )
    assert_frame(got, expected)


def test_reconciliation_frame_empty(spark: SparkSession) -> None:
    f = frames(spark, [], [], [])
    assert Q.reconciliation_frame(f.raw_df, f.quarantine_df, f.aggregates_df).count() == 0


def test_hour_must_be_aware_and_on_the_hour() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        Q.normalize_hour(datetime(2026, 11, 22, 12))
    with pytest.raises(ValueError, match="start of an hour"):
        Q.normalize_hour(at(1))
    plus_one = HOUR.astimezone(timezone(timedelta(hours=1)))
    assert Q.normalize_hour(plus_one) == HOUR


# ---------------------------------------------------------------------------
# validate_frames: a consistent hour, then one defect at a time


def test_consistent_hour_passes_and_keeps_results_and_docs(spark: SparkSession, settings) -> None:
    result = Q.validate_frames(settings, HOUR, frames(spark))
    assert result.success, result.describe()
    assert result.failed == []
    assert result.hour == HOUR
    # 7 raw + 18 aggregates + 4 reconciliation expectations.
    assert result.evaluated == 33
    assert result.parameters == {
        "expected_windows": 2,
        "expected_impressions": 3,
        "expected_clicks": 1,
        "max_late_share": 0.25,
        "min_raw_rows": 0,
        "expected_regions": [],
    }
    assert result.data_docs is not None and result.data_docs.name == "index.html"
    assert result.data_docs.is_relative_to(settings.home)
    assert result.data_docs.exists()
    for name in (Q.RAW_NAME, Q.AGGREGATES_NAME, Q.RECONCILIATION_NAME):
        assert name in result.data_docs.read_text()
        (page,) = result.data_docs.parent.glob(f"validations/{name}/adpipe-2026-11-22T12/*/*.html")
    body = json.loads(result.results_path.read_text())
    assert body["success"] is True and body["hour"] == "2026-11-22T12:00:00+00:00"
    assert body["engine"] == "pandas"  # a small hour
    assert set(body["suites"]) == {Q.RAW_NAME, Q.AGGREGATES_NAME, Q.RECONCILIATION_NAME}
    # GE's own validation results store kept every suite's result too.
    stored = list((settings.home / "gx" / "uncommitted" / "validations").rglob("*.json"))
    assert {p.relative_to(settings.home / "gx" / "uncommitted" / "validations").parts[0] for p in stored} == {
        Q.RAW_NAME,
        Q.AGGREGATES_NAME,
        Q.RECONCILIATION_NAME,
    }
    result.raise_for_failure()  # no exception
    assert "passed" in result.describe()


def test_the_engine_follows_the_hour_size_and_both_find_the_same_defects(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The fixture hour with a duplicated window (5 raw events and 3
    aggregate rows): pandas at a limit of 8 rows, Spark at 7, and Spark too
    when the hour fails to collect (here made to), in one GE context (its
    checkpoints move between the two data sources). Both engines fail the same
    expectations naming the same rows, with the same parameters; a count
    column that is not a long is named in each engine's own terms."""
    from unittest.mock import Mock

    from adpipe.lakehouse.quality import pandas_frames, validate

    f = frames(spark, agg_rows=[*AGG_ROWS, agg("u3", "ad-2", at(1), 1, 0)])
    aggregates = f.aggregates_df.withColumn("impressions", F.col("impressions").cast("double"))
    hour_frames = Q.HourFrames(f.raw_df, f.quarantine_df, aggregates)
    env = {"ADPIPE_HOME": str(tmp_path), "ADPIPE_MAX_LATE_SHARE": "0.25", "ADPIPE_GATE_PANDAS_MAX_ROWS": "8"}
    on_pandas = Q.validate_frames(load_settings(env), HOUR, hour_frames)
    one_over = load_settings({**env, "ADPIPE_GATE_PANDAS_MAX_ROWS": "7"})
    assert validate._pandas_input(one_over, hour_frames, Q.KafkaFacts()) is None  # one row over the limit: Spark
    monkeypatch.setattr(pandas_frames, "collect", Mock(side_effect=MemoryError("the driver has no room for the hour")))
    on_spark = Q.validate_frames(load_settings(env), HOUR, hour_frames)
    engines = [json.loads(r.results_path.read_text())["engine"] for r in (on_pandas, on_spark)]
    assert engines == ["pandas", "spark"] and "did not collect to pandas: the driver has no room" in caplog.text
    assert on_pandas.evaluated == on_spark.evaluated == 33 and on_pandas.parameters == on_spark.parameters
    assert failed_with(on_pandas, "expect_column_values_to_be_of_type", "type_='int64'", "observed 'float64'")
    assert failed_with(on_spark, "expect_column_values_to_be_of_type", "type_='LongType'", "observed 'DoubleType'")

    def others(result: Q.QualityResult) -> list[str]:
        return [line for line in result.failed if "to_be_of_type" not in line]

    # The duplicated window is a revision held twice too (no revisions given: the aggregates are theirs).
    assert others(on_pandas) == others(on_spark) and len(others(on_pandas)) == 5
    # An unexpected row names the gate's index columns first, then the rest by name.
    row = "{ad_id='ad-2', window_start=2026-11-22T12:01:00, region='region-local'}"
    assert any(f"e.g. {row}; {row}" in line for line in others(on_pandas))


def test_the_docs_index_lists_the_newest_results_only(
    spark: SparkSession, settings, monkeypatch: pytest.MonkeyPatch  # noqa: ANN001
) -> None:
    """GE rebuilds the index from every stored result after each run: it is
    bounded to the newest DOCS_INDEX_LIMIT (here 3: one hour's three suites)."""
    from adpipe.lakehouse.quality import context as gx_context

    monkeypatch.setattr(gx_context, "DOCS_INDEX_LIMIT", 3)
    for hour in (HOUR, HOUR + timedelta(hours=1)):
        result = Q.validate_frames(settings, hour, frames(spark))
    index = result.data_docs.read_text()
    assert "adpipe-2026-11-22T13" in index and "adpipe-2026-11-22T12" not in index
    # The older hour's pages are still built, and reachable from its own page.
    assert list(result.data_docs.parent.glob("validations/*/adpipe-2026-11-22T12/*/*.html"))
    assert "validation_results_limit: 3" in (settings.home / "gx" / "great_expectations.yml").read_text()


def test_injected_duplicate_aggregate_fires_naming_the_expectation(spark: SparkSession, settings) -> None:
    result = Q.validate_frames(settings, HOUR, frames(spark, agg_rows=[*AGG_ROWS, AGG_ROWS[0]]))
    assert not result.success
    (line,) = failed_with(result, Q.AGGREGATES_NAME, "expect_column_values_to_be_unique", "column='record_uuid'")
    assert "2 unexpected of 3 rows" in line and "'u1'" in line
    failed_with(result, "expect_compound_columns_to_be_unique", "column_list=['region', 'ad_id', 'window_start']")
    failed_with(result, "expect_table_row_count_to_equal", "value=2", "observed 3")
    with pytest.raises(Q.QualityError) as err:
        result.raise_for_failure()
    assert "expect_column_values_to_be_unique(column='record_uuid')" in str(err.value)
    assert err.value.result is result


def test_duplicate_ad_minute_with_other_uuid_fails(spark: SparkSession, settings) -> None:
    rows = [*AGG_ROWS, agg("u3", "ad-1", at(0), 2, 1)]
    result = Q.validate_frames(settings, HOUR, frames(spark, agg_rows=rows))
    assert not result.success
    failed_with(result, "expect_compound_columns_to_be_unique", "'ad-1'")
    assert not [line for line in result.failed if "column='record_uuid'" in line]


def test_a_late_share_above_the_limit_fails_naming_the_expectation(spark: SparkSession, tmp_path: Path) -> None:
    strict = load_settings({"ADPIPE_HOME": str(tmp_path)})  # the default: 1 %
    assert strict.max_late_share == 0.01
    result = Q.validate_frames(strict, HOUR, frames(spark))  # one late event of five: 20 %
    assert not result.success
    (line,) = failed_with(result, Q.RAW_NAME, "expect_column_mean_to_be_between", "column='is_late'")
    assert "0.2" in line, line
    assert [f for f in result.failed if "is_late" not in f] == []  # nothing else is wrong with the hour
    lenient = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_MAX_LATE_SHARE": "0.2"})
    assert Q.validate_frames(lenient, HOUR, frames(spark)).success  # the bound is inclusive


def test_two_regions_serving_one_ad_in_one_minute_pass(spark: SparkSession, settings) -> None:
    """Each region counts its own events: ad-1 at 12:00 has e1 and e3 through
    this region and e2 through another, two aggregates that sum to the raw."""
    raw_rows = [
        RAW_ROWS[0],
        raw("e2", "ad-1", "impression", at(0, 40), region="region-eu"),
        *RAW_ROWS[2:],
    ]
    rows = [
        agg("u1", "ad-1", at(0), 1, 1),
        agg("u1-eu", "ad-1", at(0), 1, 0, region="region-eu"),
        AGG_ROWS[1],
    ]
    result = Q.validate_frames(settings, HOUR, frames(spark, raw_rows=raw_rows, agg_rows=rows))
    assert result.success, result.failed


@pytest.mark.parametrize(
    ("bad_row", "column"),
    [
        (agg("u2", "ad-2", at(1, 30), 1, 0), "window_start_us_past_minute"),
        (agg("u2", "ad-2", at(1), 1, 0, window_end=at(3)), "window_length_us"),
    ],
    ids=["start-at-30s", "end-not-start-plus-1min"],
)
def test_misaligned_window_fails(spark: SparkSession, settings, bad_row: tuple, column: str) -> None:
    result = Q.validate_frames(settings, HOUR, frames(spark, agg_rows=[AGG_ROWS[0], bad_row]))
    assert not result.success
    failed_with(result, "expect_column_values_to_be_in_set", f"column='{column}'", "1 unexpected of 2 rows")


def test_negative_count_fails(spark: SparkSession, settings) -> None:
    rows = [AGG_ROWS[0], agg("u2", "ad-2", at(1), 1, -1)]
    result = Q.validate_frames(settings, HOUR, frames(spark, agg_rows=rows))
    assert not result.success
    (line,) = failed_with(result, "expect_column_values_to_be_between", "column='clicks'", "min_value=0")
    assert "clicks=-1" in line


def test_count_off_by_one_fails_reconciliation_and_totals(spark: SparkSession, settings) -> None:
    rows = [agg("u1", "ad-1", at(0), 3, 1), AGG_ROWS[1]]
    result = Q.validate_frames(settings, HOUR, frames(spark, agg_rows=rows))
    assert not result.success
    (line,) = failed_with(result, Q.RECONCILIATION_NAME, "column='impressions_diff'")
    assert "ad_id='ad-1'" in line and "impressions_diff=1" in line
    failed_with(result, "expect_column_sum_to_be_between", "column='impressions'", "min_value=3", "observed 4")
    assert not [line for line in result.failed if "clicks" in line]


def test_raw_event_missing_from_aggregates_fails(spark: SparkSession, settings) -> None:
    raw_rows = [*RAW_ROWS, raw("e6", "ad-3", "click", at(7, 7))]
    result = Q.validate_frames(settings, HOUR, frames(spark, raw_rows=raw_rows))
    assert not result.success
    (line,) = failed_with(result, "expect_column_values_to_not_be_null", "column='actual_impressions'")
    assert "ad_id='ad-3'" in line
    failed_with(result, "expect_table_row_count_to_equal", "value=3", "observed 2")
    failed_with(result, "expect_column_sum_to_be_between", "column='clicks'", "min_value=2", "observed 1")


def test_aggregate_without_raw_events_fails(spark: SparkSession, settings) -> None:
    rows = [*AGG_ROWS, agg("u9", "ad-9", at(9), 1, 0)]
    result = Q.validate_frames(settings, HOUR, frames(spark, agg_rows=rows))
    assert not result.success
    failed_with(result, "expect_column_values_to_not_be_null", "column='expected_impressions'", "'ad-9'")


def test_late_event_counts_only_when_quarantined(spark: SparkSession, settings) -> None:
    # The consistent hour already holds e5, late and quarantined: excluded,
    # it passes (test above). Without its quarantine record, e5 is an
    # on-time event the aggregates missed.
    result = Q.validate_frames(settings, HOUR, frames(spark, quarantine_rows=[QUARANTINE_ROWS[1]]))
    assert not result.success
    failed_with(result, "column='actual_impressions'", "'ad-1'")
    assert result.parameters["expected_impressions"] == 4


def test_totals_mismatch_names_the_sum(spark: SparkSession, settings) -> None:
    rows = [AGG_ROWS[0], agg("u2", "ad-2", at(1), 1, 1)]
    result = Q.validate_frames(settings, HOUR, frames(spark, agg_rows=rows))
    assert not result.success
    (line,) = failed_with(result, "expect_column_sum_to_be_between", "column='clicks'")
    assert "min_value=1, max_value=1" in line and "observed 2" in line


def test_count_type_must_be_long(spark: SparkSession, settings) -> None:
    f = frames(spark)
    doubled = f.aggregates_df.withColumn("impressions", F.col("impressions").cast("double"))
    result = Q.validate_frames(settings, HOUR, Q.HourFrames(f.raw_df, f.quarantine_df, doubled))
    assert not result.success
    failed_with(result, "expect_column_values_to_be_of_type", "column='impressions'", "observed 'float64'")


def test_raw_duplicate_event_id_fails(spark: SparkSession, settings) -> None:
    raw_rows = [*RAW_ROWS, raw("e1", "ad-1", "impression", at(0, 5), offset=9)]
    result = Q.validate_frames(settings, HOUR, frames(spark, raw_rows=raw_rows))
    assert not result.success
    (line,) = failed_with(result, Q.RAW_NAME, "expect_column_values_to_be_unique", "column='event_id'")
    assert "'e1'" in line
    # The reconciliation counts the rows as they are (event_id is the raw
    # table's key): the event's minute shows one impression missing too.
    (recon,) = failed_with(result, Q.RECONCILIATION_NAME, "impressions_diff")
    assert "ad_id='ad-1'" in recon and "impressions_diff=-1" in recon
    assert not [line for line in result.failed if "'ad-2'" in line]  # the other minute is fine


def test_empty_hour_is_valid(spark: SparkSession, settings) -> None:
    result = Q.validate_frames(settings, HOUR, frames(spark, [], [], []))
    assert result.success
    assert result.evaluated == 0
    assert any("empty hour" in note for note in result.notes)
    assert json.loads(result.results_path.read_text())["success"] is True


def test_hour_of_only_late_events_still_checks_raw(spark: SparkSession, tmp_path: Path) -> None:
    raw_rows = [raw("e5", "ad-1", "impression", at(2, 1))]
    hour_frames = frames(spark, raw_rows, [QUARANTINE_ROWS[0]], [])
    # Every event of the hour late: the late-share gate fails it, and only it.
    result = Q.validate_frames(load_settings({"ADPIPE_HOME": str(tmp_path)}), HOUR, hour_frames)
    assert not result.success
    failed_with(result, Q.RAW_NAME, "column='is_late'", "observed 1")
    assert result.evaluated == 8 and len(result.failed) == 1  # the raw suite only
    assert any("nothing to reconcile" in note for note in result.notes)
    lenient = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_MAX_LATE_SHARE": "1"})
    assert Q.validate_frames(lenient, HOUR, hour_frames).success


# ---------------------------------------------------------------------------
# What Kafka says of the hour: input, regions, retention


def test_an_hour_with_input_in_kafka_and_no_rows_fails_it_is_never_empty(spark: SparkSession, settings) -> None:
    facts = Q.KafkaFacts(regions_with_input=("region-local",))
    result = Q.validate_frames(settings, HOUR, frames(spark, [], [], []), facts)
    assert not result.success
    failed_with(result, Q.RAW_NAME, "expect_table_row_count_to_be_between", "min_value=1", "observed 0")
    failed_with(result, Q.RAW_NAME, "expect_column_distinct_values_to_contain_set", "column='region'")
    assert not any("empty hour" in note for note in result.notes)


def test_a_configured_region_with_input_but_no_rows_fails_naming_it(spark: SparkSession, settings) -> None:
    facts = Q.KafkaFacts(regions_with_input=("region-local", "eu-west"))
    result = Q.validate_frames(settings, HOUR, frames(spark), facts)
    assert not result.success
    (line,) = failed_with(result, "expect_column_distinct_values_to_contain_set", "column='region'")
    assert "eu-west" in line
    assert len(result.failed) == 1
    assert Q.validate_frames(settings, HOUR, frames(spark), Q.KafkaFacts(("region-local",))).success


def test_windows_the_stream_has_not_closed_expect_no_aggregate_yet(spark: SparkSession, settings) -> None:
    # A quiet region's hour is closed by the clock while its stream's
    # watermark is still at 12:02:30: the 12:02 window (e5..e7) is not
    # emitted yet, so it has no aggregate and must not be expected.
    open_window = [raw(f"e{i}", "ad-3", "impression", at(2, 10 + i)) for i in (6, 7)]
    mark = int(at(2, 30).timestamp() * 1000)
    kept = Q.emitted_only(frames(spark, [*RAW_ROWS, *open_window]).raw_df, {"region-local": mark})
    assert sorted(r.event_id for r in kept.collect()) == ["e1", "e2", "e3", "e4"]  # 12:00 and 12:01 only
    assert Q.emitted_only(frames(spark).raw_df, {}).count() == 0  # a stream that never committed
    facts = Q.KafkaFacts(watermarks={"region-local": mark})
    result = Q.validate_frames(settings, HOUR, frames(spark, [*RAW_ROWS, *open_window]), facts)
    assert result.success, result.describe()
    assert result.parameters["expected_windows"] == 2
    # Without the watermark the same rows fail: the 12:02 window has no aggregate.
    unfiltered = Q.validate_frames(settings, HOUR, frames(spark, [*RAW_ROWS, *open_window]))
    failed_with(unfiltered, Q.RECONCILIATION_NAME, "column='actual_impressions'")


def test_an_hour_kafka_no_longer_holds_fails_rather_than_passes(spark: SparkSession, settings) -> None:
    gap = {"region": "region-local", "topic": "ad-events", "partition": 2, "first_offset": 900,
           "first_timestamp_ms": 1_795_400_000_000}
    result = Q.validate_frames(settings, HOUR, frames(spark, [], [], []), Q.KafkaFacts(retention_gaps=(gap,)))
    assert not result.success
    (line,) = failed_with(result, "kafka_retention", "ad-events[2]", "offset 900")
    assert "can no longer prove" in line


# ---------------------------------------------------------------------------
# validate_hour (reads the tables), repeated runs, two processes


def test_validate_hour_reads_only_that_hour_and_reruns(spark: SparkSession, settings, monkeypatch) -> None:
    other = HOUR + timedelta(hours=1)
    views = {}
    for name, schema, rows in (
        ("RAW", tables.RAW_SCHEMA, [*RAW_ROWS, raw("x1", "ad-1", "click", other)]),  # x1: 1 click
        ("QUARANTINE", tables.QUARANTINE_SCHEMA, QUARANTINE_ROWS),
        ("AGGREGATES", tables.AGGREGATES_SCHEMA, [*AGG_ROWS, agg("x", "ad-1", other, 7, 7)]),
        ("REVISIONS", tables.REVISIONS_SCHEMA, [*AGG_ROWS, agg("x", "ad-1", other, 7, 7)]),
        ("LOAD_RUNS", tables.LOAD_RUNS_SCHEMA, []),
    ):
        view = f"quality_test_{name.lower()}"
        spark.createDataFrame(rows, schema).createOrReplaceTempView(view)
        monkeypatch.setattr(tables, name, view)
        views[name] = view
    try:
        first = Q.validate_hour(settings, HOUR, spark)
        second = Q.validate_hour(settings, HOUR, spark)
        assert first.success and second.success, first.describe() + "\n" + second.describe()
        assert first.evaluated == second.evaluated == 33
        assert first.results_path != second.results_path
        assert first.results_path.exists() and second.results_path.exists()
        # Re-running updated the stored suites in place instead of adding copies.
        suites = sorted(p.name for p in (settings.home / "gx" / "expectations").glob("*.json"))
        assert suites == sorted(f"{n}.json" for n in (Q.RAW_NAME, Q.AGGREGATES_NAME, Q.RECONCILIATION_NAME))
        # The rows of the next hour (inconsistent on purpose) were not read
        # above; read on their own, they fail.
        next_hour = Q.validate_hour(settings, other, spark)
        assert not next_hour.success
        assert next_hour.parameters == {
            "expected_windows": 1,
            "expected_impressions": 0,
            "expected_clicks": 1,
            "max_late_share": 0.25,
            "min_raw_rows": 0,
            "expected_regions": [],
        }
        failed_with(next_hour, "expect_column_sum_to_be_between", "column='clicks'", "observed 7")
    finally:
        for view in views.values():
            spark.catalog.dropTempView(view)


SETUP_SCRIPT = """
import sys
from adpipe.lakehouse.quality.context import context_lock, set_up_checkpoints
from adpipe.settings import load_settings
settings = load_settings({"ADPIPE_HOME": sys.argv[1]})
with context_lock(settings):
    _, checkpoints = set_up_checkpoints(settings)
print(sorted(checkpoints))
"""


def test_two_processes_set_up_the_same_context(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SETUP_SCRIPT, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert Q.AGGREGATES_NAME in out


def test_failure_line_for_an_expectation_error() -> None:
    class Config:
        type = "expect_column_values_to_be_unique"
        kwargs = {"column": "nope"}
        notes = None

    class Result:
        expectation_config = Config()
        exception_info = {"raised_exception": True, "exception_message": "column nope not found"}
        result: dict = {}

    line = Q.failure_line("suite", Result())
    assert line == "suite: expect_column_values_to_be_unique(column='nope'): error: column nope not found"
