"""Prometheus metrics of the stream job, the budget service and Union & Load:
every metric adpipe exposes is defined here, and served from here.

Each part has a registry of its own per process (:func:`stream`,
:func:`budget`, :func:`load`, made on first use), and :func:`serve` exposes
it over HTTP at ``ADPIPE_METRICS_HOST`` (127.0.0.1) on the part's port
(``ADPIPE_STREAM_METRICS_PORT`` 9461, ``ADPIPE_BUDGET_METRICS_PORT`` 9462,
``ADPIPE_LOAD_METRICS_PORT`` 9463; 0: not served), once per process. A port
already taken (a second instance of the part on the host) is a warning: the
part runs on without an endpoint. Metrics never stop the pipeline.

- The stream job and the budget service run for days: their counters count
  from the process start (Prometheus' ``rate``/``increase`` take restarts in
  their stride). The stream job counts committed micro-batches only: a
  replayed batch found already committed counts in
  ``adpipe_stream_batches_total{outcome="skipped"}`` alone, its records were
  counted by the process that committed them.
- Consumer lag: the stream job's is read from the broker when scraped (the
  raw topic's read_committed end offsets less the offsets after the last
  committed batch); the budget service's from its consumer's cached high
  watermarks after each poll (no broker call), 0 for a partition it has read
  to the end (the offsets left are transaction markers).
- A load is a batch job, often gone before a scrape. Its values are those of
  the last step the process ran (gauges), served while it runs and, after
  each step, written to ``$ADPIPE_HOME/metrics/adpipe_load_<step>.prom`` for
  node_exporter's textfile collector (no Pushgateway): each step's file
  stays until that step runs again, whichever process ran it (``adpipe
  load``, a spark-submitted step, an Airflow task).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    start_http_server,
    write_to_textfile,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

from adpipe.settings import Settings

log = logging.getLogger(__name__)

# The parts that serve metrics, and the steps of a load.
STREAM, BUDGET, LOAD = "stream", "budget", "load"
LOAD_STEPS = ("stage", "audit", "publish")

# A micro-batch takes from a fraction of a second to a few minutes
# (docs/performance.md); a budget transaction milliseconds to seconds.
STREAM_BUCKETS_S = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300)
BUDGET_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
# A scrape waits this long at most for the raw topic's end offsets.
LAG_TIMEOUT_S = 5.0

# Each counter is one series, ``<name>_total``, without a ``_created`` twin.
disable_created_metrics()


def _process_registry() -> CollectorRegistry:
    """A registry with this process's CPU, memory and Python version."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry


class StreamMetrics:
    """The stream job's (adpipe.stream.job.BatchHandler records them)."""

    LAG = "adpipe_stream_consumer_lag_offsets"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # Per raw-topic partition, the offset after the last committed batch;
        # None until the job knows it (restored from the checkpoint at start).
        self.committed: dict[int, int] | None = None
        self.registry = r = _process_registry()
        self.info = Info("adpipe_stream", "The stream job this process runs", registry=r)
        self.batches = Counter(
            "adpipe_stream_batches",
            "Micro-batches handled: committed, or skipped (a replay of a batch committed before)",
            ["outcome"],
            registry=r,
        )
        self.events_in = Counter(
            "adpipe_stream_events_in", "Raw records (input offsets) of the batches committed", registry=r
        )
        self.windows_out = Counter(
            "adpipe_stream_windows_out", "Minute aggregates written: one per closed (ad_id, window_start)", registry=r
        )
        self.late = Counter("adpipe_stream_late_events", "Late events written to the late topic", registry=r)
        self.late_repeats = Counter(
            "adpipe_stream_late_repeats_skipped",
            "Late rows not listed: an event already counted or listed",
            registry=r,
        )
        self.dlq = Counter("adpipe_stream_dlq_events", "Malformed records written to the DLQ", registry=r)
        self.batch_seconds = Histogram(
            "adpipe_stream_batch_duration_seconds",
            "A micro-batch, from its query to its committed transaction",
            buckets=STREAM_BUCKETS_S,
            registry=r,
        )
        self.transaction_seconds = Histogram(
            "adpipe_stream_transaction_duration_seconds",
            "A micro-batch's Kafka transaction: produce, offsets, commit",
            buckets=STREAM_BUCKETS_S,
            registry=r,
        )
        self.last_batch = Gauge(
            "adpipe_stream_last_committed_batch", "Id of the last micro-batch committed (-1: none)", registry=r
        )
        self.last_batch_at = Gauge(
            "adpipe_stream_last_batch_timestamp_seconds", "When this process last finished a micro-batch", registry=r
        )
        self.watermark = Gauge(
            "adpipe_stream_watermark_timestamp_seconds", "Event-time watermark of the last batch", registry=r
        )
        self.committed_offset = Gauge(
            "adpipe_stream_committed_offset",
            "Per raw-topic partition: the offset after the last committed batch's input",
            ["partition"],
            registry=r,
        )
        self.last_batch.set(-1)
        r.register(_StreamLag(self))
        self.configure(settings)

    def configure(self, settings: Settings) -> None:
        self.settings = settings
        self.info.info(
            {"job_id": settings.job_id, "events_topic": settings.topics.events,
             "aggregates_topic": settings.topics.aggregates}
        )

    def restored(self, checkpointed: tuple[int, Mapping[int, int], int] | None) -> None:
        """Where the checkpoint stands at start: (last committed batch, its end
        offsets, its watermark), or None for a new checkpoint."""
        if checkpointed is None:
            self._offsets({})
            return
        batch_id, end, watermark_ms = checkpointed
        self.last_batch.set(batch_id)
        self.watermark.set(watermark_ms / 1000)
        self._offsets(end)

    def batch_done(
        self,
        batch_id: int,
        *,
        skipped: bool,
        input_offsets: int,
        windows: int,
        dlq: int,
        late: int,
        late_repeats: int,
        end_offsets: Mapping[int, int],
        watermark_ms: int,
        transaction_s: float,
        batch_s: float,
    ) -> None:
        """One micro-batch handled (committed now, or ``skipped``)."""
        self.batches.labels("skipped" if skipped else "committed").inc()
        if not skipped:
            self.events_in.inc(input_offsets)
            self.windows_out.inc(windows)
            self.dlq.inc(dlq)
            self.late.inc(late)
            self.late_repeats.inc(late_repeats)
            self.batch_seconds.observe(batch_s)
            self.transaction_seconds.observe(transaction_s)
        self.last_batch.set(batch_id)
        self.last_batch_at.set(time.time())
        self.watermark.set(watermark_ms / 1000)
        self._offsets(end_offsets)

    def _offsets(self, end: Mapping[int, int]) -> None:
        self.committed = {**(self.committed or {}), **end}
        for p, offset in self.committed.items():
            self.committed_offset.labels(str(p)).set(offset)


class _StreamLag:
    """Scrape-time lag of the stream job: per partition of the raw topic,
    its read_committed end offset less the offset after the last committed
    batch (a partition no batch read yet: from 0). Nothing when the broker
    does not answer within LAG_TIMEOUT_S (a warning in the log)."""

    def __init__(self, metrics: StreamMetrics) -> None:
        self.metrics = metrics

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            StreamMetrics.LAG, "Per raw-topic partition: offsets not yet committed by the stream job",
            labels=["partition"],
        )

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterator[Metric]:
        from adpipe import kafka_io

        family = self._family()
        committed = self.metrics.committed
        if committed is not None:
            settings = self.metrics.settings
            try:
                ends = kafka_io.end_offsets(settings.kafka, settings.topics.events, timeout_s=LAG_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - a scrape without lag, never a failed scrape
                log.warning("metrics: the raw topic's end offsets are not available (%s): no lag this scrape", exc)
                ends = {}
            for p, end in sorted(ends.items()):
                family.add_metric([str(p)], max(0, end - committed.get(p, 0)))
        yield family


class BudgetBatch(Protocol):
    """What the budget service's batch result (adpipe.budget.batch.BatchResult) says."""

    records: int
    applied: int
    duplicates: int
    already_applied: int
    malformed: int
    rejected: int
    conflicts: int
    superseded: int
    revised: int
    spend_added_micros: int

    @property
    def paused(self) -> list[tuple[str, str]]: ...

    @property
    def transitions(self) -> list[Any]: ...


class WatermarkSource(Protocol):
    """A confluent-kafka consumer, for its cached high watermarks."""

    def get_watermark_offsets(self, partition: Any, timeout: float | None = ..., cached: bool = ...) -> Any: ...


class BudgetMetrics:
    """The budget service's (adpipe.budget.stats.ServiceStats records them)."""

    def __init__(self, settings: Settings) -> None:
        self.registry = r = _process_registry()
        self.info = Info("adpipe_budget", "The budget service instance this process runs", registry=r)
        self.batches = Counter("adpipe_budget_batches", "Batches applied (one database transaction each)", registry=r)
        self.records = Counter("adpipe_budget_records", "Aggregates read from the aggregates topic", registry=r)
        self.applied = Counter("adpipe_budget_applied", "Aggregates charged: new ledger rows", registry=r)
        self.duplicates = Counter(
            "adpipe_budget_duplicates", "Aggregates skipped: a record_uuid charged before, same counts", registry=r
        )
        self.already_applied = Counter(
            "adpipe_budget_already_applied", "Records below the database offset (read again): skipped", registry=r
        )
        self.superseded = Counter(
            "adpipe_budget_superseded",
            "Aggregates skipped: their window's revision charged is at or above theirs (a replay, an older revision)",
            registry=r,
        )
        self.revised = Counter(
            "adpipe_budget_revised",
            "Aggregates charged as a revision: the difference from their window's revision charged before",
            registry=r,
        )
        self.quarantined = Counter(
            "adpipe_budget_quarantined", "Aggregates quarantined, by reason", ["reason"], registry=r
        )
        self.spend = Counter(
            "adpipe_budget_spend_micros", "Spend charged, in micro-units of the currency", registry=r
        )
        self.paused = Counter("adpipe_budget_ads_paused", "Ads paused (spend reached budget)", registry=r)
        self.resumed = Counter("adpipe_budget_ads_resumed", "Ads resumed (budget raised)", registry=r)
        self.transaction_seconds = Histogram(
            "adpipe_budget_transaction_duration_seconds",
            "A batch: its database transaction(s) and Kafka offset commit",
            buckets=BUDGET_BUCKETS_S,
            registry=r,
        )
        self.last_batch_at = Gauge(
            "adpipe_budget_last_batch_timestamp_seconds", "When this process last applied a batch", registry=r
        )
        self.committed_offset = Gauge(
            "adpipe_budget_committed_offset",
            "Per assigned aggregates partition: the database offset (the next record to charge)",
            ["partition"],
            registry=r,
        )
        self.lag = Gauge(
            "adpipe_budget_consumer_lag_offsets",
            "Per assigned aggregates partition: offsets after the database offset (0 when read to the end)",
            ["partition"],
            registry=r,
        )
        self.assigned = Gauge("adpipe_budget_assigned_partitions", "Partitions assigned to this instance", registry=r)
        self._partitions: set[str] = set()
        self.configure(settings)

    def configure(self, settings: Settings) -> None:
        self.info.info({"group": settings.budget_group, "topic": settings.topics.aggregates})

    def batch_applied(self, result: BudgetBatch, seconds: float) -> None:
        self.batches.inc()
        self.records.inc(result.records)
        self.applied.inc(result.applied)
        self.duplicates.inc(result.duplicates)
        self.already_applied.inc(result.already_applied)
        self.superseded.inc(result.superseded)
        self.revised.inc(result.revised)
        for reason, n in (("malformed", result.malformed), ("rejected", result.rejected),
                          ("conflict", result.conflicts)):
            self.quarantined.labels(reason).inc(n)
        self.spend.inc(result.spend_added_micros)
        self.paused.inc(len(result.paused))
        self.resumed.inc(len(result.transitions) - len(result.paused))
        self.transaction_seconds.observe(seconds)
        self.last_batch_at.set(time.time())

    def positions(
        self, consumer: WatermarkSource, topic: str, positions: Mapping[int, int | None], drained: set[int]
    ) -> None:
        """The assigned partitions' database offsets and lag (``positions``:
        partition -> database offset, None = from the beginning)."""
        from confluent_kafka import KafkaException, TopicPartition

        current = set()
        for p, offset in sorted(positions.items()):
            label = str(p)
            if p in drained:
                lag = 0
            else:
                try:
                    low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), cached=True)
                except KafkaException:
                    continue
                if high < 0:  # nothing fetched from it yet
                    continue
                lag = max(0, high - (low if offset is None else offset))
            current.add(label)
            self.lag.labels(label).set(lag)
            if offset is not None:
                self.committed_offset.labels(label).set(offset)
        for label in self._partitions - current:  # revoked, or not positioned now
            for gauge in (self.lag, self.committed_offset):
                try:
                    gauge.remove(label)
                except KeyError:
                    pass
        self._partitions = current
        self.assigned.set(len(positions))


class _LoadStep:
    """What each load step records, in a registry of the step's own (its textfile)."""

    def __init__(self, step: str) -> None:
        self.step = step
        self.registry = r = CollectorRegistry()
        self.run_id = Gauge(f"adpipe_load_{step}_run_id", f"Ledger run id of the last {step} (0: none yet)", registry=r)
        self.seconds = Gauge(f"adpipe_load_{step}_duration_seconds", f"How long the last {step} took", registry=r)
        self.finished_at = Gauge(
            f"adpipe_load_{step}_last_success_timestamp_seconds", f"When the last {step} finished", registry=r
        )


class LoadMetrics:
    """Union & Load's (adpipe.lakehouse.load's steps record them)."""

    def __init__(self) -> None:
        self.steps = {step: _LoadStep(step) for step in LOAD_STEPS}
        stage, audit, publish = (self.steps[s].registry for s in LOAD_STEPS)
        self.rows_staged = Gauge(
            "adpipe_load_rows_staged", "Rows the last stage wrote to staging, per table", ["table"], registry=stage
        )
        self.lost = Gauge(
            "adpipe_load_records_lost_to_retention",
            "Records the last stage found deleted by retention before any load read them",
            registry=stage,
        )
        self.gate = Gauge(
            "adpipe_load_gate_passed", "Per hour the last audit checked: 1 passed, 0 failed", ["hour"], registry=audit
        )
        self.rows_published = Gauge(
            "adpipe_load_rows_published", "Rows the last publish inserted, per table", ["table"], registry=publish
        )
        self.corrections = Gauge(
            "adpipe_load_late_corrections",
            "Rows the last publish inserted into hours published before",
            registry=publish,
        )
        self.registry = _process_registry()
        for step in self.steps.values():
            self.registry.register(step.registry)  # type: ignore[arg-type] - a registry is a collector

    def staged(self, settings: Settings, run_id: int, rows: Mapping[str, int], lost: int, seconds: float) -> None:
        self.rows_staged.clear()
        for table, n in rows.items():
            self.rows_staged.labels(table).set(n)
        self.lost.set(lost)
        self._finished(settings, "stage", run_id, seconds)

    def audited(self, settings: Settings, run_id: int, gates: Iterable[tuple[str, bool]], seconds: float) -> None:
        self.gate.clear()
        for hour, passed in gates:
            self.gate.labels(hour).set(1 if passed else 0)
        self._finished(settings, "audit", run_id, seconds)

    def published(
        self, settings: Settings, run_id: int, rows: Mapping[str, int], corrections: int, seconds: float
    ) -> None:
        self.rows_published.clear()
        for table, n in rows.items():
            self.rows_published.labels(table).set(n)
        self.corrections.set(corrections)
        self._finished(settings, "publish", run_id, seconds)

    def _finished(self, settings: Settings, step: str, run_id: int, seconds: float) -> None:
        metrics = self.steps[step]
        metrics.run_id.set(run_id)
        metrics.seconds.set(seconds)
        metrics.finished_at.set(time.time())
        path = textfile(settings, step)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_to_textfile(str(path), metrics.registry)
        except OSError as exc:
            log.warning("metrics: cannot write %s: %s", path, exc)


def textfile(settings: Settings, step: str) -> Path:
    """The node_exporter textfile of a load step."""
    return settings.metrics_dir / f"adpipe_load_{step}.prom"


# ------------------------------------------------------------------ per process

_lock = threading.Lock()
_parts: dict[str, Any] = {}
_served: dict[str, tuple[str, int]] = {}
_retrying: set[str] = set()  # parts whose taken port is tried again in the background


def stream(settings: Settings) -> StreamMetrics:
    """This process's stream job metrics."""
    with _lock:
        metrics = _parts.get(STREAM)
        if metrics is None:
            metrics = _parts[STREAM] = StreamMetrics(settings)
        else:
            metrics.configure(settings)
        return metrics


def budget(settings: Settings) -> BudgetMetrics:
    """This process's budget service metrics."""
    with _lock:
        metrics = _parts.get(BUDGET)
        if metrics is None:
            metrics = _parts[BUDGET] = BudgetMetrics(settings)
        else:
            metrics.configure(settings)
        return metrics


def load() -> LoadMetrics:
    """This process's Union & Load metrics."""
    with _lock:
        metrics = _parts.get(LOAD)
        if metrics is None:
            metrics = _parts[LOAD] = LoadMetrics()
        return metrics


def port_of(settings: Settings, part: str) -> int:
    return {STREAM: settings.stream_metrics_port, BUDGET: settings.budget_metrics_port,
            LOAD: settings.load_metrics_port}[part]


# A part whose port is taken tries it again this often, in the background.
SERVE_RETRY_S = 5.0


def serve(part: str, settings: Settings) -> str | None:
    """Serve ``part``'s registry at ``http://<host>:<port>/metrics``, once per
    process; the address, or None when not served (port 0, or taken). A
    taken port is tried again in the background (a stream driver that took
    over from a paused one: the paused process holds the port until it
    ends), and served once it comes free."""
    registry = {STREAM: lambda: stream(settings), BUDGET: lambda: budget(settings), LOAD: load}[part]().registry
    host, port = settings.metrics_host, port_of(settings, part)
    with _lock:
        if part in _served:
            host, port = _served[part]
            return f"http://{host}:{port}/metrics"
        if not port or part in _retrying:
            return None
        try:
            start_http_server(port, host, registry)
        except OSError as exc:
            log.warning(
                "metrics: the %s cannot serve on %s:%d (%s); it runs without /metrics and tries again every "
                "%.0f s (another instance on this host? give it ADPIPE_%s_METRICS_PORT)",
                part, host, port, exc.strerror or exc, SERVE_RETRY_S, part.upper(),
            )
            _retrying.add(part)
            threading.Thread(target=_serve_later, args=(part, host, port, registry), name=f"metrics-{part}",
                             daemon=True).start()
            return None
        _served[part] = (host, port)
    address = f"http://{host}:{port}/metrics"
    log.info("metrics: %s", address)
    return address


def _serve_later(part: str, host: str, port: int, registry: CollectorRegistry) -> None:
    while True:
        time.sleep(SERVE_RETRY_S)
        try:
            start_http_server(port, host, registry)
        except OSError:
            continue
        with _lock:
            _served[part] = (host, port)
            _retrying.discard(part)
        log.info("metrics: http://%s:%d/metrics (the port came free)", host, port)
        return
