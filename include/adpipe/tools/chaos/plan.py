"""What one chaos run does: its spec, its seeded fault schedule, the events it
produces and the command that replays it."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from adpipe.tools import produce

STREAM_KILL = "stream_kill"
STREAM_PAUSE = "stream_pause"
WORKER_KILL = "spark_worker_kill"
BUDGET_KILL = "budget_kill"
LOAD_KILL = "load_kill"
BROKER_TERM = "broker_sigterm"
BROKER_KILL = "broker_sigkill"
COORDINATOR_KILL = "txn_coordinator_kill"
HOST_CUT = "host_cut"
HOST_KILL = "host_kill"
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
    HOST_CUT: 3,
    HOST_KILL: 2,
}
BROKER_KINDS = (BROKER_TERM, BROKER_KILL, COORDINATOR_KILL)
MAX_HOSTS = 8
# Faults on a whole host of ``--hosts``: every part on it cut off or killed.
HOST_KINDS = (HOST_CUT, HOST_KILL)
# Faults that take down a part the pipeline waits for (restarted by the run).
PART_KINDS = (STREAM_KILL, STREAM_PAUSE, BUDGET_KILL, WORKER_KILL)


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
    # 0: every part on this machine's own network; N: spread over N hosts
    # (namespaces) beside a services host for the brokers and PostgreSQL.
    hosts: int = 0

    def __post_init__(self) -> None:
        if self.events < 1 or self.duration_s <= 0 or self.fault_interval_s <= 0 or self.ads < 1:
            raise ValueError("events, duration, fault interval and ads must be positive")
        if self.hosts and not 2 <= self.hosts <= MAX_HOSTS:
            raise ValueError(f"--hosts {self.hosts}: 2 to {MAX_HOSTS} (a standby driver runs on a host of its own)")

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
    tries: int = 0  # a load kill's earlier tries, whose load finished first


# A load kill whose load finished before it came is tried again on a later
# load, sooner into it, this many times at most.
LOAD_KILL_TRIES = 4


def sooner(planned: PlannedFault, load_ran_s: float) -> PlannedFault:
    """``planned`` (a load kill whose load finished after ``load_ran_s``)
    for another load: killed halfway through that time at the latest."""
    pick = min(planned.pick, max(0.0, (load_ran_s / 2 - 3) / 30))
    return replace(planned, pick=pick, tries=planned.tries + 1)


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


def load_kill_delay(planned: PlannedFault) -> float:
    """Seconds into its run a load is killed: a few (Spark start-up, staging
    or publish)."""
    return 3 + 30 * planned.pick


def event_plans(spec: ChaosSpec, seed: int, lateness_ms: int) -> tuple[produce.Plan, produce.Plan, datetime]:
    """The events (over ``minutes`` of event time that pass about as fast
    as the run, so that windows close during it and faults fall between
    them) and a few closing events an hour on, which close every window
    and hour of the first plan."""
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
            seed=seed,
            ads=spec.ads,
            minutes=minutes,
            start=start,
            duplicate_rate=0.02,
            malformed_rate=0.01,
            late_rate=0.002,
            late_by_minutes=3,
            revise_rate=0.005,
        )
    )
    end = start + timedelta(minutes=minutes)
    closer_start = end.replace(minute=0) + timedelta(hours=1, seconds=lateness_ms // 1000 + 120)
    closer = produce.plan(produce.ProduceSpec(events=20, seed=seed + 1, minutes=1, start=closer_start))
    return main, closer, closer_start


def run_hours(main: produce.Plan) -> list[str]:
    """The hours (``YYYY-MM-DDTHH``) the events fall in: the hours to load."""
    minutes = {row["window_start"] for row in main.summary["counts"]}
    minutes |= {row["window_start"] for row in main.summary["late_events"]}
    return sorted({m[:13] for m in minutes})


def replay_command(spec: ChaosSpec, seed: int) -> list[str]:
    return [
        "adpipe", "chaos", "--events", str(spec.events), "--duration", f"{spec.duration_s:g}",
        "--rate", f"{spec.events_per_second:g}", "--fault-interval", f"{spec.fault_interval_s:g}",
        "--seed", str(seed),
        *(["--hosts", str(spec.hosts)] if spec.hosts else []),
    ]  # fmt: skip
