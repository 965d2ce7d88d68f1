"""``python -m bench --failover`` (``make bench ARGS="--failover"``): how
long the stream job is blind when its active driver dies or is paused, with
a warm standby (``adpipe stream --standby``) beside it.

One run: fresh topics and job id on the local broker, an active driver and
a standby, and a producer sending at ``rate`` events/s (a trickle: the
idle pipeline; or a steady load) for the whole run. Then ``faults`` times:
wait until a standby is warm and waits for the checkpoint, SIGKILL (or SIGSTOP) the
active driver's process group at a random moment, and time the fault to
the successor's first batch done (its log's ``standby: took over``
line); the successor is the active driver of the next round, a new standby
is started beside it, and a SIGSTOPped driver is resumed and must exit
fenced. At the end the producer stops, the last driver drains and stops,
and ``adpipe verify`` must say exactly-once holds. Prints p50, p99 and the
worst, and keeps them as JSON under ``$ADPIPE_HOME/bench/``."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from adpipe import kafka_io
from adpipe.local import kafka_broker
from adpipe.processes import start_detached
from adpipe.settings import KafkaAccess, Settings, load_settings
from adpipe.stream import leadership
from adpipe.tools import demo, produce

from bench.logs import batch_stats

TOOK_OVER = "standby: took over ("
WARM = leadership.STANDBY_WARM_LINE


def _drivers(job: Settings) -> list[leadership.Driver]:
    """The job's leadership group (empty when the brokers do not answer this time)."""
    try:
        return leadership.drivers(job, timeout_s=5)
    except Exception:  # noqa: BLE001 - asked again
        return []


@dataclass
class Driver:
    proc: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@dataclass
class FailoverRun:
    signal_name: str
    rate: float
    seconds: list[float] = field(default_factory=list)
    zombie_exits: list[int | None] = field(default_factory=list)
    verify_ok: bool | None = None

    def summary(self) -> dict:
        return {
            "signal": self.signal_name,
            "rate": self.rate,
            **percentiles(self.seconds),
            "zombies_fenced": sum(1 for rc in self.zombie_exits if rc == leadership.EXIT_FENCED),
            "verify_ok": self.verify_ok,
        }


def first_batches(logs: list[str]) -> dict:
    """From the drivers' logs (the first driver's, then its successors'):
    the first batch of a cold start, of each warm standby after it took
    over, and a steady batch (the median of every driver's later batches
    with input), each as the batch line times it (ms)."""
    stats = [batch_stats(text) for text in logs]
    steady = [s["median_steady_batch_ms"] for s in stats if s["median_steady_batch_ms"] is not None]
    return {
        "cold_first_batch_ms": stats[0]["first_batch_ms"] if stats else None,
        "takeover_first_batch_ms": [s["first_batch_ms"] for s, text in zip(stats, logs, strict=True)
                                    if TOOK_OVER in text and s["first_batch_ms"] is not None],
        "steady_batch_ms": round(statistics.median(steady)) if steady else None,
    }


def percentiles(seconds: list[float]) -> dict:
    """The faults' count, p50, p99 and worst, and each time (in order)."""
    ordered = sorted(seconds)
    return {
        "faults": len(ordered),
        "p50_s": round(statistics.median(ordered), 1) if ordered else None,
        "p99_s": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 1) if ordered else None,
        "max_s": round(ordered[-1], 1) if ordered else None,
        "seconds": [round(s, 1) for s in seconds],
    }


def _start(env: dict[str, str], work: Path, name: str, *args: str) -> Driver:
    log_path = work / f"{name}.log"
    return Driver(start_detached([sys.executable, "-m", "adpipe", "stream", *args], log_path, env=env), log_path)


def stop_all(procs: list[subprocess.Popen], timeout_s: float) -> None:
    """SIGTERM each process group still running (resumed first, if paused),
    then SIGKILL those not gone within ``timeout_s`` each."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait(what: str, probe, timeout_s: float) -> None:  # noqa: ANN001
    """Until ``probe()`` is true, asked every 0.1 s; a RuntimeError naming
    ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise RuntimeError(f"failover bench: timed out waiting for {what}")
        time.sleep(0.1)


def produce_steadily(
    kafka: KafkaAccess | str,
    topic: str,
    rate: float,
    stop: threading.Event,
    on_delivery: Callable[[float], Callable] | None = None,
) -> None:
    """Events of the current minutes at ``rate`` per second until stopped,
    one second's worth at a time (each its own seeded plan), through one
    long-lived idempotent producer, as a real one runs.
    ``on_delivery(sent_at)``: the delivery callback for a record sent at
    that moment (``time.monotonic()``)."""
    logging.getLogger("adpipe.tools.produce").setLevel(logging.WARNING)  # a line per second's plan otherwise
    producer = produce.idempotent_producer(kafka)
    n = 0
    while not stop.is_set():
        started = time.monotonic()
        spec = produce.ProduceSpec(events=max(1, int(rate)), seed=n, ads=20, minutes=1,
                                   start=datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=1))
        callback = on_delivery(started) if on_delivery else None
        for msg in produce.plan(spec).messages:
            producer.produce(topic, msg.value, msg.key, on_delivery=callback)
        producer.poll(0)
        n += 1
        stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))
        producer.poll(0)
    producer.flush(60)


def run(settings: Settings, faults: int = 10, rate: float = 5.0, signal_name: str = "KILL", seed: int = 7) -> dict:
    """The measurement (module doc); its summary."""
    run_id = f"failover-{time.strftime('%Y%m%d%H%M%S')}"
    work = settings.home / "bench" / run_id
    work.mkdir(parents=True, exist_ok=True)
    env = {**demo.demo_env(settings, run_id), "ADPIPE_TRIGGER_INTERVAL_S": os.environ.get(
        "ADPIPE_TRIGGER_INTERVAL_S", "1")}
    job = load_settings(env)
    kafka_broker.up(settings)
    kafka_io.ensure_pipeline_topics(job)
    result = FailoverRun(signal_name, rate)
    stop = threading.Event()
    producer = threading.Thread(target=produce_steadily, args=(job.kafka, job.topics.events, rate, stop),
                                daemon=True)
    rng = random.Random(seed)
    active = _start(env, work, "driver-0")
    drivers = [active]
    try:
        wait("the first driver leading", lambda: _drivers(job)[:1] != [] and _drivers(job)[0].leads, 300)
        producer.start()
        for n in range(1, faults + 1):
            standby = _start(env, work, f"driver-{n}", "--standby")
            drivers.append(standby)
            # It waits from its session's start and warms up meanwhile: the fault comes once it is warm.
            wait(f"standby {n} waiting, warm",
                 lambda s=standby: len(_drivers(job)) > 1 and WARM in s.log(), 300)
            time.sleep(rng.uniform(2.0, 6.0))  # a random moment of the active driver's batches
            fault_at = time.monotonic()
            os.killpg(active.proc.pid, getattr(signal, f"SIG{signal_name}"))
            wait(f"standby {n} taking over", lambda s=standby: TOOK_OVER in s.log(), 600)
            result.seconds.append(time.monotonic() - fault_at)
            print(f"  fault {n}/{faults}: SIG{signal_name}, the standby's first batch {result.seconds[-1]:.1f} s "
                  "after it", flush=True)
            if signal_name == "STOP":
                os.killpg(active.proc.pid, signal.SIGCONT)
                try:
                    result.zombie_exits.append(active.proc.wait(timeout=60))
                except subprocess.TimeoutExpired:
                    result.zombie_exits.append(None)
            active = standby
        stop.set()
        producer.join(timeout=30)
        wait("the last driver draining", lambda: sum(kafka_io.stream_lag(job).values()) == 0, 300)
    finally:
        stop.set()
        stop_all([driver.proc for driver in drivers], 120)
    verify = subprocess.run([sys.executable, "-m", "adpipe", "verify"], env=env, capture_output=True, text=True,
                            check=False)
    (work / "verify.json").write_text(verify.stdout)
    result.verify_ok = verify.returncode == 0
    summary = {"run": run_id, "trigger_interval_s": job.trigger_interval_s, "lease_s": job.stream_lease_s,
               **result.summary(), **first_batches([driver.log() for driver in drivers]), "logs": str(work)}
    (work / "failover.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
