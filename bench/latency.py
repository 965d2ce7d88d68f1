"""``make bench ARGS="--latency"``: each streaming row (``STREAMING``) runs
continuously on a topic of its own while a producer sends at a fixed rate,
events timed now; a read_committed consumer (:class:`Watcher`) notes when
each window's aggregate first becomes visible (its first revision), and the
delay is measured from the window's close (its end plus the watermark delay)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from adpipe import kafka_io
from adpipe.settings import Settings
from adpipe.tools import produce
from adpipe.tools.chaos import check as chaos_check

from bench.engines import Context, launch, topic_name
from bench.processes import Running


def latency_stats(
    arrivals: Iterable[tuple[str, float]], delay_ms: int, until_ms: float, send_lag_ms: float = 0.0
) -> dict:
    """Seconds from each window's close (its end plus the watermark delay)
    to its aggregate being visible, for the windows that closed by
    ``until_ms`` (event time: the producer's last events; later windows never
    close). ``arrivals``: (window_end ISO, epoch ms first seen) per
    aggregate. ``send_lag_ms``: how long after its event time each event was
    sent (the producer plans its events, timed from when it starts planning,
    before it sends them): a window closes that much later on the wall clock."""
    delays = []
    for window_end, seen_ms in arrivals:
        close_ms = datetime.fromisoformat(window_end).timestamp() * 1000 + delay_ms
        if close_ms <= until_ms:
            delays.append((seen_ms - close_ms - send_lag_ms) / 1000)
    return {
        "windows": len(delays),  # aggregates: (ad, window) pairs
        "p50_s": chaos_check.percentile(delays, 0.5),
        "p99_s": chaos_check.percentile(delays, 0.99),
        "max_s": max(delays) if delays else None,
    }


class Watcher:
    """A read_committed consumer of an output topic, in a thread: when each
    aggregate (by ad and window) first became visible."""

    def __init__(self, settings: Settings, topic: str) -> None:
        from confluent_kafka import Consumer

        self.first_seen: dict[tuple[str, str], float] = {}
        self.copies = 0
        self._stop = threading.Event()
        self._consumer = Consumer(
            kafka_io.client_config(
                settings.kafka,
                {
                    "group.id": f"adpipe-bench-watch-{topic}",
                    "isolation.level": "read_committed",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    "fetch.wait.max.ms": 50,
                },
            )
        )
        self._consumer.subscribe([topic])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            msg = self._consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            now = time.time() * 1000
            body = json.loads(msg.value())
            key = (body["ad_id"], body["window_end"])
            if key in self.first_seen:
                self.copies += 1
            else:
                self.first_seen[key] = now
        self._consumer.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def arrivals(self) -> list[tuple[str, float]]:
        """(window_end, epoch ms first visible) of each aggregate."""
        return [(window_end, seen) for (_, window_end), seen in self.first_seen.items()]


def latency_row(ctx: Context, engine: str, rate: float, duration_s: float, ads: int, seed: int) -> dict:
    """``engine`` running continuously on a topic of its own while a
    producer sends ``rate`` messages/s of events timed now for
    ``duration_s``; then the delays of the windows that closed."""
    settings = ctx.settings
    source = topic_name(ctx, f"latency-{engine}-events")
    kafka_io.ensure_topics(settings.kafka, [source], settings.topic_partitions)
    how = launch(ctx, engine, source, 0, continuous=True, tag="-latency")
    running = Running(how.cmd, how.env, ctx.work / f"{engine}-latency.log")
    if not running.wait_ready(300, how.ready_marker):
        running.terminate()
        measured = running.finish(60)
        return {
            "engine": engine,
            "windows": 0,
            "p50_s": None,
            "p99_s": None,
            "max_s": None,
            "cpu_s_per_min": None,
            "error": f"did not start (exit {measured.returncode}); see {measured.log}",
        }
    watcher = Watcher(settings, how.aggregates)
    # Events timed from now, spread over the duration; retries and malformed
    # ones among them, so that messages, not only events, arrive at ``rate``.
    # The send is paced so that it takes as long as the event times span
    # (whole minutes): event time then keeps to the wall clock.
    share = 1 + 0.02 + 0.01
    minutes = max(1, round(duration_s / 60))
    start = datetime.now(UTC)
    spec = produce.ProduceSpec(
        events=max(1, round(rate * minutes * 60 / share)),
        seed=seed,
        ads=ads,
        minutes=minutes,
        start=start,
        duplicate_rate=0.02,
        malformed_rate=0.01,
    )
    plan = produce.plan(spec)
    paced = len(plan.messages) / (minutes * 60)
    # Planning takes seconds: each event is sent this long after its event time.
    send_lag_ms = max(0.0, time.time() * 1000 - start.timestamp() * 1000)
    print(
        f"   {engine}: producing {paced:,.0f} messages/s for {minutes * 60} s "
        f"(each event sent {send_lag_ms / 1000:.1f} s after its event time)",
        flush=True,
    )
    cpu_before, sending = running.cpu_s_now(), time.monotonic()
    produce.send(settings.kafka, source, plan, events_per_second=paced)
    # The job's CPU while it kept up with the producer (its start-up left out).
    cpu_per_min = (running.cpu_s_now() - cpu_before) / max(1e-9, time.monotonic() - sending) * 60
    until_ms = min(time.time() * 1000 - send_lag_ms, (start + timedelta(minutes=minutes)).timestamp() * 1000)
    time.sleep(settings.watermark_delay_s + settings.trigger_interval_s + 30)  # the last closed windows' output
    watcher.stop()
    running.terminate()
    measured = running.finish(120)
    stats = latency_stats(watcher.arrivals(), settings.watermark_delay_s * 1000, until_ms, send_lag_ms)
    return {
        "engine": engine,
        **stats,
        "send_lag_s": round(send_lag_ms / 1000, 1),
        "cpu_s_per_min": round(cpu_per_min, 1),
        "trigger_interval_s": settings.trigger_interval_s,
        "copies": watcher.copies,
        "returncode": measured.returncode,
        "log": str(measured.log),
        "error": None,
    }
