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


# The fast path: an event in the contract's own shape (the shape of
# ``adpipe produce`` and of the contract's example) is recognised by one
# regular expression and its fields read by splitting its text at its
# quotes, not by the variant route, which costs several times more (a
# variant per field for its type, a second JSON parse for the trailing-text
# check), nor by ``from_json`` (Jackson's parser, set up per row, was a fifth
# of the stream job's JVM time: JFR). The pattern only admits text that the
# variant route reads as a valid event or rejects for its event_time alone:
# a flat object whose keys come in the contract's order (so none is
# repeated), string values without escapes, quotes or control characters
# (so the text between two quotes is the value), non-empty ids, a known
# event_type, event_time a string or at most 15 digits of milliseconds,
# JSON whitespace only, nothing after it. Every other record (extra fields,
# another key order, escapes) takes the variant route, with the same
# verdicts: tests hold the two routes to each other.
_WS = r"[ \t\n\r]*"
_TEXT = r'"[^"\\\x00-\x1f]*"'
_NON_EMPTY_TEXT = r'"[^"\\\x00-\x1f]+"'
_MS_TIME = r"(?:0|[1-9][0-9]{0,14})"


def _canonical_event(time_value: str) -> str:
    def member(name: str, value: str) -> str:
        return f'{_WS}"{name}"{_WS}:{_WS}{value}{_WS}'

    event_types = "|".join(S.EVENT_TYPES)
    members = ",".join(
        [
            member("event_id", _NON_EMPTY_TEXT),
            member("ad_id", _NON_EMPTY_TEXT) + f"(?:,{member('campaign_id', _TEXT)})?",
            member("event_type", f'"(?:{event_types})"'),
            member("event_time", time_value),
        ]
    )
    return rf"^{_WS}\{{{members}\}}{_WS}(?![\s\S])"


CANONICAL_EVENT = _canonical_event(f"(?:{_NON_EMPTY_TEXT}|{_MS_TIME})")
# The text of a canonical event split at its quotes has 4 parts per key and
# string value pair, 2 per key and number pair, and one more: by count,
# whether campaign_id is there and whether event_time is a string.
_PARTS_TIME_TYPE = {15: "BIGINT", 17: "STRING", 19: "BIGINT", 21: "STRING"}
_PARTS_WITH_CAMPAIGN = (19, 21)


def _canonical_parts(text: Column) -> Column:
    """The text split at its quotes when it is in the contract's own shape
    and takes the fast path; null when it takes the variant route. Invalid
    UTF-8 is not JSON (a cast alone would turn it into U+FFFD)."""
    return F.when(F.is_valid_utf8(text) & text.rlike(CANONICAL_EVENT), F.split(text, '"', -1))


def _time_type_of_parts(parts: Column) -> Column:
    """``STRING`` or ``BIGINT``: the JSON type of a canonical event's
    event_time, from its parts (:func:`_canonical_parts`)."""
    size = F.size(parts)
    kind = F.lit(None).cast("string")
    for count, name in _PARTS_TIME_TYPE.items():
        kind = F.when(size == count, F.lit(name)).otherwise(kind)
    return kind


def _canonical_fields(parts: Column) -> dict[str, Column]:
    """A canonical event's fields from its parts: a value sits between the
    quotes after its key's (event_time, a number, in the last part)."""
    with_campaign = F.size(parts).isin(*_PARTS_WITH_CAMPAIGN)
    string_time = _time_type_of_parts(parts) == "STRING"
    return {
        "event_id": parts.getItem(3),
        "ad_id": parts.getItem(7),
        "campaign_id": F.when(with_campaign, parts.getItem(11)),
        "event_type": F.when(with_campaign, parts.getItem(15)).otherwise(parts.getItem(11)),
        "event_time": F.when(string_time, F.element_at(parts, -2)).otherwise(
            F.regexp_extract(F.element_at(parts, -1), "[0-9]+", 0)
        ),
    }


def fast_path_kind(text: Column) -> Column:
    """For a record's text: ``STRING`` or ``BIGINT`` (the JSON type of its
    event_time) when it is in the contract's own shape and takes the fast
    path, null when it takes the variant route."""
    return _time_type_of_parts(_canonical_parts(text))


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
    canonical = _canonical_fields(F.col("__parts"))
    time_type = F.coalesce(fast, _field_type(v, "event_time"))
    time_text = F.coalesce(canonical["event_time"], F.try_variant_get(v, "$.event_time", "string"))
    # Cast only what the pattern read as digits: try_cast on other text
    # throws and catches an exception per row (a second per million rows).
    time_millis = F.coalesce(
        F.when(fast == "BIGINT", canonical["event_time"].cast("long")),
        F.try_variant_get(v, "$.event_time", "long"),
    )
    event_type = F.coalesce(canonical["event_type"], F.try_variant_get(v, "$.event_type", "string"))
    event_id = F.coalesce(canonical["event_id"], F.try_variant_get(v, "$.event_id", "string"))
    ad_id = F.coalesce(canonical["ad_id"], F.try_variant_get(v, "$.ad_id", "string"))
    valid_campaign = _true(_field_type(v, "campaign_id") == "STRING")
    campaign_id = (
        F.when(fast.isNotNull(), canonical["campaign_id"])
        .when(valid_campaign, F.try_variant_get(v, "$.campaign_id", "string"))
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
        .otherwise(time_reason)
    )
    parts = _canonical_parts(text) if fast_path else F.lit(None).cast("array<string>")
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
        .withColumn("__parts", parts)
        .withColumn("__fast", _time_type_of_parts(F.col("__parts")))
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
