"""``make bench``: how long each stage takes on this machine, for N events.

Speed belongs here, never in timed tests. Each stage runs as the real
command on its own topics (like the demo) and is timed from the outside;
the result is printed and kept as JSON under ``$ADPIPE_HOME/bench/``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

from adpipe import kafka_io
from adpipe.lakehouse import load
from adpipe.local import kafka_broker, postgres
from adpipe.settings import Settings, load_settings
from adpipe.tools import demo, produce


def _timed(env: dict[str, str], log_path: Path, *args: str) -> float:
    started = time.monotonic()
    with log_path.open("w") as out:
        rc = subprocess.run(  # noqa: S603
            [sys.executable, "-m", "adpipe", *args], env=env, stdout=out, stderr=subprocess.STDOUT, check=False
        ).returncode
    if rc != 0:
        raise RuntimeError(f"`adpipe {' '.join(args)}` failed (exit {rc}); see {log_path}")
    return time.monotonic() - started


_BATCH_LINE = re.compile(r"adpipe\.stream: batch \d+: input offsets (\d+),.* in (\d+) ms \(batch (\d+) ms\)")


def batch_stats(log_text: str) -> dict:
    """From a stream log: how many batches, the largest input, the slowest
    batch and the slowest transaction."""
    found = [tuple(map(int, m.groups())) for m in _BATCH_LINE.finditer(log_text)]
    with_input = [f for f in found if f[0] > 0]
    return {
        "batches": len(found),
        "batches_with_input": len(with_input),
        "max_batch_offsets": max((f[0] for f in found), default=0),
        "max_transaction_ms": max((f[1] for f in found), default=0),
        "max_batch_ms": max((f[2] for f in found), default=0),
    }


def stream_caps(settings: Settings, caps: list[int], events: int = 200_000, seed: int = 7) -> dict:
    """The stream job alone over one topic of ``events``, once per cap on
    records per micro-batch (``ADPIPE_MAX_OFFSETS_PER_TRIGGER``; 0: none),
    each from a fresh checkpoint: how the cap trades throughput for batch
    length (which bounds the transaction time and the driver's memory)."""
    run_id = "caps-" + time.strftime("%Y%m%d%H%M%S")
    env = demo.demo_env(settings, run_id)
    bench_settings = load_settings(env)
    work = settings.home / "bench" / run_id
    work.mkdir(parents=True, exist_ok=True)
    kafka_broker.up(settings)
    kafka_io.ensure_topics(settings.kafka_bootstrap, bench_settings.topics.all(), settings.topic_partitions)
    spec = produce.ProduceSpec(events=events, seed=seed, ads=50, minutes=30, duplicate_rate=0.02, malformed_rate=0.01)
    plan = produce.plan(spec)
    produce.send(settings.kafka_bootstrap, bench_settings.topics.events, plan)
    rows = []
    for cap in caps:
        cap_env = {**env, "ADPIPE_JOB_ID": f"{env['ADPIPE_JOB_ID']}-cap{cap}"}
        log_path = work / f"stream-cap{cap}.log"
        seconds = _timed(cap_env, log_path, "stream", "--available-now", "--max-offsets-per-trigger", str(cap))
        row = {
            "max_offsets_per_trigger": cap,
            "seconds": round(seconds, 1),
            "events_per_s": round(plan.summary["messages"] / seconds),
            **batch_stats(log_path.read_text()),
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    result = {"events": events, "messages": plan.summary["messages"], "runs": rows}
    (work / "caps.json").write_text(json.dumps(result, indent=2) + "\n")
    result["files"] = str(work)
    return result


def run(settings: Settings, events: int = 20_000, seed: int = 7) -> dict:
    run_id = "bench-" + time.strftime("%Y%m%d%H%M%S")
    env = demo.demo_env(settings, run_id)
    bench_settings = load_settings(env)
    work = settings.home / "bench" / run_id
    work.mkdir(parents=True, exist_ok=True)
    env["ADPIPE_BUDGET_DB"] = f"sqlite:///{work / 'budget.db'}"
    kafka_broker.up(settings)
    postgres.up(settings)
    kafka_io.ensure_topics(settings.kafka_bootstrap, bench_settings.topics.all(), settings.topic_partitions)

    spec = produce.ProduceSpec(events=events, seed=seed, ads=50, minutes=30, duplicate_rate=0.02, malformed_rate=0.01)
    started = time.monotonic()
    plan = produce.plan(spec)
    produce.send(settings.kafka_bootstrap, bench_settings.topics.events, plan)
    produce_s = time.monotonic() - started
    # Close the hour: a few events of the next one.
    closing = produce.ProduceSpec(events=10, seed=seed + 1, minutes=1, start=spec.start + timedelta(hours=1, minutes=1))
    produce.send(settings.kafka_bootstrap, bench_settings.topics.events, produce.plan(closing))

    hour = load.hour_label(spec.start)
    result = {
        "events": events,
        "messages": plan.summary["messages"],
        "produce_s": round(produce_s, 1),
        "stream_available_now_s": round(_timed(env, work / "stream.log", "stream", "--available-now"), 1),
        "budget_once_s": round(_timed(env, work / "budget.log", "budget", "--once"), 1),
        "load_hour_s": round(_timed(env, work / "load.log", "load", "--hour", hour), 1),
        "load_rerun_s": round(_timed(env, work / "load-rerun.log", "load", "--hour", hour), 1),
        "validate_s": round(_timed(env, work / "validate.log", "validate", "--hour", hour), 1),
    }
    result["stream_events_per_s"] = round(result["messages"] / result["stream_available_now_s"])
    (work / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    result["files"] = str(work)
    return result
