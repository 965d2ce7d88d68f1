"""adpipe.metrics: what each part records, where it is served, the load's
textfiles, the settings, and the Grafana dashboard's queries (every metric
name in deploy/grafana/adpipe.json exists, every adpipe metric is on it)."""

from __future__ import annotations

import json
import re
import socket
import time
import urllib.request
from pathlib import Path

import pytest
from adpipe import kafka_io, metrics
from adpipe.budget import status
from adpipe.budget.batch import BatchResult
from adpipe.settings import PROJECT_ROOT, SettingsError, load_settings
from confluent_kafka import TopicPartition
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = PROJECT_ROOT / "deploy" / "grafana" / "adpipe.json"
AIRFLOW_PACKAGE = Path(__import__("airflow").__file__).parent


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value for family in registry.collect() for s in family.samples
    }


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return samples(registry).get((name, tuple(sorted(labels.items()))))


@pytest.fixture(autouse=True)
def no_broker(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scrape of the stream's metrics reads the raw topic's end offsets:
    none here, unless a test says otherwise."""
    monkeypatch.setattr(kafka_io, "end_offsets", lambda *_args, **_kwargs: {})


@pytest.fixture
def settings(tmp_path: Path):  # noqa: ANN201
    return load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_KAFKA_BOOTSTRAP": "127.0.0.1:9"})


# ------------------------------------------------------------------ settings


def test_each_part_has_its_own_port_by_default_and_0_turns_one_off() -> None:
    default = load_settings({})
    ports = [metrics.port_of(default, part) for part in (metrics.STREAM, metrics.BUDGET, metrics.LOAD)]
    assert len(set(ports)) == 3 and all(ports)
    assert default.metrics_host == "127.0.0.1"
    assert default.airflow_statsd == "127.0.0.1:9125"
    custom = load_settings({"ADPIPE_STREAM_METRICS_PORT": "0", "ADPIPE_BUDGET_METRICS_PORT": "19462",
                            "ADPIPE_METRICS_HOST": "0.0.0.0", "ADPIPE_AIRFLOW_STATSD": "off"})  # noqa: S104
    assert (custom.stream_metrics_port, custom.budget_metrics_port, custom.metrics_host) == (0, 19462, "0.0.0.0")  # noqa: S104
    assert custom.airflow_statsd == ""


@pytest.mark.parametrize(
    "env",
    [{"ADPIPE_LOAD_METRICS_PORT": "70000"}, {"ADPIPE_BUDGET_METRICS_PORT": "-1"},
     {"ADPIPE_STREAM_METRICS_PORT": "http"}, {"ADPIPE_AIRFLOW_STATSD": "localhost"}],
)
def test_a_bad_metrics_setting_is_refused(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        load_settings(env)


# ------------------------------------------------------------------ stream


def test_stream_counts_committed_batches_and_a_skipped_replay_only_as_skipped(settings) -> None:  # noqa: ANN001
    m = metrics.StreamMetrics(settings)
    m.restored((6, {0: 100, 1: 90}, 1_795_000_000_000))
    assert value(m.registry, "adpipe_stream_last_committed_batch") == 6
    common = {"end_offsets": {0: 150, 1: 90}, "watermark_ms": 1_795_000_060_000, "transaction_s": 0.5, "batch_s": 2.0}
    m.batch_done(7, skipped=True, input_offsets=50, windows=9, dlq=1, late=2, late_repeats=0, **common)
    m.batch_done(8, skipped=False, input_offsets=40, windows=5, dlq=3, late=4, late_repeats=1,
                 **{**common, "end_offsets": {0: 170, 1: 110}})
    r = m.registry
    assert value(r, "adpipe_stream_batches_total", outcome="skipped") == 1
    assert value(r, "adpipe_stream_batches_total", outcome="committed") == 1
    assert [value(r, f"adpipe_stream_{n}_total") for n in
            ("events_in", "windows_out", "dlq_events", "late_events", "late_repeats_skipped")] == [40, 5, 3, 4, 1]
    assert value(r, "adpipe_stream_batch_duration_seconds_count") == 1
    assert value(r, "adpipe_stream_transaction_duration_seconds_sum") == 0.5
    assert value(r, "adpipe_stream_last_committed_batch") == 8
    assert value(r, "adpipe_stream_watermark_timestamp_seconds") == 1_795_000_060
    assert value(r, "adpipe_stream_committed_offset", partition="1") == 110


def test_stream_lag_is_the_end_offset_less_the_committed_one_per_partition(settings, monkeypatch) -> None:  # noqa: ANN001
    asked = []

    def end_offsets(kafka, topic, isolation="read_committed", timeout_s=30.0):  # noqa: ANN001, ANN202
        asked.append((topic, isolation, timeout_s))
        return {0: 120, 1: 90, 2: 5}

    monkeypatch.setattr(kafka_io, "end_offsets", end_offsets)
    m = metrics.StreamMetrics(settings)
    assert value(m.registry, metrics.StreamMetrics.LAG, partition="0") is None  # unknown before the checkpoint is read
    m.restored((3, {0: 100, 1: 90}, 0))
    lag = {p: value(m.registry, metrics.StreamMetrics.LAG, partition=p) for p in ("0", "1", "2")}
    assert lag == {"0": 20, "1": 0, "2": 5}  # partition 2: no batch read it yet
    assert asked[-1] == (settings.topics.events, "read_committed", metrics.LAG_TIMEOUT_S)


def test_stream_lag_without_a_broker_is_a_scrape_without_lag(settings, monkeypatch, caplog) -> None:  # noqa: ANN001
    def refused(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
        raise RuntimeError("no broker")

    monkeypatch.setattr(kafka_io, "end_offsets", refused)
    m = metrics.StreamMetrics(settings)
    m.restored(None)
    names = {name for name, _labels in samples(m.registry)}
    assert metrics.StreamMetrics.LAG not in names and "adpipe_stream_events_in_total" in names
    assert "no lag this scrape" in caplog.text


# ------------------------------------------------------------------ budget


def transition(state: str) -> status.Transition:
    return status.Transition("ad-1", "2026-11-22", 1, state, "spend", 0, None)


class Watermarks:
    def __init__(self, marks: dict[int, tuple[int, int]]) -> None:
        self.marks = marks

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float | None = None, cached: bool = False):  # noqa: ANN201
        assert cached, "the budget loop must not call the broker for its lag"
        return self.marks[tp.partition]


def test_budget_counts_each_batch_and_its_spend(settings) -> None:  # noqa: ANN001
    m = metrics.BudgetMetrics(settings)
    m.batch_applied(BatchResult(records=10, applied=7, duplicates=1, already_applied=1, malformed=1,
                                spend_added_micros=2_500_000,
                                transitions=[transition(status.PAUSED), transition(status.ACTIVE)]), 0.02)
    m.batch_applied(BatchResult(records=3, applied=2, conflicts=1, spend_added_micros=500_000), 0.01)
    r = m.registry
    assert [value(r, f"adpipe_budget_{n}_total") for n in
            ("batches", "records", "applied", "duplicates", "already_applied", "spend_micros", "ads_paused",
             "ads_resumed")] == [2, 13, 9, 1, 1, 3_000_000, 1, 1]
    assert value(r, "adpipe_budget_quarantined_total", reason="malformed") == 1
    assert value(r, "adpipe_budget_quarantined_total", reason="conflict") == 1
    assert value(r, "adpipe_budget_transaction_duration_seconds_count") == 2


def test_budget_lag_per_partition_from_cached_watermarks(settings) -> None:  # noqa: ANN001
    m = metrics.BudgetMetrics(settings)
    consumer = Watermarks({0: (0, 50), 1: (10, 40), 2: (0, 99), 3: (-1, -1)})
    # 0: read to 20; 1: from the beginning (log start 10); 2: at its end; 3: nothing fetched yet
    m.positions(consumer, "aggs", {0: 20, 1: None, 2: 97, 3: 0}, drained={2})
    r = m.registry
    lag = {p: value(r, "adpipe_budget_consumer_lag_offsets", partition=p) for p in "0123"}
    assert lag == {"0": 30, "1": 30, "2": 0, "3": None}
    assert value(r, "adpipe_budget_committed_offset", partition="2") == 97
    assert value(r, "adpipe_budget_assigned_partitions") == 4
    m.positions(consumer, "aggs", {0: 50}, drained={0})  # 1, 2, 3 revoked
    assert value(r, "adpipe_budget_consumer_lag_offsets", partition="2") is None
    assert value(r, "adpipe_budget_committed_offset", partition="2") is None
    assert value(r, "adpipe_budget_consumer_lag_offsets", partition="0") == 0


# ------------------------------------------------------------------ load


def test_each_load_step_writes_its_own_textfile(settings) -> None:  # noqa: ANN001
    m = metrics.LoadMetrics()
    m.staged(settings, 4, {"ads.ad_events_raw": 10, "ads.ad_minute_aggregates": 3}, 2, 12.5)
    m.audited(settings, 4, [("2026-11-22T12", True), ("2026-11-22T13", False)], 3.0)
    m.published(settings, 5, {"ads.ad_events_raw": 8}, 1, 4.0)
    m.staged(settings, 6, {"ads.ad_events_raw": 1}, 0, 1.0)  # a later run replaces the tables

    def parsed(step: str) -> dict[tuple[str, tuple], float]:
        text = metrics.textfile(settings, step).read_text()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in text_string_to_metric_families(text) for s in f.samples}

    stage, audit, publish = parsed("stage"), parsed("audit"), parsed("publish")
    assert stage[("adpipe_load_rows_staged", (("table", "ads.ad_events_raw"),))] == 1
    assert ("adpipe_load_rows_staged", (("table", "ads.ad_minute_aggregates"),)) not in stage
    assert stage[("adpipe_load_stage_run_id", ())] == 6
    assert audit[("adpipe_load_gate_passed", (("hour", "2026-11-22T13"),))] == 0
    assert audit[("adpipe_load_audit_duration_seconds", ())] == 3.0
    assert publish[("adpipe_load_rows_published", (("table", "ads.ad_events_raw"),))] == 8
    assert publish[("adpipe_load_late_corrections", ())] == 1
    # A step's file holds its own metrics only: node_exporter merges the three.
    assert not {name for name, _ in stage} & {name for name, _ in publish}
    # The endpoint shows all three steps.
    assert value(m.registry, "adpipe_load_publish_run_id") == 5 and value(m.registry, "adpipe_load_stage_run_id") == 6


# ------------------------------------------------------------------ serving


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_once_per_process_on_the_parts_port_and_a_taken_port_is_only_a_warning(
    tmp_path: Path, monkeypatch, caplog  # noqa: ANN001
) -> None:
    monkeypatch.setattr(metrics, "_parts", {})
    monkeypatch.setattr(metrics, "_served", {})
    port = _free_port()
    env = {"ADPIPE_HOME": str(tmp_path), "ADPIPE_LOAD_METRICS_PORT": str(port), "ADPIPE_BUDGET_METRICS_PORT": "0"}
    settings = load_settings(env)
    address = metrics.serve(metrics.LOAD, settings)
    assert address == f"http://127.0.0.1:{port}/metrics"
    assert metrics.serve(metrics.LOAD, settings) == address  # once per process
    metrics.load().staged(settings, 9, {"ads.t": 3}, 0, 1.0)
    with urllib.request.urlopen(address, timeout=10) as response:  # noqa: S310
        body = response.read().decode()
    assert 'adpipe_load_rows_staged{table="ads.t"} 3.0' in body and "process_resident_memory_bytes" in body
    assert metrics.serve(metrics.BUDGET, settings) is None  # port 0: not served
    # The stream's port is the load's: taken. The job runs on, without it.
    taken = load_settings({**env, "ADPIPE_STREAM_METRICS_PORT": str(port)})
    assert metrics.serve(metrics.STREAM, taken) is None
    assert "runs without /metrics" in caplog.text


def test_a_taken_port_is_served_once_it_comes_free(tmp_path: Path, monkeypatch, caplog) -> None:  # noqa: ANN001
    """A driver that took over from a paused one: the paused process holds
    the port until it ends; then the new driver serves it."""
    monkeypatch.setattr(metrics, "_parts", {})
    monkeypatch.setattr(metrics, "_served", {})
    monkeypatch.setattr(metrics, "_retrying", set())
    monkeypatch.setattr(metrics, "SERVE_RETRY_S", 0.1)
    caplog.set_level("INFO", logger="adpipe.metrics")
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    settings = load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_STREAM_METRICS_PORT": str(port)})
    try:
        assert metrics.serve(metrics.STREAM, settings) is None
        assert metrics.serve(metrics.STREAM, settings) is None  # one retrying thread, not two
        time.sleep(0.3)
        assert metrics.STREAM not in metrics._served  # still taken
    finally:
        holder.close()
    deadline = time.monotonic() + 10
    while metrics.STREAM not in metrics._served and time.monotonic() < deadline:
        time.sleep(0.05)
    address = f"http://127.0.0.1:{port}/metrics"
    assert metrics.serve(metrics.STREAM, settings) == address and "the port came free" in caplog.text
    with urllib.request.urlopen(address, timeout=10) as response:  # noqa: S310
        assert "adpipe_stream_events_in" in response.read().decode()


# ------------------------------------------------------------------ the dashboard

# Airflow's StatsD names as statsd_exporter's default mapping exposes them
# ("." -> "_"), with the name Airflow's code emits.
AIRFLOW_METRICS = {
    "airflow_scheduler_heartbeat": "scheduler_heartbeat",
    "airflow_dagbag_size": "dagbag_size",
    "airflow_dag_processing_import_errors": "dag_processing.import_errors",
    "airflow_ti_successes": "ti_successes",
    "airflow_ti_failures": "ti_failures",
    "airflow_executor_running_tasks": "executor.running_tasks",
    "airflow_executor_open_slots": "executor.open_slots",
}
_NAME = re.compile(r"\b((?:adpipe|process|python|airflow)_[a-zA-Z0-9_]*)")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "info": ("_info",)}


def exposed_names(registry: CollectorRegistry) -> dict[str, str]:
    """Every series name a registry can expose -> its family's name (a
    labelled family without children yet included)."""
    names = {}
    for family in registry.collect():
        for suffix in _SUFFIXES.get(family.type, ("",)):
            names[family.name + suffix] = family.name
    return names


def dashboard_queries() -> list[str]:
    def walk(panels: list[dict]) -> list[str]:
        found = []
        for panel in panels:
            found += [t["expr"] for t in panel.get("targets", [])]
            found += walk(panel.get("panels", []))
        return found

    return walk(json.loads(DASHBOARD.read_text())["panels"])


def test_every_metric_the_dashboard_queries_exists_and_every_adpipe_metric_is_on_it(settings) -> None:  # noqa: ANN001
    exposed: dict[str, str] = {}
    for registry in (metrics.StreamMetrics(settings).registry, metrics.BudgetMetrics(settings).registry,
                     metrics.LoadMetrics().registry):
        exposed.update(exposed_names(registry))
    queried = {name for expr in dashboard_queries() for name in _NAME.findall(expr)}
    unknown = sorted(n for n in queried if n not in exposed and n not in AIRFLOW_METRICS)
    assert unknown == [], f"the dashboard queries metrics nobody exposes: {unknown}"
    families = {exposed[n] for n in queried if n in exposed}
    unshown = sorted(f for f in set(exposed.values()) if f.startswith("adpipe_") and f not in families)
    assert unshown == [], f"adpipe metrics no panel shows: {unshown}"
    assert queried >= set(AIRFLOW_METRICS), "an Airflow metric listed here is on no panel"


def test_the_dashboards_airflow_metrics_are_names_airflow_emits() -> None:
    missing = {exposed: emitted for exposed, emitted in AIRFLOW_METRICS.items()}
    for exposed, emitted in AIRFLOW_METRICS.items():
        assert exposed == "airflow_" + emitted.replace(".", "_")
    for path in AIRFLOW_PACKAGE.rglob("*.py"):
        text = path.read_text(errors="replace")
        missing = {k: v for k, v in missing.items() if f'"{v}"' not in text}
        if not missing:
            break
    assert missing == {}, f"Airflow ({AIRFLOW_PACKAGE}) never emits these"
