"""The aggregation stream job: Kafka ``ad-events`` -> one-minute aggregates
per ad -> ``ad-aggregates``, exactly once, through the transactional sink.

One read of the input, two stateful operators in the JVM
(adpipe.stream.transforms.stream_rows): the first decides every record
(malformed, repeated, a conflicting copy, late, counted), the second owns
the windows, emits each when the watermark passes its end and revises it
while late events come within the allowed lateness. The watermark is the
driver's (adpipe.stream.watermark: the slowest partition with records
waiting), computed for batch N from the checkpoint before the batch runs,
and handed to the batch's job; a replay computes and hands the same. Spark
records the batch's end offsets in ``offsets/N`` before running it, and a
replay reads the very same entries and state version, so it decides the
same. Small malformed rows come with their key and value; the driver
fetches just the other named rows' payloads from Kafka by position. A
listener checks for every batch that Spark itself dropped no row (a dropped
row would be neither counted nor listed)."""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark.sql import DataFrame, Row, SparkSession

from adpipe import kafka_io, metrics
from adpipe import schemas as S
from adpipe.settings import Settings
from adpipe.stream import transforms as T
from adpipe.stream import watermark as W
from adpipe.stream.liveness import heartbeat_path, record_failover
from adpipe.stream.offset_log import (
    BatchOffsets,
    CheckpointFiles,
    OffsetLogError,
    batch_offsets,
    query_id,
)
from adpipe.stream.sink import (
    LedgerMismatchError,
    OutRecord,
    ProducerFencedError,
    TransactionalSink,
    TransactionTimedOutError,
)

# Named after the part: operators grep "adpipe.stream: batch N".
log = logging.getLogger("adpipe.stream")

# record_uuid namespace: uuid5 of the job id, the ad and the window. It is
# a pure function of those, so a window that is recomputed after a crash
# (the replay of an uncommitted batch) carries the same record_uuid, and
# consumers deduplicate it; the job id keeps two regions' aggregates of the
# same ad and minute distinct.
RECORD_UUID_NAMESPACE = uuid.UUID("6f1c2b9e-4a55-5d1e-9a7e-2f3b8c0d4e61")


def record_uuid(job_id: str, ad_id: str, window_start: int | datetime, revision: int = 0) -> str:
    """uuid5 of the job, the ad and the window's UTC start (epoch ms, or an
    aware datetime): a window's first emission (revision 0) has the
    record_uuid it always had; a revision's adds its number."""
    name = f"{job_id}|{ad_id}|{iso_utc(window_start)}"
    return str(uuid.uuid5(RECORD_UUID_NAMESPACE, name if revision == 0 else f"{name}|r{revision}"))


def iso_utc(ts: int | datetime) -> str:
    """``2026-11-22T12:00:00Z`` from epoch milliseconds or an aware datetime.

    A naive datetime is refused: PySpark turns a timestamp into a naive
    datetime in the *driver's* zone (whatever Spark's session zone), so the
    same window would read differently on another host. Window bounds leave
    Spark as epoch milliseconds instead (``BatchHandler``)."""
    if isinstance(ts, int):
        ts = datetime.fromtimestamp(ts / 1000, UTC)
    elif ts.tzinfo is None:
        raise ValueError(f"naive datetime {ts!r}: pass epoch milliseconds or an aware datetime")
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def transactional_id(settings: Settings) -> str:
    return f"adpipe-agg-{settings.job_id}-{settings.topics.aggregates}"


def aggregate_record(settings: Settings, row: dict, batch_id: int) -> OutRecord:
    revision = int(row.get("revision") or 0)
    fields = (
        record_uuid(settings.job_id, row["ad_id"], row["window_start"], revision),
        row["ad_id"],
        iso_utc(row["window_start"]),
        iso_utc(row["window_end"]),
        int(row["impressions"]),
        int(row["clicks"]),
        revision,
    )
    value = dict(zip(S.AGGREGATE_RECORD.fieldNames(), fields, strict=True))  # the contract's order
    headers = [
        ("adpipe.kind", b"aggregate"),
        (S.HEADER_JOB, settings.job_id.encode()),
        (S.HEADER_BATCH, str(batch_id).encode()),
    ]
    return OutRecord(settings.topics.aggregates, row["ad_id"].encode(), json.dumps(value).encode(), headers)


def _source(row: dict) -> bytes:
    return f"{row['topic']}/{row['partition']}/{row['offset']}".encode()


# Room left in a record batch for its own overhead (batch and record headers).
RECORD_OVERHEAD_BYTES = 16_384
# An oversized copy keeps at most this much of its key (the raw record keeps it whole).
TRUNCATED_KEY_BYTES = 1_024


def value_limits(max_message_bytes: dict[str, int]) -> dict[str, int]:
    """Per topic, the largest record (key, value and headers together) a DLQ
    or late copy is written with whole: the topic's ``max.message.bytes``
    less room for the batch's overhead. The sink compresses, so a record
    within it always fits."""
    smallest = 4 * TRUNCATED_KEY_BYTES
    return {topic: max(smallest, limit - RECORD_OVERHEAD_BYTES) for topic, limit in max_message_bytes.items()}


def record_bytes(key: bytes | None, value: bytes, headers: Iterable[tuple[str, bytes]]) -> int:
    """What a record weighs against its topic's limit: key, value and every
    header's name and value (the broker counts them all)."""
    return len(key or b"") + len(value) + sum(len(name.encode()) + len(body) for name, body in headers)


def _copy(
    topic: str,
    key: bytes | None,
    value: bytes,
    kind: str,
    reason: str,
    headers: list[tuple[str, bytes]],
    limit: int | None,
) -> OutRecord:
    """The record as it is, or, when key, value and headers together are
    over ``limit`` (None: no limit), truncated with ``oversized`` headers:
    the key to ``TRUNCATED_KEY_BYTES``, the value to what room is left."""
    whole = [("adpipe.kind", kind.encode()), (S.HEADER_REASON, reason.encode()), *headers]
    if limit is None or record_bytes(key, value, whole) <= limit:
        return OutRecord(topic, key, value, whole)
    short_key = None if key is None else key[:TRUNCATED_KEY_BYTES]
    marked = [
        ("adpipe.kind", kind.encode()),
        (S.HEADER_REASON, S.REASON_OVERSIZED.encode()),
        (S.HEADER_ORIGINAL_REASON, reason.encode()),
        (S.HEADER_ORIGINAL_SIZE, str(len(value)).encode()),
        *headers,
    ]
    room = max(0, limit - record_bytes(short_key, b"", marked))
    return OutRecord(topic, short_key, value[:room], marked)


@dataclass
class ExceptionCopies:
    """The DLQ copies of malformed rows and of conflicting copies of an
    event, and the late copies of late ones, made while the rows stream by
    (the driver holds one record at a time, not the batch's); a copy whose
    value is over its topic's entry in ``limits`` is truncated
    (:func:`value_limits`). The rows must come in (partition, offset) order,
    so that a replay writes the very same records."""

    settings: Settings
    batch_id: int
    watermark_ms: int
    limits: dict[str, int] = field(default_factory=dict)
    dlq: int = 0
    conflicts: int = 0
    late: int = 0

    def records(self, rows: Iterable[dict]) -> Iterator[OutRecord]:
        settings = self.settings
        common = [(S.HEADER_JOB, settings.job_id.encode()), (S.HEADER_BATCH, str(self.batch_id).encode())]
        for row in rows:
            value = bytes(row["value"]) if row["value"] is not None else b""
            key = bytes(row["key"]) if row["key"] is not None else None
            if row["kind"] == T.KIND_MALFORMED:
                self.dlq += 1
                topic = settings.topics.dlq
                headers = [(S.HEADER_SOURCE, _source(row)), *common]
                yield _copy(topic, key, value, "dlq", row["reject_reason"], headers, self.limits.get(topic))
                continue
            event = [
                (S.HEADER_SOURCE, _source(row)),
                (S.HEADER_EVENT_ID, row["event_id"].encode()),
                (S.HEADER_EVENT_TIME_MS, str(row["event_ms"]).encode()),
            ]
            if row["kind"] == T.KIND_CONFLICT:
                self.dlq += 1
                self.conflicts += 1
                topic = settings.topics.dlq
                headers = [*event, (S.HEADER_FIRST_EVENT_TIME_MS, str(row["first_event_ms"]).encode()), *common]
                yield _copy(topic, key, value, "dlq", S.REASON_CONFLICTING_DUPLICATE, headers, self.limits.get(topic))
                continue
            self.late += 1
            topic = settings.topics.late
            headers = [*event, (S.HEADER_WATERMARK, str(self.watermark_ms).encode()), *common]
            yield _copy(topic, row["ad_id"].encode(), value, "late", "late", headers, self.limits.get(topic))


@dataclass
class BatchOutput:
    """What one micro-batch's query gave the driver."""

    aggregates: list[OutRecord] = field(default_factory=list)
    # malformed, conflicting and late rows, by position, without their payload
    exceptions: list[dict] = field(default_factory=list)
    # copies of an event already counted or listed (same event time): neither counted nor listed again
    repeats: int = 0
    # of which the event's window was past its allowed lateness
    late_repeats: int = 0
    # windows emitted again, with later events (revision > 0)
    revisions: int = 0
    # per partition read: its highest valid event time (None: records, none valid)
    read: dict[int, int | None] = field(default_factory=dict)


def _position(row: Mapping | Row) -> tuple[int, int]:
    return row["partition"], row["offset"]


def _window(ad_id: str, start_ms: int, impressions: int, clicks: int, revision: int) -> dict:
    """A window as :func:`aggregate_record` reads it (bounds in epoch
    milliseconds: host-zone independent, see iso_utc)."""
    return {
        "ad_id": ad_id,
        "window_start": start_ms,
        "window_end": start_ms + T.MINUTE_MS,
        "impressions": impressions,
        "clicks": clicks,
        "revision": revision,
    }


def _with_records(settings: Settings, topic: str, rows: list[dict]) -> Iterator[dict]:
    """``rows`` (sorted by position) each with its record's ``key``, ``value``
    and ``topic``: an ``inline`` row's as it came, the others' fetched from
    Kafka (no consumer at all when none is to be fetched)."""
    wanted: dict[int, list[int]] = collections.defaultdict(list)
    for row in rows:
        if not row.get("inline"):
            wanted[row["partition"]].append(row["offset"])
    fetched = kafka_io.read_positions(settings.kafka, topic, wanted) if wanted else iter(())
    for row in rows:
        if row.get("inline"):
            yield {**row, "topic": topic}
            continue
        record = next(fetched, None)
        if record is None or (record.partition, record.offset) != _position(row):
            got = None if record is None else (record.partition, record.offset)
            raise kafka_io.MissingRecordError(f"expected {topic} {_position(row)}, read {got}")
        yield {**row, "topic": topic, "key": record.key, "value": record.value}
    extra = next(fetched, None)  # and the reader ends (its consumer closed) here
    if extra is not None:
        raise kafka_io.MissingRecordError(f"read {topic} {(extra.partition, extra.offset)}, which no row named")


@dataclass(frozen=True)
class Takeover:
    """Why a standby driver took the checkpoint over, and when (monotonic)."""

    reason: str
    at: float


class BatchHandler:
    """The foreachBatch function: the batch's watermark, its output, its commit."""

    def __init__(
        self,
        spark: SparkSession,
        settings: Settings,
        sink: TransactionalSink,
        limits: dict[str, int],
        checkpoint: CheckpointFiles,
        took_over: Takeover | None = None,
    ) -> None:
        self.spark = spark
        self.took_over = took_over  # a standby's: why and when it took the checkpoint
        self.settings = settings
        self.checkpoint = checkpoint
        self.progress = W.ProgressLog(checkpoint)
        self.sink = sink
        self.limits = limits  # per output topic, the largest value copied whole
        self.in_batch = threading.Event()
        self.batches = 0
        self.fatal: Exception | None = None
        self.metrics = metrics.stream(settings)

    def __call__(self, batch_df: DataFrame, batch_id: int) -> None:
        self.in_batch.set()
        try:
            self._handle(batch_df, batch_id)
        except (ProducerFencedError, LedgerMismatchError, TransactionTimedOutError, OffsetLogError) as exc:
            self.fatal = exc  # Spark wraps it; run() re-raises the original
            raise
        finally:
            self.in_batch.clear()

    def watermark(self, offsets: BatchOffsets) -> tuple[W.Progress | None, int]:
        """The progress after the batch before ``offsets``' and the watermark
        this batch runs with (adpipe.stream.watermark), the same in a replay."""
        previous = self.progress.before(offsets.batch_id)
        settings = self.settings
        return previous, W.batch_watermark(
            previous, offsets.waiting, settings.watermark_delay_s * 1000, settings.watermark_alignment
        )

    def _batch_output(self, batch_df: DataFrame, batch_id: int, watermark_ms: int) -> BatchOutput:
        """The records of the windows the batch emitted or revised, its
        exception rows (malformed, conflicting, late) and what it read, from
        one action: Spark runs the batch's stateful operators once and the
        input is read once. All are small (a row per window, a row per
        exception of one bounded batch, no payload). The batch's job gets its
        watermark as a local property (adpipe.spark.StreamOperators)."""
        context = self.spark.sparkContext
        context.setLocalProperty(T.WATERMARK_PROPERTY, str(watermark_ms))
        try:
            rows = batch_df.collect()
        finally:
            context.setLocalProperty(T.WATERMARK_PROPERTY, None)  # type: ignore[arg-type] - None clears it
        output = BatchOutput()
        windows = []
        for row in rows:
            if row["watermark_ms"] != watermark_ms:
                # Never expected: an operator would have decided by another watermark.
                raise RuntimeError(
                    f"batch {batch_id}: the stateful operators ran with watermark {row['watermark_ms']}, "
                    f"not the batch's watermark {watermark_ms}"
                )
            kind = row["kind"]
            if kind == T.KIND_AGGREGATE:
                windows.append(
                    _window(row["ad_id"], row["window_start_ms"], row["impressions"], row["clicks"], row["revision"])
                )
            elif kind == T.KIND_PROGRESS:
                highest = row["progress_ms"]
                known = output.read.get(row["partition"])
                output.read[row["partition"]] = highest if known is None else max(known, highest or known)
            elif kind == T.KIND_COUNTERS:
                output.repeats += row["repeats"]
                output.late_repeats += row["late_repeats"]
            else:  # malformed, conflicting or late
                output.exceptions.append(
                    {
                        "kind": kind,
                        "partition": row["partition"],
                        "offset": row["offset"],
                        "reject_reason": row["reject_reason"],
                        "event_id": row["event_id"],
                        "ad_id": row["ad_id"],
                        "event_ms": None if row["event_us"] is None else row["event_us"] // 1000,
                        "first_event_ms": None if row["first_event_us"] is None else row["first_event_us"] // 1000,
                        "inline": bool(row["inline"]),
                        "key": row["key"],
                        "value": row["value"],
                    }
                )
        output.exceptions.sort(key=_position)
        windows.sort(key=lambda w: (w["window_start"], w["ad_id"]))
        output.revisions = sum(w["revision"] > 0 for w in windows)
        output.aggregates = [aggregate_record(self.settings, window, batch_id) for window in windows]
        return output

    def _handle(self, batch_df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        offsets = batch_offsets(self.checkpoint, batch_id)
        previous, watermark_ms = self.watermark(offsets)
        output = self._batch_output(batch_df, batch_id, watermark_ms)
        # Before the commit: the next batch (or this one's replay) reads it.
        self.progress.write(W.after_batch(previous, batch_id, watermark_ms, offsets.waiting, output.read))
        aggregates = output.aggregates
        attempts: list[ExceptionCopies] = []

        def batch_records() -> Iterator[OutRecord]:
            """The batch's records, streamed again on each attempt (with fresh
            counts); the exception rows' payloads are fetched as they go."""
            copies = ExceptionCopies(self.settings, batch_id, watermark_ms, self.limits)
            attempts.append(copies)
            yield from aggregates
            yield from copies.records(_with_records(self.settings, offsets.topic, output.exceptions))

        if self.sink.query_id is None:  # written by Spark before the first batch
            self.sink.query_id = query_id(self.checkpoint)
        result = self.sink.commit_batch(batch_id, offsets.end, batch_records, len(aggregates), watermark_ms)
        if result.skipped:  # nothing was written: count what would have been, for the drop check
            collections.deque(batch_records(), maxlen=0)
        copies = attempts[-1]
        self.batches += 1
        log.info(
            "batch %d: input offsets %d, windows emitted %d (revisions %d), dlq %d (conflicting copies %d), "
            "late %d, repeats skipped %d (late %d), watermark %s, transaction %s %s in %.0f ms (batch %.0f ms)",
            batch_id,
            offsets.input_offsets,
            len(aggregates),
            output.revisions,
            copies.dlq,
            copies.conflicts,
            copies.late,
            output.repeats,
            output.late_repeats,
            iso_utc(watermark_ms),
            result.transactional_id,
            "skipped (already committed)" if result.skipped else "committed",
            result.duration_ms,
            (time.monotonic() - started) * 1000,
        )
        self.metrics.batch_done(
            batch_id, skipped=result.skipped, input_offsets=offsets.input_offsets, windows=len(aggregates),
            dlq=copies.dlq, late=copies.late, late_repeats=output.late_repeats, end_offsets=offsets.end,
            watermark_ms=watermark_ms, transaction_s=result.duration_ms / 1000,
            batch_s=time.monotonic() - started,
        )
        write_heartbeat(
            self.settings, batch_id, offsets, watermark_ms, len(aggregates), copies.dlq, copies.late, result.skipped
        )
        if self.took_over is not None and self.batches == 1:
            seconds = time.monotonic() - self.took_over.at
            log.info("standby: took over (%s); batch %d done %.1f s after taking over", self.took_over.reason,
                     batch_id, seconds)
            record_failover(self.settings, self.took_over.reason, batch_id, seconds)


def write_heartbeat(
    settings: Settings,
    batch_id: int,
    offsets: BatchOffsets,
    watermark_ms: int,
    windows: int,
    dlq: int,
    late: int,
    skipped: bool,
) -> None:
    """Liveness for supervisors: the last batch this job finished."""
    path = heartbeat_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(
        json.dumps(
            {
                "job_id": settings.job_id,
                "batch_id": batch_id,
                "at": time.time(),
                "watermark_ms": watermark_ms,
                "end_offsets": offsets.end,
                "windows": windows,
                "dlq": dlq,
                "late": late,
                "replay_skipped": skipped,
            }
        )
    )
    tmp.replace(path)
