"""Raw Kafka rows and events for the unit tests of the raw-event reading
and of the stream's windows."""

from __future__ import annotations

import json

from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType, TimestampType

# Kafka source rows as the stream job receives them (key and value binary).
RAW_KAFKA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", LongType()),
        StructField("offset", LongType()),
    ]
)

VALID_EVENTS = StructType(
    [
        StructField("event_id", StringType()),
        StructField("ad_id", StringType()),
        StructField("event_type", StringType()),
        StructField("event_time", TimestampType()),
    ]
)

BASE = {
    "event_id": "e-1",
    "ad_id": "ad-1",
    "campaign_id": "cmp-1",
    "event_type": "impression",
    "event_time": "2026-11-22T12:00:00.250Z",
}
DROP = object()


def body(**changes: object) -> bytes:
    """The valid base event with fields replaced (or removed with DROP)."""
    event = dict(BASE)
    for name, value in changes.items():
        if value is DROP:
            del event[name]
        else:
            event[name] = value
    return json.dumps(event).encode()

TOPIC = "ad-events"
