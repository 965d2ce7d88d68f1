"""Union & Load: every region's new records into the ``ads`` Delta tables,
written, audited, then published.

Uber's Union & Load is a streaming job; ours is an hourly batch by design
(the project card): the Airflow DAG ``ad_union_and_load`` runs it once an
hour is closed, and any hour can be loaded again, repaired or backfilled.

One run (``adpipe load --hour H``; the DAG's tasks do the same steps)
---------------------------------------------------------------------
1. **Stage** (under the load lock): read, per region and topic, what arrived
   since the offsets earlier runs loaded (:mod:`adpipe.lakehouse.ranges`),
   union the regions, dedupe by each table's key, and insert the rows not
   published yet into the staging twins (``ads_staging.*``), each in the
   partition of its own ``event_hour``. Then append a ``staged`` row to the
   ledger ``ads.load_runs`` with the coverage after this run.
2. **Audit**: for each closed hour with staged rows (and the hour asked
   for), the Great Expectations gate on the candidate (published rows plus
   the staged ones) and what Kafka says of the hour. Per hour: a failed
   gate appends a ``failed`` ledger row for that hour naming the
   expectations, and the hour is *held*: its staged rows stay for
   inspection, later runs neither audit nor publish it (:func:`held_hours`;
   an hour they were not asked for is alerted once), until an operator
   loads it again, repairs it or discards its staged rows. One hour never
   holds back another.
3. **Publish** (under the load lock): the staged rows of the hours that passed are
   inserted into ``ads.*`` (insert-if-absent on each key, ``load_run`` =
   this run), removed from staging, and a ``published`` ledger row records
   the hours and, per hour, the late corrections (rows published into an
   hour after its first publication; also the view ``ads.late_corrections``).
   Rows of hours still open stay staged until their hour closes.

A crash anywhere loses and doubles nothing: before the ``staged`` ledger
row the next run reads the same offsets again, and every write is
insert-if-absent on the table's key (a staged row already published, or
staged, is not written again); after it, the rows are in staging and the
next run audits and publishes them. ``adpipe load --hour H --repair``
rebuilds one hour's published partitions from Kafka (read from the hour's
start, whatever was loaded), audited the same way: for an hour published
wrongly before this gate existed.

A manifest of each run (ranges read, rows, gate) is kept under
``$ADPIPE_HOME/load/runs/``."""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from adpipe import alerting, faults, kafka_io, metrics, raw_events
from adpipe import schemas as S
from adpipe.lakehouse import quality
from adpipe.lakehouse import tables as T
from adpipe.lakehouse.metastore import metastore_session
from adpipe.lakehouse.ranges import (
    ONE_HOUR,
    Coverage,
    OutputNotStable,
    RegionRanges,
    TopicRange,
    advance,
    closed_hours,
    closed_through,
    hour_closed,
    hour_label,
    hour_ms,
    hours_between,
    iso_ms,
    parse_hour,
    read_since_ms,
    region_ranges,
    retention_gaps,
    stream_watermarks,
)
from adpipe.settings import KafkaAccess, Settings
from adpipe.spark import in_threads

__all__ = [
    "ONE_HOUR",
    "LoadError",
    "LoadResult",
    "OutputNotStable",
    "StagedRun",
    "TopicRange",
    "audit",
    "discard_staged",
    "hour_closed",
    "hour_label",
    "hours_between",
    "iso_ms",
    "kafka_facts",
    "load_hour",
    "parse_hour",
    "publish",
    "read_since_ms",
    "region_ranges",
    "repair_hour",
    "stage",
    "step_file",
    "write_json",
]

log = logging.getLogger(__name__)

MERGE_ATTEMPTS = 8
SOURCE_BAD_AGGREGATE = "bad_aggregate"
# The raw record a late copy lists ("topic/partition/offset"), beside the
# quarantine rows until mark_late_repeats has used it.
RAW_SOURCE = "__raw_source"
LISTED_WATERMARK = "__listed_watermark_ms"  # the watermark of the batch that listed a late copy


class LoadError(RuntimeError):
    """The hour cannot be loaded (not closed yet, or a table write failed for good)."""


class GateFailed(LoadError):
    """The audit failed: nothing was published; the message names the expectations."""

    def __init__(self, message: str, results: list[quality.QualityResult]) -> None:
        super().__init__(message)
        self.results = results


# --- pure transformations ------------------------------------------------------------------


def _hour_of(ts: Column) -> Column:
    return F.date_trunc("hour", ts)


def _kafka_columns(region: str, loaded_at: datetime) -> list[Column]:
    return [
        F.lit(region).alias("region"),
        F.col("topic").alias("kafka_topic"),
        F.col("partition").cast("int").alias("kafka_partition"),
        F.col("offset").cast("long").alias("kafka_offset"),
        F.lit(loaded_at).cast("timestamp").alias("loaded_at"),
        F.lit(None).cast("long").alias("load_run"),  # set by the run that stages the rows
    ]


def _first_per_key(df: DataFrame, keys: list[str]) -> DataFrame:
    """One row per key, deterministically: the lowest (region, partition, offset)."""
    w = Window.partitionBy(*keys).orderBy("region", "kafka_topic", "kafka_partition", "kafka_offset")
    return df.withColumn("__n", F.row_number().over(w)).where(F.col("__n") == 1).drop("__n")


def _in_hour(hour: datetime | None) -> Column:
    """Rows of ``hour``; every row for None (a load files each row in its own hour)."""
    if hour is None:
        return F.lit(True)
    return F.col("event_hour") == F.lit(hour.astimezone(UTC)).cast("timestamp")


def raw_table_rows(
    kafka_df: DataFrame, region: str, hour: datetime | None, loaded_at: datetime, max_future_skew_ms: int
) -> DataFrame:
    """Raw Kafka rows -> ``ads.ad_events_raw`` rows (of ``hour`` only, unless
    None): valid events only, by the stream job's own reading of the contract."""
    parsed = raw_events.valid_events(raw_events.parse_raw_events(kafka_df, max_future_skew_ms))
    rows = parsed.select(
        "event_id",
        "ad_id",
        "campaign_id",
        "event_type",
        "event_time",
        _hour_of(F.col("event_time")).alias("event_hour"),
        *_kafka_columns(region, loaded_at),
    ).where(_in_hour(hour))
    return rows.select(*T.RAW_SCHEMA.fieldNames())


def with_aggregate_fields(kafka_df: DataFrame) -> DataFrame:
    """Aggregate records with their JSON read into ``a`` and
    ``aggregate_ok`` (every field of the contract there and readable). A
    frame that has them already (read once and cached for both tables that
    need it) is returned as it is."""
    if "aggregate_ok" in kafka_df.columns:
        return kafka_df
    body = F.from_json(F.col("value").cast("string"), S.AGGREGATE_RECORD)
    return kafka_df.select("*", body.alias("a")).withColumn("aggregate_ok", _aggregate_ok())


def aggregate_table_rows(kafka_df: DataFrame, region: str, hour: datetime | None, loaded_at: datetime) -> DataFrame:
    """Aggregate records -> ``ads.ad_minute_aggregates`` rows (of ``hour`` only, unless None)."""
    parsed = with_aggregate_fields(kafka_df).where(F.col("aggregate_ok"))
    rows = parsed.select(
        F.col("a.record_uuid").alias("record_uuid"),
        F.col("a.ad_id").alias("ad_id"),
        F.to_timestamp("a.window_start").alias("window_start"),
        F.to_timestamp("a.window_end").alias("window_end"),
        F.col("a.impressions").alias("impressions"),
        F.col("a.clicks").alias("clicks"),
        _hour_of(F.to_timestamp("a.window_start")).alias("event_hour"),
        *_kafka_columns(region, loaded_at),
    ).where(_in_hour(hour))
    return rows.select(*T.AGGREGATES_SCHEMA.fieldNames())


def _aggregate_ok() -> Column:
    a = F.col("a")
    return F.coalesce(
        a.record_uuid.isNotNull()
        & a.ad_id.isNotNull()
        & F.to_timestamp(a.window_start).isNotNull()
        & F.to_timestamp(a.window_end).isNotNull()
        & a.impressions.isNotNull()
        & a.clicks.isNotNull(),
        F.lit(False),
    )


def _header(name: str) -> Column:
    """A Kafka header's value as a string (Spark's includeHeaders array)."""
    match = F.filter(F.col("headers"), lambda h: h["key"] == name)
    return F.when(F.size(match) > 0, match[0]["value"].cast("string"))


def _with_event_fields(copies_df: DataFrame) -> DataFrame:
    """DLQ or late copies with the event fields read from their bytes (and
    ``reject_reason``), headers kept. No future-time rule: the job checked
    their source records."""
    parsed = raw_events.parse_raw_events(copies_df.drop("headers"), None).select(
        "event_id",
        "ad_id",
        "event_type",
        "event_time",
        "reject_reason",
        F.col("offset").alias("__offset"),
        F.col("partition").alias("__partition"),
    )
    joined = copies_df.join(
        parsed, (copies_df["offset"] == parsed["__offset"]) & (copies_df["partition"] == parsed["__partition"])
    )
    return joined.drop("__offset", "__partition")


def quarantine_table_rows(
    dlq_df: DataFrame,
    late_df: DataFrame,
    aggregates_df: DataFrame,
    region: str,
    hour: datetime | None,
    loaded_at: datetime,
) -> DataFrame:
    """DLQ records, late events and unreadable aggregate records ->
    ``ads.ad_events_quarantine`` rows (of ``hour`` only, unless None)."""
    # DLQ: the original bytes; an event time when one can be read from them,
    # else the hour the record reached the DLQ.
    dlq_rows = _with_event_fields(dlq_df).select(
        F.lit(T.SOURCE_DLQ).alias("source"),
        F.coalesce(_header(S.HEADER_SOURCE), F.concat_ws("/", "topic", "partition", "offset")).alias("event_key"),
        F.coalesce(_header(S.HEADER_REASON), F.lit("unknown")).alias("reason"),
        F.col("value").cast("binary").alias("raw_value"),
        "event_id",
        "ad_id",
        "event_type",
        "event_time",
        _hour_of(F.coalesce("event_time", "timestamp")).alias("event_hour"),
        *_kafka_columns(region, loaded_at),
    )
    # Late: the event the copy lists; one truncated as oversized names it in
    # its headers (its JSON is cut).
    late = _with_event_fields(late_df).withColumns(
        {
            "event_id": F.coalesce(_header(S.HEADER_EVENT_ID), "event_id"),
            "ad_id": F.coalesce("ad_id", F.col("key").cast("string")),
            "event_time": F.coalesce(
                "event_time", F.timestamp_millis(_header(S.HEADER_EVENT_TIME_MS).cast("long"))
            ),
        }
    )
    late_rows = late.where(F.col("reject_reason").isNull() | _header(S.HEADER_EVENT_ID).isNotNull()).select(
        _header(S.HEADER_SOURCE).alias(RAW_SOURCE),
        _header(S.HEADER_WATERMARK).cast("long").alias(LISTED_WATERMARK),
        F.lit(T.SOURCE_LATE).alias("source"),
        F.col("event_id").alias("event_key"),
        F.lit("late").alias("reason"),
        F.col("value").alias("raw_value"),
        "event_id",
        "ad_id",
        "event_type",
        "event_time",
        _hour_of(F.col("event_time")).alias("event_hour"),
        *_kafka_columns(region, loaded_at),
    )
    bad_aggregates = (
        with_aggregate_fields(aggregates_df)
        .where(~F.col("aggregate_ok"))
        .select(
            F.lit(SOURCE_BAD_AGGREGATE).alias("source"),
            F.concat_ws("/", "topic", "partition", "offset").alias("event_key"),
            F.lit("unreadable_aggregate").alias("reason"),
            F.col("value").cast("binary").alias("raw_value"),
            F.lit(None).cast("string").alias("event_id"),
            F.col("a.ad_id").alias("ad_id"),
            F.lit(None).cast("string").alias("event_type"),
            F.lit(None).cast("timestamp").alias("event_time"),
            _hour_of(F.col("timestamp")).alias("event_hour"),
            *_kafka_columns(region, loaded_at),
        )
    )
    names = T.QUARANTINE_SCHEMA.fieldNames()
    listing = [F.lit(None).cast("string").alias(RAW_SOURCE), F.lit(None).cast("long").alias(LISTED_WATERMARK)]
    return (
        dlq_rows.select(*names, *listing)
        .unionByName(late_rows.select(*names, RAW_SOURCE, LISTED_WATERMARK))
        .unionByName(bad_aggregates.select(*names, *listing))
        .where(_in_hour(hour))
    )


def mark_late_repeats(quarantine_df: DataFrame, first_raw_df: DataFrame, retention_ms: int) -> DataFrame:
    """Quarantine rows (with :data:`RAW_SOURCE` and :data:`LISTED_WATERMARK`)
    -> the same rows, each late listing whose raw record is not the event's
    first (``first_raw_df``: one raw row per ``event_id``, its Kafka
    position) and whose batch's watermark had passed the event's window end
    plus the dedupe retention (``retention_ms``) made a ``late_repeat``: a
    producer retry that came after the retention, listed late again though
    its first copy was counted or listed before. (Within the retention the
    stream still knew the id: that listing is the event's one.) Such a row
    is kept to be seen, and never counted as late (the gate and verify count
    ``late`` rows only). The two helper columns are dropped."""
    first = first_raw_df.select(
        "event_id", F.concat_ws("/", "kafka_topic", "kafka_partition", "kafka_offset").alias("__first_source")
    )
    window_end_ms = (F.floor(F.unix_millis("event_time") / 60_000) + 1) * 60_000
    repeat = (
        (F.col("source") == F.lit(T.SOURCE_LATE))
        & F.col(RAW_SOURCE).isNotNull()
        & F.col("__first_source").isNotNull()
        & (F.col("__first_source") != F.col(RAW_SOURCE))
        & F.coalesce(F.col(LISTED_WATERMARK) >= window_end_ms + F.lit(retention_ms), F.lit(False))
    )
    return (
        quarantine_df.join(first, "event_id", "left")
        .withColumns({
            "source": F.when(repeat, F.lit(T.SOURCE_LATE_REPEAT)).otherwise(F.col("source")),
            "reason": F.when(repeat, F.lit(T.SOURCE_LATE_REPEAT)).otherwise(F.col("reason")),
        })
        .select(*T.QUARANTINE_SCHEMA.fieldNames())
    )


# --- I/O at the edges ---------------------------------------------------------------------


def _region_kafka(settings: Settings, rr: RegionRanges) -> KafkaAccess:
    """The broker ranges were planned on, with this process's credentials
    for that region (the ranges, kept in the loads' ledger, hold only the
    address)."""
    for region in settings.regions:
        if region.job_id == rr.region:
            return KafkaAccess(rr.bootstrap, region.kafka_credentials)
    return KafkaAccess(rr.bootstrap, settings.kafka_credentials)


def _read(spark: SparkSession, kafka: KafkaAccess, rng: TopicRange) -> DataFrame | None:
    if not rng.partitions():
        return None
    reader = (
        spark.read.format("kafka")
        .options(**kafka.spark_options())
        .option("kafka.isolation.level", "read_committed")
        .option("includeHeaders", "true")
    )
    for key, value in rng.options().items():
        reader = reader.option(key, value)
    return reader.load()


def _empty_kafka_df(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        [],
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
        "timestampType int, headers array<struct<key:string,value:binary>>",
    )


# Delta's conflicts of optimistic concurrency, by Java class. delta-spark's
# Python classes for them are siblings (none is a subclass of
# DeltaConcurrentModificationException), so they are matched one by one,
# and by the Java name for a conflict that reaches Python under another class.
_CONFLICT_JAVA_CLASSES = (
    "io.delta.exceptions.DeltaConcurrentModificationException",
    "io.delta.exceptions.ConcurrentWriteException",
    "io.delta.exceptions.MetadataChangedException",
    "io.delta.exceptions.ProtocolChangedException",
    "io.delta.exceptions.ConcurrentAppendException",
    "io.delta.exceptions.ConcurrentDeleteReadException",
    "io.delta.exceptions.ConcurrentDeleteDeleteException",
    "io.delta.exceptions.ConcurrentTransactionException",
)


def is_write_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is one of Delta's concurrent-write conflicts (to retry)."""
    from delta.exceptions import (
        ConcurrentAppendException,
        ConcurrentDeleteDeleteException,
        ConcurrentDeleteReadException,
        ConcurrentTransactionException,
        ConcurrentWriteException,
        DeltaConcurrentModificationException,
        MetadataChangedException,
        ProtocolChangedException,
    )

    conflicts = (
        DeltaConcurrentModificationException,
        ConcurrentWriteException,
        MetadataChangedException,
        ProtocolChangedException,
        ConcurrentAppendException,
        ConcurrentDeleteReadException,
        ConcurrentDeleteDeleteException,
        ConcurrentTransactionException,
    )
    if isinstance(exc, conflicts):
        return True
    text = str(exc)
    return any(f"{name}:" in text or f"{name} " in text for name in _CONFLICT_JAVA_CLASSES)


def _hours_condition(column: str, hours: list[datetime]) -> str:
    literals = ", ".join(f"TIMESTAMP'{h.astimezone(UTC):%Y-%m-%d %H:%M:%S}'" for h in sorted(set(hours)))
    return f"{column} IN ({literals})"


def merge_new_rows(
    spark: SparkSession,
    table: str,
    source: DataFrame,
    keys: tuple[str, ...],
    hours: datetime | list[datetime],
    before_merge: Callable[[], None] | None = None,
) -> int:
    """Insert the rows of ``source`` whose key is not in the table's
    partitions of ``hours`` yet (insert-if-absent); a rerun finds nothing
    new and writes no table version at all. Columns the table has and the
    source lacks (one an operator added) are left null.

    Concurrent writers conflict in Delta's optimistic concurrency (any class
    of :func:`is_write_conflict`); the loser retries with backoff and
    jitter, and then finds the winner's rows present. ``before_merge`` runs
    before each MERGE (the tests hold two loads at a barrier there). Returns
    the number of rows inserted."""
    from delta.tables import DeltaTable

    hours = [hours] if isinstance(hours, datetime) else list(hours)
    if not hours:
        return 0
    # The partition list limits the MERGE's read (and so its conflicts) to these hours.
    in_hours = _hours_condition("t.event_hour", hours)
    condition = " AND ".join([f"t.{k} <=> s.{k}" for k in keys] + [in_hours])
    for attempt in range(1, MERGE_ATTEMPTS + 1):
        try:
            existing = spark.table(table).where(F.expr(in_hours.replace("t.event_hour", "event_hour"))).select(*keys)
            new_rows = source.join(existing, list(keys), "left_anti")
            if new_rows.isEmpty():
                return 0
            if before_merge is not None:
                before_merge()
            # The MERGE's own metrics row: the table's latest history entry
            # may already be another load's commit.
            metrics = (
                DeltaTable.forName(spark, table)
                .alias("t")
                .merge(source.alias("s"), condition)
                .whenNotMatchedInsert(values={c: F.col(f"s.{c}") for c in source.columns})
                .execute()
                .first()
            )
            return int(metrics["num_inserted_rows"]) if metrics is not None else 0
        except Exception as exc:
            if not is_write_conflict(exc):
                raise
            if attempt == MERGE_ATTEMPTS:
                raise LoadError(f"{table}: still conflicting after {attempt} attempts: {exc}") from exc
            pause = min(30.0, 0.5 * 2**attempt) * (0.5 + random.random())  # noqa: S311 - jitter
            log.warning(
                "%s: concurrent write conflict (%s); retry %d in %.1fs",
                table,
                type(exc).__name__,
                attempt,
                pause,
            )
            time.sleep(pause)
    raise AssertionError("unreachable")


# --- rows of a run ----------------------------------------------------------------------------


@contextmanager
def table_rows(
    spark: SparkSession,
    settings: Settings,
    ranges: list[RegionRanges],
    loaded_at: datetime,
    run_id: int,
    hour: datetime | None = None,
) -> Iterator[dict[str, DataFrame]]:
    """Per table, the rows of the records in ``ranges``: every region's,
    unioned, one row per key (a producer retry, a replayed or injected
    duplicate: the dedupe the design puts before the load), ``load_run`` =
    ``run_id``; only the rows of ``hour`` when one is given (a repair).

    Each region's aggregate records feed two tables (the readable ones
    ``ad_minute_aggregates``, the others the quarantine): they are read
    from Kafka and parsed once, and cached while the block runs."""
    parts: dict[str, list[DataFrame]] = {table: [] for table in T.TABLES}
    shared: list[DataFrame] = []
    for rr in ranges:
        empty = _empty_kafka_df(spark)
        kafka = _region_kafka(settings, rr)
        raw_df = _read(spark, kafka, rr.raw) or empty
        agg_df = with_aggregate_fields(_read(spark, kafka, rr.aggregates) or empty).persist()
        shared.append(agg_df)
        late_df = _read(spark, kafka, rr.late) or empty
        dlq_df = _read(spark, kafka, rr.dlq) or empty
        parts[T.RAW].append(raw_table_rows(raw_df, rr.region, hour, loaded_at, settings.max_future_skew_ms))
        parts[T.AGGREGATES].append(aggregate_table_rows(agg_df, rr.region, hour, loaded_at))
        parts[T.QUARANTINE].append(quarantine_table_rows(dlq_df, late_df, agg_df, rr.region, hour, loaded_at))
    unions = {table: functools.reduce(DataFrame.unionByName, dfs) for table, dfs in parts.items()}
    unions[T.QUARANTINE] = mark_late_repeats(
        unions[T.QUARANTINE], _first_raw(spark, unions), settings.late_dedupe_retention_s * 1000
    )
    if len(ranges) > 1:  # one region has no copy in another
        loaded = _loaded_raw(spark, unions[T.RAW].select("event_hour", "event_id"))
        unions[T.QUARANTINE] = unions[T.QUARANTINE].unionByName(
            cross_region_copies(unions[T.RAW], loaded, loaded_at)
        )
    out = {}
    for table, union in unions.items():
        _schema, keys = T.TABLES[table]
        out[table] = _first_per_key(union, list(keys)).withColumn("load_run", F.lit(run_id).cast("long"))
    try:
        yield out
    finally:
        for df in shared:
            df.unpersist()


def _loaded_raw(spark: SparkSession, keys: DataFrame) -> DataFrame:
    """The raw rows earlier runs loaded (published or staged) of the events
    in ``keys`` (``event_hour``, ``event_id``)."""
    hours = [parse_hour(h) for h in _hour_labels(keys)]
    loaded = [
        spark.table(t).where(_in_hours(hours)).select(*T.RAW_SCHEMA.fieldNames()) for t in (T.RAW, T.staged(T.RAW))
    ]
    return functools.reduce(DataFrame.unionByName, loaded).join(
        keys.distinct(), ["event_hour", "event_id"], "left_semi"
    )


def _ranked_raw(new_df: DataFrame, loaded_df: DataFrame) -> DataFrame:
    """Raw rows with ``__n``: 1 for the row of each event that counts as its
    first, the one an earlier run loaded before this run's (then the lowest
    region and Kafka position), and ``__first_region``, that row's region."""
    columns = T.RAW_SCHEMA.fieldNames()
    ranked = loaded_df.select(*columns).withColumn("__new", F.lit(1)).unionByName(
        new_df.select(*columns).withColumn("__new", F.lit(2))
    )
    w = Window.partitionBy("event_id").orderBy("__new", "region", "kafka_topic", "kafka_partition", "kafka_offset")
    return (
        ranked.withColumn("__n", F.row_number().over(w))
        .withColumn("__first_region", F.first("region").over(w))
        .drop("__new")
    )


def _first_raw(spark: SparkSession, unions: dict[str, DataFrame]) -> DataFrame:
    """For the events this run's late copies list: the raw row of each event
    that counts as its first (:func:`_ranked_raw`)."""
    late = unions[T.QUARANTINE].where(F.col("source") == F.lit(T.SOURCE_LATE))
    keys = late.select("event_hour", "event_id").distinct()
    new = unions[T.RAW].join(F.broadcast(keys), ["event_hour", "event_id"], "left_semi")
    ranked = _ranked_raw(new, _loaded_raw(spark, keys))
    return ranked.where(F.col("__n") == 1).drop("__n", "__first_region")


def cross_region_copies(new_df: DataFrame, loaded_df: DataFrame, loaded_at: datetime) -> DataFrame:
    """Raw rows of this run (every region's, before the dedupe) and the rows
    earlier runs loaded of the same events -> a quarantine row
    (``cross_region``) for each copy of an event in a region other than the
    one whose row the raw table keeps: that region's stream counted it too,
    so the spend is charged twice (docs/design.md says what is done about it)."""
    regions = (
        new_df.select("event_id", "region").unionByName(loaded_df.select("event_id", "region"))
        .groupBy("event_id").agg(F.countDistinct("region").alias("__regions"))
        .where(F.col("__regions") > 1)
        .select("event_id")
    )
    copies = _ranked_raw(
        new_df.join(regions, "event_id", "left_semi"), loaded_df.join(regions, "event_id", "left_semi")
    ).where(F.col("region") != F.col("__first_region"))
    copies = _first_per_key(copies.drop("__n", "__first_region"), ["event_id", "region"])
    return copies.select(
        F.lit(T.SOURCE_CROSS_REGION).alias("source"),
        F.concat_ws("@", "event_id", "region").alias("event_key"),
        F.lit("cross_region_duplicate").alias("reason"),
        F.lit(None).cast("binary").alias("raw_value"),
        "event_id",
        "ad_id",
        "event_type",
        "event_time",
        "event_hour",
        "region",
        "kafka_topic",
        "kafka_partition",
        "kafka_offset",
        F.lit(loaded_at).cast("timestamp").alias("loaded_at"),
        F.lit(None).cast("long").alias("load_run"),
    )


def _hour_labels(df: DataFrame) -> list[str]:
    """The distinct ``event_hour`` values of ``df`` as UTC labels (formatted
    by Spark in its UTC session zone: a collected timestamp would be a naive
    datetime in the host's zone)."""
    label = F.date_format("event_hour", "yyyy-MM-dd'T'HH").alias("h")
    return sorted(r["h"] for r in df.select(label).distinct().collect())


def _in_hours(hours: list[datetime]) -> Column:
    return F.expr(_hours_condition("event_hour", hours)) if hours else F.lit(False)


# --- what Kafka says of an hour ------------------------------------------------------------


def regions_with_events(settings: Settings, spark: SparkSession, hour: datetime) -> list[str]:
    """The regions whose raw topic holds a valid event of ``hour`` among the
    records written during it and committed by its stream: read by record
    time, not through the loads' coverage, so an hour a load lost is seen.
    (Records written in the hour may all be of other hours, replays or late
    ones: only a valid event of the hour itself counts.)"""
    start_ms, end_ms = hour_ms(hour), hour_ms(hour + ONE_HOUR)
    loaded_at = datetime.now(UTC)
    out = []
    for region in settings.regions:
        rs = settings.for_region(region)
        topic = rs.topics.events
        committed = kafka_io.stream_commits(rs)
        firsts = kafka_io.offsets_for_times(rs.kafka, topic, start_ms)
        afters = kafka_io.offsets_for_times(rs.kafka, topic, end_ms)
        start, end = {}, {}
        for p, first in firsts.items():
            if first is None:
                continue
            stop = afters.get(p) if afters.get(p) is not None else committed.get(p, (first, ""))[0]
            start[p], end[p] = first, min(stop, committed.get(p, (first, ""))[0])
        df = _read(spark, rs.kafka, TopicRange(topic, start, end))
        if df is not None and not raw_table_rows(
            df, region.job_id, hour, loaded_at, settings.max_future_skew_ms
        ).isEmpty():
            out.append(region.job_id)
    return out


def kafka_facts(settings: Settings, spark: SparkSession, hour: datetime) -> quality.KafkaFacts:
    """What Kafka says of ``hour`` for the gate (:class:`~adpipe.lakehouse.quality.KafkaFacts`)."""
    return quality.KafkaFacts(
        tuple(regions_with_events(settings, spark, hour)),
        tuple(retention_gaps(settings, hour)),
        stream_watermarks(settings),
    )


# --- the ledger ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerState:
    next_run: int
    coverage: Coverage


def ledger_state(spark: SparkSession) -> LedgerState:
    """The next run's id and every offset loaded so far (the coverage of the
    latest ``staged`` row)."""
    # One pass over the ledger (max_by skips the rows its ordering leaves null).
    row = (
        spark.table(T.LOAD_RUNS)
        .agg(
            F.max("run_id").alias("last_run"),
            F.max_by("coverage", F.when(F.col("step") == "staged", F.col("run_id"))).alias("coverage"),
        )
        .first()
    )
    coverage = json.loads(row["coverage"]) if row is not None and row["coverage"] else {}
    return LedgerState(int(row["last_run"] or 0) + 1 if row is not None else 1, coverage)


def _append_ledger(
    spark: SparkSession, run_id: int, step: str, kind: str, hour: datetime | None, **fields: object
) -> None:
    row: dict[str, object] = dict.fromkeys(T.LOAD_RUNS_SCHEMA.fieldNames())
    row.update(run_id=run_id, step=step, kind=kind, hour=hour, at=datetime.now(UTC))
    row.update({k: v if isinstance(v, str) or v is None else json.dumps(v, default=str) for k, v in fields.items()})
    names = T.LOAD_RUNS_SCHEMA.fieldNames()
    spark.createDataFrame([tuple(row[n] for n in names)], T.LOAD_RUNS_SCHEMA).write.format("delta").mode(
        "append"
    ).saveAsTable(T.LOAD_RUNS)


def _finalized_hours(spark: SparkSession) -> set[str]:
    """Hours some run has published (or repaired): rows published into them
    later are late corrections."""
    done = spark.table(T.LOAD_RUNS).where(F.col("step").isin("published", "repaired")).select("hours").collect()
    return {h for r in done if r["hours"] for h in json.loads(r["hours"])}


def held_hours(spark: SparkSession) -> dict[str, str]:
    """The hours held by a failed gate: their last ledger step of
    ``failed``, ``published``, ``repaired`` or ``discarded`` is ``failed``.
    Hour -> that failure's message. Their staged rows wait for an operator
    (a load asking for the hour again, ``--repair`` or ``--discard-staged``);
    other runs neither audit nor publish them, and are not held back."""
    steps = (
        spark.table(T.LOAD_RUNS)
        .where(F.col("step").isin("failed", "published", "repaired", "discarded"))
        .select("run_id", "step", "at", "hours", "message")
        .collect()
    )
    last: dict[str, tuple] = {}
    for row in sorted(steps, key=lambda r: (r["run_id"], r["at"])):
        for hour in json.loads(row["hours"] or "[]"):
            last[hour] = (row["step"], row["message"])
    return {hour: message or "" for hour, (step, message) in last.items() if step == "failed"}


def _failed_before(spark: SparkSession, hour: str, message: str, run_id: int) -> bool:
    """Whether an earlier run's gate failed ``hour`` with the same message
    (so its alert went out already)."""
    rows = spark.table(T.LOAD_RUNS).where((F.col("step") == "failed") & (F.col("run_id") < run_id)).collect()
    return any(json.loads(r["hours"] or "[]") == [hour] and r["message"] == message for r in rows)


LOCK_WAIT_S = 3600.0


@contextmanager
def load_lock(settings: Settings, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """One load step at a time per ``ADPIPE_HOME``: staging and publishing
    read the ledger and the tables and write them back. A second load waits
    (logging who holds the lock) rather than fail."""
    settings.home.mkdir(parents=True, exist_ok=True)
    path = settings.home / "load.lock"
    with open(path, "a+") as handle:
        deadline = time.monotonic() + wait_s
        waited = False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LoadError(f"another load holds {path} (pid {path.read_text().strip()}) too long") from None
                if not waited:
                    log.info("waiting for the load running as pid %s (%s)", path.read_text().strip() or "?", path)
                    waited = True
                time.sleep(1.0)
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


# --- write, audit, publish ----------------------------------------------------------------------


class HourOpen(LoadError):
    """An hour asked for is not closed by every region's stream yet."""


@dataclass
class StagedRun:
    """What a staging step did; handed to audit and publish (also through
    Airflow's XCom, as a dict)."""

    run_id: int
    kind: str
    hour: str  # the hour asked for (the first of a range)
    hours: list[str]  # the hours to audit and publish: closed ones with staged rows, and those asked for
    staged: dict[str, int] = field(default_factory=dict)  # rows staged by this run, per table
    read: list[dict] = field(default_factory=list)  # the ranges read, per region
    lost_to_retention: int = 0
    asked: list[str] = field(default_factory=list)  # the hours asked for (empty: ``hour`` alone)
    held: list[str] = field(default_factory=list)  # hours with staged rows a failed gate holds (not audited)

    def hour_list(self) -> list[datetime]:
        return [parse_hour(h) for h in self.hours]

    def asked_hours(self) -> list[str]:
        return self.asked or [self.hour]

    def to_dict(self) -> dict:
        return json.loads(json.dumps(asdict(self), default=str))

    @classmethod
    def from_dict(cls, data: dict) -> StagedRun:
        return cls(**data)


def _pending_hours(spark: SparkSession, run_id: int) -> list[str]:
    """The hours with rows staged by runs up to ``run_id``, in one Spark job."""
    staged = [spark.table(T.staged(t)).where(F.col("load_run") <= run_id).select("event_hour") for t in T.TABLES]
    return _hour_labels(functools.reduce(DataFrame.unionByName, staged))


def _stage_table(spark: SparkSession, table: str, source: DataFrame, run_id: int) -> int:
    """The rows of ``source`` that are neither published nor staged yet,
    into the staging twin of ``table``; returns how many."""
    source = source.cache()
    try:
        hours = [parse_hour(h) for h in _hour_labels(source)]
        _schema, keys = T.TABLES[table]
        published = spark.table(table).where(_in_hours(hours)).select(*keys)
        new_rows = source.join(published, list(keys), "left_anti")
        staged = merge_new_rows(spark, T.staged(table), new_rows, keys, hours)
    finally:
        source.unpersist()
    log.info("run %d: %s: %d rows staged", run_id, T.staged(table), staged)
    return staged


def _alert_cross_region(settings: Settings, spark: SparkSession, run_id: int) -> None:
    """One alert for the cross-region copies this run found (each copy is
    staged once, by the run that found it first)."""
    label = F.date_format("event_hour", "yyyy-MM-dd'T'HH").alias("h")
    found = (
        spark.table(T.staged(T.QUARANTINE))
        .where((F.col("source") == F.lit(T.SOURCE_CROSS_REGION)) & (F.col("load_run") == F.lit(run_id)))
        .groupBy(label).count().collect()
    )
    if not found:
        return
    by_hour = {r["h"]: int(r["count"]) for r in found}
    log.warning("run %d: events that reached more than one region (counted by each): %s", run_id, by_hour)
    alerting.send_alert(settings, {
        "at": datetime.now(UTC).isoformat(), "source": "union_and_load", "run_id": run_id,
        "hours": sorted(by_hour), "cross_region_duplicates": sum(by_hour.values()),
        "regions": [r.job_id for r in settings.regions],
        "message": f"{sum(by_hour.values())} raw events reached more than one region and were counted (and "
        f"charged) by each region's stream, per hour {by_hour}; listed in {T.CROSS_REGION_DUPLICATES}",
    })


def stage(
    settings: Settings,
    spark: SparkSession,
    hour: datetime,
    last_hour: datetime | None = None,
    allow_open: bool = False,
) -> StagedRun:
    """Step 1 (module doc): stage what arrived since the last run. ``hour``
    (to ``last_hour``): the hours asked for, which must be closed unless
    ``allow_open``; the first one bounds the read of a partition no run has
    loaded yet."""
    started = time.monotonic()
    asked = hours_between(hour, last_hour)
    if not allow_open:
        open_hours = [h for h in asked if h not in closed_hours(settings, asked)]
        if open_hours:
            raise HourOpen(
                f"hour {hour_label(open_hours[0])} is not closed yet: a region's stream watermark has not passed "
                f"{hour_label(open_hours[0] + ONE_HOUR)}. Wait, or pass --allow-open to load what is there (its "
                "windows may be incomplete)."
            )
    with load_lock(settings):
        state = ledger_state(spark)
        run_id = state.next_run
        loaded_at = datetime.now(UTC).replace(microsecond=0)
        # Besides the hours asked, a run audits the hours with staged rows
        # that were closed before its read, so the read holds all they will
        # ever have. One that closes during the read waits for the next run:
        # audited now, its rows read before it closed would fail the gate for
        # no fault (adpipe chaos found it).
        horizon = closed_through(settings, asked[0], datetime.now(UTC).replace(minute=0, second=0, microsecond=0))
        ranges = [region_ranges(settings, r, hour, state.coverage.get(r.job_id)) for r in settings.regions]
        for rr in ranges:
            log.info(
                "run %d, region %s: raw %d records (to the stream's committed offsets), aggregates %d, late %d, "
                "dlq %d",
                run_id, rr.region, rr.raw.records(), rr.aggregates.records(), rr.late.records(), rr.dlq.records(),
            )
        with table_rows(spark, settings, ranges, loaded_at, run_id) as rows:
            # The tables are independent (their own Delta logs): staged side
            # by side, one table's planning and commits fill the cores while
            # another's tasks wait.
            staged = in_threads(
                {table: functools.partial(_stage_table, spark, table, source, run_id) for table, source in rows.items()}
            )
        if len(settings.regions) > 1:
            _alert_cross_region(settings, spark, run_id)
        faults_plan = faults.FaultPlan.from_env()
        if faults_plan is not None:
            faults_plan.hit(faults.LOAD_AFTER_STAGE, run_id, 1)
        pending = [parse_hour(h) for h in _pending_hours(spark, run_id)]
        held = held_hours(spark)
        ready = {h for h in pending if h not in asked and horizon is not None and h <= horizon}
        waiting = sorted(hour_label(h) for h in ready if hour_label(h) in held)
        if waiting:
            log.warning("run %d: hours held by a failed gate, left for an operator: %s", run_id, ", ".join(waiting))
        hours = sorted({h for h in ready if hour_label(h) not in held} | set(asked))
        lost = sum(n for rr in ranges for rng in rr.topics() for n in rng.lost.values())
        run = StagedRun(
            run_id, "load", hour_label(hour), [hour_label(h) for h in hours], staged, [asdict(r) for r in ranges], lost,
            asked=[hour_label(h) for h in asked], held=waiting,
        )
        _append_ledger(
            spark, run_id, "staged", "load", hour,
            coverage=advance(state.coverage, ranges), read=run.read, rows=staged, hours=run.hours,
            message=f"{lost} records lost to retention before any load read them" if lost else None,
        )
    _write_manifest(settings, run_id, "staged", run.to_dict())
    metrics.load().staged(settings, run_id, staged, lost, time.monotonic() - started)
    return run


def audit(settings: Settings, spark: SparkSession, run: StagedRun) -> list[quality.QualityResult]:
    """Step 2: the gate on each hour's candidate (published plus staged
    rows). A failure is written to the ledger; nothing is published."""
    started = time.monotonic()
    results = []
    for hour in run.hour_list():
        frames = quality.hour_frames(spark, hour, staged_through=run.run_id)
        results.append(quality.validate_frames(settings, hour, frames, kafka_facts(settings, spark, hour)))
    failed = {hour_label(r.hour): "\n".join(r.failed) for r in results if not r.success}
    for label, message in failed.items():
        # One ledger row per failed hour: publish leaves it out, later runs leave it held (held_hours).
        _append_ledger(spark, run.run_id, "failed", run.kind, parse_hour(label), hours=[label], message=message)
        if label not in run.asked_hours() and not _failed_before(spark, label, message, run.run_id):
            # An hour this run was not asked for fails nobody's task: it is said here, once.
            alerting.send_alert(settings, {
                "at": datetime.now(UTC).isoformat(), "source": "union_and_load", "hour": label,
                "run_id": run.run_id, "message": f"hour {label} held by its quality gate (its staged rows wait for "
                f"an operator; other hours go on being published): {message}",
            })
    if failed:
        _write_manifest(settings, run.run_id, "failed", {"failed": failed})
    gates = [(hour_label(r.hour), r.success) for r in results]
    metrics.load().audited(settings, run.run_id, gates, time.monotonic() - started)
    return results


def failed_asked(run: StagedRun, results: list[quality.QualityResult]) -> list[quality.QualityResult]:
    """The failed results of hours the run was asked for (those fail the
    command or task; another failed hour is held and alerted by audit)."""
    return [r for r in results if not r.success and hour_label(r.hour) in run.asked_hours()]


def audit_text(results: list[quality.QualityResult]) -> str:
    """What the audit says: the failed hours' results, or every result."""
    failed = [r for r in results if not r.success]
    return "\n".join(r.describe() for r in (failed or results))


def publish(settings: Settings, spark: SparkSession, run: StagedRun) -> dict[str, dict]:
    """Step 3: the audited hours' staged rows into the published tables.
    Returns ``{"inserted": {table: rows}, "corrections": {hour: rows}}``."""
    started = time.monotonic()
    inserted: dict[str, int] = {}
    corrections: dict[str, int] = {}
    with load_lock(settings):
        failed = _failed_in_run(spark, run.run_id)
        hours = [h for h in run.hour_list() if hour_label(h) not in failed]
        finalized = _finalized_hours(spark)
        fault_plan = faults.FaultPlan.from_env()
        for table, (schema, keys) in T.TABLES.items():
            staged = (
                spark.table(T.staged(table))
                .where(_in_hours(hours) & (F.col("load_run") <= run.run_id))
                .select(*schema.fieldNames())
                .withColumn("load_run", F.lit(run.run_id).cast("long"))
            )
            published = spark.table(table).where(_in_hours(hours)).select(*keys)
            new_rows = staged.join(published, list(keys), "left_anti")
            # Counted only in the hours published before (a first
            # publication has none): the MERGE reads the rows once.
            late_hours = [h for h in hours if hour_label(h) in finalized]
            if late_hours:
                label = F.date_format("event_hour", "yyyy-MM-dd'T'HH").alias("h")
                for r in new_rows.where(_in_hours(late_hours)).groupBy(label).count().collect():
                    corrections[r["h"]] = corrections.get(r["h"], 0) + int(r["count"])
            inserted[table] = merge_new_rows(spark, table, new_rows, keys, hours)
            log.info("run %d: %s: %d rows published", run.run_id, table, inserted[table])
            if fault_plan is not None:
                fault_plan.hit(faults.LOAD_AFTER_PUBLISH, run.run_id, 1)
        _clear_staged(spark, hours, run.run_id)
        _append_ledger(spark, run.run_id, "published", run.kind, parse_hour(run.hour), rows=inserted,
                       hours=[hour_label(h) for h in hours], corrections=corrections)
    if corrections:
        log.info("run %d: late corrections to hours already published: %s", run.run_id, corrections)
    _write_manifest(settings, run.run_id, "published", {"inserted": inserted, "corrections": corrections})
    metrics.load().published(settings, run.run_id, inserted, sum(corrections.values()), time.monotonic() - started)
    return {"inserted": inserted, "corrections": corrections}


def _failed_in_run(spark: SparkSession, run_id: int) -> set[str]:
    """The hours whose gate failed in run ``run_id`` (its audit's ledger rows)."""
    rows = spark.table(T.LOAD_RUNS).where((F.col("run_id") == run_id) & (F.col("step") == "failed")).collect()
    return {h for r in rows for h in json.loads(r["hours"] or "[]")}


def _clear_staged(spark: SparkSession, hours: list[datetime], through_run: int) -> None:
    from delta.tables import DeltaTable

    def clear(table: str) -> None:
        DeltaTable.forName(spark, T.staged(table)).delete(_in_hours(hours) & (F.col("load_run") <= through_run))

    in_threads({table: functools.partial(clear, table) for table in T.TABLES})


@dataclass
class LoadResult:
    hour: str
    run_id: int = 0
    hours: list[str] = field(default_factory=list)
    staged: dict[str, int] = field(default_factory=dict)
    inserted: dict[str, int] = field(default_factory=dict)
    corrections: dict[str, int] = field(default_factory=dict)
    gate: list[str] = field(default_factory=list)
    seconds: float = 0.0
    held: list[str] = field(default_factory=list)  # hours a failed gate holds, not published

    def describe(self) -> str:
        parts = ", ".join(f"{t}: +{self.inserted.get(t, 0)} of {self.staged.get(t, 0)} staged" for t in T.TABLES)
        extra = f"; late corrections {self.corrections}" if self.corrections else ""
        if self.held:
            extra += f"; held by a failed gate (not published): {', '.join(sorted(set(self.held)))}"
        hours = ", ".join(self.hours) or "none"
        return f"run {self.run_id}: hours {hours} audited and published in {self.seconds:.1f}s ({parts}){extra}"


def _gate_failure(results: list[quality.QualityResult], published: list[str] | None = None) -> GateFailed:
    failed = [r for r in results if not r.success]
    text = "\n".join(r.describe() for r in failed)
    held = ", ".join(hour_label(r.hour) for r in failed)
    done = (f"hours {', '.join(published)} passed and were published" if published
            else "nothing was published")
    return GateFailed(f"the gate failed for {held}: {done}; the failed hours' rows stay staged in "
                      f"{T.STAGING_DATABASE} (held until an operator reloads, repairs or discards them):\n{text}",
                      failed)


def load_hour(
    settings: Settings,
    hour: datetime,
    spark: SparkSession | None = None,
    last_hour: datetime | None = None,
    allow_open: bool = False,
) -> LoadResult:
    """Union & Load asked for ``hour`` (to ``last_hour``): stage, audit,
    publish (module doc). Raises :class:`HourOpen` for an hour not closed,
    :class:`GateFailed` (nothing published) for a failed audit."""
    started = time.monotonic()
    spark = spark or metastore_session(settings, f"adpipe-load-{hour_label(hour)}")
    run = stage(settings, spark, hour, last_hour, allow_open)
    results = audit(settings, spark, run)
    # Write-audit-publish per hour: the hours that passed are published
    # whatever another hour's gate says.
    passed = [hour_label(r.hour) for r in results if r.success]
    done = publish(settings, spark, run) if passed else {"inserted": {}, "corrections": {}}
    if failed_asked(run, results):
        raise _gate_failure(results, passed)
    return LoadResult(
        hour=run.hour, run_id=run.run_id, hours=passed, staged=run.staged, inserted=done["inserted"],
        corrections=done["corrections"], gate=[r.describe().splitlines()[0] for r in results],
        seconds=time.monotonic() - started, held=[hour_label(r.hour) for r in results if not r.success] + run.held,
    )


def repair_hour(settings: Settings, hour: datetime, spark: SparkSession | None = None) -> LoadResult:
    """Rebuild the published partitions of ``hour`` from Kafka: every record
    from the hour's start (less the slack) to the ends a load reads, the rows
    of that hour only, audited like a load, then written over the hour's
    partitions in one Delta commit per table (``replaceWhere``). Idempotent:
    the same records give the same rows."""
    started = time.monotonic()
    spark = spark or metastore_session(settings, f"adpipe-repair-{hour_label(hour)}")
    with load_lock(settings):
        run_id = ledger_state(spark).next_run
        loaded_at = datetime.now(UTC).replace(microsecond=0)
        ranges = [region_ranges(settings, r, hour, None) for r in settings.regions]
        # Materialized, lineage cut: the checks and the write below then read
        # shallow plans instead of re-planning four Kafka reads, joins and a
        # window for every expectation.
        with table_rows(spark, settings, ranges, loaded_at, run_id, hour) as rebuilt:
            rows = {table: df.localCheckpoint() for table, df in rebuilt.items()}
        frames = quality.HourFrames(raw_df=rows[T.RAW], quarantine_df=rows[T.QUARANTINE],
                                    aggregates_df=rows[T.AGGREGATES])
        result = quality.validate_frames(settings, hour, frames, kafka_facts(settings, spark, hour))
        if not result.success:
            _append_ledger(spark, run_id, "failed", "repair", hour, hours=[hour_label(hour)],
                           message="\n".join(result.failed))
            raise _gate_failure([result])
        written: dict[str, int] = {}
        for table, df in rows.items():
            target = spark.table(table)
            columns = [F.col(c) if c in df.columns else F.lit(None).cast(target.schema[c].dataType).alias(c)
                       for c in target.columns]
            written[table] = df.count()
            df.select(*columns).write.format("delta").mode("overwrite").option(
                "replaceWhere", _hours_condition("event_hour", [hour])
            ).saveAsTable(table)
        _clear_staged(spark, [hour], run_id)
        _append_ledger(spark, run_id, "repaired", "repair", hour, read=[asdict(r) for r in ranges], rows=written,
                       hours=[hour_label(hour)])
    _write_manifest(settings, run_id, "repaired", {"hour": hour_label(hour), "rows": written})
    return LoadResult(hour=hour_label(hour), run_id=run_id, hours=[hour_label(hour)], staged=written,
                      inserted=written, gate=[result.describe().splitlines()[0]],
                      seconds=time.monotonic() - started)


def discard_staged(settings: Settings, hour: datetime, spark: SparkSession | None = None) -> dict[str, int]:
    """Delete the staged rows of ``hour`` (after a failed gate, once an
    operator has inspected them and decided they must not be published); a
    ``discarded`` ledger row records how many per table. The Kafka records
    stay loaded (the coverage does not go back): ``--repair`` rebuilds the
    hour from Kafka if it should be published after all."""
    from delta.tables import DeltaTable

    spark = spark or metastore_session(settings, f"adpipe-discard-{hour_label(hour)}")
    with load_lock(settings):
        run_id = ledger_state(spark).next_run
        counts = {}
        for table in T.TABLES:
            staged = spark.table(T.staged(table)).where(_in_hours([hour]))
            counts[table] = staged.count()
            if counts[table]:
                DeltaTable.forName(spark, T.staged(table)).delete(_in_hours([hour]))
        _append_ledger(spark, run_id, "discarded", "discard", hour, rows=counts, hours=[hour_label(hour)])
    log.warning("run %d: discarded the staged rows of %s: %s", run_id, hour_label(hour), counts)
    return counts


def _write_manifest(settings: Settings, run_id: int, step: str, body: dict) -> Path:
    return write_json(settings.home / "load" / "runs" / f"{run_id:06d}-{step}.json", body)


def write_json(path: Path, body: dict) -> Path:
    """Write ``body`` whole or not at all (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(body, indent=2, default=str) + "\n")
    tmp.replace(path)
    return path


def step_file(run_file: Path, step: str) -> Path:
    """Where a step of the run handed over in ``run_file`` writes its result."""
    return run_file.with_name(f"{run_file.stem}.{step}.json")
