"""``make bench``: how long each stage takes on this machine, for N events.

Speed belongs here, never in timed tests. Each stage runs as the real
command on its own topics (like the demo) and is timed from the outside;
the result is printed and kept as JSON under ``$ADPIPE_HOME/bench/``."""

from __future__ import annotations

import json
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
