"""The /metrics endpoints of a real run, scraped with plain HTTP GETs while
the parts run: the stream job and the budget service side by side on a real
broker and PostgreSQL, then Union & Load of the hour (its endpoint while it
runs, its textfiles after). Every number is checked against what was
produced (the producer's own summary), what Kafka holds, Spark's checkpoint
and the budget database, never against the code under test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
from adpipe import kafka_io, metrics
from adpipe import pg as pg_client
from adpipe.faults import wait_group_gone
from adpipe.lakehouse import tables as T
from adpipe.settings import Settings
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import PORT_BASE
from tests.integration.helpers import NO_REVISIONS, closed_watermark_ms, expected_windows, make_pipeline, window_end_ms

STREAM_PORT, BUDGET_PORT, LOAD_PORT = PORT_BASE + 73, PORT_BASE + 74, PORT_BASE + 75
HOUR = "2026-11-22T12"
# 12:55-12:59 on time (duplicates, malformed); then 13:00-13:02 with late
# events timed 12:55-12:58 sent last: the hour closes, the late ones are late.
FIRST = {"events": 1200, "seed": 1601, "ads": 10, "ad_offset": 1600, "minutes": 4,
         "start": datetime(2026, 11, 22, 12, 55, tzinfo=UTC), "duplicate_rate": 0.05, "malformed_rate": 0.03}
SECOND = {"events": 300, "seed": 1602, "ads": 10, "ad_offset": 1600, "minutes": 2,
          "start": datetime(2026, 11, 22, 13, 0, tzinfo=UTC), "late_rate": 0.1, "late_by_minutes": 3}
# The budget service's default prices (micro-units): an empty pricing table is seeded with them.
CPM_MICROS, CPC_MICROS = 2_000_000, 500_000

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(port: int) -> Samples | None:
    """One GET of /metrics, parsed; None when nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:  # noqa: S310
            text = response.read().decode()
    except (urllib.error.URLError, OSError):
        return None
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def get(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def by_partition(samples: Samples, name: str) -> dict[int, float]:
    return {int(dict(labels)["partition"]): v for (n, labels), v in samples.items() if n == name}


def wait_for(what: str, port: int, done, timeout_s: float, procs: list[subprocess.Popen]) -> Samples:  # noqa: ANN001
    """Scrape every half second until ``done(samples)``; fail if a process died."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        for proc in procs:
            assert proc.poll() is None, f"{proc.args} exited {proc.returncode} while waiting for {what}"
        last = scrape(port)
        if last is not None and done(last):
            return last
        time.sleep(0.5)
    ours = {str(k): v for k, v in (last or {}).items() if k[0].startswith("adpipe")}
    pytest.fail(f"{what}: not within {timeout_s:.0f} s; last scrape: {json.dumps(ours)[:3000]}")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the adpipe process (its Spark JVM, in its group, is its to
    stop); SIGKILL to the group if it is still there after 90 s."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wait_group_gone(proc.pid)


def adpipe(env: dict[str, str], log_path: Path, *args: str) -> subprocess.Popen:
    with log_path.open("w") as log:
        return subprocess.Popen(  # noqa: S603
            [sys.executable, "-m", "adpipe", *args], env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def committed_batches(settings: Settings) -> list[int]:
    """Spark's own commit log of the checkpoint."""
    return sorted(int(p.name) for p in (settings.checkpoint_dir / "commits").iterdir() if p.name.isdigit())


# About 2 minutes for the stream job and the budget service, 2 to 3 more for
# the load (a Spark application and a new metastore): make test-extended.
@pytest.mark.slow
@pytest.mark.extended
def test_stream_budget_and_load_metrics_match_what_was_produced(broker: Settings, pg: Settings, tmp_path: Path) -> None:
    name = f"m{uuid.uuid4().hex[:8]}"
    conn = pg_client.connect(pg, "postgres")
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    pipe = make_pipeline(tmp_path, {
        **NO_REVISIONS,
        # Tables, checkpoint and metastore of its own (the session's are shared).
        "ADPIPE_HOME": str(tmp_path / "home"),
        "ADPIPE_METASTORE_DATABASE": f"adpipe_ms_{name}",
        "ADPIPE_BUDGET_DB": pg.pg_url(name),
        "ADPIPE_BUDGET_GROUP": f"{name}-budget",
        "ADPIPE_STREAM_METRICS_PORT": str(STREAM_PORT),
        "ADPIPE_BUDGET_METRICS_PORT": str(BUDGET_PORT),
        "ADPIPE_LOAD_METRICS_PORT": str(LOAD_PORT),
        "ADPIPE_TRIGGER_INTERVAL_S": "1",
        "ADPIPE_MAX_OFFSETS_PER_TRIGGER": "300",  # a backlog of several batches: lag to see
        "ADPIPE_MAX_LATE_SHARE": "0.2",  # the scenario's late events, on purpose
    })
    settings, events = pipe.settings, pipe.settings.topics.events
    first = pipe.produce(**FIRST)
    ends = kafka_io.end_offsets(settings.kafka_bootstrap, events)
    assert sum(ends.values()) == first["messages"]

    stream = adpipe(pipe.env, tmp_path / "stream.log", "stream")
    budget = adpipe(pipe.env, tmp_path / "budget.log", "budget")
    procs = [stream, budget]
    try:
        # ---- the stream job: lag while it works through the backlog, then none
        lags: list[int] = []

        def first_done(s: Samples) -> bool:
            lag = by_partition(s, metrics.StreamMetrics.LAG)
            committed = by_partition(s, "adpipe_stream_committed_offset")
            if lag:
                assert set(lag) == set(ends)
                for p, end in ends.items():  # the lag is what the job has not committed (or less, a batch later)
                    assert 0 <= lag[p] <= end - committed.get(p, 0), (p, lag, committed, ends)
                lags.append(int(sum(lag.values())))
            return get(s, "adpipe_stream_events_in_total") == first["messages"]

        wait_for("the first batch of events", STREAM_PORT, first_done, 300, procs)
        assert lags and lags[0] == first["messages"], f"before the first batch the lag is the whole topic: {lags}"
        assert lags[-1] < lags[0]

        before = ends
        # In one transaction: the running job sees every partition's records at
        # once (helpers.Pipeline.produce), so no on-time event of the plan turns late.
        second = pipe.produce(atomic=True, **SECOND)
        ends = kafka_io.end_offsets(settings.kafka_bootstrap, events)
        produced = first["messages"] + second["messages"]
        # The commit marker takes an offset in each partition the transaction
        # wrote; the job's input counter counts offsets.
        offsets_in = produced + sum(1 for p in ends if ends[p] > before[p])
        assert sum(ends.values()) == offsets_in

        # The job may commit one more batch (no data, a later watermark) after the
        # last one with data: the scrape and the ledger and checkpoint read after
        # it must describe the same batch, or the test scrapes again.
        ledger: dict = {}

        def all_windows_out(s: Samples) -> bool:
            if get(s, "adpipe_stream_events_in_total") != offsets_in:
                return False
            ledger["watermark"], ledger["batches"] = closed_watermark_ms(pipe), committed_batches(settings)
            closed = [k for k in expected_windows(first, second) if window_end_ms(k[1]) <= ledger["watermark"]]
            return (
                get(s, "adpipe_stream_windows_out_total") == len(closed)
                and bool(ledger["batches"])
                and get(s, "adpipe_stream_last_committed_batch") == ledger["batches"][-1]
                and get(s, "adpipe_stream_watermark_timestamp_seconds") == ledger["watermark"] / 1000
            )

        s = wait_for("every closed window", STREAM_PORT, all_windows_out, 300, procs)
        watermark, batches = ledger["watermark"], ledger["batches"]
        expected = {k: v for k, v in expected_windows(first, second).items() if window_end_ms(k[1]) <= watermark}
        assert len(expected) > 40 and any(k[1].startswith("2026-11-22T13") for k in expected)
        assert get(s, "adpipe_stream_events_in_total") == offsets_in
        assert get(s, "adpipe_stream_windows_out_total") == len(expected)
        assert get(s, "adpipe_stream_dlq_events_total") == first["malformed"] + second["malformed"] > 0
        assert get(s, "adpipe_stream_late_events_total") == second["late"] == 30
        assert get(s, "adpipe_stream_batches_total", outcome="committed") == len(batches) > 4
        assert get(s, "adpipe_stream_batches_total", outcome="skipped") is None
        assert get(s, "adpipe_stream_last_committed_batch") == batches[-1]
        assert get(s, "adpipe_stream_batch_duration_seconds_count") == len(batches)
        assert get(s, "adpipe_stream_transaction_duration_seconds_count") == len(batches)
        assert 0 < get(s, "adpipe_stream_transaction_duration_seconds_sum") < get(  # type: ignore[operator]
            s, "adpipe_stream_batch_duration_seconds_sum")
        assert get(s, "adpipe_stream_watermark_timestamp_seconds") == watermark / 1000
        assert by_partition(s, "adpipe_stream_committed_offset") == ends
        assert by_partition(s, metrics.StreamMetrics.LAG) == dict.fromkeys(ends, 0)
        assert get(s, "adpipe_stream_info", job_id=settings.job_id, events_topic=events,
                   aggregates_topic=settings.topics.aggregates) == 1

        # ---- the budget service: every aggregate charged once, at the default prices
        aggregates = pipe.aggregates()
        assert len(aggregates) == len(expected)
        spend = sum(a["impressions"] * CPM_MICROS // 1000 + a["clicks"] * CPC_MICROS for a in aggregates)
        b = wait_for(
            "the budget service to charge every aggregate", BUDGET_PORT,
            lambda s: get(s, "adpipe_budget_applied_total") == len(aggregates)
            and set(by_partition(s, "adpipe_budget_consumer_lag_offsets").values()) == {0},
            120, procs,
        )
        assert get(b, "adpipe_budget_records_total") == len(aggregates)
        assert get(b, "adpipe_budget_spend_micros_total") == spend > 0
        assert get(b, "adpipe_budget_duplicates_total") == get(b, "adpipe_budget_already_applied_total") == 0
        assert {dict(k[1])["reason"]: v for k, v in b.items() if k[0] == "adpipe_budget_quarantined_total"} == {
            "malformed": 0, "rejected": 0, "conflict": 0}
        assert get(b, "adpipe_budget_transaction_duration_seconds_count") == get(b, "adpipe_budget_batches_total") > 0
        assert get(b, "adpipe_budget_assigned_partitions") == settings.topic_partitions
        conn = pg_client.connect(pg, name)
        with conn.cursor() as cur:
            cur.execute("SELECT kafka_partition, next_offset FROM budget_offsets WHERE group_id = %s",
                        (f"{name}-budget",))
            stored = dict(cur.fetchall())
        conn.close()
        assert by_partition(b, "adpipe_budget_committed_offset") == {p: o for p, o in stored.items()}
    finally:
        for proc in procs:
            stop(proc)
    assert stream.returncode == 0, (tmp_path / "stream.log").read_text()[-3000:]
    assert budget.returncode == 0, (tmp_path / "budget.log").read_text()[-3000:]

    # ---- Union & Load of hour 12: served while it runs, a textfile per step after
    load = adpipe(pipe.env, tmp_path / "load.log", "load", "--hour", HOUR)
    scrapes: list[Samples] = []
    try:
        while load.poll() is None:
            got = scrape(LOAD_PORT)
            if got is not None:
                scrapes.append(got)
            time.sleep(1)
    finally:
        stop(load)
    assert load.returncode == 0, (tmp_path / "load.log").read_text()[-4000:]
    assert scrapes and all(("adpipe_load_stage_run_id", ()) in got for got in scrapes), "no scrape while it ran"
    files = {}
    for step in metrics.LOAD_STEPS:
        text = metrics.textfile(settings, step).read_text()
        files[step] = {(x.name, tuple(sorted(x.labels.items()))): x.value
                       for family in text_string_to_metric_families(text) for x in family.samples}
    stage, audit, publish = files["stage"], files["audit"], files["publish"]
    in_hour = [k for k in expected if k[1].startswith(HOUR)]
    assert get(stage, "adpipe_load_rows_staged", table=T.RAW) == (
        first["distinct_on_time"] + second["distinct_on_time"] + second["late"])
    assert get(stage, "adpipe_load_rows_staged", table=T.AGGREGATES) == len(aggregates)
    assert get(stage, "adpipe_load_rows_staged", table=T.QUARANTINE) == (
        first["malformed"] + second["malformed"] + second["late"])
    assert get(audit, "adpipe_load_gate_passed", hour=HOUR) == 1
    assert get(publish, "adpipe_load_rows_published", table=T.RAW) == first["distinct_on_time"] + second["late"]
    assert get(publish, "adpipe_load_rows_published", table=T.AGGREGATES) == len(in_hour)
    assert get(publish, "adpipe_load_late_corrections") == 0
    run_ids = {get(f, f"adpipe_load_{step}_run_id") for step, f in files.items()}
    assert len(run_ids) == 1 and run_ids != {0}
    for step, f in files.items():
        assert get(f, f"adpipe_load_{step}_duration_seconds") > 0  # type: ignore[operator]
