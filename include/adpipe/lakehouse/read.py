"""Union & Load, step 1's reading: each region's Kafka ranges (from
``adpipe.lakehouse.ranges``) read into DataFrames and shaped into the three
tables' rows (``adpipe.lakehouse.rows``), the raw rows already loaded looked
up for dedupe; and what Kafka says of an hour for the gate (which regions had
events in it, ``kafka_facts``)."""

from __future__ import annotations

import functools
import logging
from datetime import UTC, datetime

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from adpipe import kafka_io
from adpipe.lakehouse import quality
from adpipe.lakehouse import tables as T
from adpipe.lakehouse.merge import (
    _hours_condition,
)
from adpipe.lakehouse.ranges import (
    ONE_HOUR,
    RegionRanges,
    TopicRange,
    hour_ms,
    parse_hour,
    retention_gaps,
    stream_watermarks,
)
from adpipe.lakehouse.rows import (
    _first_per_key,
    _ranked_raw,
    aggregate_table_rows,
    cross_region_copies,
    dlq_sources,
    mark_late_repeats,
    quarantine_table_rows,
    raw_table_rows,
    with_aggregate_fields,
    without_dlq_copies,
)
from adpipe.settings import KafkaAccess, Settings
from adpipe.spark import in_threads

log = logging.getLogger(__name__)


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


def table_rows(
    spark: SparkSession,
    settings: Settings,
    ranges: list[RegionRanges],
    loaded_at: datetime,
    run_id: int,
    hour: datetime | None = None,
) -> dict[str, DataFrame]:
    """Per table, the rows of the records in ``ranges``: every region's,
    unioned, one row per key (a producer retry, a replayed or injected
    duplicate: the dedupe the design puts before the load), ``load_run`` =
    ``run_id``; only the rows of ``hour`` when one is given (a repair).

    Each table's rows are a local checkpoint (rows, not a cache's columns:
    a million raw rows cost 3 s less to keep), kept by the first job that
    reads them, the raw rows at once (beside each region's aggregate
    records): what reads them later (the hours, the
    MERGE, a repair's gate) reads them, not Kafka again. The other tables'
    rows are each read by one thread at a time. The quarantine's late
    listings are checked against the raw rows kept so (they once read and
    parsed every raw record a second time). Each region's aggregate records
    feed two tables (the readable ones ``ad_minute_aggregates``, the others
    the quarantine): they are read from Kafka and parsed once, and kept (a
    local checkpoint, at once) without the readable ones' bytes."""
    kafka = {rr.region: _region_kafka(settings, rr) for rr in ranges}

    def records(rr: RegionRanges, topic: TopicRange) -> DataFrame:
        return _read(spark, kafka[rr.region], topic) or _empty_kafka_df(spark)

    raw_union = functools.reduce(DataFrame.unionByName, [
        raw_table_rows(records(rr, rr.raw), rr.region, hour, loaded_at, settings.max_future_skew_ms) for rr in ranges
    ])
    # The raw records the DLQ lists are no raw rows: a re-stamped retry's
    # later copies (conflicting_duplicate) were not counted, the first was.
    listed = functools.reduce(DataFrame.unionByName, [dlq_sources(records(rr, rr.dlq), rr.region) for rr in ranges])
    raw_union = without_dlq_copies(raw_union, listed)

    def rows_of(table: str, union: DataFrame, eager: bool = False) -> DataFrame:
        _schema, keys = T.TABLES[table]
        first = _first_per_key(union, list(keys)).withColumn("load_run", F.lit(run_id).cast("long"))
        return first.localCheckpoint(eager=eager)

    def kept_aggregates() -> list[DataFrame]:
        return [with_aggregate_fields(records(rr, rr.aggregates)).localCheckpoint(eager=True) for rr in ranges]

    # The raw rows and each region's aggregate records are kept now, side by
    # side (one's planning and last tasks overlap the other's tasks), before
    # the tables are staged: the quarantine's rows read both, and a lazy
    # checkpoint that two jobs compute at once hangs Spark's scheduler (a
    # two-region load did). Each checkpoint here is computed by its own job.
    kept = in_threads({T.RAW: functools.partial(rows_of, T.RAW, raw_union, eager=True), "aggregates": kept_aggregates})
    earlier = _listed_by_earlier_runs(spark, kept[T.RAW], ranges)
    if earlier is not None:
        # A DLQ copy loaded before its raw record (its batch committed
        # between an earlier run's reading of the ledger and of the DLQ):
        # the raw rows again, without that record.
        raw_union = without_dlq_copies(raw_union, listed.unionByName(earlier))
        kept[T.RAW] = rows_of(T.RAW, raw_union, eager=True)
    parts: dict[str, list[DataFrame]] = {T.AGGREGATES: [], T.QUARANTINE: []}
    for rr, agg_df in zip(ranges, kept["aggregates"], strict=True):
        parts[T.AGGREGATES].append(aggregate_table_rows(agg_df, rr.region, hour, loaded_at))
        parts[T.QUARANTINE].append(
            quarantine_table_rows(records(rr, rr.dlq), records(rr, rr.late), agg_df, rr.region, hour, loaded_at)
        )
    unions = {T.RAW: raw_union} | {table: functools.reduce(DataFrame.unionByName, dfs) for table, dfs in parts.items()}
    out = {T.RAW: kept[T.RAW]}
    unions[T.QUARANTINE] = mark_late_repeats(
        unions[T.QUARANTINE], _first_raw(spark, unions[T.QUARANTINE], out[T.RAW]),
        settings.late_dedupe_retention_s * 1000,
    )
    if len(ranges) > 1:  # one region has no copy in another
        loaded = _loaded_raw(spark, unions[T.RAW].select("event_hour", "event_id"))
        unions[T.QUARANTINE] = unions[T.QUARANTINE].unionByName(
            cross_region_copies(unions[T.RAW], loaded, loaded_at)
        )
    return out | {table: rows_of(table, unions[table]) for table in unions if table != T.RAW}


def _listed_by_earlier_runs(spark: SparkSession, raw_rows: DataFrame, ranges: list[RegionRanges]) -> DataFrame | None:
    """The DLQ rows earlier runs loaded (published or staged) that name a
    raw record this run read (``ranges``), in the hours of its ``raw_rows``
    (a re-stamped copy and its DLQ row share their event hour): (``region``,
    ``event_key``), or None for none (the rule: a DLQ copy comes with its raw
    record, or in the run before)."""
    hours = [parse_hour(h) for h in _hour_labels(raw_rows)]
    if not hours:
        return None
    parts = F.split("event_key", "/")
    read = F.lit(False)
    for rr in ranges:
        for p in rr.raw.partitions():
            read = read | (
                (F.col("region") == rr.region) & (parts[0] == rr.raw.topic) & (parts[1] == str(p))
                & (parts[2].try_cast("long") >= rr.raw.start[p]) & (parts[2].try_cast("long") < rr.raw.end[p])
            )
    loaded = [
        spark.table(t).where(_in_hours(hours) & (F.col("source") == F.lit(T.SOURCE_DLQ))).select("region", "event_key")
        for t in (T.QUARANTINE, T.staged(T.QUARANTINE))
    ]
    earlier = functools.reduce(DataFrame.unionByName, loaded).where(read)
    return None if earlier.isEmpty() else earlier.localCheckpoint()


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


def _first_raw(spark: SparkSession, quarantine: DataFrame, raw_rows: DataFrame) -> DataFrame:
    """For the events this run's late copies (in ``quarantine``) list: the
    raw row of each event that counts as its first (:func:`_ranked_raw`),
    among this run's ``raw_rows`` (one per event already) and those loaded."""
    late = quarantine.where(F.col("source") == F.lit(T.SOURCE_LATE))
    keys = late.select("event_hour", "event_id").distinct()
    new = raw_rows.join(F.broadcast(keys), ["event_hour", "event_id"], "left_semi")
    ranked = _ranked_raw(new, _loaded_raw(spark, keys))
    return ranked.where(F.col("__n") == 1).drop("__n", "__first_region")


def _hour_labels(df: DataFrame) -> list[str]:
    """The distinct ``event_hour`` values of ``df`` as UTC labels (formatted
    by Spark in its UTC session zone: a collected timestamp would be a naive
    datetime in the host's zone)."""
    label = F.date_format("event_hour", "yyyy-MM-dd'T'HH").alias("h")
    return sorted(r["h"] for r in df.select(label).distinct().collect())


def _in_hours(hours: list[datetime]) -> Column:
    return F.expr(_hours_condition("event_hour", hours)) if hours else F.lit(False)


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
