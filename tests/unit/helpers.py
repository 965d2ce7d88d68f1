"""The unit tests' helpers, one module for every test module (the fixtures
are in conftest.py): raw Kafka rows and events for the tests of the
raw-event reading and of the stream's windows, aggregate records as the
stream job writes them, and the commands of a Makefile target."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime

from adpipe.settings import PROJECT_ROOT
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType, TimestampType

# Kafka source rows as the stream job receives them (key and value binary).
RAW_KAFKA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", LongType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
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
# Every test record's own Kafka timestamp, and the contract's default skew:
# an event_time after RECORD_MS + SKEW_MS is future_event_time.
RECORD_TIME = datetime(2026, 11, 22, 13, 0, tzinfo=UTC)
RECORD_MS = 1_795_352_400_000
SKEW_MS = 300_000


def kafka_frame(spark, rows: list[tuple]):  # noqa: ANN001, ANN201 - SparkSession -> DataFrame
    """(key, value, topic, partition, offset) rows as the Kafka source gives
    them, each with the record timestamp RECORD_TIME."""
    return spark.createDataFrame([(*row, RECORD_TIME) for row in rows], RAW_KAFKA)


def aggregate(ad: str, window: str, impressions: int, clicks: int, record_uuid: str | None = None) -> bytes:
    """An aggregate record's value (the contract's JSON), its record_uuid
    made of the ad and the window unless given."""
    return json.dumps(
        {
            "record_uuid": record_uuid or f"u-{ad}-{window}",
            "ad_id": ad,
            "window_start": window,
            "window_end": "x",
            "impressions": impressions,
            "clicks": clicks,
        }
    ).encode()


def make_dry_run(*args: str) -> list[str]:
    """The commands make would run (``make -n``), one per line."""
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", *args], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    )
    return [line.strip() for line in done.stdout.replace("\\\n", " ").splitlines() if line.strip()]
