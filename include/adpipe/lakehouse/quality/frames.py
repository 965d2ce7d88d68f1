"""The hour's DataFrames the quality gate checks, built in Spark (no GE here),
and collected to pandas for a small hour.

The three tables' rows of one ``event_hour`` (published, or the candidate a
write-audit-publish run would publish), and the frames and helper columns
the suites read: the expected per-minute counts from the raw events, the
reconciliation of those with the aggregates, and the columns GE's built-in
expectations check window alignment, event hours and the late share on."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from adpipe import schemas as S
from adpipe.lakehouse import tables

if TYPE_CHECKING:
    import pandas as pd

MINUTE_US = 60_000_000


@dataclass(frozen=True)
class HourFrames:
    """The tables' rows of one ``event_hour``: the raw events, the
    quarantine, each window's latest aggregate (``aggregates_df``) and every
    revision of the windows (``revisions_df``; None: the aggregates are
    their windows' only revisions)."""

    raw_df: DataFrame
    quarantine_df: DataFrame
    aggregates_df: DataFrame
    revisions_df: DataFrame | None = None

    def revisions(self) -> DataFrame:
        return self.aggregates_df if self.revisions_df is None else self.revisions_df

    @contextmanager
    def for_gate(self) -> Iterator[HourFrames]:
        """These frames cut to the columns the gate reads (GATE_COLUMNS),
        the quarantine's cached while the block runs (the gate reads it
        three times, and it is small). The raw events and the aggregates are
        read twice from their tables instead: building the cache of a
        million raw rows cost 3-4 s more than the second read, and a small
        hour's audit takes as long either way."""
        frames = {f.name: getattr(self, f.name) for f in fields(self)} | {"revisions_df": self.revisions()}
        pruned = HourFrames(**{name: df.select(*GATE_COLUMNS[name]) for name, df in frames.items()})
        pruned.quarantine_df.persist()
        try:
            yield pruned
        finally:
            pruned.quarantine_df.unpersist()


# What the gate reads of each frame: the suites' columns and the
# reconciliation's (validate_frames, expected_minute_counts, with_late_flag).
GATE_COLUMNS = {
    "raw_df": ("event_id", "ad_id", "event_type", "event_time", "event_hour", "region"),
    "quarantine_df": ("source", "reason", "event_id", "ad_id", "event_type", "event_time", "region"),
    "aggregates_df": (
        "record_uuid", "region", "ad_id", "window_start", "window_end", "event_hour", "impressions", "clicks",
        "revision",
    ),
    "revisions_df": ("record_uuid", "region", "ad_id", "window_start", "revision", "impressions", "clicks"),
}
WINDOW_KEYS = ["region", "ad_id", "window_start"]


def normalize_hour(hour: datetime) -> datetime:
    """The hour as an aware UTC datetime; rejects naive or mid-hour values."""
    if hour.tzinfo is None or hour.utcoffset() is None:
        raise ValueError(f"hour {hour!r} must be timezone-aware (UTC)")
    hour = hour.astimezone(UTC)
    if (hour.minute, hour.second, hour.microsecond) != (0, 0, 0):
        raise ValueError(f"hour {hour.isoformat()} is not the start of an hour")
    return datetime(hour.year, hour.month, hour.day, hour.hour, tzinfo=UTC)


def hour_frames(
    spark: SparkSession,
    hour: datetime,
    staged_through: int | None = None,
    unstaged: dict[str, DataFrame] | None = None,
) -> HourFrames:
    """The tables' rows of ``event_hour == hour``: the published ones
    (those of the hour's current repair and later runs, :func:`shown_in_hour`),
    or with ``staged_through`` the candidate a write-audit-publish run would
    publish: the published rows plus the staged rows of runs up to that one
    that are not published yet, plus (``unstaged``, per table) the run's own
    rows it keeps in memory instead of staging them, which are neither
    published nor staged. The candidate's aggregates are, per window, the
    rows at its highest revision among the published and the new ones (two
    of one revision stay two: a duplicate the gate fails); its revisions,
    the published ones and the new ones."""
    from adpipe.lakehouse.ledger import shown_in_hour
    from adpipe.lakehouse.revisions import at_highest_revision, revision_of

    hour = normalize_hour(hour)
    in_hour = (F.col("event_hour") == F.lit(hour)) & shown_in_hour(spark, hour)

    def published(name: str, schema: Any) -> DataFrame:
        df = spark.table(name).where(in_hour).select(*schema.fieldNames())
        return df.withColumn("revision", revision_of()) if "revision" in schema.fieldNames() else df

    def new(name: str, schema: Any) -> DataFrame:
        """The staged and unstaged rows of ``name`` not published yet (by its load key)."""
        _schema, keys = tables.TABLES[name]
        names = schema.fieldNames()
        staged = (
            spark.table(tables.staged(name))  # the staging twin of a published table
            .where((F.col("event_hour") == F.lit(hour)) & (F.col("load_run") <= F.lit(staged_through)))
            .select(*names)
        )
        if unstaged is not None:
            staged = staged.unionByName(unstaged[name].where(F.col("event_hour") == F.lit(hour)).select(*names))
        loaded = published(tables.loaded_in(name), schema).select(*keys)
        rows = staged.join(loaded, list(keys), "left_anti")
        return rows.withColumn("revision", revision_of()) if "revision" in names else rows

    raw = published(tables.RAW, tables.RAW_SCHEMA)
    quarantine = published(tables.QUARANTINE, tables.QUARANTINE_SCHEMA)
    aggregates = published(tables.AGGREGATES, tables.AGGREGATES_SCHEMA)
    revisions = published(tables.REVISIONS, tables.REVISIONS_SCHEMA)
    if staged_through is None:
        return HourFrames(raw, quarantine, aggregates, revisions)
    new_aggregates = new(tables.AGGREGATES, tables.AGGREGATES_SCHEMA)
    # A record the table holds already (a run that died before it reached
    # the revisions table) is not a second row of its window.
    unpublished = new_aggregates.join(aggregates.select("record_uuid"), "record_uuid", "left_anti")
    return HourFrames(
        raw_df=raw.unionByName(new(tables.RAW, tables.RAW_SCHEMA)),
        quarantine_df=quarantine.unionByName(new(tables.QUARANTINE, tables.QUARANTINE_SCHEMA)),
        aggregates_df=at_highest_revision(aggregates.unionByName(unpublished)),
        revisions_df=revisions.unionByName(new_aggregates),
    )


def expected_minute_counts(raw_df: DataFrame, quarantine_df: DataFrame) -> DataFrame:
    """Per (``region``, ``ad_id``, ``window_start``): the raw events of each
    type, without the ``event_id``s quarantined as late (the contract's
    counts). Each region's stream counts the events of its own raw topic, so
    the region is part of the key. ``raw_df`` holds one row per event: the
    raw table's key is ``event_id``, and the raw suite fails an hour where
    it is not unique (deduplicating here again cost the 10,000-ad hour's gate
    a shuffle of a million rows)."""
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
        raw_df.select(*event_columns)
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


def revision_stats(revisions_df: DataFrame, aggregates_df: DataFrame) -> DataFrame:
    """Per (``region``, ``ad_id``, ``window_start``) of the revisions: the
    history against the window's latest row(s) in the aggregates.
    ``history_max_revision``, ``history_rows``, ``history_revisions`` (distinct)
    and ``revisions_over_latest``: the revisions counting more impressions
    or more clicks than the latest (a revision only ever adds events)."""
    latest = aggregates_df.groupBy(*WINDOW_KEYS).agg(
        F.sum("impressions").alias("__latest_impressions"), F.sum("clicks").alias("__latest_clicks")
    )
    over = (F.col("impressions") > F.col("__latest_impressions")) | (F.col("clicks") > F.col("__latest_clicks"))
    return (
        revisions_df.join(latest, on=WINDOW_KEYS, how="left")
        .groupBy(*WINDOW_KEYS)
        .agg(
            F.max(F.coalesce("revision", F.lit(0).cast("long"))).alias("history_max_revision"),
            F.count(F.lit(1)).alias("history_rows"),
            F.countDistinct(F.coalesce("revision", F.lit(0).cast("long"))).alias("history_revisions"),
            F.count(F.when(over, True)).alias("revisions_over_latest"),
        )
    )


def reconciliation_frame(
    raw_df: DataFrame, quarantine_df: DataFrame, aggregates_df: DataFrame, revisions_df: DataFrame | None = None
) -> DataFrame:
    """Per (``region``, ``ad_id``, ``window_start``): expected counts (from
    raw) next to the latest aggregates' counts and the window's revisions,
    full outer joins, so a missing aggregate has null ``actual_*`` and an
    aggregate without raw events has null ``expected_*``.

    Columns: ``region``, ``ad_id``, ``window_start``, ``expected_impressions``,
    ``expected_clicks``, ``actual_impressions``, ``actual_clicks`` (summed over
    the aggregate rows of the key, so a duplicated aggregate shows as an
    over-count too), ``aggregate_rows``, ``impressions_diff`` and
    ``clicks_diff`` (actual - expected; null when a side is missing), and of
    the revisions (``revisions_df``; None: the aggregates are the only ones):
    ``revision_gap`` (the history's highest revision less the latest row's,
    each -1 where missing: 0 when the table holds the newest revision
    loaded), ``revisions_over_latest`` and ``duplicated_revisions`` (rows of
    a revision the history holds twice)."""
    expected_df = expected_minute_counts(raw_df, quarantine_df)
    actual_df = aggregates_df.groupBy(*WINDOW_KEYS).agg(
        F.sum("impressions").alias("actual_impressions"),
        F.sum("clicks").alias("actual_clicks"),
        F.count(F.lit(1)).alias("aggregate_rows"),
        F.max(F.coalesce("revision", F.lit(0).cast("long"))).alias("latest_revision"),
    )
    history_df = revision_stats(aggregates_df if revisions_df is None else revisions_df, aggregates_df)
    missing = F.lit(-1).cast("long")
    # A hash join, not Spark's default sort-merge: the 10,000-ad hour's
    # reconciliation 5.1-5.7 -> 3.2-3.8 s. Its table is a partition's share of
    # the hour's windows (a row per ad and minute), not of its events.
    return (
        expected_df.join(actual_df.hint("shuffle_hash"), on=WINDOW_KEYS, how="full_outer")
        .join(history_df.hint("shuffle_hash"), on=WINDOW_KEYS, how="full_outer")
        .withColumn("impressions_diff", F.col("actual_impressions") - F.col("expected_impressions"))
        .withColumn("clicks_diff", F.col("actual_clicks") - F.col("expected_clicks"))
        .withColumn(
            "revision_gap",
            F.coalesce("history_max_revision", missing) - F.coalesce("latest_revision", missing),
        )
        .withColumn("revisions_over_latest", F.coalesce("revisions_over_latest", F.lit(0).cast("long")))
        .withColumn(
            "duplicated_revisions",
            F.coalesce(F.col("history_rows") - F.col("history_revisions"), F.lit(0).cast("long")),
        )
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
            "revision_gap",
            "revisions_over_latest",
            "duplicated_revisions",
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


def with_conflict_flag(raw_df: DataFrame, quarantine_df: DataFrame) -> DataFrame:
    """``is_conflicting_copy``: 1 for a raw event whose copy (its region,
    ``event_id`` and ``event_time``) the DLQ lists as a re-stamped retry
    (reason ``conflicting_duplicate``): the stream did not count that copy,
    so the raw table must hold the other. Else 0."""
    listed = (
        quarantine_df.where(
            (F.col("source") == F.lit(tables.SOURCE_DLQ)) & (F.col("reason") == F.lit(S.REASON_CONFLICTING_DUPLICATE))
        )
        .where(F.col("event_id").isNotNull() & F.col("event_time").isNotNull())
        .select("region", "event_id", "event_time", F.lit(1).alias("is_conflicting_copy"))
        .distinct()
    )
    return raw_df.join(listed, on=["region", "event_id", "event_time"], how="left").withColumn(
        "is_conflicting_copy", F.coalesce(F.col("is_conflicting_copy"), F.lit(0))
    )


def pandas_frame(df: DataFrame) -> pd.DataFrame:
    """``df`` collected (through Arrow) as GE's pandas engine should see it:
    a 64-bit integer column stays one with nulls (``Int64``, not float), and
    timestamps are naive UTC, as Spark's own rows give them here."""
    import pandas as pd
    import pyarrow as pa

    frame = df.toArrow().to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    for name, dtype in frame.dtypes.items():
        if isinstance(dtype, pd.DatetimeTZDtype):
            frame[name] = frame[name].dt.tz_convert("UTC").dt.tz_localize(None)
    return frame


def with_hour_check(raw_df: DataFrame) -> DataFrame:
    """``event_time_hour``: the hour ``event_time`` falls in (must equal ``event_hour``)."""
    return raw_df.withColumn("event_time_hour", F.date_trunc("hour", F.col("event_time")))
