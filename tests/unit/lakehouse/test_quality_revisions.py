"""The gate on revised windows and re-stamped retries (adpipe.lakehouse.quality),
on the small hour of test_quality: the aggregates hold each window's latest
revision, the revisions every one; a raw event is the copy the stream
counted. Each defect fails with the expectation that catches it named."""

from __future__ import annotations

from pathlib import Path

import pytest
from adpipe.lakehouse import quality as Q
from adpipe.lakehouse import tables
from adpipe.settings import Settings, load_settings
from pyspark.sql import SparkSession

from tests.unit.lakehouse.test_quality import (
    AGG_ROWS,
    HOUR,
    QUARANTINE_ROWS,
    RAW_ROWS,
    agg,
    at,
    failed_with,
    frames,
    kafka,
    raw,
)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_MAX_LATE_SHARE": "0.25"})  # test_quality's hour


def revised(spark: SparkSession, history: list[tuple], latest: list[tuple]) -> Q.HourFrames:
    f = frames(spark, agg_rows=latest)
    history_df = spark.createDataFrame(history, tables.REVISIONS_SCHEMA)
    return Q.HourFrames(f.raw_df, f.quarantine_df, f.aggregates_df, history_df)


# ad-1 at 12:00 emitted twice: revision 0 with e1 and e3, revision 1 with e2 too (the fixture's raw events).
REVISED = [agg("u1", "ad-1", at(0), 1, 1), agg("u1r1", "ad-1", at(0), 2, 1, revision=1), AGG_ROWS[1]]
LATEST = [agg("u1r1", "ad-1", at(0), 2, 1, revision=1), AGG_ROWS[1]]


def test_a_revised_window_reconciles_its_latest_revision(spark: SparkSession, settings) -> None:
    result = Q.validate_frames(settings, HOUR, revised(spark, REVISED, LATEST))
    assert result.success, result.describe()


def test_a_revision_counting_more_than_the_latest_fails(spark: SparkSession, settings) -> None:
    history = [*REVISED, agg("u1x", "ad-1", at(0), 3, 0, revision=2)]  # clicks fewer, impressions more
    result = Q.validate_frames(settings, HOUR, revised(spark, history, LATEST))
    assert not result.success
    (line,) = failed_with(result, Q.RECONCILIATION_NAME, "revisions_over_latest")
    assert "ad_id='ad-1'" in line and "revisions_over_latest=1" in line
    # It is also a revision above the table's: the table does not hold the newest loaded.
    failed_with(result, Q.RECONCILIATION_NAME, "revision_gap", "revision_gap=1")


def test_a_table_left_at_an_older_revision_fails(spark: SparkSession, settings) -> None:
    result = Q.validate_frames(settings, HOUR, revised(spark, REVISED, [REVISED[0], AGG_ROWS[1]]))
    assert not result.success
    failed_with(result, Q.RECONCILIATION_NAME, "revision_gap", "ad_id='ad-1'", "revision_gap=1")
    failed_with(result, Q.RECONCILIATION_NAME, "impressions_diff", "impressions_diff=-1")  # e2 not counted
    # A revision held twice, and a latest the history lacks, fail too.
    twice = Q.validate_frames(settings, HOUR, revised(spark, [*REVISED, REVISED[1]], LATEST))
    failed_with(twice, Q.RECONCILIATION_NAME, "duplicated_revisions", "duplicated_revisions=1")
    lacking = Q.validate_frames(settings, HOUR, revised(spark, REVISED[:2], LATEST))
    failed_with(lacking, Q.RECONCILIATION_NAME, "revision_gap", "ad_id='ad-2'", "revision_gap=-1")


def test_a_raw_event_the_dlq_lists_as_a_conflicting_copy_fails(spark: SparkSession, settings) -> None:
    """e3 (a click at 12:00:59) was sent again at 12:02:59: the stream
    counted the first copy and listed the second as conflicting_duplicate.
    The raw table must hold the first; holding the listed one fails the
    raw suite (and the minutes, which then count it at 12:02)."""
    listed = (tables.SOURCE_DLQ, "ad-events/2/9", "conflicting_duplicate", b"{}", "e3", "ad-1", "click", at(2, 59),
              HOUR, *kafka(9))
    good = Q.validate_frames(settings, HOUR, frames(spark, quarantine_rows=[*QUARANTINE_ROWS, listed]))
    assert good.success, good.describe()
    raw_rows = [*RAW_ROWS[:2], raw("e3", "ad-1", "click", at(2, 59), offset=9), *RAW_ROWS[3:]]
    bad = Q.validate_frames(settings, HOUR, frames(spark, raw_rows, [*QUARANTINE_ROWS, listed]))
    assert not bad.success
    (line,) = failed_with(bad, Q.RAW_NAME, "is_conflicting_copy")
    assert "'e3'" in line
