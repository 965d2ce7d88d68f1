"""What the peer programs share; standard library only (they run in their
own environments, without adpipe). The driver and the Spark rows take
``READY_LINE`` and ``REPORT_PREFIX`` from here too: one spelling of the
lines they read back.

``classify`` is a peer's own reading of the contract's raw event, written
as a user of that engine would write it: not adpipe's code (the unit tests
hold it to ``adpipe.tools.verify.classify`` on every kind of malformed
message the producer makes)."""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

REPORT_PREFIX = "BENCH-REPORT "
READY_LINE = "BENCH-READY"
# The contract's ISO-8601 with a zone (adpipe.schemas.ISO_WITH_ZONE).
ISO_WITH_ZONE = re.compile(
    r"^(?!0000)\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}(:?\d{2})?)(?![\s\S])"
)
EPOCH_MS_MAX = 253_402_300_799_999
EVENT_TYPES = ("impression", "click")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ONE_MS = timedelta(milliseconds=1)
# The same namespace as adpipe's record_uuid: uuid5(job|ad|window start).
RECORD_UUID_NAMESPACE = uuid.UUID("6f1c2b9e-4a55-5d1e-9a7e-2f3b8c0d4e61")


def _no_constant(token: str) -> None:
    raise ValueError(f"{token} is not JSON")


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    if len(pairs) != len({k for k, _ in pairs}):
        raise ValueError("duplicate key")
    return dict(pairs)


def _event_ms(raw_time: object) -> int | None:
    if isinstance(raw_time, int) and not isinstance(raw_time, bool):
        return raw_time if 0 <= raw_time <= EPOCH_MS_MAX else None
    if isinstance(raw_time, str) and ISO_WITH_ZONE.match(raw_time):
        try:
            ts = datetime.fromisoformat(raw_time)
        except ValueError:
            return None
        return (ts - _EPOCH) // _ONE_MS if ts.tzinfo is not None else None
    return None


def classify(value: bytes | None, record_ms: int | None = None, max_future_skew_ms: int = 300_000) -> dict | str:
    """``{"event_id", "ad_id", "event_type", "ms"}`` of a valid event, or the
    reason the message is malformed (the contract's reason names)."""
    try:
        body = (
            json.loads(value.decode("utf-8"), parse_constant=_no_constant, object_pairs_hook=_unique_keys)
            if value
            else None
        )
    except (UnicodeDecodeError, ValueError):
        return "not_json"
    if body is None and not value:
        return "not_json"
    if not isinstance(body, dict):
        return "not_object"
    event_id, ad_id = body.get("event_id"), body.get("ad_id")
    if not isinstance(event_id, str) or not event_id:
        return "missing_or_invalid_event_id"
    if not isinstance(ad_id, str) or not ad_id:
        return "missing_or_invalid_ad_id"
    event_type = body.get("event_type")
    if event_type not in EVENT_TYPES:
        return "missing_or_unknown_event_type"
    ms = _event_ms(body.get("event_time"))
    if ms is None:
        return "missing_or_invalid_event_time"
    if record_ms is not None and ms > record_ms + max_future_skew_ms:
        return "future_event_time"
    return {"event_id": event_id, "ad_id": ad_id, "event_type": event_type, "ms": ms}


def iso_utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def aggregate(job_id: str, ad_id: str, start_ms: int, impressions: int, clicks: int) -> dict:
    """The contract's minute aggregate."""
    start = iso_utc(start_ms)
    return {
        "record_uuid": str(uuid.uuid5(RECORD_UUID_NAMESPACE, f"{job_id}|{ad_id}|{start}")),
        "ad_id": ad_id,
        "window_start": start,
        "window_end": iso_utc(start_ms + 60_000),
        "impressions": impressions,
        "clicks": clicks,
    }


def dlq_value(reason: str, topic: str, partition: int, offset: int) -> dict:
    """A peer's DLQ record: the reason and the raw record's position (the
    bench counts distinct positions)."""
    return {"reason": reason, "source": f"{topic}/{partition}/{offset}"}


def arguments(description: str) -> argparse.ArgumentParser:
    """The options every peer takes from the bench driver."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--input", required=True, help="raw ad-events topic")
    p.add_argument("--aggregates", help="output topic of the minute aggregates")
    p.add_argument("--dlq", help="output topic of the malformed records")
    p.add_argument("--job-id", default="bench", help="group, transactional id and record_uuid namespace")
    p.add_argument("--messages", type=int, default=0, help="stop after this many input records (0: run until SIGTERM)")
    p.add_argument("--lateness-s", type=int, default=30, help="watermark delay / grace (seconds)")
    p.add_argument("--work", default=".", help="a folder of this run's own (state, checkpoints)")
    return p


class Clock:
    """When the engine was ready, saw its first record, and finished: the
    report the driver reads (steady state = records / (done - first))."""

    def __init__(self) -> None:
        self.started = time.time()
        self.ready: float | None = None
        self.first: float | None = None
        self.records = 0
        self.stop_requested = False

    def mark_ready(self) -> None:
        self.ready = time.time()
        print(READY_LINE, flush=True)

    def seen(self, n: int = 1) -> None:
        if self.first is None:
            self.first = time.time()
        self.records += n

    def stop_on_sigterm(self, on_stop=None) -> None:  # noqa: ANN001
        def handler(_signum, _frame) -> None:  # noqa: ANN001
            self.stop_requested = True
            if on_stop is not None:
                on_stop()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def report(self, **extra: object) -> None:
        done = time.time()
        body = {
            "records": self.records,
            "startup_s": round((self.first or done) - self.started, 3),
            "ready_s": None if self.ready is None else round(self.ready - self.started, 3),
            "processing_s": round(done - (self.first or done), 3),
            **extra,
        }
        print(REPORT_PREFIX + json.dumps(body), flush=True)
        sys.stdout.flush()
