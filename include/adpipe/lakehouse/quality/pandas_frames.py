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

from adpipe import schemas as S
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
    "actual_clicks", "aggregate_rows", "impressions_diff", "clicks_diff", "revision_gap", "revisions_over_latest",
    "duplicated_revisions",
)


@dataclass(frozen=True)
class CollectedHour:
    """The hour's frames in pandas, cut to the columns the gate reads."""

    raw: pd.DataFrame
    quarantine: pd.DataFrame
    aggregates: pd.DataFrame
    revisions: pd.DataFrame


def collect(frames: HourFrames) -> CollectedHour:
    """The four frames collected through Arrow (one Spark job each)."""
    return CollectedHour(
        raw=pandas_frame(frames.raw_df.select(*GATE_COLUMNS["raw_df"])),
        quarantine=pandas_frame(frames.quarantine_df.select(*GATE_COLUMNS["quarantine_df"])),
        aggregates=pandas_frame(frames.aggregates_df.select(*GATE_COLUMNS["aggregates_df"])),
        revisions=pandas_frame(frames.revisions().select(*GATE_COLUMNS["revisions_df"])),
    )


def _micros(timestamps: pd.Series) -> pd.Series:
    """Microseconds since the epoch (``unix_micros``), null where the time is."""
    import pandas as pd

    values = timestamps.dt.as_unit("us").to_numpy(dtype="datetime64[us]").view("int64")
    return pd.Series(pd.arrays.IntegerArray(values, timestamps.isna().to_numpy()), index=timestamps.index)


def _late_ids(quarantine: pd.DataFrame) -> pd.DataFrame:
    late = quarantine[(quarantine["source"] == tables.SOURCE_LATE) & quarantine["event_id"].notna()]
    return late[["region", "event_id"]].drop_duplicates()


def _conflicting_copies(raw: pd.DataFrame, quarantine: pd.DataFrame) -> pd.Series:
    """``with_conflict_flag``'s flag: whether a raw event's (region,
    event_id, event_time) is a copy the DLQ lists as conflicting_duplicate."""
    import pandas as pd

    keys = ["region", "event_id", "event_time"]
    listed = quarantine[
        (quarantine["source"] == tables.SOURCE_DLQ) & (quarantine["reason"] == S.REASON_CONFLICTING_DUPLICATE)
    ].dropna(subset=["event_id", "event_time"])
    flag = pd.Series(0, index=raw.index, dtype="int32")  # Spark's lit(1): an int
    if len(listed) and len(raw):
        known = raw[keys].notna().all(axis=1)  # a null never matches in Spark's join
        hits = pd.MultiIndex.from_frame(raw.loc[known, keys]).isin(pd.MultiIndex.from_frame(listed[keys]))
        flag[raw.index[known][hits]] = 1
    return flag


def raw_checked(collected: CollectedHour) -> pd.DataFrame:
    """``with_conflict_flag(with_late_flag(with_hour_check(raw)))`` cut to RAW_CHECKED_COLUMNS."""
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
            "is_conflicting_copy": _conflicting_copies(raw, collected.quarantine),
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


def _outer(left: pd.DataFrame, right: pd.DataFrame) -> pd.DataFrame:
    """Spark's full outer join on WINDOW_KEYS: a row with a null key meets nothing, on either side."""
    import pandas as pd

    left_null, right_null = _any_null(left, WINDOW_KEYS), _any_null(right, WINDOW_KEYS)
    return pd.concat(
        [
            left[~left_null].merge(right[~right_null], on=WINDOW_KEYS, how="outer", sort=False),
            left[left_null],
            right[right_null],
        ],
        ignore_index=True,
    )


def revision_stats(revisions: pd.DataFrame, aggregates: pd.DataFrame) -> pd.DataFrame:
    """:func:`adpipe.lakehouse.quality.frames.revision_stats` in pandas."""
    import pandas as pd

    latest = aggregates.groupby(WINDOW_KEYS, dropna=False, sort=False)[["impressions", "clicks"]].sum(min_count=1)
    latest.columns = ["latest_impressions", "latest_clicks"]
    latest = latest.reset_index()
    history = revisions.assign(revision=revisions["revision"].fillna(0))
    # A left join: a null key meets nothing.
    matched = history[~_any_null(history, WINDOW_KEYS)].merge(
        latest[~_any_null(latest, WINDOW_KEYS)], on=WINDOW_KEYS, how="left", sort=False
    )
    history = pd.concat([matched, history[_any_null(history, WINDOW_KEYS)]], ignore_index=True)
    over = (history["impressions"] > history["latest_impressions"]) | (history["clicks"] > history["latest_clicks"])
    history["over"] = over.fillna(False).astype("int64")
    grouped = history.groupby(WINDOW_KEYS, dropna=False, sort=False)
    return pd.DataFrame(
        {
            "history_max_revision": grouped["revision"].max().astype("Int64"),
            "history_rows": grouped.size().astype("Int64"),
            "history_revisions": grouped["revision"].nunique().astype("Int64"),
            "revisions_over_latest": grouped["over"].sum().astype("Int64"),
        }
    ).reset_index()


def reconciliation(collected: CollectedHour, watermarks: dict[str, int] | None) -> pd.DataFrame:
    """:func:`adpipe.lakehouse.quality.frames.reconciliation_frame` of the
    emitted raw events, in pandas."""
    expected = expected_minute_counts(emitted_only(collected.raw, watermarks), collected.quarantine)
    aggregates = collected.aggregates.assign(revision=collected.aggregates["revision"].fillna(0))
    grouped = aggregates.groupby(WINDOW_KEYS, dropna=False, sort=False)
    actual = grouped[["impressions", "clicks"]].sum(min_count=1)
    actual.columns = ["actual_impressions", "actual_clicks"]
    actual["aggregate_rows"] = grouped.size().astype("Int64")
    actual["latest_revision"] = grouped["revision"].max().astype("Int64")
    actual = actual.reset_index()
    joined = _outer(_outer(expected, actual), revision_stats(collected.revisions, collected.aggregates))
    joined["impressions_diff"] = joined["actual_impressions"] - joined["expected_impressions"]
    joined["clicks_diff"] = joined["actual_clicks"] - joined["expected_clicks"]
    joined["revision_gap"] = joined["history_max_revision"].fillna(-1) - joined["latest_revision"].fillna(-1)
    joined["revisions_over_latest"] = joined["revisions_over_latest"].fillna(0)
    joined["duplicated_revisions"] = (joined["history_rows"] - joined["history_revisions"]).fillna(0)
    return _spark_like(joined[list(RECONCILIATION_COLUMNS)])


def expected_parameters(recon: pd.DataFrame) -> dict[str, int]:
    """What :func:`adpipe.lakehouse.quality.validate._expected_parameters` reads from Spark."""
    return {
        P_EXPECTED_WINDOWS: int(recon["expected_impressions"].notna().sum()),
        P_EXPECTED_IMPRESSIONS: int(recon["expected_impressions"].sum()),
        P_EXPECTED_CLICKS: int(recon["expected_clicks"].sum()),
        "recon_rows": len(recon),
    }
