"""Great Expectations 1.x: the exactly-once proof for one hour of the Delta tables.

For one UTC ``event_hour`` this module reads the three tables of
:mod:`adpipe.lakehouse.tables` and runs three GE checkpoints on Spark DataFrames:

* ``adpipe_ad_events_raw`` on the raw events: ``event_id`` unique, a known
  ``event_type``, ``event_hour`` = the hour of ``event_time``.
* ``adpipe_ad_minute_aggregates`` on the aggregates: ``record_uuid`` unique,
  (``region``, ``ad_id``, ``window_start``) unique, windows aligned (start on the minute,
  end = start + 1 minute, in the validated hour), counts non-null
  non-negative ``LongType``; row count and the hour's impression and click
  totals equal to what the raw table implies (numbers computed in Spark and
  passed to GE as ``$PARAMETER`` expectation parameters at run time).
* ``adpipe_minute_reconciliation`` on :func:`reconciliation_frame`: for every
  (ad, minute) the aggregates' counts equal the distinct raw events minus
  those quarantined as late; no side missing.

GE runs from a file-backed context under ``settings.home / "gx"``: data
source, assets, suites, validation definitions and checkpoints are created or
updated on every run (under a file lock, so two processes never race on
"already exists"), results are kept by GE's validation results store, and
each checkpoint's ``UpdateDataDocsAction`` rebuilds the HTML Data Docs under
``gx/uncommitted/data_docs/local_site``. A combined JSON of the hour's results
is written next to them (:attr:`QualityResult.results_path`).

GE and pyspark 4.1: GE 1.24's Spark engine first tries
``pyspark.sql.connect`` ``SparkSession.builder.getOrCreate()``; without a
``SPARK_REMOTE`` that raises a ``ValueError`` that GE catches, and it then
takes the classic ``SparkSession.builder.getOrCreate()``, which returns our
already-running classic session. We give the data source no ``spark_config``
so GE never tries to reconfigure (or stop and restart) that session. Do not
set ``SPARK_REMOTE`` for processes that run these checks.
"""

from __future__ import annotations

import fcntl
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from adpipe.lakehouse import tables
from adpipe.settings import Settings

log = logging.getLogger(__name__)

DATASOURCE = "adpipe_spark"
BATCH_DEFINITION = "whole_dataframe"
DOCS_SITE = "local_site"

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

MINUTE_US = 60_000_000
EVENT_TYPES = ("impression", "click")
# What the raw suite reads (and the index column its failures name rows by).
RAW_CHECKED_COLUMNS = ("event_id", "event_type", "event_time_hour", "event_hour", "is_late", "region")
_EXAMPLES = 5


# --------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------


class QualityError(RuntimeError):
    """A quality gate failed; the message lists the failed expectations."""

    def __init__(self, message: str, result: QualityResult | None = None) -> None:
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class QualityResult:
    hour: datetime  # UTC, start of the hour
    success: bool
    evaluated: int  # number of expectations evaluated
    failed: list[str]  # one line per failed expectation: suite, type, column(s), observed value
    data_docs: Path | None  # index.html of the built Data Docs
    results_path: Path  # the JSON of this run's validation results
    notes: list[str] = field(default_factory=list)
    parameters: dict[str, Any] = field(default_factory=dict)  # the expectation parameters used

    def describe(self) -> str:
        verdict = "passed" if self.success else f"FAILED ({len(self.failed)} of {self.evaluated} expectations failed)"
        lines = [f"Great Expectations, hour {_hour_tag(self.hour)}: {verdict}; {self.evaluated} expectations evaluated"]
        lines += [f"  FAILED {line}" for line in self.failed]
        lines += [f"  note: {note}" for note in self.notes]
        if self.parameters:
            lines.append("  parameters: " + ", ".join(f"{k}={v}" for k, v in sorted(self.parameters.items())))
        lines.append(f"  results: {self.results_path}")
        lines.append(f"  data docs: {self.data_docs or '(not built)'}")
        return "\n".join(lines)

    def raise_for_failure(self) -> None:
        """Raise :class:`QualityError` naming every failed expectation, if any."""
        if not self.success:
            raise QualityError(self.describe(), self)


# --------------------------------------------------------------------------
# Frames
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class HourFrames:
    """The three tables' rows of one ``event_hour``."""

    raw_df: DataFrame
    quarantine_df: DataFrame
    aggregates_df: DataFrame


def normalize_hour(hour: datetime) -> datetime:
    """The hour as an aware UTC datetime; rejects naive or mid-hour values."""
    if hour.tzinfo is None or hour.utcoffset() is None:
        raise ValueError(f"hour {hour!r} must be timezone-aware (UTC)")
    hour = hour.astimezone(UTC)
    if (hour.minute, hour.second, hour.microsecond) != (0, 0, 0):
        raise ValueError(f"hour {hour.isoformat()} is not the start of an hour")
    return datetime(hour.year, hour.month, hour.day, hour.hour, tzinfo=UTC)


def _hour_tag(hour: datetime) -> str:
    return hour.astimezone(UTC).strftime("%Y-%m-%dT%H")


def hour_frames(spark: SparkSession, hour: datetime, staged_through: int | None = None) -> HourFrames:
    """The three tables' rows of ``event_hour == hour``: the published ones,
    or with ``staged_through`` the candidate a write-audit-publish run would
    publish: the published rows plus the staged rows of runs up to that one
    that are not published yet."""
    hour = normalize_hour(hour)

    def read(name: str, schema: Any) -> DataFrame:
        keys = next(k for s, k in tables.TABLES.values() if s is schema)
        names = schema.fieldNames()
        published = spark.table(name).where(F.col("event_hour") == F.lit(hour)).select(*names)
        if staged_through is None:
            return published
        staged = (
            spark.table(tables.staged(name))  # the staging twin of a published table
            .where((F.col("event_hour") == F.lit(hour)) & (F.col("load_run") <= F.lit(staged_through)))
            .select(*names)
            .join(published.select(*keys), list(keys), "left_anti")
        )
        return published.unionByName(staged)

    return HourFrames(
        raw_df=read(tables.RAW, tables.RAW_SCHEMA),
        quarantine_df=read(tables.QUARANTINE, tables.QUARANTINE_SCHEMA),
        aggregates_df=read(tables.AGGREGATES, tables.AGGREGATES_SCHEMA),
    )


def expected_minute_counts(raw_df: DataFrame, quarantine_df: DataFrame) -> DataFrame:
    """Per (``region``, ``ad_id``, ``window_start``): the distinct raw events
    of each type, without the ``event_id``s quarantined as late (the
    contract's counts). Each region's stream counts the events of its own
    raw topic, so the region is part of the key."""
    late_ids_df = (
        quarantine_df.where(F.col("source") == F.lit(tables.SOURCE_LATE))
        .where(F.col("event_id").isNotNull())
        .select("region", "event_id")
        .distinct()
    )
    # An event that reached several regions is counted by each one's stream:
    # the raw table holds one region's row, the quarantine the others' copies.
    event_columns = ["region", "event_id", "ad_id", "event_type", "event_time"]
    copies_df = quarantine_df.where(F.col("source") == F.lit(tables.SOURCE_CROSS_REGION)).select(*event_columns)
    return (
        raw_df.dropDuplicates(["event_id"])
        .select(*event_columns)
        .unionByName(copies_df)
        .join(late_ids_df, on=["region", "event_id"], how="left_anti")
        .withColumn("window_start", F.date_trunc("minute", F.col("event_time")))
        .groupBy("region", "ad_id", "window_start")
        .agg(
            F.count(F.when(F.col("event_type") == "impression", True)).alias("expected_impressions"),
            F.count(F.when(F.col("event_type") == "click", True)).alias("expected_clicks"),
        )
    )


def emitted_only(raw_df: DataFrame, watermarks: dict[str, int] | None) -> DataFrame:
    """The raw events whose minute window the region's stream has closed
    (window end at or before its committed watermark, epoch ms): only those
    can have an aggregate yet. A quiet region closes an hour by the clock
    while its last windows are still open in its stream (they are emitted
    with its next events, and loaded then as corrections). None: all."""
    if watermarks is None:
        return raw_df
    if not watermarks:
        return raw_df.where(F.lit(False))
    pairs = [item for region, mark in sorted(watermarks.items()) for item in (F.lit(region), F.lit(mark))]
    mark = F.create_map(*pairs)[F.col("region")]
    window_end_ms = F.unix_millis(F.date_trunc("minute", F.col("event_time"))) + F.lit(60_000)
    return raw_df.where(F.coalesce(window_end_ms <= mark, F.lit(False)))


def reconciliation_frame(raw_df: DataFrame, quarantine_df: DataFrame, aggregates_df: DataFrame) -> DataFrame:
    """Per (``region``, ``ad_id``, ``window_start``): expected counts (from
    raw) next to the aggregates' counts, full outer join, so a missing aggregate has null
    ``actual_*`` and an aggregate without raw events has null ``expected_*``.

    Columns: ``region``, ``ad_id``, ``window_start``, ``expected_impressions``,
    ``expected_clicks``, ``actual_impressions``, ``actual_clicks`` (summed over
    the aggregate rows of the key, so a duplicated aggregate shows as an
    over-count too), ``aggregate_rows``, ``impressions_diff`` and
    ``clicks_diff`` (actual - expected; null when a side is missing)."""
    expected_df = expected_minute_counts(raw_df, quarantine_df)
    actual_df = aggregates_df.groupBy("region", "ad_id", "window_start").agg(
        F.sum("impressions").alias("actual_impressions"),
        F.sum("clicks").alias("actual_clicks"),
        F.count(F.lit(1)).alias("aggregate_rows"),
    )
    return (
        expected_df.join(actual_df, on=["region", "ad_id", "window_start"], how="full_outer")
        .withColumn("impressions_diff", F.col("actual_impressions") - F.col("expected_impressions"))
        .withColumn("clicks_diff", F.col("actual_clicks") - F.col("expected_clicks"))
        .select(
            "region",
            "ad_id",
            "window_start",
            "expected_impressions",
            "expected_clicks",
            "actual_impressions",
            "actual_clicks",
            "aggregate_rows",
            "impressions_diff",
            "clicks_diff",
        )
    )


def with_window_checks(aggregates_df: DataFrame) -> DataFrame:
    """Helper columns GE's built-ins can check the window alignment on:
    ``window_start_us_past_minute`` (0 when the start is on the minute),
    ``window_length_us`` (60 000 000 for a one-minute window) and
    ``window_start_hour`` (must equal ``event_hour``)."""
    start_us = F.unix_micros(F.col("window_start"))
    return (
        aggregates_df.withColumn("window_start_us_past_minute", F.pmod(start_us, F.lit(MINUTE_US)))
        .withColumn("window_length_us", F.unix_micros(F.col("window_end")) - start_us)
        .withColumn("window_start_hour", F.date_trunc("hour", F.col("window_start")))
    )


def with_late_flag(raw_df: DataFrame, quarantine_df: DataFrame) -> DataFrame:
    """``is_late``: 1 for a raw event quarantined as late, else 0 (its mean
    is the hour's late share)."""
    late_ids_df = (
        quarantine_df.where(F.col("source") == F.lit(tables.SOURCE_LATE))
        .where(F.col("event_id").isNotNull())
        .select("event_id", F.lit(1).alias("is_late"))
        .distinct()
    )
    return raw_df.join(late_ids_df, on="event_id", how="left").withColumn(
        "is_late", F.coalesce(F.col("is_late"), F.lit(0))
    )


def with_hour_check(raw_df: DataFrame) -> DataFrame:
    """``event_time_hour``: the hour ``event_time`` falls in (must equal ``event_hour``)."""
    return raw_df.withColumn("event_time_hour", F.date_trunc("hour", F.col("event_time")))


# --------------------------------------------------------------------------
# Suites (GE built-in expectations only)
# --------------------------------------------------------------------------


def _raw_expectations() -> list[Any]:
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectColumnValuesToNotBeNull(column="event_id"),
        gxe.ExpectColumnValuesToBeUnique(column="event_id", notes="event_id is the raw table's key"),
        gxe.ExpectColumnValuesToBeInSet(column="event_type", value_set=list(EVENT_TYPES)),
        gxe.ExpectColumnPairValuesToBeEqual(
            column_A="event_time_hour", column_B="event_hour", notes="event_hour is the hour of event_time"
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


def _aggregates_expectations() -> list[Any]:
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
            gxe.ExpectColumnValuesToBeOfType(column=name, type_="LongType"),
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


def _reconciliation_expectations() -> list[Any]:
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
    ]


@dataclass(frozen=True)
class _Gate:
    """One checkpoint: a data asset, its suite, and how results name rows."""

    name: str  # asset, suite, validation definition and checkpoint name
    expectations: Any  # () -> list of expectations
    index_columns: tuple[str, ...]  # identify unexpected rows in the results


GATES = (
    _Gate(RAW_NAME, _raw_expectations, ("event_id",)),
    _Gate(AGGREGATES_NAME, _aggregates_expectations, ("ad_id", "window_start")),
    _Gate(RECONCILIATION_NAME, _reconciliation_expectations, ("ad_id", "window_start")),
)


# --------------------------------------------------------------------------
# GE context
# --------------------------------------------------------------------------


def gx_root(settings: Settings) -> Path:
    return settings.home / "gx"


@contextmanager
def _context_lock(settings: Settings) -> Iterator[None]:
    """Serialize GE work on one ``ADPIPE_HOME``: GE's file stores do
    get-then-add (a second process would fail on "already exists") and
    rewrite great_expectations.yml and the Data Docs index in place."""
    settings.home.mkdir(parents=True, exist_ok=True)
    with open(settings.home / "gx.lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _checkpoints(settings: Settings) -> tuple[Any, dict[str, Any]]:
    """The file context and one checkpoint per gate, created or updated."""
    import great_expectations as gx
    from great_expectations.checkpoint import UpdateDataDocsAction
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="file", project_root_dir=str(settings.home))
    # Read back from great_expectations.yml this is a plain dict.
    progress_bars = context.variables.progress_bars
    if isinstance(progress_bars, dict):
        progress_bars_off = progress_bars.get("globally") is False
    else:
        progress_bars_off = getattr(progress_bars, "globally", None) is False
    if not progress_bars_off:
        context.variables.progress_bars = ProgressBarsConfig(globally=False)
        context.variables.save()

    # Not add_or_update_spark: updating the data source replaces it with one
    # without assets, which breaks the stored batch definitions' references.
    if DATASOURCE in context.data_sources.all():
        datasource = context.data_sources.get(DATASOURCE)
    else:
        datasource = context.data_sources.add_spark(name=DATASOURCE)

    checkpoints: dict[str, Any] = {}
    for gate in GATES:
        try:
            asset = datasource.get_asset(gate.name)
        except LookupError:
            asset = datasource.add_dataframe_asset(name=gate.name)
        try:
            batch_definition = asset.get_batch_definition(BATCH_DEFINITION)
        except KeyError:
            batch_definition = asset.add_batch_definition_whole_dataframe(BATCH_DEFINITION)
        suite = gx.ExpectationSuite(name=gate.name, expectations=gate.expectations())
        suite = context.suites.add_or_update(suite)
        validation = context.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=gate.name, data=batch_definition, suite=suite)
        )
        checkpoints[gate.name] = context.checkpoints.add_or_update(
            gx.Checkpoint(
                name=gate.name,
                validation_definitions=[validation],
                actions=[UpdateDataDocsAction(name="update_data_docs", site_names=[DOCS_SITE])],
                result_format={
                    "result_format": "SUMMARY",
                    "unexpected_index_column_names": list(gate.index_columns),
                    "partial_unexpected_count": _EXAMPLES,
                },
            )
        )
    return context, checkpoints


def docs_site(settings: Settings) -> Path | None:
    """The local Data Docs site's folder, once a validation has built it."""
    site = gx_root(settings) / "uncommitted" / "data_docs" / DOCS_SITE
    return site if (site / "index.html").exists() else None


def _docs_index(context: Any) -> Path | None:
    for site in context.get_docs_sites_urls(site_name=DOCS_SITE) or []:
        url = site.get("site_url")
        if url and url.startswith("file://"):
            path = Path(unquote(urlparse(url).path))
            if path.exists():
                return path
    return None


# --------------------------------------------------------------------------
# Failure lines
# --------------------------------------------------------------------------

_TARGET_KEYS = (
    "column",
    "column_list",
    "column_A",
    "column_B",
    "type_",
    "value_set",
    "value",
    "min_value",
    "max_value",
)


def _short(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={_short(v)}" for k, v in value.items()) + "}"
    return repr(value) if isinstance(value, str) else str(value)


def _exception_message(info: Any) -> str | None:
    if not isinstance(info, dict):
        return None
    if info.get("raised_exception"):
        return str(info.get("exception_message") or "exception")
    for value in info.values():
        message = _exception_message(value)
        if message:
            return message
    return None


def _observed(result: dict[str, Any]) -> str:
    if "observed_value" in result:
        return f"observed {_short(result['observed_value'])}"
    parts = [f"{result.get('unexpected_count')} unexpected of {result.get('element_count')} rows"]
    examples = result.get("partial_unexpected_index_list") or result.get("partial_unexpected_counts") or []
    if examples:
        parts.append("e.g. " + "; ".join(_short(e) for e in examples[:_EXAMPLES]))
    return ", ".join(parts)


def failure_line(suite: str, evr: Any) -> str:
    """``suite: type(column=..., ...): observed ...`` for one failed expectation result."""
    config = evr.expectation_config
    kwargs = config.kwargs
    target = ", ".join(f"{k}={_short(kwargs[k])}" for k in _TARGET_KEYS if kwargs.get(k) is not None)
    error = _exception_message(evr.exception_info)
    observed = f"error: {error}" if error else _observed(evr.result or {})
    notes = getattr(config, "notes", None)
    why = f" [{notes if isinstance(notes, str) else '; '.join(notes)}]" if notes else ""
    return f"{suite}: {config.type}({target}): {observed}{why}"


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------


def _expected_parameters(recon_df: DataFrame) -> dict[str, int]:
    row = recon_df.agg(
        F.count("expected_impressions").alias(P_EXPECTED_WINDOWS),
        F.coalesce(F.sum("expected_impressions"), F.lit(0)).alias(P_EXPECTED_IMPRESSIONS),
        F.coalesce(F.sum("expected_clicks"), F.lit(0)).alias(P_EXPECTED_CLICKS),
        F.count(F.lit(1)).alias("recon_rows"),
    ).first()
    assert row is not None
    return {k: int(row[k]) for k in (P_EXPECTED_WINDOWS, P_EXPECTED_IMPRESSIONS, P_EXPECTED_CLICKS, "recon_rows")}


@dataclass(frozen=True)
class KafkaFacts:
    """What Kafka says about an hour, independently of the tables
    (:func:`adpipe.lakehouse.load.kafka_facts`): the regions whose raw topic
    holds a valid event of the hour, the topics that no longer hold all of
    its records (deleted by retention), and each stream's watermark."""

    regions_with_input: tuple[str, ...] = ()
    retention_gaps: tuple[dict, ...] = ()
    # Per region, its stream's committed watermark (epoch ms; a region that
    # never committed is absent): windows past it have no aggregate yet.
    # None: reconcile every raw event.
    watermarks: dict[str, int] | None = None

    def failures(self) -> list[str]:
        return [
            f"kafka_retention: {g['region']} {g['topic']}[{g['partition']}] keeps records from offset "
            f"{g['first_offset']} only, written after the hour began: Kafka can no longer prove this hour"
            for g in self.retention_gaps
        ]


def validate_frames(
    settings: Settings, hour: datetime, frames: HourFrames, facts: KafkaFacts | None = None
) -> QualityResult:
    """Run the hour's GE checkpoints on the given frames (no table reads).

    ``facts`` (:func:`kafka_facts`): an hour whose raw topics received
    records is never "empty" (the raw checks then run, and fail on no rows),
    each region with input must have rows, and an hour Kafka no longer holds
    in full fails. An hour with neither on-time raw events nor aggregates
    skips the aggregates and reconciliation checkpoints (GE's column sum of
    an empty column is null, not 0); an hour with nothing at all and no
    input passes with a note.
    """
    from great_expectations.core.run_identifier import RunIdentifier

    facts = facts or KafkaFacts()
    hour = normalize_hour(hour)
    tag = _hour_tag(hour)
    # Only the columns the raw suite reads: GE caches the frame it checks.
    raw_df = with_late_flag(with_hour_check(frames.raw_df), frames.quarantine_df).select(*RAW_CHECKED_COLUMNS)
    aggregates_df = with_window_checks(frames.aggregates_df)
    recon_df = reconciliation_frame(
        emitted_only(frames.raw_df, facts.watermarks), frames.quarantine_df, frames.aggregates_df
    )
    # Cached now, so GE's runs on them (which persist the same frames) read
    # what the parameters and the row count below computed, instead of
    # joining again; each is unpersisted after its run, or below if none.
    for df in (raw_df, recon_df):
        df.persist()

    # The numbers GE compares the aggregates with, computed in Spark from raw.
    stats = _expected_parameters(recon_df)
    recon_rows = stats.pop("recon_rows")
    parameters: dict[str, Any] = {
        **stats,
        P_MAX_LATE_SHARE: settings.max_late_share,
        P_MIN_RAW_ROWS: 1 if facts.regions_with_input else 0,
        P_EXPECTED_REGIONS: sorted(facts.regions_with_input),
    }
    raw_rows = raw_df.count()

    notes: list[str] = []
    to_run: list[tuple[str, DataFrame]] = []
    if raw_rows or facts.regions_with_input:
        to_run.append((RAW_NAME, raw_df))
    else:
        notes.append("no raw events in this hour and no raw input in Kafka: raw checks skipped")
    if recon_rows:
        to_run += [(AGGREGATES_NAME, aggregates_df), (RECONCILIATION_NAME, recon_df)]
    else:
        notes.append("no on-time raw events and no aggregates in this hour: nothing to reconcile")
    if not to_run:
        notes.append("empty hour: valid")
    for df in (raw_df, recon_df):
        if all(df is not checked for _name, checked in to_run):
            df.unpersist()

    run_time = datetime.now(UTC)  # a record of when the check ran, not a partition
    run_id = RunIdentifier(run_name=f"adpipe-{tag}", run_time=run_time)
    failed: list[str] = []
    all_succeeded = True
    evaluated = 0
    suite_results: dict[str, Any] = {}
    data_docs: Path | None = None

    # The lock is held through the runs too: GE writes results, suites and
    # the Data Docs index as it goes. Hours are validated one at a time anyway.
    with _context_lock(settings):
        context, checkpoints = _checkpoints(settings)
        for name, df in to_run:
            log.info("GE: validating %s for hour %s", name, tag)
            try:
                result = checkpoints[name].run(
                    batch_parameters={"dataframe": df},
                    expectation_parameters=dict(parameters),
                    run_id=run_id,
                )
            finally:
                df.unpersist()  # GE's Spark engine persists the batch DataFrame
            all_succeeded = all_succeeded and bool(result.success)
            for suite_result in result.run_results.values():
                evaluated += int(suite_result.statistics.get("evaluated_expectations", 0))
                suite_results[name] = suite_result.to_json_dict()
                failed += [failure_line(name, evr) for evr in suite_result.results if not evr.success]
        data_docs = _docs_index(context)

    failed += facts.failures()
    success = all_succeeded and not failed
    results_path = gx_root(settings) / "uncommitted" / "hourly_results" / tag / f"{run_time:%Y%m%dT%H%M%S%fZ}.json"
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(
        json.dumps(
            {
                "hour": hour.isoformat(),
                "run_name": run_id.run_name,
                "run_time": run_time.isoformat(),
                "success": success,
                "evaluated": evaluated,
                "failed": failed,
                "notes": notes,
                "parameters": parameters,
                "data_docs": str(data_docs) if data_docs else None,
                "suites": suite_results,
            },
            indent=2,
            default=str,
        )
    )
    quality = QualityResult(
        hour=hour,
        success=success,
        evaluated=evaluated,
        failed=failed,
        data_docs=data_docs,
        results_path=results_path,
        notes=notes,
        parameters=parameters,
    )
    if success:
        log.info("GE: hour %s passed: %d expectations evaluated; %s", tag, evaluated, "; ".join(notes) or "")
    else:
        log.error("GE: hour %s FAILED:\n%s", tag, quality.describe())
    return quality


def validate_hour(
    settings: Settings, hour: datetime, spark: SparkSession | None = None, facts: KafkaFacts | None = None
) -> QualityResult:
    """Read the hour from the published tables and validate it, with
    ``facts``: what Kafka says of the hour (see :func:`validate_frames`).

    Without ``spark``, builds the session on the metastore (where the tables
    are) and stops it afterwards when this call started it."""
    hour = normalize_hour(hour)
    owned = False
    if spark is None:
        from adpipe.lakehouse.metastore import metastore_session

        owned = SparkSession.getActiveSession() is None
        spark = metastore_session(settings, "adpipe-quality")
    try:
        return validate_frames(settings, hour, hour_frames(spark, hour), facts)
    finally:
        if owned:
            spark.stop()


__all__ = [
    "HourFrames",
    "KafkaFacts",
    "QualityError",
    "QualityResult",
    "expected_minute_counts",
    "hour_frames",
    "normalize_hour",
    "reconciliation_frame",
    "validate_frames",
    "validate_hour",
]
