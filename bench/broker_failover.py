"""``python -m bench --failover --part broker``: how long each part of the
pipeline is held up when one broker of three is SIGKILLed.

One run: a cluster of three nodes of the bench's own (under
``$ADPIPE_HOME/bench/brokers``, on the bootstrap and controller ports plus
:data:`PORT_OFFSET`: 9142/9242/9342 by default), beside whatever runs on the
usual ports; fresh topics there (three replicas, two in sync to write); the
stream job (one ``adpipe stream`` driver, trigger 1 s) over raw events from
an idempotent producer at ``rate`` events/s; and one ``adpipe budget``
instance over a topic of synthetic aggregates that a transactional producer
writes at ``rate`` a second (as the stream job writes them, but every
second, where real windows close once a minute). Then ``faults`` times:
wait until every partition has all its replicas in sync, SIGKILL a broker
(each in turn) at a random moment, and time from the kill until

* ``leaders``: every partition of the run's topics and of Kafka's
  transaction and offsets logs is led by a live broker, and the dead one
  is out of its in-sync replicas (until then a write that every in-sync
  replica must acknowledge waits for it);
* ``producer``: every raw partition acknowledged a record sent after it;
* ``transactions``: a transaction begun after it committed;
* ``stream``: the stream job's ledger went past, on every raw partition,
  where the partition ended at the kill (it handled a record sent after);
* ``budget``: the budget service's offsets did the same on every
  aggregates partition;

then start the broker again. A stream or budget process that exits is
started again (counted: each is a finding). At the end the producers stop,
the stream job drains, ``adpipe verify`` must say exactly-once holds, and
the budget ledger must equal a plain-Python sum of what was committed.
Prints p50/p99/worst per part; keeps them as JSON under
``$ADPIPE_HOME/bench/``."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from adpipe import kafka_io
from adpipe.budget import db
from adpipe.budget.batch import stored_offsets
from adpipe.local import kafka_broker, postgres
from adpipe.processes import start_detached
from adpipe.settings import Settings, load_settings
from adpipe.tools import demo

from bench.budget_failover import produce_aggregates
from bench.failover import percentiles, produce_steadily, stop_all, wait
from bench.stages import budget_env, database_name, expected_spend, ledger_totals, new_run, synthetic_aggregates

PORT_OFFSET = 50
BROKERS = 3
PARTS = ("leaders", "producer", "transactions", "stream", "budget")
# A part not moving this long after a kill is reported as stuck.
PART_TIMEOUT_S = 300.0


def cluster_settings(settings: Settings) -> Settings:
    """The bench's own three-node cluster: under ``$ADPIPE_HOME/bench/brokers``,
    on this home's ports plus :data:`PORT_OFFSET`, without credentials."""
    host, port = settings.kafka_bootstrap.split(",")[0].rsplit(":", 1)
    return load_settings(
        {
            **os.environ,
            "ADPIPE_HOME": str(settings.home / "bench" / "brokers"),
            "ADPIPE_KAFKA_BOOTSTRAP": f"{host}:{int(port) + PORT_OFFSET}",
            "ADPIPE_KAFKA_CONTROLLER_PORT": str(settings.kafka_controller_port + PORT_OFFSET),
            "ADPIPE_KAFKA_SECURITY": "plaintext",
        }
    )


class FirstAfter:
    """When each key first progressed after the last :meth:`arm` (a
    record acknowledged on a partition, a transaction committed), counting
    only what began after it. Fed from client callbacks on their threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._since: float | None = None
        self._at: dict[int, float] = {}
        self.errors = 0

    def arm(self, since: float) -> None:
        with self._lock:
            self._since, self._at = since, {}

    def note(self, key: int, begun_at: float) -> None:
        with self._lock:
            if self._since is not None and begun_at >= self._since:
                self._at.setdefault(key, time.monotonic())

    def on_delivery(self, sent_at: float) -> Callable:
        def callback(err, msg) -> None:  # noqa: ANN001 - confluent_kafka's
            if err is not None:
                self.errors += 1
            else:
                self.note(msg.partition(), sent_at)

        return callback

    def all_at(self, keys: set[int]) -> float | None:
        """The moment the last of ``keys`` progressed; None while one has not."""
        with self._lock:
            return max(self._at[k] for k in keys) if keys <= self._at.keys() else None


@dataclass
class Part:
    """A supervised child: started again whenever it exits."""

    name: str
    args: list[str]
    env: dict[str, str]
    work: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def start(self) -> None:
        log_path = self.work / f"{self.name}-{len(self.procs)}.log"
        self.procs.append(start_detached([sys.executable, "-m", "adpipe", *self.args], log_path, env=self.env))

    def keep_running(self) -> None:
        if self.procs[-1].poll() is not None:
            print(f"  {self.name} exited (rc {self.procs[-1].returncode}); starting it again", flush=True)
            self.start()

    @property
    def restarts(self) -> int:
        return len(self.procs) - 1


def _leaders_live(kafka: str, topics: set[str], dead: int) -> bool:
    """Every partition of ``topics`` led by a live broker, ``dead`` in no ISR."""
    try:
        md = kafka_io.admin(kafka).list_topics(timeout=2)
    except Exception:  # noqa: BLE001 - no answer yet: not live
        return False
    wanted = [t for name, t in md.topics.items() if name in topics]
    return len(wanted) == len(topics) and all(
        p.leader not in (-1, dead) and dead not in p.isrs for t in wanted for p in t.partitions.values()
    )


def _past(ends: dict[int, int], done: dict[int, int]) -> bool:
    """Every partition's consumer went past where it ended at the kill: it
    handled a record written after it."""
    return bool(ends) and all(done.get(p, -1) > end for p, end in ends.items())


def run(settings: Settings, faults: int = 10, rate: float = 50.0, seed: int = 7) -> dict:
    """The measurement (module doc); its summary."""
    run_id, work = new_run(settings, "broker-failover")
    cluster = cluster_settings(settings)
    print(f"starting the bench's cluster of {BROKERS} brokers under {cluster.home}", flush=True)
    kafka_broker.up(cluster, brokers=BROKERS)
    postgres.up(settings)
    bootstrap = kafka_broker.cluster_bootstrap(cluster)
    overrides = {"ADPIPE_KAFKA_BOOTSTRAP": bootstrap}
    stream_env = {**demo.demo_env(settings, run_id), **overrides, "ADPIPE_TRIGGER_INTERVAL_S": "1"}
    job = load_settings(stream_env)
    kafka_io.ensure_pipeline_topics(job)
    topic = f"bench-{run_id}-aggregates"
    kafka_io.ensure_topics(bootstrap, [topic], job.topic_partitions)
    database = database_name(run_id)
    env_budget = budget_env(settings, run_id, "", topic, database, **overrides)
    budget_job = load_settings(env_budget)
    engine = db.make_engine(budget_job)
    watched = {job.topics.events, job.topics.aggregates, topic, kafka_io.TRANSACTION_STATE, kafka_io.CONSUMER_OFFSETS}

    acks, commits = FirstAfter(), FirstAfter()
    sent: list[dict] = []
    stop = threading.Event()
    values = synthetic_aggregates(int(rate * (120 + 120 * faults)), ads=200, seed=seed, duplicate_rate=0.0)
    threads = [
        threading.Thread(target=produce_steadily, args=(bootstrap, job.topics.events, rate, stop, acks.on_delivery),
                         daemon=True),
        threading.Thread(target=produce_aggregates, daemon=True, args=(
            load_settings({**os.environ, **overrides}), topic, values, rate, stop, sent,
            lambda begun: commits.note(0, begun))),
    ]
    stream = Part("stream", ["stream"], stream_env, work)
    budget = Part("budget", ["budget"], env_budget, work)
    rng = random.Random(seed)
    times: dict[str, list[float]] = {part: [] for part in PARTS}
    stuck: dict[str, int] = {part: 0 for part in PARTS}
    killed: list[int] = []
    raw_partitions = set(range(job.topic_partitions))
    first_node = rng.randrange(BROKERS)

    def ledger() -> dict[int, int]:
        try:
            return {p: o for p, (o, _) in kafka_io.stream_commits(job, timeout_s=2).items()}
        except Exception:  # noqa: BLE001 - the coordinator moving: not readable now
            return {}

    def charged() -> dict[int, int]:
        with engine.connect() as conn:
            return stored_offsets(conn, budget_job.budget_group, topic, sorted(raw_partitions))

    try:
        stream.start()
        budget.start()
        for thread in threads:
            thread.start()
        wait("the stream job's first batch", lambda: set(ledger()) == raw_partitions, 600)
        wait("the budget service's first batch", lambda: set(charged()) == raw_partitions, 300)
        for n in range(1, faults + 1):
            wait(f"every replica in sync (fault {n})", lambda: kafka_io.fully_replicated(bootstrap), 300)
            time.sleep(rng.uniform(2.0, 6.0))
            stream.keep_running()
            budget.keep_running()
            node = (first_node + n) % BROKERS + 1  # each in turn: a restarted node leads nothing at first
            # What was written before the kill: progress counts only past it.
            raw_ends = kafka_io.end_offsets(bootstrap, job.topics.events, "read_uncommitted")
            aggregate_ends = kafka_io.end_offsets(bootstrap, topic)
            fault_at = time.monotonic()
            acks.arm(fault_at)
            commits.arm(fault_at)
            kafka_broker.stop_node(cluster, node, signal.SIGKILL)
            killed.append(node)
            done: dict[str, float] = {}
            probes: dict[str, Callable[[], float | None]] = {
                "leaders": lambda d=node: time.monotonic() if _leaders_live(bootstrap, watched, d) else None,
                "producer": lambda: acks.all_at(raw_partitions),
                "transactions": lambda: commits.all_at({0}),
                "stream": lambda b=raw_ends: time.monotonic() if _past(b, ledger()) else None,
                "budget": lambda b=aggregate_ends: time.monotonic() if _past(b, charged()) else None,
            }
            while len(done) < len(PARTS) and time.monotonic() - fault_at < PART_TIMEOUT_S:
                for part, probe in probes.items():
                    if part not in done and (at := probe()) is not None:
                        done[part] = at - fault_at
                stream.keep_running()
                budget.keep_running()
                time.sleep(0.2)
            for part in PARTS:
                if part in done:
                    times[part].append(done[part])
                else:
                    stuck[part] += 1
            print(f"  fault {n}/{faults}: SIGKILL of broker {node}; "
                  + ", ".join(f"{p} {done[p]:.1f} s" if p in done else f"{p} STUCK" for p in PARTS), flush=True)
            kafka_broker.start_node(cluster, node)
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
        wait("the stream job draining", lambda: sum(kafka_io.stream_lag(job, timeout_s=10).values()) == 0, 600)
        ends = kafka_io.end_offsets(bootstrap, topic)

        def drained() -> bool:
            ranges = {p: (charged().get(p, 0), end) for p, end in ends.items()}
            return not kafka_io.readable_partitions(bootstrap, topic, ranges)

        wait("the budget service draining", drained, 300)
    finally:
        stop.set()
        stop_all(stream.procs + budget.procs, 120)
        engine.dispose()
    verify = subprocess.run([sys.executable, "-m", "adpipe", "verify"], env=stream_env, capture_output=True,
                            text=True, check=False)
    (work / "verify.json").write_text(verify.stdout)
    distinct, spend = expected_spend(sent, budget_job.budget_default_cpm_micros, budget_job.budget_default_cpc_micros)
    rows, charged_total = ledger_totals(settings, database)
    summary = {
        "run": run_id, "part": "broker", "rate": rate, "brokers": BROKERS, "killed": killed,
        "parts": {part: {**percentiles(times[part]), "stuck": stuck[part]} for part in PARTS},
        "restarts": {"stream": stream.restarts, "budget": budget.restarts},
        "producer_errors": acks.errors,
        "verify_ok": verify.returncode == 0,
        "budget_exact": rows == distinct and charged_total == spend, "ledger_rows": rows, "distinct_sent": distinct,
        "logs": str(work),
    }
    (work / "failover.json").write_text(json.dumps(summary, indent=2) + "\n")
    kafka_broker.down(cluster)
    return summary
