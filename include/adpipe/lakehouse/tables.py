"""The Delta tables of the contract (database ``ads`` in the Hive metastore):
their names, schemas and unique keys, in one place for the loader, the
Great Expectations checks and verify.

Every table carries ``event_hour`` (the UTC hour the event time, or the
window start, falls in): the load files each row in its own hour, and the
checks read one ``event_hour`` at a time.

Write-audit-publish: a load first writes the rows it read into the staging
twins of the three tables (database ``ads_staging``, same schemas), the
Great Expectations gate audits them, and only then are they published into
``ads``. ``load_run`` is the load run that published a row (in staging: the
run that staged it). ``ads.load_runs`` is the loads' ledger (which Kafka
offsets each run read, what it published), and ``ads.late_corrections``
the rows published into an hour after its first publication."""

from __future__ import annotations

from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

DATABASE = "ads"
STAGING_DATABASE = "ads_staging"
RAW = f"{DATABASE}.ad_events_raw"
AGGREGATES = f"{DATABASE}.ad_minute_aggregates"
QUARANTINE = f"{DATABASE}.ad_events_quarantine"
LOAD_RUNS = f"{DATABASE}.load_runs"
LATE_CORRECTIONS = f"{DATABASE}.late_corrections"

# Quarantine sources.
SOURCE_DLQ = "dlq"
SOURCE_LATE = "late"
# A late listing of an event whose first raw record was counted or listed
# before: a producer retry that came after the stream's dedupe retention
# (ADPIPE_LATE_DEDUPE_RETENTION_S). Kept to be seen, never counted as late.
SOURCE_LATE_REPEAT = "late_repeat"
# A raw event whose event_id reached more than one region: the raw table
# keeps one row (the first region's), and each other region's copy is listed
# here (event_key "event_id@region"): that region's stream counted it too.
SOURCE_CROSS_REGION = "cross_region"

_KAFKA_COLUMNS = [
    StructField("region", StringType(), False),  # the stream job / region the record came through
    StructField("kafka_topic", StringType(), False),
    StructField("kafka_partition", IntegerType(), False),
    StructField("kafka_offset", LongType(), False),
    StructField("loaded_at", TimestampType(), False),
    # The load run that published the row (in staging: that staged it);
    # null in rows published before runs were numbered.
    StructField("load_run", LongType(), True),
]

RAW_SCHEMA = StructType(
    [
        StructField("event_id", StringType(), False),
        StructField("ad_id", StringType(), False),
        StructField("campaign_id", StringType(), True),
        StructField("event_type", StringType(), False),
        StructField("event_time", TimestampType(), False),
        StructField("event_hour", TimestampType(), False),
        *_KAFKA_COLUMNS,
    ]
)

AGGREGATES_SCHEMA = StructType(
    [
        StructField("record_uuid", StringType(), False),
        StructField("ad_id", StringType(), False),
        StructField("window_start", TimestampType(), False),
        StructField("window_end", TimestampType(), False),
        StructField("impressions", LongType(), False),
        StructField("clicks", LongType(), False),
        StructField("event_hour", TimestampType(), False),
        *_KAFKA_COLUMNS,
    ]
)

QUARANTINE_SCHEMA = StructType(
    [
        StructField("source", StringType(), False),  # SOURCE_DLQ, SOURCE_LATE, SOURCE_LATE_REPEAT, SOURCE_CROSS_REGION
        # DLQ: "topic/partition/offset" of the rejected raw record; late: event_id.
        StructField("event_key", StringType(), False),
        StructField("reason", StringType(), False),
        StructField("raw_value", BinaryType(), True),
        StructField("event_id", StringType(), True),
        StructField("ad_id", StringType(), True),
        StructField("event_type", StringType(), True),
        StructField("event_time", TimestampType(), True),
        # Late: the event's hour. DLQ: the event's hour when a time can be
        # read from the bytes, else the hour the record reached the DLQ.
        StructField("event_hour", TimestampType(), False),
        *_KAFKA_COLUMNS,
    ]
)

# table -> (schema, unique key used by the insert-if-absent MERGE)
TABLES: dict[str, tuple[StructType, tuple[str, ...]]] = {
    RAW: (RAW_SCHEMA, ("event_id",)),
    AGGREGATES: (AGGREGATES_SCHEMA, ("record_uuid",)),
    QUARANTINE: (QUARANTINE_SCHEMA, ("source", "event_key")),
}


def staged(table: str) -> str:
    """The staging twin of a published table (``ads.x`` -> ``ads_staging.x``)."""
    return f"{STAGING_DATABASE}.{table.split('.', 1)[1]}"


# The loads' ledger: one row per step of a run (append-only).
LOAD_RUNS_SCHEMA = StructType(
    [
        StructField("run_id", LongType(), False),
        StructField("step", StringType(), False),  # staged | published | failed | repaired | discarded
        StructField("kind", StringType(), False),  # load | repair | discard
        StructField("hour", TimestampType(), True),  # the hour the run was asked for
        StructField("at", TimestampType(), False),
        # JSON {region: {topic: {partition: [first, end)}}}: every offset loaded
        # so far (on "staged" rows: after this run).
        StructField("coverage", StringType(), True),
        StructField("read", StringType(), True),  # JSON: the ranges this run read
        StructField("rows", StringType(), True),  # JSON {table: rows} staged or published
        StructField("hours", StringType(), True),  # JSON list of the hours published
        StructField("corrections", StringType(), True),  # JSON {hour: rows} published after the hour's first
        StructField("message", StringType(), True),  # failed expectations, retention gaps
    ]
)

# An hour is final at the first run that published it (or the latest that
# repaired it, which rewrote every row of it): rows published into it by a
# later run are late corrections. Final runs come from the ledger, so a run
# that crashed half-way through publishing never counts as final.
LATE_CORRECTIONS_SQL = f"""
CREATE OR REPLACE VIEW {LATE_CORRECTIONS} AS
WITH steps AS (
    SELECT to_timestamp(h, "yyyy-MM-dd'T'HH") AS event_hour, step, run_id
    FROM {LOAD_RUNS} LATERAL VIEW explode(from_json(hours, 'array<string>')) x AS h
    WHERE step IN ('published', 'repaired')
),
final AS (
    SELECT event_hour,
           coalesce(max(CASE WHEN step = 'repaired' THEN run_id END),
                    min(CASE WHEN step = 'published' THEN run_id END)) AS final_run
    FROM steps GROUP BY event_hour
),
published AS (
    SELECT '{RAW}' AS table_name, event_hour, load_run FROM {RAW}
    UNION ALL SELECT '{AGGREGATES}', event_hour, load_run FROM {AGGREGATES}
    UNION ALL SELECT '{QUARANTINE}', event_hour, load_run FROM {QUARANTINE}
)
SELECT p.event_hour, p.table_name, p.load_run, f.final_run, count(*) AS rows
FROM published p JOIN final f ON p.event_hour = f.event_hour
WHERE p.load_run > f.final_run
GROUP BY p.event_hour, p.table_name, p.load_run, f.final_run
"""  # noqa: S608 - table names are this module's constants


CROSS_REGION_DUPLICATES = f"{DATABASE}.cross_region_duplicates"
CROSS_REGION_SQL = f"""
CREATE OR REPLACE VIEW {CROSS_REGION_DUPLICATES} AS
SELECT event_hour, event_id, region, ad_id, event_type, event_time, kafka_topic, kafka_partition, kafka_offset,
       load_run
FROM {QUARANTINE} WHERE source = '{SOURCE_CROSS_REGION}'
"""  # noqa: S608 - table names are this module's constants


# A load publishes the three tables in three Delta commits (one per table),
# then its ``published`` ledger row. A reader of a table itself may see a
# run's rows in one table and not yet in the next; a reader of the
# whole-hour views never does: they show the rows of runs up to the last one
# whose publication (or repair) completed, by the ledger. A run that died
# half-way is shown whole once a later run completes it.
def whole_view(table: str) -> str:
    """The whole-hour view of a published table (``ads.x`` -> ``ads.x_whole``)."""
    return f"{table}_whole"


def whole_view_sql(table: str) -> str:
    return f"""
CREATE OR REPLACE VIEW {whole_view(table)} AS
SELECT * FROM {table}
WHERE load_run IS NULL
   OR load_run <= (SELECT max(run_id) FROM {LOAD_RUNS} WHERE step IN ('published', 'repaired'))
"""  # noqa: S608 - table names are this module's constants

