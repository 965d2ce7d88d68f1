"""``adpipe chaos``: the whole pipeline under random faults, then an
independent check (:mod:`adpipe.tools.chaos_check`).

One run starts the stream job, two budget service instances and hourly
Union & Load runs as real processes on the local cluster (the brokers of
``adpipe kafka up``, the PostgreSQL of ``adpipe pg up`` and, with
``ADPIPE_SPARK_MASTER=spark://``, the workers of ``adpipe spark up``), while
a producer writes at a steady rate. For ``--duration`` seconds it injects
faults drawn from a seeded schedule (``--seed`` replays one): SIGKILL of the
stream driver, of a Spark worker, of a budget instance, of a load; SIGSTOP
and, seconds later, SIGCONT of the driver; SIGTERM or SIGKILL of one broker
at a time, and of the leader of the transaction-state partition that holds
the stream job's transactional id. Killed parts are restarted as a
supervisor would. Then it drains (every window closed, every hour loaded)
and checks the output against the producer's own record of what it sent.

Each run has its own topics, job id, budget database and metastore
database, under ``$ADPIPE_HOME/chaos/<run id>``."""

from __future__ import annotations

import json
import logging
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from adpipe import kafka_io, pg
from adpipe import schemas as S
from adpipe.faults import wait_group_gone
from adpipe.local import kafka_broker
from adpipe.settings import KafkaAccess, Settings, isolated_env, load_settings
from adpipe.tools import chaos_check, produce

log = logging.getLogger(__name__)

STREAM_KILL = "stream_kill"
STREAM_PAUSE = "stream_pause"
WORKER_KILL = "spark_worker_kill"
BUDGET_KILL = "budget_kill"
LOAD_KILL = "load_kill"
BROKER_TERM = "broker_sigterm"
BROKER_KILL = "broker_sigkill"
COORDINATOR_KILL = "txn_coordinator_kill"
# Weights: the stream job is what exactly-once is about; brokers next.
KIND_WEIGHTS = {
    STREAM_KILL: 3,
    STREAM_PAUSE: 2,
    WORKER_KILL: 2,
    BUDGET_KILL: 2,
    LOAD_KILL: 1,
    BROKER_TERM: 1,
    BROKER_KILL: 2,
    COORDINATOR_KILL: 1,
}
BROKER_KINDS = (BROKER_TERM, BROKER_KILL, COORDINATOR_KILL)
# Faults that take down a part the pipeline waits for (restarted by the run).
PART_KINDS = (STREAM_KILL, STREAM_PAUSE, BUDGET_KILL, WORKER_KILL)
BUDGET_INSTANCES = 2
# The fault clock waits this long at most for the stream job's first batch.
WARM_UP_MAX_S = 300.0
# The drain ends when the aggregates topic has not grown for this long.
QUIET_S = 15.0
# A running, unpaused stream job whose ledger has not moved for this long
# while input waits is stalled: killed and restarted, as the stream DAG's
# supervisor does (ADPIPE_STREAM_STALL_S), and counted in the report.
STALL_S = 240.0


@dataclass(frozen=True)
class ChaosSpec:
    """What one run does. ``rate`` 0: the events spread over ``duration_s``."""

    events: int = 200_000
    rate: float = 0.0
    duration_s: float = 600.0
    seed: int | None = None
    fault_interval_s: float = 12.0
    ads: int = 50
    # Seconds a killed or stopped part stays down before it is restarted
    # (a broker, a worker, the stopped driver): drawn in this range.
    down_s: tuple[float, float] = (2.0, 20.0)
    load_interval_s: float = 60.0

    def __post_init__(self) -> None:
        if self.events < 1 or self.duration_s <= 0 or self.fault_interval_s <= 0 or self.ads < 1:
            raise ValueError("events, duration, fault interval and ads must be positive")

    @property
    def events_per_second(self) -> float:
        return self.rate or self.events / self.duration_s


@dataclass(frozen=True)
class PlannedFault:
    """One entry of the seeded schedule: when (seconds into the run), what,
    and two random draws the fault uses (which target, how long down)."""

    at_s: float
    kind: str
    pick: float
    down_s: float


def fault_schedule(seed: int, spec: ChaosSpec, kinds: tuple[str, ...]) -> list[PlannedFault]:
    """The faults of a run: the same for the same seed, spec and kinds."""
    rng = random.Random(seed)
    weights = [KIND_WEIGHTS[k] for k in kinds]
    schedule, at = [], 0.0
    while True:
        at += spec.fault_interval_s * rng.uniform(0.5, 1.5)
        if at >= spec.duration_s:
            return schedule
        kind = rng.choices(kinds, weights)[0]
        schedule.append(PlannedFault(round(at, 3), kind, rng.random(), rng.uniform(*spec.down_s)))


@dataclass
class FaultRecord:
    kind: str
    target: str
    at_s: float
    down_s: float
    restored_at_s: float | None = None
    recovery_s: float | None = None
    note: str = ""


class Part:
    """A supervised process of the run (its own process group, so a kill
    takes its JVM with it), restarted after it dies."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name, self.argv, self.env, self.log_dir = name, argv, env, log_dir
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.exits: Counter[int] = Counter()
        self.hold_until = 0.0  # not restarted before this (monotonic)
        self.started_at = 0.0

    def start(self) -> None:
        self.starts += 1
        self.started_at = time.monotonic()
        log_path = self.log_dir / f"{self.name}-{self.starts}.log"
        with log_path.open("w") as out:
            self.proc = subprocess.Popen(  # noqa: S603
                self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> bool:
        if not self.alive:
            return False
        try:
            os.killpg(self.proc.pid, sig)  # type: ignore[union-attr]
        except ProcessLookupError:
            return False
        return True

    def reap(self) -> None:
        """Note how a finished process ended (once)."""
        if self.proc is not None and self.proc.poll() is not None:
            self.exits[self.proc.returncode] += 1
            wait_group_gone(self.proc.pid)
            self.proc = None

    def stop(self, timeout_s: float = 60.0) -> None:
        if self.signal(signal.SIGCONT) and self.signal(signal.SIGTERM):
            try:
                self.proc.wait(timeout=timeout_s)  # type: ignore[union-attr]
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait()  # type: ignore[union-attr]
        self.reap()


def java_string_hash(text: str) -> int:
    """Java's String.hashCode (Kafka places a transactional id by it)."""
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_node(kafka: KafkaAccess, transactional_id: str) -> int | None:
    """The broker that leads the transaction-state partition of an id (its
    transaction coordinator), from metadata: partition = abs(hash) % count."""
    md = kafka_io.admin(kafka).list_topics("__transaction_state", timeout=5)
    topic = md.topics.get("__transaction_state")
    if topic is None or topic.error is not None or not topic.partitions:
        return None
    partition = (java_string_hash(transactional_id) & 0x7FFFFFFF) % len(topic.partitions)
    leader = topic.partitions[partition].leader
    return leader if leader >= 0 else None


def fully_replicated(kafka: KafkaAccess) -> bool:
    """Every partition of every topic has all its replicas in sync."""
    try:
        md = kafka_io.admin(kafka).list_topics(timeout=5)
    except Exception:  # noqa: BLE001 - not answering: not replicated
        return False
    return all(
        p.leader >= 0 and set(p.isrs) == set(p.replicas) for t in md.topics.values() for p in t.partitions.values()
    )


def run_env(settings: Settings, run_id: str, run_home: Path) -> dict[str, str]:
    """The children's environment: this run's topics, job id, checkpoint and
    databases on the local cluster, with faults in mind (a short transaction
    timeout, so a stopped driver's open transaction is aborted within the run)."""
    prefix = f"chaos-{run_id}"
    return {
        **os.environ,
        "ADPIPE_HOME": str(run_home),
        "ADPIPE_KAFKA_BOOTSTRAP": kafka_broker.cluster_bootstrap(settings),
        **isolated_env(prefix),
        "ADPIPE_CHECKPOINT_URI": f"file://{run_home / 'checkpoints'}",
        "ADPIPE_BUDGET_DB": settings.pg_url(_db_name(run_id, "budget")),
        "ADPIPE_BUDGET_GROUP": f"{prefix}-budget",
        "ADPIPE_METASTORE_DATABASE": _db_name(run_id, "ms"),
        "ADPIPE_TRANSACTION_TIMEOUT_MS": "30000",
        "ADPIPE_TRIGGER_INTERVAL_S": "2",
        "ADPIPE_MAX_OFFSETS_PER_TRIGGER": "20000",
        "ADPIPE_SPARK_DRIVER_MEMORY": os.environ.get("ADPIPE_SPARK_DRIVER_MEMORY", "1g"),
        # Faults delay partitions unevenly: a late event is a correct outcome
        # (listed once in the late topic), never a reason to hold a load back.
        "ADPIPE_MAX_LATE_SHARE": "1",
    }


def budget_offsets(settings: Settings) -> dict[int, int]:
    """The budget service's next offset per partition of the aggregates
    topic, from its database (its offsets live there, in the transaction
    that charges; the Kafka group's commits are for monitoring only)."""
    import sqlalchemy as sa

    engine = sa.create_engine(settings.budget_db)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text("SELECT kafka_partition, next_offset FROM budget_offsets WHERE group_id = :g AND topic = :t"),
                {"g": settings.budget_group, "t": settings.topics.aggregates},
            ).all()
    except sa.exc.SQLAlchemyError:  # no table before the first batch
        return {}
    finally:
        engine.dispose()
    return {int(p): int(o) for p, o in rows}


def _db_name(run_id: str, what: str) -> str:
    return f"chaos_{run_id}_{what}".lower()


@dataclass
class Monitor:
    """Samples progress once a second: the stream job's committed input and
    lag, the budget group's committed input."""

    settings: Settings  # the run's
    stream_committed: int = 0
    stream_lag: int = 0
    max_stream_lag: int = 0
    budget_committed: int = 0
    budget_lag: int = 0
    stream_progress_at: float = 0.0
    budget_progress_at: float = 0.0
    sampled_at: float = 0.0
    hours: list[str] = field(default_factory=list)
    closed_hours: set[str] = field(default_factory=set)
    errors: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        s = self.settings
        try:
            commits = kafka_io.stream_commits(s)
            lag = sum(kafka_io.stream_lag(s, commits).values())
            done = sum(offset for offset, _ in commits.values())
            budget_done = sum(budget_offsets(s).values())
            # Each transaction ends in a commit marker the service never
            # reads: a lag of one per partition is caught up.
            budget_end = sum(kafka_io.end_offsets(s.kafka, s.topics.aggregates).values())
            budget_end -= s.topic_partitions
        except Exception as exc:  # noqa: BLE001 - a broker down: sample again
            self.errors += 1
            log.debug("monitor: %s", exc)
            return
        now = time.monotonic()
        self.sampled_at = now
        if done > self.stream_committed:
            self.stream_committed, self.stream_progress_at = done, now
        if budget_done > self.budget_committed:
            self.budget_committed, self.budget_progress_at = budget_done, now
        self.stream_lag, self.budget_lag = lag, max(0, budget_end - budget_done)
        self.max_stream_lag = max(self.max_stream_lag, lag)

    def sample_hours(self) -> None:
        """Which of the run's hours the stream has closed (loads wait for it)."""
        from adpipe.lakehouse import load

        for hour in self.hours:
            if hour in self.closed_hours:
                continue
            try:
                if load.hour_closed(self.settings, load.parse_hour(hour)):
                    self.closed_hours.add(hour)
            except Exception as exc:  # noqa: BLE001 - a broker down: ask again
                log.debug("monitor: %s", exc)
                return

    def loop(self) -> None:
        """Here, not on the run's own thread: with a broker down these calls
        wait for their timeouts, and faults must keep their schedule."""
        ticks = 0
        while not self.stop.wait(1.0):
            self.sample()
            ticks += 1
            if ticks % 5 == 0:
                self.sample_hours()


class ChaosRun:
    """One run: set-up, the fault window, the drain and the check."""

    def __init__(self, settings: Settings, spec: ChaosSpec) -> None:
        self.base = settings
        self.spec = spec
        self.seed = spec.seed if spec.seed is not None else random.SystemRandom().randrange(1, 2**31)
        self.run_id = time.strftime("%Y%m%d%H%M%S", time.gmtime())
        self.home = settings.home / "chaos" / self.run_id
        self.logs = self.home / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = run_env(settings, self.run_id, self.home)
        self.settings = load_settings(self.env)
        self.monitor = Monitor(self.settings)
        adpipe = [sys.executable, "-m", "adpipe"]
        self.stream = Part("stream", [*adpipe, "stream"], self.env, self.logs)
        self.budgets = [
            Part(f"budget-{i + 1}", [*adpipe, "budget"], self.env, self.logs) for i in range(BUDGET_INSTANCES)
        ]
        self.load: Part | None = None
        self.load_hour: str | None = None
        self.loads_done: dict[str, int] = {}
        self.load_starts = 0
        self.load_rcs: Counter[int] = Counter()
        self.hour_labels: list[str] = []
        self.restarted: Counter[str] = Counter()
        self.skipped: list[PlannedFault] = []
        self.stalls = 0
        self.warm_up_s = 0.0
        self.faults: list[FaultRecord] = []
        self.pending: list[tuple[float, str, object]] = []  # (monotonic due, action, arg)
        self.broker_down: int | None = None
        self.worker_down: int | None = None
        self.t0 = 0.0
        self.producer_error: str | None = None

    # -- set-up --------------------------------------------------------------

    def _spark_cluster(self):  # noqa: ANN202 - the module, when a local standalone cluster serves us
        if not self.settings.spark_master.startswith("spark://"):
            return None
        try:
            from adpipe.local import spark_cluster
        except ImportError:
            return None
        return spark_cluster if spark_cluster.worker_pids(self.base) else None

    def kinds(self) -> tuple[str, ...]:
        """The fault kinds this set-up can take."""
        kinds = [STREAM_KILL, STREAM_PAUSE, BUDGET_KILL, LOAD_KILL]
        if self._spark_cluster() is not None:
            kinds.append(WORKER_KILL)
        if kafka_broker.status(self.base).running:
            kinds += list(BROKER_KINDS)
        return tuple(kinds)

    def plans(self) -> tuple[produce.Plan, produce.Plan, datetime]:
        """The events (over ``minutes`` of event time that pass about as fast
        as the run, so that windows close during it and faults fall between
        them) and a few closing events an hour on, which close every window
        and hour of the first plan."""
        spec = self.spec
        seconds = spec.events / spec.events_per_second
        minutes = max(2, math.ceil(seconds / 60))
        # Two days back (an event time ahead of its record is malformed), and
        # across an hour: the first hour closes a quarter into the run, so
        # loads (and their faults) happen while it goes on.
        start = (datetime.now(UTC) - timedelta(days=2)).replace(minute=0, second=0, microsecond=0)
        start -= timedelta(minutes=max(1, minutes // 4))
        main = produce.plan(
            produce.ProduceSpec(
                events=spec.events,
                seed=self.seed,
                ads=spec.ads,
                minutes=minutes,
                start=start,
                duplicate_rate=0.02,
                malformed_rate=0.01,
                late_rate=0.002,
                late_by_minutes=3,
            )
        )
        end = start + timedelta(minutes=minutes)
        closer_start = end.replace(minute=0) + timedelta(hours=1, seconds=self.settings.lateness_ms // 1000 + 120)
        closer = produce.plan(produce.ProduceSpec(events=20, seed=self.seed + 1, minutes=1, start=closer_start))
        return main, closer, closer_start

    def hours(self, main: produce.Plan) -> list[str]:
        minutes = {row["window_start"] for row in main.summary["counts"]}
        minutes |= {row["window_start"] for row in main.summary["late_events"]}
        return sorted({m[:13] for m in minutes})

    # -- faults --------------------------------------------------------------

    def _elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _later(self, delay_s: float, action: str, arg: object = None) -> None:
        self.pending.append((time.monotonic() + delay_s, action, arg))

    def inject(self, planned: PlannedFault) -> FaultRecord | None:
        """Carry out one planned fault; None when it must wait (a broker is
        still down or catching up, a worker is still down)."""
        kind, pick = planned.kind, planned.pick
        record = FaultRecord(kind, "", round(self._elapsed(), 1), round(planned.down_s, 1))
        if kind in (STREAM_KILL, STREAM_PAUSE):
            if not self.stream.alive:
                return None
            record.target = f"stream pid {self.stream.proc.pid}"  # type: ignore[union-attr]
            if kind == STREAM_KILL:
                self.stream.signal(signal.SIGKILL)
            else:
                self.stream.signal(signal.SIGSTOP)
                self._later(planned.down_s, "resume_stream")
        elif kind == BUDGET_KILL:
            part = self.budgets[int(pick * len(self.budgets))]
            if not part.alive:
                return None
            record.target = part.name
            part.signal(signal.SIGKILL)
            part.hold_until = time.monotonic() + planned.down_s
        elif kind == LOAD_KILL:
            if self.load is None or not self.load.alive:
                self._start_load()
                if self.load is None:
                    return None
                # Killed a few seconds into its run (Spark start-up, staging or publish).
                self._later(3 + 30 * pick, "kill_load", self.load)
                record.target = f"load {self.load_hour} (killed {3 + 30 * pick:.0f} s into it)"
            else:
                record.target = f"load {self.load_hour}"
                self.load.signal(signal.SIGKILL)
        elif kind == WORKER_KILL:
            cluster = self._spark_cluster()
            if cluster is None or self.worker_down is not None:
                return None
            workers = sorted(cluster.worker_pids(self.base))
            if not workers:
                return None
            index = workers[int(pick * len(workers))]
            cluster.kill_worker(self.base, index, signal.SIGKILL)
            self.worker_down = index
            record.target = f"spark worker {index}"
            self._later(planned.down_s, "start_worker", index)
        else:
            if self.broker_down is not None or not fully_replicated(self.settings.kafka):
                return None
            nodes = kafka_broker.nodes(self.base)
            if kind == COORDINATOR_KILL:
                from adpipe.stream.job import transactional_id

                node = coordinator_node(self.settings.kafka, transactional_id(self.settings))
                if node is None:
                    return None
                record.target = f"broker {node} (coordinator of {transactional_id(self.settings)})"
            else:
                node = nodes[int(pick * len(nodes))].node_id
                record.target = f"broker {node}"
            sig = signal.SIGTERM if kind == BROKER_TERM else signal.SIGKILL
            self.broker_down = node
            threading.Thread(target=kafka_broker.stop_node, args=(self.base, node, sig), daemon=True).start()
            self._later(planned.down_s, "start_broker", node)
        log.info("fault %s: %s at %.1f s", kind, record.target, record.at_s)
        self.faults.append(record)
        return record

    def _start_load(self) -> None:
        """Load the next hour that is closed (in turn), unless one runs."""
        if self.load is not None and self.load.alive:
            return
        closed = sorted(self.monitor.closed_hours)
        if not closed:
            return
        self.load_starts += 1
        hour = closed[self.load_starts % len(closed)]
        self.load = self._load_part(f"load{self.load_starts}", hour)
        self.load.start()
        self.load_hour = hour

    def _load_part(self, name: str, hour: str) -> Part:
        return Part(f"{name}-{hour}", [sys.executable, "-m", "adpipe", "load", "--hour", hour], self.env, self.logs)

    def _due(self) -> None:
        now = time.monotonic()
        ready = [p for p in self.pending if p[0] <= now]
        self.pending = [p for p in self.pending if p[0] > now]
        for _, action, arg in ready:
            if action == "resume_stream":
                self.stream.signal(signal.SIGCONT)
                self._restored(STREAM_PAUSE)
            elif action == "kill_load" and arg is self.load and self.load is not None:
                self.load.signal(signal.SIGKILL)
            elif action == "start_worker":
                self._spark_cluster().start_worker(self.base, arg)  # type: ignore[union-attr]
                self.worker_down = None
                self.restarted["spark_worker"] += 1
                self._restored(WORKER_KILL)
            elif action == "start_broker":
                threading.Thread(target=self._start_broker, args=(arg,), daemon=True).start()

    def _start_broker(self, node: int) -> None:
        try:
            kafka_broker.start_node(self.base, node)
        except kafka_broker.BrokerError as exc:
            log.error("restarting broker %d: %s", node, exc)
            self._later(5, "start_broker", node)
            return
        self.restarted["broker"] += 1
        self._restored(*BROKER_KINDS)
        self.broker_down = None

    def _restored(self, *kinds: str) -> None:
        for record in reversed(self.faults):
            if record.kind in kinds and record.restored_at_s is None:
                record.restored_at_s = round(self._elapsed(), 1)
                return

    def _supervise(self) -> None:
        """Restart what died (a supervisor's job), note loads that finished."""
        now = time.monotonic()
        m = self.monitor
        paused = any(a == "resume_stream" for _, a, _ in self.pending)
        if (
            self.stream.alive
            and not paused
            and m.stream_lag > 0
            and now - max(m.stream_progress_at, self.stream.started_at) > STALL_S
        ):
            log.error(
                "the stream job made no progress for %.0f s with %d records waiting: killed", STALL_S, m.stream_lag
            )
            self.stalls += 1
            self.stream.signal(signal.SIGKILL)
        for part in [self.stream, *self.budgets]:
            if part.proc is not None and part.proc.poll() is not None:
                part.reap()
                part.hold_until = max(part.hold_until, now + 1)
            if part.proc is None and now >= part.hold_until:
                part.start()
                is_stream = part is self.stream
                self.restarted["stream" if is_stream else "budget"] += 1
                self._restored(STREAM_KILL if is_stream else BUDGET_KILL)
        if self.load is not None and self.load.proc is not None and self.load.proc.poll() is not None:
            rc = self.load.proc.returncode
            self.load.reap()
            if rc == 0:
                self.loads_done[self.load_hour] = self.loads_done.get(self.load_hour, 0) + 1  # type: ignore[index]
                self._recovered_load()
            self.load_rcs[rc] += 1
            self.load = None

    def _recovered_load(self) -> None:
        for record in self.faults:
            if record.kind == LOAD_KILL and record.recovery_s is None:
                record.recovery_s = round(self._elapsed() - record.at_s, 1)

    def _judge_recovery(self) -> None:
        """A fault is recovered from when the part it hit runs again (a
        killed or stopped stream job, budget instance or worker; a broker is
        not waited for: the others carry on) and, after the fault, what that
        part feeds moved on (the stream job's ledger, the budget service's
        offsets) or had nothing waiting."""
        m, now = self.monitor, time.monotonic()
        for record in self.faults:
            if record.recovery_s is not None or record.kind == LOAD_KILL:
                continue
            if record.kind in PART_KINDS and record.restored_at_s is None:
                continue
            since = self.t0 + max(record.at_s, record.restored_at_s or 0.0)
            budget = record.kind == BUDGET_KILL
            progress_at = m.budget_progress_at if budget else m.stream_progress_at
            idle = (m.budget_lag == 0 and self.budgets_alive()) if budget else (m.stream_lag == 0 and self.stream.alive)
            if progress_at > since:
                record.recovery_s = round(progress_at - self.t0 - record.at_s, 1)
            elif idle and m.sampled_at > since:
                record.recovery_s = round(now - self.t0 - record.at_s, 1)

    def budgets_alive(self) -> bool:
        return all(p.alive for p in self.budgets)

    # -- the run -------------------------------------------------------------

    def _produce(self, main: produce.Plan) -> None:
        try:
            produce.send(self.settings.kafka, self.settings.topics.events, main, self.spec.events_per_second)
        except Exception as exc:  # noqa: BLE001 - reported, and the check will say what is missing
            self.producer_error = str(exc)
            log.error("the producer failed: %s", exc)

    def run(self) -> dict:
        spec = self.spec
        kinds = self.kinds()
        schedule = fault_schedule(self.seed, spec, kinds)
        print(
            f"chaos run {self.run_id}, seed {self.seed} (replay: --seed {self.seed}); {len(schedule)} faults "
            f"planned over {spec.duration_s:.0f} s of kinds {', '.join(kinds)}; {spec.events} events at "
            f"{spec.events_per_second:.0f}/s on {self.settings.kafka_bootstrap}, Spark {self.settings.spark_master}; "
            f"logs in {self.logs}",
            flush=True,
        )
        pg.ensure_databases(self.base, (_db_name(self.run_id, "budget"), _db_name(self.run_id, "ms")))
        kafka_io.ensure_topics(self.settings.kafka, self.settings.topics.all(), self.settings.topic_partitions)
        main, closer, closer_start = self.plans()
        produce.write_summary(main.summary, self.home / "produced.json")
        self.hour_labels = self.hours(main)
        self.monitor.hours = self.hour_labels

        self.t0 = time.monotonic()
        try:
            return self._run(schedule, main, closer, closer_start)
        finally:
            # Whatever happened (an error here, Ctrl-C): no part outlives the run.
            for part in [self.stream, *self.budgets, self.load]:
                if part is not None:
                    part.signal(signal.SIGCONT)
                    part.signal(signal.SIGKILL)
                    part.reap()
            self.monitor.stop.set()

    def _run(
        self, schedule: list[PlannedFault], main: produce.Plan, closer: produce.Plan, closer_start: datetime
    ) -> dict:
        spec = self.spec
        for part in [self.stream, *self.budgets]:
            part.start()
        producer = threading.Thread(target=self._produce, args=(main,), daemon=True)
        producer.start()
        watcher = threading.Thread(target=self.monitor.loop, daemon=True)
        watcher.start()
        # The fault clock starts once the stream job has committed a batch:
        # faults are meant for a running pipeline, not only its start-up.
        warm_up = time.monotonic()
        while self.monitor.stream_committed == 0 and time.monotonic() - warm_up < WARM_UP_MAX_S:
            self._supervise()
            time.sleep(0.5)
        self.warm_up_s = time.monotonic() - warm_up
        self.t0 = time.monotonic()
        print(f"  warm-up: the stream job committed its first batch after {self.warm_up_s:.0f} s; faults begin")
        next_load = time.monotonic() + spec.load_interval_s
        queue = list(schedule)
        last_note = retry_at = 0.0
        while queue or self._elapsed() < spec.duration_s or producer.is_alive() or self.pending:
            if queue and self._elapsed() >= max(queue[0].at_s, retry_at):
                # A fault that cannot happen yet (a broker still catching up,
                # no hour to load) is tried again every few seconds, for two
                # minutes at most; then it is dropped from the schedule.
                if self.inject(queue[0]) is not None:
                    queue.pop(0)
                elif self._elapsed() > queue[0].at_s + 120:
                    self.skipped.append(queue.pop(0))
                else:
                    retry_at = self._elapsed() + 3
            self._due()
            self._supervise()
            self._judge_recovery()
            if time.monotonic() >= next_load:
                self._start_load()
                next_load = time.monotonic() + spec.load_interval_s
            if self._elapsed() - last_note >= 30:
                last_note = self._elapsed()
                print(
                    f"  {last_note:5.0f} s: {len(self.faults)} faults, stream lag {self.monitor.stream_lag}, "
                    f"restarts {self.restarts()}",
                    flush=True,
                )
            time.sleep(0.25)

        print("fault window over: draining (every part up, closing events, every hour loaded)", flush=True)
        drain_started = time.monotonic()
        produce.send(self.settings.kafka, self.settings.topics.events, closer)
        closer_minute = closer_start.strftime("%Y-%m-%dT%H:%M:00Z")
        self._drain(drain_started)
        drain_s = time.monotonic() - drain_started
        for part in [self.stream, *self.budgets]:
            part.stop()
        return self._report(main, closer_minute, drain_s, len(schedule))

    def _drain(self, started: float, timeout_s: float = 1800) -> None:
        """Until the stream job has committed everything and its output has
        been quiet for a while (a window closed by the last batch is written
        by the next), then every hour loaded once more, then until the
        budget service has read every aggregate."""
        deadline = started + timeout_s
        quiet_since, last_end = time.monotonic(), -1
        while time.monotonic() < deadline:
            self._due()
            self._supervise()
            self._judge_recovery()
            self.monitor.sample()
            end = sum(kafka_io.end_offsets(self.settings.kafka, self.settings.topics.aggregates).values())
            if end != last_end or self.monitor.stream_lag or not self.stream.alive:
                quiet_since, last_end = time.monotonic(), end
            elif time.monotonic() - quiet_since >= QUIET_S:
                break
            time.sleep(1)
        # Every hour once more, in one run (a backfill: one Spark start-up).
        first, last = self.hour_labels[0], self.hour_labels[-1]
        for attempt in range(1, 6):
            part = Part(
                f"final-load{attempt}",
                [sys.executable, "-m", "adpipe", "load", "--hour", first, "--to-hour", last],
                self.env,
                self.logs,
            )
            part.start()
            rc = part.proc.wait()  # type: ignore[union-attr]
            part.reap()
            if rc == 0:
                for hour in self.hour_labels:
                    self.loads_done[hour] = self.loads_done.get(hour, 0) + 1
                self._recovered_load()
                break
            log.warning("final load of %s..%s exited %d; again", first, last, rc)
        # Every aggregate charged: the service's offsets past the last
        # committed record of each partition.
        last: dict[int, int] = {}
        for record in kafka_io.read_topic(self.settings.kafka, self.settings.topics.aggregates):
            last[record.partition] = record.offset + 1
        while time.monotonic() < deadline:
            self._due()
            self._supervise()
            done = budget_offsets(self.settings)
            if all(done.get(p, 0) >= o for p, o in last.items()):
                return
            time.sleep(1)
        log.error("the budget service did not charge every aggregate within %.0f s of the drain", timeout_s)

    def restarts(self) -> dict[str, int]:
        """Restarts per part (loads: runs that did not finish)."""
        return {**self.restarted, "load_failed": sum(n for rc, n in self.load_rcs.items() if rc != 0)}

    def _report(self, main: produce.Plan, closer_minute: str, drain_s: float, planned: int) -> dict:
        s = self.settings
        aggregates = [r.value for r in kafka_io.read_topic(s.kafka, s.topics.aggregates)]
        late = [r.value for r in kafka_io.read_topic(s.kafka, s.topics.late)]
        dlq = [r.header(S.HEADER_SOURCE) for r in kafka_io.read_topic(s.kafka, s.topics.dlq)]
        truth = chaos_check.Truth.from_summaries([main.summary], closed_before=closer_minute)
        judged = [a for a in aggregates if json.loads(a)["window_start"] < closer_minute]
        check = chaos_check.check_events(truth, judged, late, dlq)
        spend = chaos_check.check_spend(
            judged, self._spend_rows(), (s.budget_default_cpm_micros, s.budget_default_cpc_micros)
        )
        tables = self._tables()
        ok = check["ok"] and spend["ok"] and tables["ok"] and self.producer_error is None
        report = {
            "run_id": self.run_id,
            "seed": self.seed,
            "command": " ".join(self.command()),
            "brokers": len(kafka_broker.nodes(self.base)),
            "spark_master": s.spark_master,
            "duration_s": self._elapsed(),
            "events": {
                "sent_messages": main.summary["messages"],
                "distinct_events": truth.distinct_events,
                "duplicates_sent": main.summary["duplicates"],
                "malformed": truth.malformed,
                "late_planned": main.summary["late"],
            },
            "faults_planned": planned,
            "faults_skipped": [asdict(f) for f in self.skipped],
            "faults": chaos_check.summarize_faults([asdict(f) for f in self.faults]),
            "fault_log": [asdict(f) for f in self.faults],
            "restarts": self.restarts(),
            "exits": {
                "stream": dict(self.stream.exits),
                "budget": dict(sum((p.exits for p in self.budgets), Counter())),
                "load": dict(self.load_rcs),
            },
            "max_stream_lag": self.monitor.max_stream_lag,
            "stream_stalls_killed": self.stalls,
            "warm_up_s": self.warm_up_s,
            "drain_s": drain_s,
            "producer_error": self.producer_error,
            "check": check,
            "spend": spend,
            "tables": tables,
            "verdict": "PASS: zero lost, zero duplicated, budgets exact, tables match"
            if ok
            else "FAIL: see check, spend and tables",
            "ok": ok,
            "logs": str(self.logs),
        }
        (self.home / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        return report

    def command(self) -> list[str]:
        spec = self.spec
        return [
            "adpipe", "chaos", "--events", str(spec.events), "--duration", f"{spec.duration_s:g}",
            "--rate", f"{spec.events_per_second:g}", "--seed", str(self.seed),
        ]  # fmt: skip

    def _spend_rows(self) -> list[tuple[str, str, int, int]]:
        import sqlalchemy as sa

        engine = sa.create_engine(self.settings.budget_db)
        try:
            with engine.connect() as conn:
                rows = conn.execute(sa.text("SELECT ad_id, period, spend_micros, records FROM budget_spend")).all()
        finally:
            engine.dispose()
        return [(r[0], r[1], int(r[2]), int(r[3])) for r in rows]

    def _tables(self) -> dict:
        """The Delta tables of every hour against Kafka (adpipe.tools.table_verify,
        as ``adpipe verify --hour H --tables-only``), in one Spark session."""
        from adpipe.lakehouse import load
        from adpipe.lakehouse.metastore import metastore_session
        from adpipe.tools import table_verify

        spark = metastore_session(self.settings, "adpipe-chaos-check")
        results, ok = {}, True
        try:
            for hour in self.hour_labels:
                report = table_verify.check_hour(self.settings, load.parse_hour(hour), spark)
                (self.logs / f"verify-tables-{hour}.json").write_text(json.dumps(report, indent=2, default=str))
                results[hour] = report["ok"]
                ok = ok and report["ok"] and self.loads_done.get(hour, 0) > 0
        finally:
            spark.stop()
        return {"ok": ok, "hours": list(results), "match": results, "loads": self.loads_done}


def run(settings: Settings, spec: ChaosSpec) -> int:
    """``adpipe chaos``: one run; prints the table and keeps the JSON."""
    chaos = ChaosRun(settings, spec)

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(f"adpipe chaos: stopped by signal {signum}; every part of the run was killed")

    # SIGTERM as Ctrl-C: the run's finally kills what it started.
    signal.signal(signal.SIGTERM, stop)
    # The monitor asks every few seconds whether an hour closed: "not yet"
    # is no news here.
    logging.getLogger("adpipe.lakehouse.ranges").setLevel(logging.WARNING)
    report = chaos.run()
    print(chaos_check.render_table(report))
    print(f"report: {chaos.home / 'report.json'}")
    return 0 if report["ok"] else 1
