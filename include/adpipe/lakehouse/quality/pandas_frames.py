"""The gate's frames for GE's pandas engine, computed in pandas from the
hour's three tables collected once (a small hour): the same columns, types
and values as the Spark functions of :mod:`adpipe.lakehouse.quality.frames`
(``tests/unit/lakehouse/test_pandas_frames.py`` holds the two equal on
random hours), without the Spark jobs that built them there (the 10,000-ad
hour's reconciliation, late flags and row count: 6-7 s of a load).

Spark's semantics kept: a null key never matches in a join (pandas' would
match null with null), ``groupBy`` keeps a null key as a group, a sum over
nothing but nulls is null, and a count of a condition skips null values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from adpipe.lakehouse import tables
from adpipe.lakehouse.quality.frames import GATE_COLUMNS, MINUTE_US, HourFrames, pandas_frame
from adpipe.lakehouse.quality.suites import (
    AGGREGATES_CHECKED_COLUMNS,
    P_EXPECTED_CLICKS,
    P_EXPECTED_IMPRESSIONS,
    P_EXPECTED_WINDOWS,
    RAW_CHECKED_COLUMNS,
)

if TYPE_CHECKING:
    import pandas as pd

WINDOW_KEYS = ["region", "ad_id", "window_start"]
RECONCILIATION_COLUMNS = (
    "region", "ad_id", "window_start", "expected_impressions", "expected_clicks", "actual_impressions",
    "actual_clicks", "aggregate_rows", "impressions_diff", "clicks_diff",
)


@dataclass(frozen=True)
class CollectedHour:
    """The hour's three frames in pandas, cut to the columns the gate reads."""

    raw: pd.DataFrame
    quarantine: pd.DataFrame
    aggregates: pd.DataFrame


def collect(frames: HourFrames) -> CollectedHour:
    """The three frames collected through Arrow (one Spark job each)."""
    return CollectedHour(
        raw=pandas_frame(frames.raw_df.select(*GATE_COLUMNS["raw_df"])),
        quarantine=pandas_frame(frames.quarantine_df.select(*GATE_COLUMNS["quarantine_df"])),
        aggregates=pandas_frame(frames.aggregates_df.select(*GATE_COLUMNS["aggregates_df"])),
    )


def _micros(timestamps: pd.Series) -> pd.Series:
    """Microseconds since the epoch (``unix_micros``), null where the time is."""
    import pandas as pd

    values = timestamps.dt.as_unit("us").to_numpy(dtype="datetime64[us]").view("int64")
    return pd.Series(pd.arrays.IntegerArray(values, timestamps.isna().to_numpy()), index=timestamps.index)


def _late_ids(quarantine: pd.DataFrame) -> pd.DataFrame:
    late = quarantine[(quarantine["source"] == tables.SOURCE_LATE) & quarantine["event_id"].notna()]
    return late[["region", "event_id"]].drop_duplicates()


def raw_checked(collected: CollectedHour) -> pd.DataFrame:
    """``with_late_flag(with_hour_check(raw))`` cut to RAW_CHECKED_COLUMNS."""
    import pandas as pd

    raw = collected.raw
    late_ids = _late_ids(collected.quarantine)["event_id"].unique()
    checked = pd.DataFrame(
        {
            "event_id": raw["event_id"],
            "event_type": raw["event_type"],
            "event_time_hour": raw["event_time"].dt.floor("h"),
            "event_hour": raw["event_hour"],
            "is_late": raw["event_id"].isin(late_ids).astype("int32"),  # Spark's lit(1): an int
            "region": raw["region"],
        }
    )
    return checked[list(RAW_CHECKED_COLUMNS)].reset_index(drop=True)


def aggregates_checked(collected: CollectedHour) -> pd.DataFrame:
    """``with_window_checks(aggregates)`` cut to AGGREGATES_CHECKED_COLUMNS."""
    aggregates = collected.aggregates
    start_us = _micros(aggregates["window_start"])
    checked = aggregates.assign(  # the collected columns shared, not copied
        window_start_us_past_minute=start_us % MINUTE_US,  # Spark's pmod: never negative
        window_length_us=_micros(aggregates["window_end"]) - start_us,
        window_start_hour=aggregates["window_start"].dt.floor("h"),
    )
    return checked[list(AGGREGATES_CHECKED_COLUMNS)].reset_index(drop=True)


def emitted_only(raw: pd.DataFrame, watermarks: dict[str, int] | None) -> pd.DataFrame:
    """:func:`adpipe.lakehouse.quality.frames.emitted_only` in pandas."""
    if watermarks is None:
        return raw
    window_end_ms = _micros(raw["event_time"].dt.floor("min")) // 1000 + 60_000
    marks = raw["region"].map(watermarks).astype("Int64")
    return raw[(window_end_ms <= marks).fillna(False).astype(bool)]


def _any_null(frame: pd.DataFrame, columns: list[str]) -> pd.Series:
    return frame[columns].isna().any(axis=1)


def expected_minute_counts(raw: pd.DataFrame, quarantine: pd.DataFrame) -> pd.DataFrame:
    """:func:`adpipe.lakehouse.quality.frames.expected_minute_counts` in pandas."""
    import pandas as pd

    columns = ["region", "event_id", "ad_id", "event_type", "event_time"]
    copies = quarantine.loc[quarantine["source"] == tables.SOURCE_CROSS_REGION, columns]
    events = pd.concat([raw[columns], copies], ignore_index=True) if len(copies) else raw[columns]
    # The late keys hold no null (an event without its id keeps its counts).
    # Only the events whose id is late anywhere are matched by region too.
    late = _late_ids(quarantine)
    candidates = events[events["event_id"].isin(late["event_id"].unique())]
    if len(candidates):
        is_late = pd.MultiIndex.from_frame(candidates[["region", "event_id"]]).isin(pd.MultiIndex.from_frame(late))
        events = events.drop(index=candidates.index[is_late])
    counted = pd.DataFrame(
        {
            "region": events["region"],
            "ad_id": events["ad_id"],
            "window_start": events["event_time"].dt.floor("min"),
            "expected_impressions": events["event_type"].eq("impression").fillna(False).astype("int64"),
            "expected_clicks": events["event_type"].eq("click").fillna(False).astype("int64"),
        }
    )
    out = counted.groupby(WINDOW_KEYS, dropna=False, sort=False).sum().reset_index()
    return out.astype({"expected_impressions": "Int64", "expected_clicks": "Int64"})


def _spark_like(frame: pd.DataFrame) -> pd.DataFrame:
    """Nullable floats as the float64 with NaN Spark's collected doubles are
    (a count column that is no long, which the gate reports)."""
    import pandas as pd

    floats = {name: "float64" for name, dtype in frame.dtypes.items() if isinstance(dtype, pd.Float64Dtype)}
    return frame.astype(floats) if floats else frame


def reconciliation(collected: CollectedHour, watermarks: dict[str, int] | None) -> pd.DataFrame:
    """:func:`adpipe.lakehouse.quality.frames.reconciliation_frame` of the
    emitted raw events, in pandas."""
    import pandas as pd

    expected = expected_minute_counts(emitted_only(collected.raw, watermarks), collected.quarantine)
    grouped = collected.aggregates.groupby(WINDOW_KEYS, dropna=False, sort=False)
    actual = grouped[["impressions", "clicks"]].sum(min_count=1)
    actual.columns = ["actual_impressions", "actual_clicks"]
    actual["aggregate_rows"] = grouped.size().astype("Int64")
    actual = actual.reset_index()
    # Spark's join: a row with a null key meets nothing, on either side.
    expected_null, actual_null = _any_null(expected, WINDOW_KEYS), _any_null(actual, WINDOW_KEYS)
    joined = pd.concat(
        [
            expected[~expected_null].merge(actual[~actual_null], on=WINDOW_KEYS, how="outer", sort=False),
            expected[expected_null],
            actual[actual_null],
        ],
        ignore_index=True,
    )
    joined["impressions_diff"] = joined["actual_impressions"] - joined["expected_impressions"]
    joined["clicks_diff"] = joined["actual_clicks"] - joined["expected_clicks"]
    return _spark_like(joined[list(RECONCILIATION_COLUMNS)])


def expected_parameters(recon: pd.DataFrame) -> dict[str, int]:
    """What :func:`adpipe.lakehouse.quality.validate._expected_parameters` reads from Spark."""
    return {
        P_EXPECTED_WINDOWS: int(recon["expected_impressions"].notna().sum()),
        P_EXPECTED_IMPRESSIONS: int(recon["expected_impressions"].sum()),
        P_EXPECTED_CLICKS: int(recon["expected_clicks"].sum()),
        "recon_rows": len(recon),
    }
