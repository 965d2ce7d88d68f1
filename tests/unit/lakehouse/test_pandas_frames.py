"""The gate's frames computed in pandas (adpipe.lakehouse.quality.pandas_frames)
equal Spark's (adpipe.lakehouse.quality.frames), column for column and type
for type, on random hours full of what the gate exists to catch: duplicated
and wrongly typed events, events outside their hour, late listings of
another region's event, cross-region copies with missing fields, raw events
the DLQ lists as conflicting copies, duplicated and misaligned windows,
windows without events and events without windows, revisions above, below,
beside and without their window's latest, and each stream's watermark
present, absent or unknown."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest
from adpipe.lakehouse import tables
from adpipe.lakehouse.quality import pandas_frames
from adpipe.lakehouse.quality.frames import (
    HourFrames,
    emitted_only,
    pandas_frame,
    reconciliation_frame,
    with_conflict_flag,
    with_hour_check,
    with_late_flag,
    with_window_checks,
)
from adpipe.lakehouse.quality.suites import AGGREGATES_CHECKED_COLUMNS, RAW_CHECKED_COLUMNS
from adpipe.lakehouse.quality.validate import _expected_parameters
from pyspark.sql import SparkSession
from pyspark.sql.types import StructField, StructType

HOUR = datetime(2026, 11, 22, 12, tzinfo=UTC)
LOADED = datetime(2026, 11, 22, 13, 5, tzinfo=UTC)
REGIONS = ("region-a", "region-b")


def _kafka(rng: random.Random, region: str) -> tuple:
    return (region, "t", 0, rng.randrange(10**6), LOADED, None)


def random_hour(seed: int, events: int = 300) -> tuple[list, list, list, list]:
    """Raw, quarantine, aggregate and revision rows of one hour (table schemas)."""
    rng = random.Random(seed)
    ads = [f"ad-{i}" for i in range(6)]

    def time_in_hour() -> datetime:
        moment = HOUR + timedelta(seconds=rng.uniform(0, 3600))
        return moment + timedelta(hours=1) if rng.random() < 0.02 else moment  # a few outside their hour

    raw, quarantine, aggregates = [], [], []
    ids = []
    for i in range(events):
        event_id = rng.choice(ids) if ids and rng.random() < 0.03 else f"e{seed}-{i}"  # a few duplicated
        ids.append(event_id)
        region = rng.choice(REGIONS)
        event_type = rng.choices(["impression", "click", "view"], [70, 28, 2])[0]
        moment = time_in_hour()
        raw.append((event_id, rng.choice(ads), "c", event_type, moment, HOUR, *_kafka(rng, region)))
    for row in rng.sample(raw, len(raw) // 10):  # late listings, some of another region, some twice
        region = row[6] if rng.random() < 0.8 else rng.choice(REGIONS)
        listing = (tables.SOURCE_LATE, row[0], "late", None, row[0], row[1], row[3], row[4], HOUR)
        quarantine += [(*listing, *_kafka(rng, region))] * rng.choice([1, 1, 2])
    for row in rng.sample(raw, len(raw) // 15):  # another region's copy, a field sometimes missing
        other = REGIONS[1] if row[6] == REGIONS[0] else REGIONS[0]
        ad_id = None if rng.random() < 0.1 else row[1]
        event_type = None if rng.random() < 0.1 else row[3]
        moment = None if rng.random() < 0.1 else row[4]
        quarantine.append((tables.SOURCE_CROSS_REGION, f"{row[0]}@{other}", "cross_region", None, row[0], ad_id,
                           event_type, moment, HOUR, *_kafka(rng, other)))
    quarantine += [(tables.SOURCE_LATE, f"k{i}", "late", None, None, None, None, None, HOUR, *_kafka(rng, "region-a"))
                   for i in range(2)]  # a late listing without an id
    quarantine += [(tables.SOURCE_DLQ, f"t/0/{i}", "not_json", b"{", None, None, None, None, HOUR,
                    *_kafka(rng, rng.choice(REGIONS))) for i in range(3)]
    for i, row in enumerate(rng.sample(raw, len(raw) // 20)):  # a conflicting copy: of this row, or another time
        moment = row[4] if rng.random() < 0.7 else row[4] + timedelta(minutes=2)
        region = row[6] if rng.random() < 0.9 else rng.choice(REGIONS)
        quarantine.append((tables.SOURCE_DLQ, f"t/1/{i}", "conflicting_duplicate", b"{", row[0], row[1], row[3],
                           moment, HOUR, *_kafka(rng, region)))
    for n in range(events // 3):
        start = HOUR + timedelta(minutes=rng.randrange(62))  # some in the next hour
        if rng.random() < 0.03:
            start += timedelta(seconds=7)  # off the minute
        end = start + timedelta(minutes=1 if rng.random() < 0.95 else 2)
        row = (f"u{seed}-{n}", rng.choice(ads), start, end, rng.randrange(5), rng.randrange(3), HOUR,
               *_kafka(rng, rng.choice(REGIONS)), rng.choice([0, 0, 0, 1, None]))
        aggregates += [row] * rng.choice([1] * 20 + [2])  # a few duplicated
    revisions = []
    for row in aggregates:  # the history: the latest, and maybe earlier ones, a few counting more
        revisions.append(row)
        for earlier in range(rng.choice([0, 0, 1, 2])):
            revisions.append((f"{row[0]}-r{earlier}", *row[1:4], max(0, row[4] - rng.randrange(-1, 3)), row[5],
                              *row[6:13], earlier))
    revisions += [row for row in rng.sample(revisions, len(revisions) // 30)]  # a revision twice
    revisions += [(f"h{seed}-{n}", "ad-h", HOUR + timedelta(minutes=n), HOUR + timedelta(minutes=n + 1), 1, 0, HOUR,
                   *_kafka(rng, REGIONS[0]), 0) for n in range(3)]  # a history without its latest
    aggregates.append((f"n{seed}", "ad-n", HOUR, HOUR + timedelta(minutes=1), 1, 0, HOUR, *_kafka(rng, REGIONS[1]),
                       2))  # a latest without its history
    return raw, quarantine, aggregates, revisions


def in_order(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(list(frame.columns), na_position="first").reset_index(drop=True)


def assert_same(spark_frame: pd.DataFrame, pandas_frame: pd.DataFrame) -> None:
    assert list(pandas_frame.columns) == list(spark_frame.columns)
    pd.testing.assert_frame_equal(in_order(pandas_frame), in_order(spark_frame), check_dtype=True)


def hour_frames(spark: SparkSession, raw: list, quarantine: list, aggregates: list, revisions: list) -> HourFrames:
    return HourFrames(
        raw_df=spark.createDataFrame(raw, tables.RAW_SCHEMA),
        quarantine_df=spark.createDataFrame(quarantine, tables.QUARANTINE_SCHEMA),
        aggregates_df=spark.createDataFrame(aggregates, tables.AGGREGATES_SCHEMA),
        revisions_df=spark.createDataFrame(revisions, tables.REVISIONS_SCHEMA),
    )


def spark_raw_checked(frames: HourFrames) -> pd.DataFrame:
    flagged = with_conflict_flag(with_late_flag(with_hour_check(frames.raw_df), frames.quarantine_df),
                                 frames.quarantine_df)
    return pandas_frame(flagged.select(*RAW_CHECKED_COLUMNS))


def watermark_cases(raw: list) -> list[dict[str, int] | None]:
    middle = int((HOUR + timedelta(minutes=31)).timestamp() * 1000)
    return [None, {}, {"region-a": middle}, {"region-a": middle, "region-b": middle + 7 * 60_000}]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pandas_frames_equal_sparks_on_random_hours(spark: SparkSession, seed: int) -> None:
    raw, quarantine, aggregates, revisions = random_hour(seed)
    frames = hour_frames(spark, raw, quarantine, aggregates, revisions)
    collected = pandas_frames.collect(frames)
    # The hour is what the generator meant: every kind of row is there.
    assert len(collected.raw) == len(raw) and collected.raw["event_id"].duplicated().any()
    assert collected.aggregates["record_uuid"].duplicated().any()
    assert set(collected.quarantine["source"]) == {tables.SOURCE_LATE, tables.SOURCE_CROSS_REGION, tables.SOURCE_DLQ}

    checked = pandas_frames.raw_checked(collected)
    assert_same(spark_raw_checked(frames), checked)
    assert checked["is_conflicting_copy"].sum() > 0
    spark_aggregates = with_window_checks(frames.aggregates_df).select(*AGGREGATES_CHECKED_COLUMNS)
    assert_same(pandas_frame(spark_aggregates), pandas_frames.aggregates_checked(collected))
    for watermarks in watermark_cases(raw):
        recon_df = reconciliation_frame(
            emitted_only(frames.raw_df, watermarks), frames.quarantine_df, frames.aggregates_df, frames.revisions_df
        )
        recon = pandas_frames.reconciliation(collected, watermarks)
        assert_same(pandas_frame(recon_df), recon)
        assert pandas_frames.expected_parameters(recon) == _expected_parameters(recon_df)
        # Not a vacuous equality: both sides see a mismatch, a missing window and an orphan one...
        assert (recon["impressions_diff"].fillna(0) != 0).any() or watermarks == {}
        assert recon["actual_impressions"].isna().any() or watermarks == {}
        assert recon["expected_impressions"].isna().any()
        # ...and revisions above their latest, twice over, without their latest or their history.
        assert (recon["revisions_over_latest"] > 0).any() and (recon["duplicated_revisions"] > 0).any()
        assert (recon["revision_gap"] > 0).any() and (recon["revision_gap"] < 0).any()


def test_pandas_frames_equal_sparks_on_empty_and_one_sided_hours(spark: SparkSession) -> None:
    raw, quarantine, aggregates, revisions = random_hour(4, events=30)
    for parts in (
        ([], [], [], []), (raw, [], [], []), ([], quarantine, [], []), ([], [], aggregates, []), ([], [], [], revisions)
    ):
        frames = hour_frames(spark, *parts)
        collected = pandas_frames.collect(frames)
        assert_same(spark_raw_checked(frames), pandas_frames.raw_checked(collected))
        recon_df = reconciliation_frame(frames.raw_df, frames.quarantine_df, frames.aggregates_df, frames.revisions_df)
        recon = pandas_frames.reconciliation(collected, None)
        assert_same(pandas_frame(recon_df), recon)
        assert pandas_frames.expected_parameters(recon) == _expected_parameters(recon_df)


def test_pandas_frames_equal_sparks_where_keys_and_counts_are_null(spark: SparkSession) -> None:
    """Frames of a looser schema than the tables' (validate_frames takes any):
    aggregates without an ad, a window or a count. Spark's join matches no
    null key and its sum over nulls only is null; pandas' would do neither."""
    raw, quarantine, aggregates, _revisions = random_hour(5, events=60)
    loose = StructType([StructField(f.name, f.dataType, True) for f in tables.AGGREGATES_SCHEMA.fields])
    # A cross-region copy without its ad meets an aggregate without its ad, in the same minute.
    copy = next(row for row in quarantine if row[0] == tables.SOURCE_CROSS_REGION)
    minute = copy[7].replace(second=0, microsecond=0)
    quarantine = [*quarantine, (*copy[:5], None, *copy[6:])]
    nulls = [
        ("n1", None, minute, minute + timedelta(minutes=1), 1, 0, HOUR, *_kafka(random.Random(0), copy[9]), 0),
        ("n2", "ad-1", None, None, 1, 0, HOUR, *_kafka(random.Random(1), "region-a"), 0),
        ("n3", "ad-9", HOUR, HOUR + timedelta(minutes=1), None, None, HOUR, *_kafka(random.Random(2), "region-b"),
         None),
    ]
    frames = HourFrames(
        raw_df=spark.createDataFrame(raw, tables.RAW_SCHEMA),
        quarantine_df=spark.createDataFrame(quarantine, tables.QUARANTINE_SCHEMA),
        aggregates_df=spark.createDataFrame([*aggregates, *nulls], loose),
    )
    collected = pandas_frames.collect(frames)
    recon_df = reconciliation_frame(frames.raw_df, frames.quarantine_df, frames.aggregates_df)
    recon = pandas_frames.reconciliation(collected, None)
    assert_same(pandas_frame(recon_df), recon)
    assert pandas_frames.expected_parameters(recon) == _expected_parameters(recon_df)
    unjoined = recon[recon["ad_id"].isna() & (recon["window_start"] == pd.Timestamp(minute).tz_convert(None))]
    # The copy's window and the aggregate's, side by side: never joined.
    assert unjoined["expected_impressions"].notna().any() and unjoined["actual_impressions"].notna().sum() == 1
    assert not (unjoined["expected_impressions"].notna() & unjoined["actual_impressions"].notna()).any()
    only_nulls = recon[recon["ad_id"] == "ad-9"]
    assert only_nulls["actual_impressions"].isna().all() and (only_nulls["aggregate_rows"] == 1).all()
    assert_same(pandas_frame(with_window_checks(frames.aggregates_df).select(*AGGREGATES_CHECKED_COLUMNS)),
                pandas_frames.aggregates_checked(collected))
