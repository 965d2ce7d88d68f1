"""The Delta tables of the contract (database ``ads`` in the Hive metastore):
their names, schemas and unique keys, in one place for the loader, the
Great Expectations checks and verify.

Every table carries ``event_hour`` (the UTC hour the event time, or the
window start, falls in): the hourly load writes and the checks read one
``event_hour`` at a time."""

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
RAW = f"{DATABASE}.ad_events_raw"
AGGREGATES = f"{DATABASE}.ad_minute_aggregates"
QUARANTINE = f"{DATABASE}.ad_events_quarantine"

# Quarantine sources.
SOURCE_DLQ = "dlq"
SOURCE_LATE = "late"

_KAFKA_COLUMNS = [
    StructField("region", StringType(), False),  # the stream job / region the record came through
    StructField("kafka_topic", StringType(), False),
    StructField("kafka_partition", IntegerType(), False),
    StructField("kafka_offset", LongType(), False),
    StructField("loaded_at", TimestampType(), False),
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
        StructField("source", StringType(), False),  # SOURCE_DLQ or SOURCE_LATE
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
