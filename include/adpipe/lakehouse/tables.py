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
the rows published into an hour after its first publication.

A minute window may be emitted more than once (revisions 0, 1, ...: each
the window's full counts): ``ads.ad_minute_aggregates`` holds each window's
highest revision loaded, one row per (``region``, ``ad_id``,
``window_start``), and ``ads.ad_minute_aggregate_revisions`` every revision
loaded (the latest included), one row per ``record_uuid``. Staging holds
aggregate records as they come, every revision, by ``record_uuid``."""

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
# Every revision of every window loaded (ads.ad_minute_aggregates keeps the latest).
REVISIONS = f"{DATABASE}.ad_minute_aggregate_revisions"
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
        # 0 for a window's first emission, then 1, 2, ... Last, where a table
        # of a version before revisions gains it; null (read as 0) in a row of
        # such a table whose migration was cut short.
        StructField("revision", LongType(), True),
    ]
)
# One row per revision: the aggregates' columns.
REVISIONS_SCHEMA = AGGREGATES_SCHEMA

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

# table -> (schema, key of the rows a load reads: its insert-if-absent
# MERGE's into staging, and into the published table but for the aggregates,
# whose records are every revision: published, each goes to REVISIONS by
# this key, and the latest of its window to AGGREGATES by WINDOW_KEY).
TABLES: dict[str, tuple[StructType, tuple[str, ...]]] = {
    RAW: (RAW_SCHEMA, ("event_id",)),
    AGGREGATES: (AGGREGATES_SCHEMA, ("record_uuid",)),
    QUARANTINE: (QUARANTINE_SCHEMA, ("source", "event_key")),
}
# ads.ad_minute_aggregates' one row per window (regions count their own events).
WINDOW_KEY = ("region", "ad_id", "window_start")
# Every published table: the three, and the aggregates' revisions (no staging twin of its own).
PUBLISHED: dict[str, StructType] = {**{t: schema for t, (schema, _k) in TABLES.items()}, REVISIONS: REVISIONS_SCHEMA}


def staged(table: str) -> str:
    """The staging twin of a published table (``ads.x`` -> ``ads_staging.x``)."""
    return f"{STAGING_DATABASE}.{table.split('.', 1)[1]}"


def loaded_in(table: str) -> str:
    """The published table that holds every row of ``table`` a load has
    published, by its key (TABLES): the aggregates' revisions for the
    aggregates (ads.ad_minute_aggregates keeps only each window's latest)."""
    return REVISIONS if table == AGGREGATES else table


# The loads' ledger: one row per step of a run (append-only). Its steps
# (docs/tables.md says when each is written); an hour past the input's
# retention with nothing loaded is ``past_retention`` (adpipe.lakehouse.retention).
STEP_PAST_RETENTION = "past_retention"
LEDGER_STEPS = ("staged", "published", "failed", STEP_PAST_RETENTION, "repairing", "repaired", "cleared", "discarded")
LOAD_RUNS_SCHEMA = StructType(
    [
        StructField("run_id", LongType(), False),
        StructField("step", StringType(), False),  # one of LEDGER_STEPS
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
        StructField("message", StringType(), True),  # failed expectations, retention gaps, a past_retention report
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


# A load publishes the tables one Delta commit each, then its ``published``
# ledger row. A reader of a table itself may see a run's rows in one table
# and not yet in the next; a reader of the whole-hour views never does: they
# show the rows of runs up to the last one whose publication (or repair)
# completed, by the ledger. A run that died half-way is shown whole once a
# later run completes it.
#
# A repair of an hour (``repaired`` in the ledger) writes the rebuilt hour
# beside the old one, under its own run, and its ledger row switches the
# views from one to the other: from then on they show the hour's rows of
# that run and later ones only (the old ones are deleted after the switch).
#
# ads.ad_minute_aggregates keeps one row per window, replaced in place by a
# newer revision; while the run that replaced it has not completed, the
# aggregates' view shows the window's revision before it, from the
# revisions table (which only ever gains rows).
def whole_view(table: str) -> str:
    """The whole-hour view of a published table (``ads.x`` -> ``ads.x_whole``)."""
    return f"{table}_whole"


# The last run whose publication (or repair) completed.
_LAST_COMPLETED = f"(SELECT max(run_id) AS run FROM {LOAD_RUNS} WHERE step IN ('published', 'repaired'))"  # noqa: S608
# Per hour, the run of its last completed repair.
_REPAIRED_HOURS = f"""(
    SELECT to_timestamp(h, "yyyy-MM-dd'T'HH") AS event_hour, max(run_id) AS repair_run
    FROM {LOAD_RUNS} LATERAL VIEW explode(from_json(hours, 'array<string>')) x AS h
    WHERE step = 'repaired' GROUP BY 1
)"""  # noqa: S608 - table names are this module's constants


def _visible(t: str) -> str:
    """Whether row ``t`` (beside ``last`` and ``r``, its hour's repair) is shown."""
    return (
        f"coalesce(({t}.load_run IS NULL OR {t}.load_run <= last.run) "
        f"AND (r.repair_run IS NULL OR {t}.load_run >= r.repair_run), false)"
    )


def _with_visible(source: str, alias: str) -> str:
    """``source`` (a table, or a table and a join) with ``__visible``."""
    joins = f"CROSS JOIN {_LAST_COMPLETED} last LEFT JOIN {_REPAIRED_HOURS} r ON {alias}.event_hour = r.event_hour"
    return f"SELECT {alias}.*, {_visible(alias)} AS __visible FROM {source} {joins}"  # noqa: S608 - our tables


def whole_view_sql(table: str) -> str:
    if table == AGGREGATES:
        return _aggregates_whole_view_sql()
    return f"""
CREATE OR REPLACE VIEW {whole_view(table)} AS
SELECT * EXCEPT (__visible) FROM ({_with_visible(f"{table} t", "t")}) WHERE __visible
"""  # noqa: S608 - table names are this module's constants


def _aggregates_whole_view_sql() -> str:
    columns = ", ".join(AGGREGATES_SCHEMA.fieldNames())
    window = ", ".join(("event_hour", *WINDOW_KEY))
    replaced = " AND ".join(f"v.{k} = h.{k}" for k in ("event_hour", *WINDOW_KEY))
    return f"""
CREATE OR REPLACE VIEW {whole_view(AGGREGATES)} AS
WITH current AS ({_with_visible(f"{AGGREGATES} a", "a")}),
shown AS (SELECT {columns} FROM current WHERE __visible),
replaced AS (SELECT DISTINCT {window} FROM current WHERE NOT __visible),
earlier AS (
    SELECT {columns}, row_number() OVER (PARTITION BY {window} ORDER BY revision DESC) AS __n
    FROM ({_with_visible(f"{REVISIONS} v LEFT SEMI JOIN replaced h ON {replaced}", "v")})
    WHERE __visible
)
SELECT * FROM shown
UNION ALL
SELECT {", ".join(f"e.{c}" for c in AGGREGATES_SCHEMA.fieldNames())} FROM earlier e
LEFT ANTI JOIN shown s ON {" AND ".join(f"e.{k} = s.{k}" for k in ("event_hour", *WINDOW_KEY))}
WHERE e.__n = 1
"""  # noqa: S608 - table names are this module's constants
