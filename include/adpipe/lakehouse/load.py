"""Union & Load: one UTC hour of every region into the ``ads`` Delta tables.

Uber's Union & Load is a streaming job; ours is an hourly batch by design
(the project card): the Airflow DAG ``ad_union_and_load`` runs it once the
hour is closed, and any hour can be loaded again or backfilled.

Which Kafka offsets cover the hour
----------------------------------
Event time and Kafka position are unrelated (late events arrive hours after
their minute; a producer may send yesterday's events today), so no offset
range is *exactly* one hour of event time. Each run therefore reads a range
that is safely over-inclusive and keeps the rows whose event time (window
start for aggregates) falls in the hour; the insert-if-absent MERGE on each
table's unique key makes any overlap between runs harmless.

- Start: the first offset whose record was written at or after the hour's
  start less the larger of the future skew and the lateness
  (``offsets_for_times``), never before the first offset the broker keeps.
  Nothing of the hour is before it: a valid event's ``event_time`` is at
  most the future skew after its record's timestamp (else it is malformed),
  a late or DLQ copy is written after its raw record, and an aggregate after
  its window closed. A run no longer scans everything Kafka keeps. The DLQ
  is the exception, read from its first kept offset: a malformed record may
  name any event time, and the topic is small.
- End of the raw topic: the offsets the region's stream job has committed in
  its ledger group (see tx_sink). Exactly the raw records whose outcome (an
  aggregate, a late listing or a DLQ entry) is already committed, so the
  raw table never holds an event whose late/DLQ fate is still unknown.
- End of the aggregates, late and DLQ topics: their last stable offsets,
  read *after* the ledger, so every output of those batches is included.

The ranges of each run are written to a manifest under
``$ADPIPE_HOME/load/`` so a run can be audited and repeated."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from adpipe import kafka_io, raw_events
from adpipe import schemas as S
from adpipe.lakehouse import tables as T
from adpipe.lakehouse.metastore import metastore_session
from adpipe.settings import Region, Settings

__all__ = ["hour_closed", "load_hour", "parse_hour"]

log = logging.getLogger(__name__)

MERGE_ATTEMPTS = 8
ONE_HOUR = timedelta(hours=1)
# The aggregate JSON of the contract (adpipe.stream.job.aggregate_record writes it).
_AGGREGATE_JSON = StructType(
    [
        StructField("record_uuid", StringType()),
        StructField("ad_id", StringType()),
        StructField("window_start", StringType()),
        StructField("window_end", StringType()),
        StructField("impressions", LongType()),
        StructField("clicks", LongType()),
    ]
)
SOURCE_BAD_AGGREGATE = "bad_aggregate"


class LoadError(RuntimeError):
    """The hour cannot be loaded (not closed yet, or a table write failed for good)."""


def parse_hour(text: str) -> datetime:
    """``YYYY-MM-DDTHH`` (also with ``:MM[:SS]`` and a zone) -> the UTC hour."""
    raw = text.strip()
    try:
        if len(raw) < 13:  # a bare date would silently mean its midnight
            raise ValueError(raw)
        if len(raw) == 13:
            ts = datetime.strptime(raw, "%Y-%m-%dT%H").replace(tzinfo=UTC)
        else:
            ts = datetime.fromisoformat(raw.replace("Z", "+00:00"))
            if ts.tzinfo is None:
                ts = ts.replace(tzinfo=UTC)
    except ValueError as exc:
        raise ValueError(f"--hour {text!r}: expected YYYY-MM-DDTHH (UTC), e.g. 2026-11-22T12") from exc
    ts = ts.astimezone(UTC)
    if (ts.minute, ts.second, ts.microsecond) != (0, 0, 0):
        raise ValueError(f"--hour {text!r} is not the start of an hour")
    return ts


def hours_between(first: datetime, last: datetime | None = None) -> list[datetime]:
    """Every hour from ``first`` to ``last`` inclusive (just ``first`` without ``last``)."""
    last = last or first
    if last < first:
        raise ValueError(f"--to-hour {hour_label(last)} is before --hour {hour_label(first)}")
    return [first + i * ONE_HOUR for i in range(int((last - first) / ONE_HOUR) + 1)]


def hour_label(hour: datetime) -> str:
    return hour.astimezone(UTC).strftime("%Y-%m-%dT%H")


# --- which offsets -------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicRange:
    topic: str
    start: dict[int, int]
    end: dict[int, int]

    def partitions(self) -> list[int]:
        return sorted(p for p in self.end if self.end[p] > self.start.get(p, 0))

    def records(self) -> int:
        return sum(self.end[p] - self.start[p] for p in self.partitions())

    def options(self) -> dict[str, str]:
        """Spark Kafka source options reading exactly this range."""
        parts = self.partitions()
        return {
            "assign": json.dumps({self.topic: parts}),
            "startingOffsets": json.dumps({self.topic: {str(p): self.start[p] for p in parts}}),
            "endingOffsets": json.dumps({self.topic: {str(p): self.end[p] for p in parts}}),
        }


@dataclass(frozen=True)
class RegionRanges:
    region: str
    bootstrap: str
    watermark_ms: int | None
    raw: TopicRange
    aggregates: TopicRange
    late: TopicRange
    dlq: TopicRange


def _kept_to_stable(bootstrap: str, topic: str) -> TopicRange:
    bounds = kafka_io.offset_bounds(bootstrap, topic)
    return TopicRange(topic, {p: lo for p, (lo, _hi) in bounds.items()}, {p: hi for p, (_lo, hi) in bounds.items()})


def _written_since(bootstrap: str, rng: TopicRange, since_ms: int) -> TopicRange:
    """``rng`` without the records written before ``since_ms``."""
    firsts = kafka_io.offsets_for_times(bootstrap, rng.topic, since_ms)
    start = {}
    for p, lo in rng.start.items():
        first = firsts.get(p)
        start[p] = rng.end.get(p, lo) if first is None else max(lo, first)  # None: nothing that recent
    return TopicRange(rng.topic, start, rng.end)


def read_since_ms(settings: Settings, hour: datetime) -> int:
    """The earliest record timestamp a record of ``hour`` can have (module doc)."""
    slack_ms = max(settings.max_future_skew_ms, settings.lateness_ms)
    return int(hour.timestamp() * 1000) - slack_ms


def region_ranges(settings: Settings, region: Region, hour: datetime) -> RegionRanges:
    """The offsets one run of ``hour`` reads from one region (see the module docstring)."""
    rs = settings.for_region(region)
    since_ms = read_since_ms(settings, hour)
    commits = kafka_io.stream_commits(rs)
    raw_bounds = kafka_io.offset_bounds(rs.kafka_bootstrap, rs.topics.events)
    raw = TopicRange(
        rs.topics.events,
        {p: lo for p, (lo, _hi) in raw_bounds.items()},
        {p: max(lo, commits[p][0]) if p in commits else lo for p, (lo, _hi) in raw_bounds.items()},
    )
    marks = [json.loads(meta).get("watermark_ms", 0) for _o, meta in commits.values() if meta]

    def output(topic: str) -> TopicRange:
        # Read after the ledger: every output of the committed batches is below these.
        return _written_since(rs.kafka_bootstrap, _kept_to_stable(rs.kafka_bootstrap, topic), since_ms)

    return RegionRanges(
        region=region.job_id,
        bootstrap=rs.kafka_bootstrap,
        watermark_ms=max(marks) if marks else None,
        raw=_written_since(rs.kafka_bootstrap, raw, since_ms),
        aggregates=output(rs.topics.aggregates),
        late=output(rs.topics.late),
        dlq=_kept_to_stable(rs.kafka_bootstrap, rs.topics.dlq),
    )


def hour_closed(settings: Settings, hour: datetime, now: datetime | None = None) -> bool:
    """True when every region has closed the hour: its stream job committed a
    batch whose watermark (delay and allowed lateness included) is past the
    hour's end, so all of the hour's windows are emitted and committed; or
    the region is quiet: nothing reached its raw topic since the hour ended
    (no record timestamp at or after the end), its stream has committed every
    record (no lag), and the wall clock (``now``) is past the hour's end plus
    the lateness. A quiet region's watermark stands still, so without this
    rule it would hold every hour open. Windows it has not emitted yet (its
    watermark short of their end) come with its next events, and a later
    load of the hour picks them up."""
    end = hour + ONE_HOUR
    end_ms = int(end.timestamp() * 1000)
    now = now or datetime.now(UTC)
    for region in settings.regions:
        rs = settings.for_region(region)
        commits = kafka_io.stream_commits(rs)
        marks = [json.loads(meta).get("watermark_ms", 0) for _o, meta in commits.values() if meta]
        if marks and max(marks) >= end_ms:
            continue
        lag = sum(kafka_io.stream_lag(rs, commits).values())
        arrived_since = kafka_io.offsets_for_times(rs.kafka_bootstrap, rs.topics.events, end_ms)
        quiet = lag == 0 and all(offset is None for offset in arrived_since.values())
        if quiet and now >= end + timedelta(milliseconds=settings.lateness_ms):
            log.info(
                "hour %s closed in quiet region %s: nothing arrived since its end, no lag, the clock past its end "
                "plus lateness",
                hour_label(hour),
                region.job_id,
            )
            continue
        log.info(
            "hour %s not closed in region %s (watermark %s, lag %d records, %s)",
            hour_label(hour),
            region.job_id,
            iso_ms(max(marks)) if marks else "none",
            lag,
            "quiet" if quiet else "records arrived since the hour's end",
        )
        return False
    return True


def iso_ms(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    ]


def _first_per_key(df: DataFrame, keys: list[str]) -> DataFrame:
    """One row per key, deterministically: the lowest (region, partition, offset)."""
    w = Window.partitionBy(*keys).orderBy("region", "kafka_topic", "kafka_partition", "kafka_offset")
    return df.withColumn("__n", F.row_number().over(w)).where(F.col("__n") == 1).drop("__n")


def _in_hour(hour: datetime) -> Column:
    return F.col("event_hour") == F.lit(hour.astimezone(UTC)).cast("timestamp")


def raw_table_rows(
    kafka_df: DataFrame, region: str, hour: datetime, loaded_at: datetime, max_future_skew_ms: int
) -> DataFrame:
    """Raw Kafka rows -> ``ads.ad_events_raw`` rows of the hour (valid events
    only, by the stream job's own reading of the contract)."""
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


def aggregate_table_rows(kafka_df: DataFrame, region: str, hour: datetime, loaded_at: datetime) -> DataFrame:
    """Aggregate records -> ``ads.ad_minute_aggregates`` rows of the hour."""
    body = F.from_json(F.col("value").cast("string"), _AGGREGATE_JSON)
    parsed = kafka_df.select("*", body.alias("a")).where(_aggregate_ok())
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
    hour: datetime,
    loaded_at: datetime,
) -> DataFrame:
    """DLQ records, late events and unreadable aggregate records ->
    ``ads.ad_events_quarantine`` rows of the hour."""
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
    body = F.from_json(F.col("value").cast("string"), _AGGREGATE_JSON)
    bad_aggregates = (
        aggregates_df.select("*", body.alias("a"))
        .where(~_aggregate_ok())
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
    return (
        dlq_rows.select(*names)
        .unionByName(late_rows.select(*names))
        .unionByName(bad_aggregates.select(*names))
        .where(_in_hour(hour))
    )


# --- I/O at the edges ---------------------------------------------------------------------


def _read(spark: SparkSession, bootstrap: str, rng: TopicRange) -> DataFrame | None:
    if not rng.partitions():
        return None
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
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


def merge_new_rows(
    spark: SparkSession,
    table: str,
    source: DataFrame,
    keys: tuple[str, ...],
    hour: datetime,
    before_merge: Callable[[], None] | None = None,
) -> int:
    """Insert the rows whose key is not in the table yet (insert-if-absent);
    a rerun finds nothing new and writes no table version at all.

    Concurrent loads of overlapping hours conflict in Delta's optimistic
    concurrency (any class of :func:`is_write_conflict`); the loser retries
    with backoff and jitter, and then finds the winner's rows present.
    ``before_merge`` runs before each MERGE (the tests hold two loads at a
    barrier there). Returns the number of rows inserted."""
    from delta.tables import DeltaTable

    hour_literal = f"TIMESTAMP'{hour.astimezone(UTC):%Y-%m-%d %H:%M:%S}'"
    # The partition literal limits the MERGE's read (and so its conflicts) to this hour.
    condition = " AND ".join([f"t.{k} <=> s.{k}" for k in keys] + [f"t.event_hour = {hour_literal}"])
    for attempt in range(1, MERGE_ATTEMPTS + 1):
        try:
            existing = spark.table(table).where(F.col("event_hour") == F.expr(hour_literal)).select(*keys)
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
                .whenNotMatchedInsertAll()
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


@dataclass
class LoadResult:
    hour: str
    inserted: dict[str, int] = field(default_factory=dict)
    source_rows: dict[str, int] = field(default_factory=dict)
    regions: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    manifest: str = ""

    def describe(self) -> str:
        parts = ", ".join(f"{t}: +{self.inserted[t]} of {self.source_rows[t]}" for t in self.inserted)
        return f"hour {self.hour} loaded in {self.seconds:.1f}s ({parts})"


def load_hour(settings: Settings, hour: datetime, spark: SparkSession | None = None) -> LoadResult:
    """Union & Load of one UTC hour from every region (idempotent)."""
    started = time.monotonic()
    if spark is None:
        spark = metastore_session(settings, f"adpipe-load-{hour_label(hour)}")
    loaded_at = datetime.now(UTC).replace(microsecond=0)
    raw_parts, agg_parts, quarantine_parts, manifest = [], [], [], []
    for region in settings.regions:
        ranges = region_ranges(settings, region, hour)
        manifest.append(asdict(ranges))
        log.info(
            "region %s: raw %d records (up to the stream's committed offsets), aggregates %d, late %d, dlq %d",
            region.job_id,
            ranges.raw.records(),
            ranges.aggregates.records(),
            ranges.late.records(),
            ranges.dlq.records(),
        )
        empty = _empty_kafka_df(spark)
        raw_df = _read(spark, ranges.bootstrap, ranges.raw) or empty
        agg_df = _read(spark, ranges.bootstrap, ranges.aggregates) or empty
        late_df = _read(spark, ranges.bootstrap, ranges.late) or empty
        dlq_df = _read(spark, ranges.bootstrap, ranges.dlq) or empty
        raw_parts.append(raw_table_rows(raw_df, region.job_id, hour, loaded_at, settings.max_future_skew_ms))
        agg_parts.append(aggregate_table_rows(agg_df, region.job_id, hour, loaded_at))
        quarantine_parts.append(quarantine_table_rows(dlq_df, late_df, agg_df, region.job_id, hour, loaded_at))

    result = LoadResult(hour=hour_label(hour), regions=manifest)
    for table, parts in ((T.RAW, raw_parts), (T.AGGREGATES, agg_parts), (T.QUARANTINE, quarantine_parts)):
        _schema, keys = T.TABLES[table]
        union = parts[0]
        for part in parts[1:]:
            union = union.unionByName(part)
        # Union of regions, then one row per key (a producer retry, a replayed
        # or injected duplicate): the dedupe the design puts before the load.
        source = _first_per_key(union, list(keys)).cache()
        result.source_rows[table] = source.count()
        result.inserted[table] = merge_new_rows(spark, table, source, keys, hour)
        source.unpersist()
        log.info("%s: %d rows for %s, %d new", table, result.source_rows[table], result.hour, result.inserted[table])
    result.seconds = time.monotonic() - started
    result.manifest = str(_write_manifest(settings, result))
    return result


def _write_manifest(settings: Settings, result: LoadResult) -> Path:
    path = settings.home / "load" / result.hour / f"{datetime.now(UTC):%Y%m%dT%H%M%S%f}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(result), indent=2, default=str) + "\n")
    return path
