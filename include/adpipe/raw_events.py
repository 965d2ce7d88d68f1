"""The contract's raw ad event, read in Spark: parse, validate, split.

A shared piece: the aggregation stream job counts what :func:`valid_events`
keeps and sends what :func:`rejected_events` keeps to the DLQ; Union & Load
files the same rows into the ``ads`` tables. ``adpipe verify`` has a reading
of its own in plain Python (``adpipe.tools.verify.classify``), and the unit
tests hold the two to the same verdicts, edge cases included."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from adpipe import schemas as S

_INTEGER_VARIANTS = ("TINYINT", "SMALLINT", "INT", "BIGINT")
# What parse_raw_events keeps of the Kafka record, and what it adds.
RECORD_COLUMNS = ("key", "value", "topic", "partition", "offset")
PARSED_FIELDS = ("event_id", "ad_id", "campaign_id", "event_type", "event_time", "reject_reason")


def _field_type(variant: Column, name: str) -> Column:
    return F.schema_of_variant(F.try_variant_get(variant, f"$.{name}", "variant"))


def _non_empty_string(variant: Column, name: str) -> Column:
    value = F.try_variant_get(variant, f"$.{name}", "string")
    return _true(_field_type(variant, name) == "STRING") & _true(F.length(value) > 0)


def _true(condition: Column) -> Column:
    """SQL's NULL (a missing field) counts as false, never as 'unknown'."""
    return F.coalesce(condition, F.lit(False))


def _nothing_after_the_value(value: Column) -> Column:
    """Whether only whitespace follows the message's first JSON value.

    Every JSON reader of Spark (try_parse_json, from_json, get_json_object)
    reads the first value and ignores what follows it, so ``{...} x`` would
    pass for an event. Wrapped as ``[<message>,0]``, a message that is one
    JSON value gives a two-element array; text after the value either breaks
    the array (null), or adds elements, or (starting with ``]``) closes it
    after one element: never exactly two."""
    wrapped = F.concat(F.lit("["), value.cast("string"), F.lit(",0]"))
    return F.json_array_length(wrapped) == 2


def parse_raw_events(kafka_df: DataFrame, max_future_skew_ms: int | None) -> DataFrame:
    """Kafka rows -> one row per message with the event's fields and
    ``reject_reason`` (null for a valid event). Never drops a row: a
    malformed message is kept, with the first reason it fails.

    An event_time more than ``max_future_skew_ms`` after the Kafka record's
    own ``timestamp`` is malformed (``future_event_time``): one clock far
    ahead would otherwise move the watermark and make every later event
    late. The record timestamp, never the wall clock, decides, so a replay
    decides the same. ``None`` leaves the rule out: for the DLQ and late
    copies the job wrote, whose source records it already checked."""
    v = F.col("__v")
    time_type = _field_type(v, "event_time")
    time_text = F.try_variant_get(v, "$.event_time", "string")
    time_millis = F.try_variant_get(v, "$.event_time", "long")
    event_time = F.when(
        _true(time_type.isin(*_INTEGER_VARIANTS)) & _true(time_millis.between(0, S.EPOCH_MS_MAX)),
        F.timestamp_millis(time_millis),
    ).when(
        _true(time_type == "STRING") & _true(time_text.rlike(S.ISO_WITH_ZONE)),
        F.try_to_timestamp(F.regexp_replace(time_text, S.ISO_NO_SECONDS, "$1:00$2")),
    )
    event_type = F.try_variant_get(v, "$.event_type", "string")
    reason = (
        F.when(v.isNull(), F.lit(S.REASON_NOT_JSON))
        .when(~_true(F.schema_of_variant(v).startswith("OBJECT")), F.lit(S.REASON_NOT_OBJECT))
        .when(~_non_empty_string(v, "event_id"), F.lit(S.REASON_BAD_EVENT_ID))
        .when(~_non_empty_string(v, "ad_id"), F.lit(S.REASON_BAD_AD_ID))
        .when(
            ~(_true(_field_type(v, "event_type") == "STRING") & _true(event_type.isin(*S.EVENT_TYPES))),
            F.lit(S.REASON_BAD_EVENT_TYPE),
        )
        .when(F.col("event_time").isNull(), F.lit(S.REASON_BAD_EVENT_TIME))
    )
    if max_future_skew_ms is not None:
        reason = reason.when(
            F.unix_millis("event_time") > F.unix_millis(F.col("timestamp")) + F.lit(max_future_skew_ms),
            F.lit(S.REASON_FUTURE_EVENT_TIME),
        )
    valid_campaign = _true(_field_type(v, "campaign_id") == "STRING")
    return (
        kafka_df.select(
            # Kept as received: the DLQ and late topics carry the raw bytes.
            F.col("key").cast("binary").alias("key"),
            F.col("value").cast("binary").alias("value"),
            "topic",
            F.col("partition").cast("long").alias("partition"),
            F.col("offset").cast("long").alias("offset"),
            "timestamp",
        )
        # Invalid UTF-8 is not JSON (a cast alone would turn it into U+FFFD),
        # nor is a JSON value followed by more than whitespace.
        .withColumn(
            "__v",
            F.when(
                F.is_valid_utf8(F.col("value").cast("string")) & _true(_nothing_after_the_value(F.col("value"))),
                F.try_parse_json(F.col("value").cast("string")),
            ),
        )
        .withColumn("event_time", event_time)
        .select(
            *RECORD_COLUMNS,
            F.try_variant_get(v, "$.event_id", "string").alias("event_id"),
            F.try_variant_get(v, "$.ad_id", "string").alias("ad_id"),
            F.when(valid_campaign, F.try_variant_get(v, "$.campaign_id", "string")).alias("campaign_id"),
            event_type.alias("event_type"),
            "event_time",
            reason.alias("reject_reason"),
        )
        # The fields pass through a generator: a filter on them (valid_events)
        # stays above it. Pushed below the projection above, Spark would
        # inline the JSON parse into the filter once per reference (measured:
        # three times the parse's cost); computed in the projection, repeated
        # parts of the fields are computed once.
        .select(*RECORD_COLUMNS, F.inline(F.array(F.struct(*PARSED_FIELDS))))
    )


def valid_events(parsed_df: DataFrame) -> DataFrame:
    return parsed_df.where(F.col("reject_reason").isNull())


def rejected_events(parsed_df: DataFrame) -> DataFrame:
    return parsed_df.where(F.col("reject_reason").isNotNull())
