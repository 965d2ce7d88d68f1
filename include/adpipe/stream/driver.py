"""The stream driver's life: the job's leadership (or, for a standby, the
wait for it; adpipe.stream.leadership), the one SparkSession, the transactional sink, the query, until
a signal or the end of the input stops it. What one micro-batch does is
:mod:`adpipe.stream.job`."""

from __future__ import annotations

import json
import logging
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery, StreamingQueryListener

from adpipe import kafka_io, metrics, raw_events
from adpipe.faults import FaultPlan
from adpipe.settings import Settings
from adpipe.spark import build_spark, stream_job_conf
from adpipe.stream import transforms as T
from adpipe.stream import upgrade
from adpipe.stream.job import RECORD_OVERHEAD_BYTES, BatchHandler, Takeover, transactional_id, value_limits
from adpipe.stream.leadership import STANDBY_WARM_LINE, leadership
from adpipe.stream.liveness import mark_polled
from adpipe.stream.offset_log import (
    CheckpointFiles,
    HadoopCheckpoint,
    batch_offsets,
    check_query_shape,
    last_committed_batch,
    query_id,
)
from adpipe.stream.sink import TransactionalSink
from adpipe.stream.watermark import ProgressLog, check_progress

# The job's lines read "adpipe.stream: ...", wherever they come from.
log = logging.getLogger("adpipe.stream")


class _DropCheck(StreamingQueryListener):
    """Checks that Spark itself dropped no row of any batch (the stateful
    operator's input has no event-time column, so Spark has none to drop by:
    a dropped row would be neither counted nor listed), and marks the query
    polled (liveness) on each progress or idle event."""

    def __init__(self, handler: BatchHandler) -> None:
        self.handler = handler

    def onQueryStarted(self, event) -> None:  # noqa: ANN001, N802
        pass

    def onQueryIdle(self, event) -> None:  # noqa: ANN001, N802
        mark_polled(self.handler.settings)

    def onQueryTerminated(self, event) -> None:  # noqa: ANN001, N802
        pass

    def onQueryProgress(self, event) -> None:  # noqa: ANN001, N802
        mark_polled(self.handler.settings)
        progress = event.progress
        dropped = sum(op.numRowsDroppedByWatermark for op in progress.stateOperators)
        if dropped:
            log.error("batch %d: Spark dropped %d rows by the watermark", progress.batchId, dropped)


def build_query_df(
    spark: SparkSession,
    settings: Settings,
    starting_offsets: str = "earliest",
    initial: tuple[DataFrame, DataFrame] | None = None,
) -> DataFrame:
    """The job's query up to its foreachBatch: the raw topic read
    read_committed, parsed, through the stateful operators (with an upgraded
    checkpoint's initial states on its first start)."""
    reader = (
        spark.readStream.format("kafka")
        .options(**settings.kafka.spark_options())
        .option("subscribe", settings.topics.events)
        .option("kafka.isolation.level", "read_committed")
        .option("startingOffsets", starting_offsets)
        .option("failOnDataLoss", "true")
    )
    if settings.max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", settings.max_offsets_per_trigger)
    return (
        reader.load()
        .transform(raw_events.parse_raw_events, settings.max_future_skew_ms)
        .transform(stream_rows, settings, initial)
    )


def stream_rows(
    parsed_df: DataFrame, settings: Settings, initial: tuple[DataFrame, DataFrame] | None = None
) -> DataFrame:
    """The job's stateful operators over parsed rows, with its lateness and retention."""
    lateness_ms, retention_ms = settings.allowed_lateness_s * 1000, settings.late_dedupe_retention_s * 1000
    return T.stream_rows(parsed_df, lateness_ms, retention_ms, initial)


def sink_for(
    settings: Settings, fault: FaultPlan | None, checkpoint: CheckpointFiles
) -> tuple[TransactionalSink, dict[str, int]]:
    """The transactional sink, sized to the output topics, and the largest
    value a DLQ or late copy is written with whole, per topic."""
    topic_limits = kafka_io.max_message_bytes(
        settings.kafka, [settings.topics.aggregates, settings.topics.dlq, settings.topics.late]
    )
    sink = TransactionalSink(
        settings.kafka,
        transactional_id(settings),
        kafka_io.ledger_group(settings.job_id),
        settings.topics.events,
        query_id(checkpoint),
        settings.transaction_timeout_ms,
        fault,
        message_max_bytes=max(topic_limits.values()) + RECORD_OVERHEAD_BYTES,
    )
    return sink, value_limits(topic_limits)


def _start_query(
    spark: SparkSession, settings: Settings, handler: BatchHandler, available_now: bool, checkpoint: CheckpointFiles
) -> StreamingQuery:
    upgraded = upgrade.pending(checkpoint)
    if upgraded is None:
        query_df = build_query_df(spark, settings)
    else:  # an upgraded checkpoint's first start (adpipe.stream.upgrade)
        log.info("the upgraded checkpoint's first batch reads on from %s", upgraded["end_offsets"])
        initial = upgrade.initial_states(spark, settings.checkpoint_uri)
        query_df = build_query_df(spark, settings, upgrade.starting_offsets(upgraded), initial)
    writer = (
        query_df
        .writeStream.outputMode("append")
        .option("checkpointLocation", settings.checkpoint_uri)
        .queryName(f"adpipe_agg_{settings.job_id}".replace("-", "_"))
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime=f"{settings.trigger_interval_s} seconds")
    )
    return writer.foreachBatch(handler).start()


def _await(query: StreamingQuery, handler: BatchHandler) -> None:
    """Until the query ends, or a SIGTERM/SIGINT stops it between batches;
    a failure of the query or of a batch is raised."""
    stop_requested = threading.Event()

    def request_stop(signum, _frame) -> None:  # noqa: ANN001
        log.info("signal %d: stopping after the current batch", signum)
        stop_requested.set()

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while query.isActive:
            if stop_requested.is_set() and not handler.in_batch.is_set():
                query.stop()
                break
            try:
                query.awaitTermination(0.5)
            except StreamingQueryException:
                break  # reported below
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    if handler.fatal is not None:
        raise handler.fatal
    exc = query.exception()
    if exc is not None:
        raise RuntimeError(f"stream query failed: {str(exc).splitlines()[0]}")


# How many times the query reads the raw topic (its offsets entries list it so often).
QUERY_SOURCES = 1


def run(
    settings: Settings,
    available_now: bool = False,
    fault: FaultPlan | None = None,
    accept_empty_ledger: bool = False,
    standby: bool = False,
) -> int:
    """Run the stream job until stopped (SIGTERM/SIGINT) or, with
    ``available_now``, until what is in the topic now is processed.
    Returns the number of batches handled.

    Before the query starts the driver takes the job's leadership (one
    driver per job, on any host), checks that the checkpoint fits this query, and
    the sink fences older instances and checks its ledger against the
    checkpoint (read through Spark's Hadoop FileSystem, at any URI): a job
    that must not run fails before any batch.

    ``standby``: start the session, then wait for the leadership, which the
    brokers hand over when the active driver leaves the group or its session
    expires (dead, frozen, cut off), while the job's query warms up
    (:class:`StandbyWarmUp`, cut short by a takeover that comes first); then
    go on as above: the sink's fencing aborts the dead driver's open
    transaction, Spark replays its uncommitted batch."""
    name = f"adpipe-stream-{settings.job_id}"
    spark = None
    warming = None
    try:
        if standby:
            started = time.monotonic()
            spark = _session(settings, name)
            warming = StandbyWarmUp(spark, settings, started)
        with leadership(settings, standby=standby) as takeover:
            took_over = Takeover(takeover, time.monotonic()) if takeover else None
            if warming is not None:
                warming.finish()
            kafka_io.ensure_pipeline_topics(settings)
            kafka_io.check_broker_time(settings.kafka, settings.topics.events)
            if spark is None:
                spark = _session(settings, name)
            try:
                checkpoint = HadoopCheckpoint(spark, settings.checkpoint_uri)
                check_query_shape(checkpoint, QUERY_SOURCES)
                check_progress(checkpoint)
                handler = _run_query(spark, settings, checkpoint, available_now, fault, accept_empty_ledger, took_over)
            finally:
                spark.stop()
                spark = None
    finally:
        if spark is not None:  # a standby stopped while it waited
            if warming is not None:
                warming.cut.set()
            spark.stop()
    log.info("stream job %s stopped after %d batches", settings.job_id, handler.batches)
    return handler.batches


def _session(settings: Settings, name: str) -> SparkSession:
    """The job's session (adpipe.spark.stream_job_conf)."""
    return build_spark(settings, name, stream_job_conf(settings))


# A standby's warm-up reads at most this many of the raw topic's last records per partition.
WARM_UP_TAIL = 5


class StandbyWarmUp:
    """A standby's warm-up (:func:`warm_up`) on a thread of its own, while
    the standby already waits for the checkpoint: a takeover that comes
    first cuts it short (:meth:`finish`) rather than wait for a warm-up
    that takes a minute or two on a loaded host."""

    def __init__(self, spark: SparkSession, settings: Settings, started: float) -> None:
        self.spark, self.settings, self.started = spark, settings, started
        self.cut = threading.Event()
        self.thread = threading.Thread(target=self._run, name="standby-warm-up", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            warm_up(self.spark, self.settings, self.cut)
        except Exception as exc:  # noqa: BLE001 - a warm-up is best effort: the standby goes on cold
            if not self.cut.is_set():
                log.warning("standby: warm-up failed (%s); standing by cold", str(exc).splitlines()[0])
            return
        if not self.cut.is_set():
            log.info("%s%.1f s", STANDBY_WARM_LINE, time.monotonic() - self.started)

    def finish(self, timeout_s: float = 60.0) -> None:
        """Cut the warm-up short if it still runs (its query stopped), and
        wait for its thread."""
        if self.thread.is_alive():
            log.info("standby: taking over %.1f s into the warm-up: cut short", time.monotonic() - self.started)
            self.cut.set()
        self.thread.join(timeout_s)


def warm_up(spark: SparkSession, settings: Settings, cut: threading.Event | None = None) -> None:
    """What a standby can do before it holds the checkpoint: run the job's
    own query (the Kafka read, parse, stateful operator, foreachBatch) for
    one batch into a scratch checkpoint, so that its plan is compiled, its
    Python workers and Kafka consumers run and the state store's classes
    are loaded. It reads the raw topic's last few records (a rate source
    when the topic has none or cannot be read). The job's state stays the
    active driver's: it is loaded at the takeover. ``cut``, once set,
    stops it where it is."""
    cut = cut or threading.Event()
    tail = _tail_offsets(settings)
    if tail is not None and not cut.is_set():
        try:
            _warm_up_query(spark, build_query_df(spark, settings, tail), "the raw topic's last records", cut)
            return
        except Exception as exc:  # noqa: BLE001 - a warm-up is best effort; the rate source follows
            if cut.is_set():
                return
            log.warning("standby: warm-up on the raw topic failed (%s); on a rate source instead",
                        str(exc).splitlines()[0])
    if not cut.is_set():
        warm_up_on_rate_source(spark, settings, cut)


def warm_up_on_rate_source(spark: SparkSession, settings: Settings, cut: threading.Event | None = None) -> None:
    """The job's query (parse, the stateful operator, foreachBatch) over
    events a rate source makes up, for one batch: no broker needed (also
    the class archive's training, adpipe.tools.class_archive_training)."""
    _warm_up_query(spark, _rate_rows(spark, settings), "a rate source", cut or threading.Event())


def _tail_offsets(settings: Settings) -> str | None:
    """Spark's startingOffsets for the raw topic's last WARM_UP_TAIL
    readable records per partition; None when it has none or does not answer."""
    try:
        bounds = kafka_io.offset_bounds(settings.kafka, settings.topics.events, timeout_s=10)
    except Exception as exc:  # noqa: BLE001 - the rate source warms the rest
        log.info("standby: the raw topic's offsets are unknown (%s)", str(exc).splitlines()[0])
        return None
    if not any(high > low for low, high in bounds.values()):
        return None
    starts = {str(p): max(low, high - WARM_UP_TAIL) for p, (low, high) in sorted(bounds.items())}
    return json.dumps({settings.topics.events: starts})


def _rate_rows(spark: SparkSession, settings: Settings) -> DataFrame:
    """The job's query with raw events made up by a rate source."""
    return (
        spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 4).option("numPartitions", 1).load()
        .select(
            F.lit(None).cast("binary").alias("key"),
            F.to_json(F.struct(
                F.concat(F.lit("warm-up-"), F.col("value").cast("string")).alias("event_id"),
                F.lit("impression").alias("event_type"), F.lit("warm-up").alias("ad_id"),
                F.lit("warm-up").alias("campaign_id"), F.unix_millis("timestamp").alias("event_time"),
            )).cast("binary").alias("value"),
            F.lit(settings.topics.events).alias("topic"), F.lit(0).alias("partition"),
            F.col("value").alias("offset"), F.col("timestamp"), F.lit(0).alias("timestampType"),
        )
        .transform(raw_events.parse_raw_events, settings.max_future_skew_ms)
        .transform(stream_rows, settings)
    )


def _collect_at_watermark(spark: SparkSession, batch_df: DataFrame, watermark_ms: int) -> list:
    """A batch of the job's query collected as its driver would, with the
    watermark its operators need (a warm-up's is the epoch's)."""
    context = spark.sparkContext
    context.setLocalProperty(T.WATERMARK_PROPERTY, str(watermark_ms))
    try:
        return batch_df.collect()
    finally:
        context.setLocalProperty(T.WATERMARK_PROPERTY, None)  # type: ignore[arg-type] - None clears it


# A warm-up query still running after this long is stopped.
WARM_UP_MAX_S = 120.0


def _warm_up_query(spark: SparkSession, rows: DataFrame, source: str, cut: threading.Event) -> None:
    """``rows`` through a collecting foreachBatch, into a scratch checkpoint,
    until caught up, ``cut`` set or WARM_UP_MAX_S passed."""
    scratch = Path(tempfile.mkdtemp(prefix="adpipe-standby-warm-up-"))
    batches: list[int] = []
    query = (
        rows.writeStream.outputMode("append").option("checkpointLocation", str(scratch))
        .trigger(availableNow=True)
        .foreachBatch(lambda batch_df, batch_id: (_collect_at_watermark(spark, batch_df, 0), batches.append(batch_id)))
        .start()
    )
    deadline = time.monotonic() + WARM_UP_MAX_S
    try:
        while not query.awaitTermination(0.25) and not cut.is_set() and time.monotonic() < deadline:
            pass
        if query.isActive:
            query.stop()
        if cut.is_set():
            log.info("standby: warm-up query on %s stopped after %d batches", source, len(batches))
            return
        failure = query.exception()
        if failure is not None:
            raise RuntimeError(str(failure))
    finally:
        if query.isActive:
            query.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    log.info("standby: warm-up query ran %d batches on %s", len(batches), source)


def _run_query(
    spark: SparkSession,
    settings: Settings,
    checkpoint: CheckpointFiles,
    available_now: bool,
    fault: FaultPlan | None,
    accept_empty_ledger: bool,
    took_over: Takeover | None = None,
) -> BatchHandler:
    sink, limits = sink_for(settings, fault, checkpoint)
    try:
        last = last_committed_batch(checkpoint)
        checkpointed = None
        if last is not None:
            batch = batch_offsets(checkpoint, last)
            progress = ProgressLog(checkpoint).at(last)
            checkpointed = (last, batch.end, progress.watermark_ms if progress is not None else 0)
        sink.start(checkpointed, accept_empty_ledger)
        handler = BatchHandler(spark, settings, sink, limits, checkpoint, took_over)
        handler.metrics.restored(checkpointed)
        metrics.serve(metrics.STREAM, settings)
        listener = _DropCheck(handler)
        spark.streams.addListener(listener)
        try:
            query = _start_query(spark, settings, handler, available_now, checkpoint)
            log.info(
                "stream job %s started: query %s, checkpoint %s, %s",
                settings.job_id,
                query.id,
                settings.checkpoint_uri,
                "available-now" if available_now else "continuous",
            )
            _await(query, handler)
        finally:
            spark.streams.removeListener(listener)
    finally:
        sink.close()
    return handler
