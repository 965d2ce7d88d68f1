"""``adpipe chaos``: the whole pipeline under random faults, then an
independent check (:mod:`adpipe.tools.chaos_check`).

One run starts the stream job, two budget service instances and hourly
Union & Load runs as real processes on the local cluster (the brokers of
``adpipe kafka up``, the PostgreSQL of ``adpipe pg up`` and, with
``ADPIPE_SPARK_MASTER=spark://``, the workers of ``adpipe spark up``), while
a producer writes at a steady rate. For ``--duration`` seconds it injects
faults drawn from a seeded schedule (``--seed`` replays one): SIGKILL of the
stream driver, of a Spark worker, of a budget instance, of a load; SIGSTOP
of the driver past the transaction timeout while a successor driver takes
over, then SIGCONT (a real zombie); SIGTERM or SIGKILL of one broker
at a time, and of the leader of the transaction-state partition that holds
the stream job's transactional id. Killed parts are restarted as a
supervisor would (a failed restart is retried with backoff, and a part
that stays down is reported in the verdict). A fault counts only when it
happened; fewer than planned make the run SHORT. Then it drains (every window closed, every hour loaded)
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
# How long a planned fault may wait for its target (a paused driver, a
# broker catching up, an hour to load) before it is dropped.
FAULT_WAIT_S = 600.0
# A failed restart of a part (a Spark worker whose web UI port the killed
# one's JVM still held: BindException) is tried again after each of these
# waits; after the last the part is reported down and the run goes on.
RESTART_BACKOFF_S = (5.0, 10.0, 20.0, 40.0, 80.0)
# A stream_pause is a real zombie: the driver stays stopped past the
# transaction timeout (plus this margin) while a successor driver takes
# over the checkpoint, and is resumed once the successor has committed a
# batch (at most PAUSE_MAX_S). The resumed zombie must then stop by itself
# (fenced) within ZOMBIE_EXIT_S, or it is killed and the fault says so.
PAUSE_MARGIN_S = 10.0
PAUSE_MAX_S = 240.0
ZOMBIE_EXIT_S = 90.0


def restart_backoff(attempt: int) -> float | None:
    """Seconds to wait before attempt ``attempt + 1`` at restarting a part
    whose attempt ``attempt`` (1-based) failed; None: give up."""
    return RESTART_BACKOFF_S[attempt - 1] if 1 <= attempt <= len(RESTART_BACKOFF_S) else None


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
    # False when it turned out not to have happened (the broker had already
    # stopped; the paused driver got no successor): not counted.
    injected: bool = True
    # "window", or "drain": a load kill carried over because no hour had
    # closed during the window (the stream job behind), landed on the
    # drain's load of the closed hours.
    phase: str = "window"


@dataclass
class ZombiePause:
    """A stream_pause in progress: the stopped driver, its successor, and
    the ledger position when it stopped."""

    record: FaultRecord
    zombie: Part
    successor: Part
    stopped_at: float  # monotonic
    min_s: float
    committed_before: int
    resumed_at: float | None = None


def _has_fenced(part: Part) -> bool:
    """Whether a stream driver's sink has taken its transactional id (its
    log says so: adpipe.stream.sink's "older instances fenced")."""
    log_path = part.log_dir / f"{part.name}-{part.starts}.log"
    try:
        return "older instances fenced" in log_path.read_text(errors="replace")
    except OSError:
        return False


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
    # The ledger's batch boundaries as sampled (the verdict bounds each
    # batch's watermark with them): batch id -> boundary.
    boundaries: dict[int, chaos_check.LedgerBoundary] = field(default_factory=dict)
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
        self.note_boundary(commits)
        now = time.monotonic()
        self.sampled_at = now
        if done > self.stream_committed:
            self.stream_committed, self.stream_progress_at = done, now
        if budget_done > self.budget_committed:
            self.budget_committed, self.budget_progress_at = budget_done, now
        self.stream_lag, self.budget_lag = lag, max(0, budget_end - budget_done)
        self.max_stream_lag = max(self.max_stream_lag, lag)

    def note_boundary(self, commits: dict[int, tuple[int, str]]) -> None:
        boundary = chaos_check.ledger_boundary(commits)
        if boundary is not None:
            self.boundaries[boundary.batch_id] = boundary

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
        # Planned faults that did not happen, and why.
        self.skipped: list[dict] = []
        self.restart_failures: list[str] = []
        self.down: dict[str, str] = {}  # part -> why its restarts gave up
        self.broker_stops: dict[int, threading.Thread] = {}
        self.pause: ZombiePause | None = None
        self.successors = 0
        self._pending_lock = threading.Lock()  # broker threads schedule too
        self.stalls = 0
        self.warm_up_s = 0.0
        self.faults: list[FaultRecord] = []
        self.pending: list[tuple[float, str, object]] = []  # (monotonic due, action, arg)
        # Load kills that found no hour to load in the window (the stream job
        # had closed none): carried over to the drain's load (_drain_load_kills).
        self.carried: list[PlannedFault] = []
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
        with self._pending_lock:
            self.pending.append((time.monotonic() + delay_s, action, arg))

    def _skip(self, planned: PlannedFault, why: str) -> None:
        self.skipped.append({**asdict(planned), "why": why, "at_run_s": round(self._elapsed(), 1)})

    def inject(self, planned: PlannedFault) -> FaultRecord | None:
        """Carry out one planned fault; None when it must wait (its target
        does not run now, a broker is still down or catching up, a worker is
        still down, a stream_pause is still on). A fault is recorded only
        once its signal reached a live target; a load kill is deferred, and
        recorded when it lands (:meth:`_kill_load`)."""
        kind, pick = planned.kind, planned.pick
        record = FaultRecord(kind, "", round(self._elapsed(), 1), round(planned.down_s, 1))
        if kind in (STREAM_KILL, STREAM_PAUSE):
            if not self.stream.alive or self.pause is not None:
                return None
            record.target = f"stream pid {self.stream.proc.pid}"  # type: ignore[union-attr]
            if not self.stream.signal(signal.SIGKILL if kind == STREAM_KILL else signal.SIGSTOP):
                return None
            if kind == STREAM_PAUSE:
                self._start_successor(record)
        elif kind == BUDGET_KILL:
            part = self.budgets[int(pick * len(self.budgets))]
            record.target = part.name
            if not part.signal(signal.SIGKILL):
                return None
            part.hold_until = time.monotonic() + planned.down_s
        elif kind == LOAD_KILL:
            if self.load is not None and self.load.alive:
                record.target = f"load {self.load_hour}"
                if not self.load.signal(signal.SIGKILL):
                    return None
            else:
                self._start_load()
                if self.load is None:
                    return None
                # Killed a few seconds into its run (Spark start-up, staging or publish).
                delay = 3 + 30 * pick
                record.target = f"load {self.load_hour} (killed {delay:.0f} s into it)"
                self._later(delay, "kill_load", (self.load, record, planned))
                return record
        elif kind == WORKER_KILL:
            cluster = self._spark_cluster()
            if cluster is None or self.worker_down is not None:
                return None
            workers = sorted(cluster.worker_pids(self.base))
            if not workers:
                return None
            index = workers[int(pick * len(workers))]
            if not cluster.kill_worker(self.base, index, signal.SIGKILL):
                return None
            self.worker_down = index
            record.target = f"spark worker {index}"
            self._later(planned.down_s, "start_worker", (index, 1))
        else:
            if self.broker_down is not None or not fully_replicated(self.settings.kafka):
                return None
            nodes = kafka_broker.nodes(self.base)
            if kind == COORDINATOR_KILL:
                from adpipe.stream.job import transactional_id

                node = kafka_io.coordinator_node(self.settings.kafka, transactional_id(self.settings))
                if node is None:
                    return None
                record.target = f"broker {node} (coordinator of {transactional_id(self.settings)})"
            else:
                node = nodes[int(pick * len(nodes))].node_id
                record.target = f"broker {node}"
            sig = signal.SIGTERM if kind == BROKER_TERM else signal.SIGKILL
            self.broker_down = node
            stopper = threading.Thread(target=self._stop_broker, args=(node, sig, record), daemon=True)
            self.broker_stops[node] = stopper
            stopper.start()
            self._later(planned.down_s, "start_broker", (node, 1))
        log.info("fault %s: %s at %.1f s", kind, record.target, record.at_s)
        self.faults.append(record)
        return record

    def _kill_load(self, load: Part, record: FaultRecord, planned: PlannedFault) -> None:
        """A deferred load kill: a fault only if that load still ran."""
        if load is self.load and load.signal(signal.SIGKILL):
            record.at_s = round(self._elapsed(), 1)
            self.faults.append(record)
        else:
            self._skip(planned, f"{record.target}: the load had finished first")

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
        with self._pending_lock:
            ready = [p for p in self.pending if p[0] <= now]
            self.pending = [p for p in self.pending if p[0] > now]
        for _, action, arg in ready:
            if action == "resume_stream":
                self._resume_zombie()
            elif action == "retire_zombie":
                self._retire_zombie()
            elif action == "kill_load":
                self._kill_load(*arg)  # type: ignore[misc]
            elif action == "start_worker":
                self._start_worker(*arg)  # type: ignore[misc]
            elif action == "start_broker":
                threading.Thread(target=self._start_broker, args=arg, daemon=True).start()

    # -- restarts ------------------------------------------------------------

    def _restart_failed(self, part: str, exc: BaseException, attempt: int, action: str, arg: object) -> None:
        """Try again after a backoff, or give up: the part is reported down
        in the verdict, and the run goes on without it."""
        self.restart_failures.append(f"{part}, attempt {attempt}: {str(exc)[:300]}")
        delay = restart_backoff(attempt)
        if delay is None:
            log.error("restarting %s failed %d times; it stays down: %s", part, attempt, exc)
            self.down[part] = str(exc)[:300]
            return
        log.warning("restarting %s failed (attempt %d), again in %.0f s: %s", part, attempt, delay, exc)
        self._later(delay, action, (arg, attempt + 1))

    def parts_down(self) -> list[str]:
        return [f"{part} ({why})" for part, why in sorted(self.down.items())]

    def _start_worker(self, index: int, attempt: int) -> None:
        # The module itself: with its only worker down, _spark_cluster() finds none.
        from adpipe.local import spark_cluster

        try:
            spark_cluster.start_worker(self.base, index)
        except Exception as exc:  # noqa: BLE001 - SparkClusterError, OSError: retried, then reported
            self._restart_failed(f"spark worker {index}", exc, attempt, "start_worker", index)
            return
        self.worker_down = None
        self.restarted["spark_worker"] += 1
        self._restored(WORKER_KILL)

    def _stop_broker(self, node: int, sig: int, record: FaultRecord) -> None:
        """Signal the broker and wait until its process has exited (its
        restart waits for this thread)."""
        try:
            ran = kafka_broker.stop_node(self.base, node, sig)
        except Exception as exc:  # noqa: BLE001 - then it was not injected
            ran, record.note = False, f"stopping it failed: {exc}"
        if not ran:
            record.injected = False
            record.note = record.note or "the broker was not running"

    def _start_broker(self, node: int, attempt: int) -> None:
        # Only after its old process has exited: a broker still shutting
        # down answers too, and would pass for restarted.
        stopper = self.broker_stops.get(node)
        if stopper is not None:
            stopper.join()
        try:
            kafka_broker.start_node(self.base, node)
        except Exception as exc:  # noqa: BLE001 - BrokerError, OSError: retried, then reported
            self._restart_failed(f"broker {node}", exc, attempt, "start_broker", node)
            return
        self.restarted["broker"] += 1
        self._restored(*BROKER_KINDS)
        self.broker_down = None

    # -- the zombie driver ---------------------------------------------------

    def _start_successor(self, record: FaultRecord) -> None:
        """Start a second driver on the stopped one's checkpoint. On one host
        the checkpoint's flock (adpipe.stream.checkpoint_lock) would refuse
        it: the stopped driver still holds it. The successor reaches the same
        checkpoint through another name, so its lock is another file, as a
        driver on another host would (where only the transactional.id's
        fencing and Spark's own offset-log checks stand between them)."""
        self.successors += 1
        # A base of its own whose <job id> entry is the checkpoint itself: the
        # successor's checkpoint is the same folder, its lock (<job id>.lock
        # beside it) another file.
        view = self.home / f"checkpoint-view-{self.successors}"
        view.mkdir(parents=True, exist_ok=True)
        (view / self.settings.job_id).symlink_to(self.settings.checkpoint_dir, target_is_directory=True)
        env = {**self.stream.env, "ADPIPE_CHECKPOINT_URI": f"file://{view}"}
        successor = Part(f"stream-successor{self.successors}", self.stream.argv, env, self.logs)
        successor.start()
        min_s = self.settings.transaction_timeout_ms / 1000 + PAUSE_MARGIN_S
        record.down_s = round(max(record.down_s, min_s), 1)
        self.pause = ZombiePause(
            record, self.stream, successor, time.monotonic(), record.down_s, self.monitor.stream_committed
        )
        self._later(record.down_s, "resume_stream")

    def _resume_zombie(self) -> None:
        """SIGCONT the stopped driver once its transaction timed out and its
        successor committed a batch (or PAUSE_MAX_S passed)."""
        pause = self.pause
        assert pause is not None
        stopped_s = time.monotonic() - pause.stopped_at
        # Taken over: the successor committed a batch, or (no input waits)
        # its sink fenced the stopped driver's transactional id.
        took_over = self.monitor.stream_committed > pause.committed_before or _has_fenced(pause.successor)
        if not took_over and pause.successor.alive and stopped_s < PAUSE_MAX_S:
            self._later(2, "resume_stream")
            return
        if not took_over:
            pause.record.injected = False
            pause.record.note = (
                f"no real zombie: the successor committed nothing in {stopped_s:.0f} s "
                f"(it {'ran' if pause.successor.alive else 'exited'})"
            )
        pause.zombie.signal(signal.SIGCONT)
        pause.resumed_at = time.monotonic()
        pause.record.down_s = round(stopped_s, 1)
        self._later(1, "retire_zombie")

    def _retire_zombie(self) -> None:
        """Wait for the resumed driver to stop by itself (fenced, or refused
        by the checkpoint); then its successor is the stream job."""
        pause = self.pause
        assert pause is not None and pause.resumed_at is not None
        since = time.monotonic() - pause.resumed_at
        if pause.zombie.alive and since < ZOMBIE_EXIT_S:
            self._later(1, "retire_zombie")
            return
        if pause.zombie.alive:
            pause.record.note = f"{pause.record.note}; the zombie still ran {since:.0f} s after its resume: killed"
            pause.zombie.signal(signal.SIGKILL)
            pause.zombie.proc.wait(timeout=30)  # type: ignore[union-attr]
        rc = pause.zombie.proc.poll() if pause.zombie.proc is not None else None
        pause.zombie.reap()
        pause.record.note = f"{pause.record.note}; the resumed zombie exited {rc} after {since:.0f} s".lstrip("; ")
        # The successor is the stream job now (restarted as one if it died).
        self.stream = pause.successor
        self.restarted["stream_takeover"] += 1
        self.pause = None
        self._restored(STREAM_PAUSE)

    def _restored(self, *kinds: str) -> None:
        for record in reversed(self.faults):
            if record.kind in kinds and record.restored_at_s is None:
                record.restored_at_s = round(self._elapsed(), 1)
                return

    def _supervise(self) -> None:
        """Restart what died (a supervisor's job), note loads that finished."""
        now = time.monotonic()
        m = self.monitor
        paused = self.pause is not None
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
        # During a stream_pause the stopped driver and its successor are the
        # pause's to handle: a restart now would be a third driver.
        for part in [*([self.stream] if self.pause is None else []), *self.budgets]:
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
        kafka_io.ensure_pipeline_topics(self.settings)
        main, closer, closer_start = self.plans()
        produce.write_summary(main.summary, self.home / "produced.json")
        self.hour_labels = self.hours(main)
        self.monitor.hours = self.hour_labels

        self.t0 = time.monotonic()
        try:
            return self._run(schedule, main, closer, closer_start)
        finally:
            # Whatever happened (an error here, Ctrl-C): no part outlives the run.
            successor = self.pause.successor if self.pause is not None else None
            for part in [self.stream, successor, *self.budgets, self.load]:
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
                # The due faults in order; one that cannot happen yet (a
                # broker still catching up, the driver paused, no hour to
                # load) waits, tried again every few seconds, without holding
                # back the faults after it; past FAULT_WAIT_S it is dropped
                # (and the run is short of its target).
                for planned in [f for f in queue if f.at_s <= self._elapsed()]:
                    if self.inject(planned) is not None:
                        queue.remove(planned)
                        break  # one per turn: the next finds its target's state after this one
                    window_over = self._elapsed() >= spec.duration_s and not producer.is_alive()
                    if planned.kind == LOAD_KILL and not self.monitor.closed_hours and (
                        window_over or self._elapsed() > planned.at_s + FAULT_WAIT_S
                    ):
                        queue.remove(planned)
                        self.carried.append(planned)
                    elif self._elapsed() > planned.at_s + FAULT_WAIT_S:
                        queue.remove(planned)
                        self._skip(planned, f"its target was not there for {FAULT_WAIT_S:.0f} s")
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
        return self._report(main, closer_minute, drain_s, schedule)

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
        # A load of the window still running ends first: beside the stream
        # job it may hold the cluster's last cores while it waits for the
        # load lock, which the final load would hold while it waits for
        # cores (adpipe chaos found this deadlock).
        while self.load is not None and time.monotonic() < deadline:
            self._due()
            self._supervise()
            time.sleep(1)
        # Every hour once more, in one run (a backfill: one Spark start-up).
        first, last = self.hour_labels[0], self.hour_labels[-1]
        argv = [sys.executable, "-m", "adpipe", "load", "--hour", first, "--to-hour", last]
        self._drain_load_kills(argv)
        for attempt in range(1, 6):
            part = Part(f"final-load{attempt}", argv, self.env, self.logs)
            self.load = part  # killed with the rest if the run is stopped
            part.start()
            rc = part.proc.wait()  # type: ignore[union-attr]
            part.reap()
            self.load = None
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

    def _drain_load_kills(self, argv: list[str]) -> None:
        """The carried-over load kills, each on a load of every hour (closed
        now) SIGKILLed ``3 + 30 * pick`` seconds into its run; one that had
        finished first is skipped, as in the window. The final load then
        recovers from all of them."""
        for n, planned in enumerate(self.carried, start=1):
            load = Part(f"drain-load{n}", argv, self.env, self.logs)
            self.load = load  # killed with the rest if the run is stopped
            load.start()
            delay = 3 + 30 * planned.pick
            target = f"load {self.hour_labels[0]}..{self.hour_labels[-1]} (killed {delay:.0f} s into it, drain)"
            record = FaultRecord(LOAD_KILL, target, round(self._elapsed(), 1), round(planned.down_s, 1), phase="drain")
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline and load.alive:
                time.sleep(0.2)
            if load.signal(signal.SIGKILL):
                record.at_s = round(self._elapsed(), 1)
                self.faults.append(record)
                log.info("fault %s: %s at %.1f s", LOAD_KILL, target, record.at_s)
            else:
                self._skip(planned, f"{target}: the load had finished first")
            self.load_rcs[load.proc.wait()] += 1  # type: ignore[union-attr]
            load.reap()
            self.load = None

    def restarts(self) -> dict[str, int]:
        """Restarts per part (loads: runs that did not finish)."""
        return {**self.restarted, "load_failed": sum(n for rc, n in self.load_rcs.items() if rc != 0)}

    def _report(self, main: produce.Plan, closer_minute: str, drain_s: float, schedule: list[PlannedFault]) -> dict:
        s = self.settings
        check, judged, (raw, late, dlq) = self._check_events(main, closer_minute)
        spend = chaos_check.check_spend(
            judged, self._spend_rows(), (s.budget_default_cpm_micros, s.budget_default_cpc_micros)
        )
        tables = self._tables()
        # The same tables read with delta-rs, when it is installed.
        rows = chaos_check.read_delta_tables(s.warehouse_dir / "ads.db")
        tables_delta_rs = (
            {"ok": None, "skipped": rows}
            if isinstance(rows, str)
            else chaos_check.compare_tables(rows, judged, raw, late, dlq, set(self.hour_labels))
        )
        faults = chaos_check.summarize_faults([asdict(f) for f in self.faults], Counter(f.kind for f in schedule))
        verdict, reasons = chaos_check.run_verdict(
            {
                "events": check["ok"],
                "spend": spend["ok"],
                "tables": tables["ok"],
                **({"tables (delta-rs)": tables_delta_rs["ok"]} if tables_delta_rs["ok"] is not None else {}),
                "producer": not self.producer_error,
            },
            faults,
            self.parts_down(),
            self.stalls,
        )
        explained = {
            "PASS": "zero lost, zero duplicated, budgets exact, tables match, every planned fault injected",
            "SHORT": "the output is right, but the run fell short: " + "; ".join(reasons),
            "FAIL": "; ".join(reasons) + ": see check, spend and tables",
        }[verdict]
        report = {
            "run_id": self.run_id,
            "seed": self.seed,
            "command": " ".join(self.command()),
            "brokers": len(kafka_broker.nodes(self.base)),
            "spark_master": s.spark_master,
            "duration_s": self._elapsed(),
            "events": {
                "sent_messages": main.summary["messages"],
                "distinct_events": check["raw_valid_events"],
                "duplicates_sent": main.summary["duplicates"],
                "malformed": main.summary["malformed"],
                "late_planned": main.summary["late"],
            },
            "faults_planned": len(schedule),
            "faults_injected": sum(row["injected"] for row in faults.values()),
            "faults_skipped": self.skipped,
            "faults": faults,
            "fault_log": [asdict(f) for f in self.faults],
            "restarts": self.restarts(),
            "restart_failures": self.restart_failures,
            "parts_down": self.parts_down(),
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
            "tables_delta_rs": tables_delta_rs,
            "verdict": f"{verdict}: {explained}",
            "ok": verdict == "PASS",
            "logs": str(self.logs),
        }
        (self.home / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        return report

    def _check_events(self, main: produce.Plan, closer_minute: str) -> tuple[dict, list[bytes], tuple]:
        """The verdict on the stream's output (chaos_check.check_stream_output):
        the producer's summary, the raw topic, the ledger boundaries sampled
        during the run (and once more now), the output topics; and the
        aggregates it judged (those of windows before the closer's), and the
        raw topic, late listings and DLQ sources it read."""
        s = self.settings
        try:
            self.monitor.note_boundary(kafka_io.stream_commits(s))
        except Exception as exc:  # noqa: BLE001 - the sampled ones still bound the watermarks
            log.warning("reading the ledger once more: %s", exc)
        rules = chaos_check.StreamRules(s.lateness_ms, s.max_future_skew_ms, s.late_dedupe_retention_s * 1000)
        raw = chaos_check.RawTopic(
            (
                chaos_check.RawRecord(r.partition, r.offset, r.timestamp_ms, r.value)
                for r in kafka_io.read_topic(s.kafka, s.topics.events)
            ),
            rules,
        )
        bounds = chaos_check.WatermarkBounds(raw, self.monitor.boundaries.values(), rules.lateness_ms)
        aggregates = [r.value for r in kafka_io.read_topic(s.kafka, s.topics.aggregates)]
        late = [
            chaos_check.LateListing.from_record(r.value, {name: r.header(name) for name in r.headers})
            for r in kafka_io.read_topic(s.kafka, s.topics.late)
        ]
        dlq = [r.header(S.HEADER_SOURCE) for r in kafka_io.read_topic(s.kafka, s.topics.dlq)]
        truth = chaos_check.Truth.from_summaries([main.summary], closed_before=closer_minute)
        judged = [a for a in aggregates if json.loads(a)["window_start"] < closer_minute]
        check = chaos_check.check_stream_output(truth, raw, bounds, judged, late, dlq, rules, closer_minute)
        return check, judged, (raw, late, dlq)

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
