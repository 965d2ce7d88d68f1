"""The quality gate's three expectation suites, GE built-in expectations only:
what the raw events, the aggregates and their reconciliation must satisfy.

Each :data:`GATES` entry names one data asset, suite, validation definition
and checkpoint, the suite's expectations, and the columns a failure names
rows by. Numbers known only at run time (the hour's expected windows and
totals, the late share, the regions with input) are ``$PARAMETER``
expectation parameters, named by the ``P_*`` constants.

The suites are the same on both engines the gate runs on (Spark, or pandas
for a small hour: :mod:`adpipe.lakehouse.quality.validate`) but for the name
of a 64-bit integer column's type, which GE reads in the engine's terms."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adpipe.lakehouse.quality.frames import MINUTE_US

RAW_NAME = "adpipe_ad_events_raw"
AGGREGATES_NAME = "adpipe_ad_minute_aggregates"
RECONCILIATION_NAME = "adpipe_minute_reconciliation"

# Expectation parameter names ({"$PARAMETER": name} in the aggregates suite).
P_EXPECTED_WINDOWS = "expected_windows"
P_EXPECTED_IMPRESSIONS = "expected_impressions"
P_EXPECTED_CLICKS = "expected_clicks"
P_MAX_LATE_SHARE = "max_late_share"
P_EXPECTED_REGIONS = "expected_regions"
P_MIN_RAW_ROWS = "min_raw_rows"

EVENT_TYPES = ("impression", "click")
# What the raw and aggregates suites read (and the index columns their
# failures name rows by): the gate hands GE these columns only.
RAW_CHECKED_COLUMNS = (
    "event_id", "event_type", "event_time_hour", "event_hour", "is_late", "is_conflicting_copy", "region",
)
AGGREGATES_CHECKED_COLUMNS = (
    "record_uuid", "region", "ad_id", "window_start", "window_end", "window_start_us_past_minute",
    "window_length_us", "window_start_hour", "event_hour", "impressions", "clicks",
)

SPARK, PANDAS = "spark", "pandas"
# A LongType column as each engine's GE names it (pandas: a nullable Int64
# column's type is numpy's int64, as a plain int64 column's is).
_LONG_TYPE = {SPARK: "LongType", PANDAS: "int64"}


def _raw_expectations(engine: str) -> list[Any]:
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectColumnValuesToNotBeNull(column="event_id"),
        gxe.ExpectColumnValuesToBeUnique(column="event_id", notes="event_id is the raw table's key"),
        gxe.ExpectColumnValuesToBeInSet(column="event_type", value_set=list(EVENT_TYPES)),
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="event_time_hour", column_B="event_hour", notes="event_hour is the hour of event_time"
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="is_conflicting_copy",
            value_set=[0],
            notes="a raw event is the copy the stream counted, never one the DLQ lists as conflicting_duplicate",
        ),
        gxe.ExpectColumnMeanToBeBetween(
            column="is_late",
            min_value=0,
            max_value={"$PARAMETER": P_MAX_LATE_SHARE},
            notes="late events are at most ADPIPE_MAX_LATE_SHARE of the hour's valid events",
        ),
        gxe.ExpectTableRowCountToBeBetween(
            min_value={"$PARAMETER": P_MIN_RAW_ROWS},
            notes="an hour with a valid event in Kafka (written during it) is never empty",
        ),
        gxe.ExpectColumnDistinctValuesToContainSet(
            column="region",
            value_set={"$PARAMETER": P_EXPECTED_REGIONS},
            notes="every configured region with a valid event of the hour in Kafka has rows of it",
        ),
    ]


def _aggregates_expectations(engine: str) -> list[Any]:
    import great_expectations.expectations as gxe

    out: list[Any] = [
        gxe.ExpectColumnValuesToNotBeNull(column=name)
        for name in ("record_uuid", "ad_id", "window_start", "window_end")
    ]
    out += [
        gxe.ExpectColumnValuesToBeUnique(column="record_uuid", notes="record_uuid is the idempotency key"),
        # Regions count their own events: two regions may serve one ad in one
        # minute, each with its own aggregate (and record_uuid).
        gxe.ExpectCompoundColumnsToBeUnique(
            column_list=["region", "ad_id", "window_start"], notes="one aggregate per region, ad and minute"
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="window_start_us_past_minute", value_set=[0], notes="window_start is on the minute"
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="window_length_us", value_set=[MINUTE_US], notes="window_end = window_start + 1 minute"
        ),
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="window_start_hour", column_B="event_hour", notes="the window starts in its event_hour"
        ),
    ]
    for name in ("impressions", "clicks"):
        out += [
            gxe.ExpectColumnValuesToNotBeNull(column=name),
            gxe.ExpectColumnValuesToBeOfType(column=name, type_=_LONG_TYPE[engine]),
            gxe.ExpectColumnValuesToBeBetween(column=name, min_value=0, notes=f"{name} is non-negative"),
        ]
    out += [
        gxe.ExpectTableRowCountToEqual(
            value={"$PARAMETER": P_EXPECTED_WINDOWS},
            notes="one aggregate per (region, ad, minute) with on-time raw events",
        ),
        gxe.ExpectColumnSumToBeBetween(
            column="impressions",
            min_value={"$PARAMETER": P_EXPECTED_IMPRESSIONS},
            max_value={"$PARAMETER": P_EXPECTED_IMPRESSIONS},
            notes="the hour's impressions = distinct on-time raw impressions",
        ),
        gxe.ExpectColumnSumToBeBetween(
            column="clicks",
            min_value={"$PARAMETER": P_EXPECTED_CLICKS},
            max_value={"$PARAMETER": P_EXPECTED_CLICKS},
            notes="the hour's clicks = distinct on-time raw clicks",
        ),
    ]
    return out


def _reconciliation_expectations(engine: str) -> list[Any]:
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectColumnValuesToNotBeNull(
            column="actual_impressions", notes="every (ad, minute) with on-time raw events has an aggregate"
        ),
        gxe.ExpectColumnValuesToNotBeNull(
            column="expected_impressions", notes="every aggregate has on-time raw events"
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="impressions_diff", value_set=[0], notes="aggregate impressions = distinct raw impressions"
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="clicks_diff", value_set=[0], notes="aggregate clicks = distinct raw clicks"
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="revision_gap",
            value_set=[0],
            notes="each window's aggregate is the highest revision of it in the revisions table",
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="revisions_over_latest",
            value_set=[0],
            notes="no earlier revision of a window counts more impressions or clicks than its latest",
        ),
        gxe.ExpectColumnValuesToBeInSet(
            column="duplicated_revisions", value_set=[0], notes="one row per window and revision in the revisions"
        ),
    ]


@dataclass(frozen=True)
class _Gate:
    """One checkpoint: a data asset, its suite, and how results name rows."""

    name: str  # asset, suite, validation definition and checkpoint name
    expectations: Any  # (engine) -> list of expectations
    index_columns: tuple[str, ...]  # identify unexpected rows in the results


GATES = (
    _Gate(RAW_NAME, _raw_expectations, ("event_id",)),
    _Gate(AGGREGATES_NAME, _aggregates_expectations, ("ad_id", "window_start")),
    _Gate(RECONCILIATION_NAME, _reconciliation_expectations, ("ad_id", "window_start")),
)
# Per gate, the columns its failures name an unexpected row by.
INDEX_COLUMNS = {gate.name: gate.index_columns for gate in GATES}
