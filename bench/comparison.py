"""``python -m bench --peers`` (``make bench``): adpipe side by side with
the engines it competes with, on one topic, every output checked.

The rows (``bench.engines.ENGINES``), each a process of its own started by
this driver, timed from the outside (wall clock, CPU seconds and peak
resident memory of its whole process tree: :mod:`bench.processes`) and from
its own report (when it was ready, when it saw its first record, when it
was done):

1. ``io_floor``: one confluent-kafka consumer that reads (read_committed)
   and ``json.loads`` every record: what reading the topic costs at least.
2. ``spark_batch``: Spark's batch ceiling, adpipe's own transforms as one
   batch query over the topic (``bench.spark_rows batch``).
3. ``spark_alo``: the same transforms as a streaming query with Spark's own
   at-least-once Kafka sink, ``availableNow`` (``bench.spark_rows alo``).
4. ``adpipe``: ``adpipe stream --available-now``, exactly once, on topics
   and a job id of its own (``settings.isolated_env``).
5. ``adpipe_cluster``: the same on a local Spark standalone cluster of
   ``CLUSTER_WORKERS`` one-core workers (``adpipe spark up``), started for
   the row and stopped after it; the workers' executors are measured with
   the driver.
6. ``quixstreams``: quixstreams 3.x, ``processing_guarantee="exactly-once"``
   (``peers/quix_peer.py``, in ``.cache/bench/quixstreams``).
7. ``pyflink``: PyFlink 2.x SQL with an exactly-once Kafka sink
   (``peers/flink_peer.py``, in ``.cache/bench/pyflink``, with the Kafka SQL
   connector jar from Maven Central).

The truth is the producer's own summary (``adpipe.tools.produce``): each
row's windows and DLQ are read back with read_committed and compared with it
(:mod:`bench.results`); a row that counts wrong is reported, not ranked.
Steady state is records / the engine's processing time (first record to
output committed); start-up is the rest of the wall time. With
``--latency``, :mod:`bench.latency` follows. Results print as a table and
are kept as JSON under ``$ADPIPE_HOME/bench/<run>/``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

from adpipe import kafka_io
from adpipe.settings import Settings
from adpipe.tools import produce

from bench.engines import ADPIPE_ROWS, CLUSTER_WORKERS, ENGINES, STREAMING, Context, launch, timeout_for, topic_name
from bench.install import ensure_peers
from bench.latency import latency_row
from bench.logs import adpipe_processing_s
from bench.processes import Running
from bench.results import add_ratios, cell, judge, make_row, read_dlq, read_values


def run_row(ctx: Context, engine: str, source: str, summary: dict, messages: int, before: str) -> dict:
    """One engine over the whole topic, its output judged."""
    how = launch(ctx, engine, source, messages)
    with _cluster_for(ctx, engine) as workers:
        measured = Running(how.cmd, how.env, ctx.work / f"{engine}.log", serving=workers).finish(
            timeout_for(messages)
        )
    processing = (measured.report or {}).get("processing_s")
    if engine in ADPIPE_ROWS:
        processing = adpipe_processing_s(measured.log.read_text(errors="replace"))
    check = None
    if measured.returncode == 0:
        if how.aggregates_file is not None and how.aggregates_file.exists():
            values = [line.encode() for line in how.aggregates_file.read_text().splitlines() if line]
            check = judge(summary, values, None, before)
        elif how.aggregates:
            values = read_values(ctx.settings, how.aggregates)
            check = judge(summary, values, read_dlq(ctx.settings, how.dlq) if how.dlq else None, before)
    return make_row(engine, messages, measured, processing, check)


@contextmanager
def _cluster_for(ctx: Context, engine: str) -> Iterator[list[int]]:
    """For the adpipe_cluster row, a local standalone cluster of
    CLUSTER_WORKERS workers under the bench's home, up for the row only:
    yields the workers' pids (their executors are measured with the
    driver). Nothing for the other rows."""
    if engine != "adpipe_cluster":
        yield []
        return
    from adpipe.local import spark_cluster

    spark_cluster.up(ctx.settings, workers=CLUSTER_WORKERS)
    try:
        yield list(spark_cluster.worker_pids(ctx.settings).values())
    finally:
        spark_cluster.down(ctx.settings)


def _iso(ts: datetime) -> str:
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def closer_plan(ads: int, at: datetime) -> produce.Plan:
    """One valid event per ad at ``at``: moves every engine's event time
    past the topic's last window, for every ad and partition (quixstreams
    closes a window only on a later record of the same key)."""
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    messages = []
    for ad in range(ads):
        ad_id = f"ad-{ad:06d}"
        body = {"event_id": f"closer-{ad_id}", "ad_id": ad_id, "event_type": "impression", "event_time": stamp}
        messages.append(produce.Message(ad_id.encode(), json.dumps(body).encode(), "on_time"))
    return produce.Plan(messages, {"messages": len(messages)})


def throughput(ctx: Context, engines: Sequence[str], events: int, ads: int, seed: int) -> dict:
    """Every row over one topic of ``events`` (50 ads by default, 30
    minutes, 2 % retries, 1 % malformed) and a closer a few minutes later
    that closes the last windows for every engine and partition."""
    settings = ctx.settings
    source = topic_name(ctx, "ad-events")
    kafka_io.ensure_topics(settings.kafka, [source], settings.topic_partitions)
    spec = produce.ProduceSpec(events=events, seed=seed, ads=ads, minutes=30, duplicate_rate=0.02, malformed_rate=0.01)
    print(f"producing {events:,} events over {ads:,} ads and 30 minutes to {source}", flush=True)
    started = time.monotonic()
    plan = produce.plan(spec)
    closing = closer_plan(ads, spec.start + timedelta(minutes=32))
    produce.send(settings.kafka, source, plan)
    produce.send(settings.kafka, source, closing)
    produce.write_summary(plan.summary, ctx.work / "produce-summary.json")
    messages = plan.summary["messages"] + closing.summary["messages"]
    print(f"   {messages:,} messages in {time.monotonic() - started:.0f} s", flush=True)
    before = _iso(spec.start + timedelta(minutes=spec.minutes))
    rows = []
    for i, engine in enumerate(engines, 1):
        print(f"[{i}/{len(engines)}] {engine} ...", flush=True)
        row = run_row(ctx, engine, source, plan.summary, messages, before)
        print(
            f"   {cell(row['events_per_s'], ',')} events/s steady, start-up {row['startup_s']} s, "
            f"wall {row['wall_s']} s, CPU {row['cpu_s_per_million']} s/M, peak {row['peak_rss_mb']} MB, "
            f"counts {row['counts']}",
            flush=True,
        )
        rows.append(row)
    add_ratios(rows)
    s = plan.summary
    return {
        "events": events,
        "ads": ads,
        "minutes": spec.minutes,
        "messages": messages,
        "duplicates": s["duplicates"],
        "malformed": s["malformed"],
        "topic": source,
        "rows": rows,
    }



def run(
    settings: Settings,
    events: int = 1_000_000,
    ads: int = 50,
    engines: Sequence[str] = ENGINES,
    seed: int = 7,
    latency: bool = False,
    rate: float | None = None,
    latency_duration_s: float = 300.0,
) -> dict:
    """The side-by-side run (and with ``latency`` the latency rows); the
    result is kept as ``peers.json`` under ``$ADPIPE_HOME/bench/<run>/``."""
    from adpipe.local import kafka_broker

    run_id = "peers-" + time.strftime("%Y%m%d%H%M%S")
    work = settings.home / "bench" / run_id
    work.mkdir(parents=True, exist_ok=True)
    ctx = Context(settings, run_id, work, ensure_peers(settings, engines))
    kafka_broker.up(settings)
    result: dict = {"run_id": run_id, "files": str(work)}
    result.update(throughput(ctx, engines, events, ads, seed))
    if latency:
        adpipe_rate = next((r["events_per_s"] for r in result["rows"] if r["engine"] == "adpipe"), None)
        chosen = rate or (adpipe_rate / 2 if adpipe_rate else 1_000.0)
        result.update({"latency_rate": chosen, "latency_duration_s": latency_duration_s, "latency": []})
        for engine in [e for e in engines if e in STREAMING]:
            print(f"latency: {engine} ...", flush=True)
            result["latency"].append(latency_row(ctx, engine, chosen, latency_duration_s, ads, seed + 2))
    (work / "peers.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    return result
