"""``python -m bench --hour-close``: how soon an hour is in the Delta
tables after it closes, along the load DAG's path (without Airflow's
scheduler, whose own seconds come on top).

One run: fresh topics and job id (as the demo's), the stream job running
(trigger 1 s) and loads in the warm load driver (``ADPIPE_LOAD_WARM=on``,
as the DAG's ``warm`` steps). Then, for each of ``hours`` hours of event
time from the demo's start: the hour's events (``events`` over 20 ads and
its minutes, 2 % retries, 1 % malformed), then a few events of the next
hour's minute just after the watermark delay and the allowed lateness,
whose batch carries the stream's watermark past the hour's end plus the
allowed lateness: the hour closes (the next hour's own events start after
that minute, so none of them is late). A probe asks ``hour_closed`` (what the DAG's
trigger asks) every 0.5 s for the moment it does; a waiter asks every 10 s
(the trigger's interval, ``HourClosedTrigger``), then runs ``adpipe load
--hour H``. Timed: close to the load's end (the tables published), split
into the wait and the load. Each hour is then checked by ``adpipe verify
--hour H --tables-only``. The first hour also starts the warm driver and
is reported apart. Prints the rows; keeps them as JSON under
``$ADPIPE_HOME/bench/``."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

from adpipe import kafka_io
from adpipe.lakehouse import warm
from adpipe.lakehouse.ranges import HOUR_CLOSED_POLL_S, hour_closed, hour_label
from adpipe.local import kafka_broker, postgres
from adpipe.processes import start_detached
from adpipe.settings import Settings, load_settings
from adpipe.tools import demo, produce

from bench.failover import stop_all
from bench.stages import new_run, timed_command

PROBE_S = 0.5
log = logging.getLogger(__name__)


def _closed_at(settings: Settings, hour, stop: threading.Event) -> float | None:  # noqa: ANN001 - a datetime
    """The first moment (monotonic) ``hour_closed`` says so, asked every
    :data:`PROBE_S`; None if stopped first."""
    while not stop.is_set():
        try:
            if hour_closed(settings, hour):
                return time.monotonic()
        except Exception as exc:  # noqa: BLE001 - a ledger read that failed: ask again
            log.debug("hour_closed: %s", exc)
        stop.wait(PROBE_S)
    return None


def run(settings: Settings, hours: int = 4, events: int = 4_000, seed: int = 7) -> dict:
    """The measurement (module doc); its summary."""
    run_id, work = new_run(settings, "hour-close")
    env = {**demo.demo_env(settings, run_id), "ADPIPE_TRIGGER_HOUR_CLOSED_POLL_S": "1", "ADPIPE_LOAD_WARM": "on"}
    job = load_settings(env)
    kafka_broker.up(settings)
    postgres.up(settings)
    kafka_io.ensure_pipeline_topics(settings, job.topics)
    start = produce.ProduceSpec(events=1).start
    stream = start_detached([sys.executable, "-m", "adpipe", "stream"], work / "stream.log", env=env)
    rows = []
    probes = ThreadPoolExecutor(1)
    # The minute into the next hour whose events close an hour for good
    # (the watermark past its end plus the allowed lateness).
    closing_minute = -(-job.lateness_ms // 60_000)
    try:
        for n in range(hours):
            hour = start + timedelta(hours=n)
            # After the first hour, from the minute after the closing events
            # of the hour before (those are on time, not late).
            first_minute = closing_minute + 1 if n else 0
            spec = produce.ProduceSpec(events=events, seed=seed + n, ads=20, minutes=60 - first_minute,
                                       start=hour + timedelta(minutes=first_minute),
                                       duplicate_rate=0.02, malformed_rate=0.01)
            produce.send(job.kafka, job.topics.events, produce.plan(spec))
            closing = produce.ProduceSpec(events=10, seed=seed + 100 + n, minutes=1,
                                          start=hour + timedelta(hours=1, minutes=closing_minute))
            stop = threading.Event()
            probe = probes.submit(_closed_at, job, hour, stop)
            produce.send(job.kafka, job.topics.events, produce.plan(closing))
            # The DAG's trigger: asks every HOUR_CLOSED_POLL_S seconds.
            while not hour_closed(job, hour):
                if stream.poll() is not None:
                    raise RuntimeError(f"the stream job exited ({stream.returncode}); see {work / 'stream.log'}")
                time.sleep(HOUR_CLOSED_POLL_S)
            resumed_at = time.monotonic()
            load_s = timed_command(env, work / f"load-{n}.log", "load", "--hour", hour_label(hour))
            done_at = time.monotonic()
            stop.set()
            closed_at = probe.result(timeout=30) or resumed_at
            verify = subprocess.run(
                [sys.executable, "-m", "adpipe", "verify", "--hour", hour_label(hour), "--tables-only"],
                env=env, capture_output=True, text=True, check=False,
            )
            (work / f"verify-{n}.json").write_text(verify.stdout)
            row = {"hour": hour_label(hour), "first": n == 0, "close_to_tables_s": round(done_at - closed_at, 1),
                   "wait_s": round(resumed_at - closed_at, 1), "load_s": round(load_s, 1),
                   "verify_ok": verify.returncode == 0}
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        stop_all([stream], 120)
        warm.stop_driver(job)
        probes.shutdown(wait=False, cancel_futures=True)
    later = [r["close_to_tables_s"] for r in rows if not r["first"]]
    summary = {"run": run_id, "events_per_hour": events, "trigger_interval_s": HOUR_CLOSED_POLL_S, "hours": rows,
               "after_the_first_max_s": max(later) if later else None,
               "verify_ok": all(r["verify_ok"] for r in rows), "logs": str(work)}
    (work / "hour_close.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
