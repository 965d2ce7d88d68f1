"""The contract's raw ad event, read in Spark: parse, validate, split.

A shared piece: the aggregation stream job counts what :func:`valid_events`
keeps and sends what :func:`rejected_events` keeps to the DLQ; Union & Load
files the same rows into the ``ads`` tables. ``adpipe verify`` has a reading
of its own in plain Python (``adpipe.tools.verify.classify``), and the unit
tests hold the two to the same verdicts, edge cases included."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from adpipe import schemas as S

_INTEGER_VARIANTS = ("TINYINT", "SMALLINT", "INT", "BIGINT")
# What parse_raw_events keeps of the Kafka record, and what it adds.
RECORD_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp")
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


# The fast path: an event in the contract's own shape (the shape of
# ``adpipe produce`` and of the contract's example) is read by adpipe's own
# JVM function (jvm/src/adpipe/spark/CanonicalEvent.java, built by
# adpipe.jars), one pass over the record's bytes, not by the variant route,
# which costs several times more (a variant per field for its type, a second
# JSON parse for the trailing-text check). Before it, a regular expression
# and a split at the quotes did the same in Spark's own functions, decoding
# the bytes to Java text and back for each (JFR: a third of the stream job's
# JVM time); before that, from_json (Jackson, set up per row). It only admits
# text that the variant route reads as a valid event or rejects for its
# event_time alone: a flat object whose keys come in the contract's order (so
# none is repeated), string values without escapes, quotes or control
# characters (so the bytes between two quotes are the value), non-empty ids,
# event_time a string or at most 15 digits of milliseconds, JSON whitespace
# only, nothing after it, valid UTF-8; and here, a known event_type. Every
# other record (extra fields, another key order, escapes) takes the variant
# route, with the same verdicts: tests hold the two routes to each other.
FAST_PATH_FUNCTION = "adpipe_canonical_event"
_FAST_PATH_CLASS = "adpipe.spark.CanonicalEvent"
_FAST_PATH_TYPE = (
    "struct<kind:string,event_id:string,ad_id:string,campaign_id:string,event_type:string,event_time:string>"
)


def register_functions(spark: SparkSession) -> None:
    """Make the fast path's JVM function known to ``spark``: adpipe.spark's
    session builder does, beside shipping its jar."""
    spark.udf.registerJavaFunction(FAST_PATH_FUNCTION, _FAST_PATH_CLASS, _FAST_PATH_TYPE)


def _canonical_event(value: Column) -> Column:
    """The fields of a record's bytes when they are an event in the
    contract's own shape; null when it takes the variant route."""
    return F.call_function(FAST_PATH_FUNCTION, value)


def _kind(canonical: Column) -> Column:
    """``STRING`` or ``BIGINT`` (the JSON type of its event_time) for an
    event that takes the fast path, else null."""
    return F.when(canonical["event_type"].isin(*S.EVENT_TYPES), canonical["kind"])


def fast_path_kind(value: Column) -> Column:
    """For a record's bytes: ``STRING`` or ``BIGINT`` (the JSON type of its
    event_time) when it is in the contract's own shape and takes the fast
    path, null when it takes the variant route."""
    return _kind(_canonical_event(value))


# The id fields the bad-characters rule reads (event_type and event_time have
# rules of their own that admit no such character).
ID_FIELDS = ("event_id", "ad_id", "campaign_id")
_C0 = "[\\x00-\\x1F]"


def _bad_characters(v: Column, text: Column, fields: dict[str, Column]) -> Column:
    """Whether an id field (read by the variant route) holds a C0 control
    character, or an unpaired surrogate: Spark's JSON readers decode a lone
    ``\\ud800`` escape as "?", where ``get_json_object`` gives null, so a
    field that is a string to the one and null to the other holds one (looked
    at only when the record has a ``\\u`` escape: the rest cannot)."""
    escaped = text.contains("\\u")
    bad = F.lit(False)
    for name, value in fields.items():
        is_string = _true(_field_type(v, name) == "STRING")
        lone_surrogate = escaped & is_string & F.get_json_object(text, f"$.{name}").isNull()
        bad = bad | _true(is_string & value.rlike(_C0)) | _true(lone_surrogate)
    return bad


def _event_time(time_type: Column, time_text: Column, time_millis: Column) -> Column:
    """The event time of an integer of epoch milliseconds or an ISO-8601
    text with a zone; null for anything else."""
    return F.when(
        _true(time_type.isin(*_INTEGER_VARIANTS)) & _true(time_millis.between(0, S.EPOCH_MS_MAX)),
        F.timestamp_millis(time_millis),
    ).when(
        _true(time_type == "STRING") & _true(time_text.rlike(S.ISO_WITH_ZONE)),
        F.try_to_timestamp(F.regexp_replace(time_text, S.ISO_NO_SECONDS, "$1:00$2")),
    )


def parse_raw_events(kafka_df: DataFrame, max_future_skew_ms: int | None, fast_path: bool = True) -> DataFrame:
    """Kafka rows -> one row per message with the event's fields and
    ``reject_reason`` (null for a valid event). Never drops a row: a
    malformed message is kept, with the first reason it fails.

    An event_time more than ``max_future_skew_ms`` after the Kafka record's
    own ``timestamp`` is malformed (``future_event_time``): one clock far
    ahead would otherwise move the watermark and make every later event
    late. The record timestamp, never the wall clock, decides, so a replay
    decides the same. ``None`` leaves the rule out: for the DLQ and late
    copies the job wrote, whose source records it already checked.

    An ``event_id``, ``ad_id`` or ``campaign_id`` longer than
    ``adpipe.schemas.MAX_FIELD_CHARS`` makes the event malformed
    (``field_too_long``), checked before its time.

    ``fast_path=False`` reads every record by the variant route (tests
    compare the two)."""
    text = F.col("value").cast("string")
    v, fast = F.col("__v"), F.col("__fast")
    # An event of an unknown event_type has its fields read (null __fast):
    # each is the text the variant route reads, which decides its verdict.
    canonical = F.col("__canonical")
    time_type = F.coalesce(fast, _field_type(v, "event_time"))
    time_text = F.coalesce(canonical["event_time"], F.try_variant_get(v, "$.event_time", "string"))
    # Cast only what the fast path read as digits: try_cast on other text
    # throws and catches an exception per row (a second per million rows).
    time_millis = F.coalesce(
        F.when(fast == "BIGINT", canonical["event_time"].cast("long")),
        F.try_variant_get(v, "$.event_time", "long"),
    )
    event_type = F.coalesce(canonical["event_type"], F.try_variant_get(v, "$.event_type", "string"))
    event_id = F.coalesce(canonical["event_id"], F.try_variant_get(v, "$.event_id", "string"))
    ad_id = F.coalesce(canonical["ad_id"], F.try_variant_get(v, "$.ad_id", "string"))
    valid_campaign = _true(_field_type(v, "campaign_id") == "STRING")
    campaign_id = F.when(fast.isNotNull(), canonical["campaign_id"]).when(
        valid_campaign, F.try_variant_get(v, "$.campaign_id", "string")
    )
    # Checked before the time: an id over the limit never becomes a key or a
    # header of any record the job writes (adpipe.schemas.MAX_FIELD_CHARS).
    too_long = _true(
        (F.length(event_id) > S.MAX_FIELD_CHARS)
        | (F.length(ad_id) > S.MAX_FIELD_CHARS)
        | (F.length(campaign_id) > S.MAX_FIELD_CHARS)
    )
    time_reason = F.when(too_long, F.lit(S.REASON_FIELD_TOO_LONG)).when(
        F.col("event_time").isNull(), F.lit(S.REASON_BAD_EVENT_TIME)
    )
    if max_future_skew_ms is not None:
        time_reason = time_reason.when(
            F.unix_millis("event_time") > F.unix_millis(F.col("timestamp")) + F.lit(max_future_skew_ms),
            F.lit(S.REASON_FUTURE_EVENT_TIME),
        )
    reason = (
        F.when(fast.isNotNull(), time_reason)
        .when(v.isNull(), F.lit(S.REASON_NOT_JSON))
        .when(~_true(F.schema_of_variant(v).startswith("OBJECT")), F.lit(S.REASON_NOT_OBJECT))
        .when(~_non_empty_string(v, "event_id"), F.lit(S.REASON_BAD_EVENT_ID))
        .when(~_non_empty_string(v, "ad_id"), F.lit(S.REASON_BAD_AD_ID))
        .when(
            ~(_true(_field_type(v, "event_type") == "STRING") & _true(event_type.isin(*S.EVENT_TYPES))),
            F.lit(S.REASON_BAD_EVENT_TYPE),
        )
        .when(
            _bad_characters(v, text, {"event_id": event_id, "ad_id": ad_id, "campaign_id": campaign_id}),
            F.lit(S.REASON_BAD_CHARACTERS),
        )
        .otherwise(time_reason)
    )
    fields = _canonical_event(F.col("value")) if fast_path else F.lit(None).cast(_FAST_PATH_TYPE)
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
        .withColumn("__canonical", fields)
        .withColumn("__fast", _kind(F.col("__canonical")))
        # A JSON value followed by more than whitespace is not JSON either.
        .withColumn(
            "__v",
            F.when(
                fast.isNull() & F.is_valid_utf8(text) & _true(_nothing_after_the_value(F.col("value"))),
                F.try_parse_json(text),
            ),
        )
        .withColumn("event_time", _event_time(time_type, time_text, time_millis))
        .select(
            *RECORD_COLUMNS,
            event_id.alias("event_id"),
            ad_id.alias("ad_id"),
            campaign_id.alias("campaign_id"),
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
