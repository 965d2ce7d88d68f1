"""The unit tests' helpers, one module for every test module (the fixtures
are in conftest.py): raw Kafka rows and events for the tests of the
raw-event reading and of the stream's windows, aggregate records as the
stream job writes them, the commands of a Makefile target, and the docs'
sections, tables and checked examples as the docs tests read them."""

from __future__ import annotations

import json
import re
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


# --- the docs, read as the reference they are (tests/unit/test_docs_*.py) ---

DOCS = PROJECT_ROOT / "docs"


def doc_sections(path, level: int = 2) -> dict[str, str]:  # noqa: ANN001 - a Path
    """A Markdown page's sections of ``level`` (``##``: 2), by heading text,
    each with its text up to the next heading of that level or above
    (fenced code blocks never hold a heading)."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        hashes = len(line) - len(line.lstrip("#"))
        if not fenced and 0 < hashes <= level and line[hashes:hashes + 1] == " ":
            current = sections.setdefault(line[hashes:].strip(), []) if hashes == level else None
            continue
        if current is not None:
            current.append(line)
    return {heading: "\n".join(lines) for heading, lines in sections.items()}


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row in ``text``, header and
    separator rows left out (a header is the row above a separator)."""
    lines = [line.strip() for line in text.splitlines()]
    rows = []
    for i, line in enumerate(lines):
        if not line.startswith("|") or set(line) <= set("|-: "):
            continue
        if i + 1 < len(lines) and lines[i + 1].startswith("|") and set(lines[i + 1]) <= set("|-: "):
            continue
        # A `|` inside backticks is text (`up|down`), not a cell's border.
        cells, cell, code = [], "", False
        for ch in line.strip("|"):
            if ch == "`":
                code = not code
            if ch == "|" and not code:
                cells.append(cell.strip())
                cell = ""
            else:
                cell += ch
        rows.append([*cells, cell.strip()])
    return rows


def first_code(cell: str) -> str | None:
    """The first `code` span of a table cell, or None."""
    found = re.search(r"`([^`]*)`", cell)
    return found.group(1) if found else None


def checked_blocks(path) -> list[tuple[str, str]]:  # noqa: ANN001 - a Path
    """The code blocks a page marks for its tests: ``<!-- checked: WHAT -->``
    on the line before a fenced block gives (WHAT, the block's text)."""
    found = re.findall(r"<!-- checked: (.+?) -->\n```[a-z]*\n(.*?)\n```", path.read_text(), flags=re.S)
    return [(what.strip(), block) for what, block in found]
