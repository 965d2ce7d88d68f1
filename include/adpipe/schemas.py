"""Schemas and the contract's constants, in one module."""

from __future__ import annotations

from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType, TimestampType

EVENT_TYPES = ("impression", "click")

# ISO-8601 date-time that carries a zone (Z or +hh:mm / +hhmm / +hh). The
# contract rejects zone-less times; this pattern is applied before any
# parsing so that Spark's special strings ('yesterday', 'now') are rejected.
# The same pattern serves Java (Spark's rlike) and Python (verify), so it
# avoids '$' (both let it match before a final line terminator, Java before
# '\r\n' too): "(?![\s\S])" means the text really ends there. Year 0000 is
# out: Spark could hold it, Python's datetime cannot.
ISO_WITH_ZONE = r"^(?!0000)\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}(:?\d{2})?)(?![\s\S])"
# Spark's timestamp parser needs the seconds, which the contract's ISO-8601 may omit.
ISO_NO_SECONDS = r"^(\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2})(Z|[+-]\d{2}(:?\d{2})?)$"
# Epoch milliseconds accepted: 1970-01-01 .. 9999-12-31.
EPOCH_MS_MAX = 253_402_300_799_999

# Reject reasons (the value of the DLQ's reason header).
REASON_NOT_JSON = "not_json"
REASON_NOT_OBJECT = "not_object"
REASON_BAD_EVENT_ID = "missing_or_invalid_event_id"
REASON_BAD_AD_ID = "missing_or_invalid_ad_id"
REASON_BAD_EVENT_TYPE = "missing_or_unknown_event_type"
REASON_BAD_EVENT_TIME = "missing_or_invalid_event_time"
# event_time more than ADPIPE_MAX_FUTURE_SKEW_S after the record's timestamp.
REASON_FUTURE_EVENT_TIME = "future_event_time"
# event_id, ad_id or campaign_id longer than MAX_FIELD_CHARS.
REASON_FIELD_TOO_LONG = "field_too_long"
# event_id, ad_id or campaign_id holding a C0 control character (NUL..U+001F)
# or an unpaired surrogate (only a JSON \u escape can make one): no id of a
# table, a record key or the budget database ever holds one.
REASON_BAD_CHARACTERS = "bad_characters"
# A later copy of an event_id already read with another event_time (a
# re-stamped retry): the first copy read is counted, this one is not.
REASON_CONFLICTING_DUPLICATE = "conflicting_duplicate"

# The one length limit of every string field of an event (event_id, ad_id,
# campaign_id), in characters (Unicode code points: Spark's length, Python's
# len and PostgreSQL's varchar count the same). The stream job rejects an
# event over it (REASON_FIELD_TOO_LONG), so no id ever becomes a record key
# or header; the tables and the budget database hold what it admits.
MAX_FIELD_CHARS = 200

# A DLQ or late copy too large for its topic even compressed: written
# truncated, its reason header "oversized" (the reason it had otherwise is in
# HEADER_ORIGINAL_REASON, its full size in HEADER_ORIGINAL_SIZE; the source
# header names the raw record, which Kafka still holds whole).
REASON_OVERSIZED = "oversized"

# Kafka headers adpipe writes on DLQ and late records.
HEADER_REASON = "adpipe.reason"
HEADER_ORIGINAL_REASON = "adpipe.original_reason"
HEADER_ORIGINAL_SIZE = "adpipe.original_size"
# On late copies: the event they list and its time, truncated or not.
HEADER_EVENT_ID = "adpipe.event_id"
HEADER_EVENT_TIME_MS = "adpipe.event_time_ms"
HEADER_SOURCE = "adpipe.source"  # topic/partition/offset of the raw record
# On a conflicting duplicate's DLQ copy: the event time of the copy that counts.
HEADER_FIRST_EVENT_TIME_MS = "adpipe.first_event_time_ms"
HEADER_JOB = "adpipe.job"
HEADER_BATCH = "adpipe.batch"
HEADER_WATERMARK = "adpipe.watermark_ms"

KAFKA_ROW = StructType(
    [
        StructField("key", StringType()),
        StructField("value", StringType()),
        StructField("topic", StringType()),
        StructField("partition", LongType()),
        StructField("offset", LongType()),
    ]
)

PARSED_EVENT = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", LongType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("event_id", StringType()),
        StructField("ad_id", StringType()),
        StructField("campaign_id", StringType()),
        StructField("event_type", StringType()),
        StructField("event_time", TimestampType()),
        StructField("reject_reason", StringType()),
    ]
)

# The aggregate record's JSON value, as the contract names it: its one
# declaration. The stream job writes it (stream.job.aggregate_record), the
# load reads it with this schema, the budget parses it (budget.aggregate).
AGGREGATE_RECORD = StructType(
    [
        StructField("record_uuid", StringType()),
        StructField("ad_id", StringType()),
        StructField("window_start", StringType()),
        StructField("window_end", StringType()),
        StructField("impressions", LongType()),
        StructField("clicks", LongType()),
        # 0 for a window's first emission (absent in records before revisions), then 1, 2, ...
        StructField("revision", LongType()),
    ]
)

MINUTE_AGGREGATE = StructType(
    [
        StructField("ad_id", StringType(), False),
        StructField("window_start", TimestampType(), False),
        StructField("window_end", TimestampType(), False),
        StructField("impressions", LongType(), False),
        StructField("clicks", LongType(), False),
    ]
)
