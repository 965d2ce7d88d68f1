"""Fault injection: each planned fault carried out on its target (a signal
to the stream driver, a budget instance, a load, a Spark worker or a
broker), the deferred ones when they come due, and the restart of the
workers and brokers a fault took down."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

from adpipe import kafka_io
from adpipe.local import kafka_broker

from .airflow import DagRunLoad
from .context import RunContext
from .hostfaults import HostFaults
from .loads import Loads
from .parts import Crew, Part, Restarts
from .plan import (
    BROKER_KINDS,
    BROKER_TERM,
    BUDGET_KILL,
    COORDINATOR_KILL,
    HOST_KINDS,
    LOAD_KILL,
    LOAD_KILL_TRIES,
    STREAM_KILL,
    STREAM_PAUSE,
    WORKER_KILL,
    PlannedFault,
    load_kill_delay,
    sooner,
)
from .spread import Spread
from .timeline import Clock, FaultLog, FaultRecord
from .zombie import Zombies, has_fenced

log = logging.getLogger("adpipe.tools.chaos")

# With a standby, a stream fault waits (at most this long after the job's
# driver became active) for the standby to stand by again (its session up,
# waiting for the checkpoint's lock; its warm-up may still run): the fault
# then measures a failover, not a second failure before the first one's
# redundancy is back (a standby's start-up takes a minute or more on a
# saturated machine). Waiting for the warm-up too let only a third of the
# planned stream faults happen.
STANDBY_WAIT_S = 300.0


class Injector:
    """Carries out the planned faults, and what they leave for later: the
    deferred load kills, the zombie's steps, the restarts of the worker or
    broker down (one of each at a time)."""

    def __init__(
        self,
        ctx: RunContext,
        crew: Crew,
        loads: Loads,
        zombies: Zombies,
        restarts: Restarts,
        faults: FaultLog,
        clock: Clock,
        spread: Spread | None = None,
    ) -> None:
        self.ctx, self.crew, self.loads, self.zombies = ctx, crew, loads, zombies
        self.restarts, self.faults, self.clock, self.spread = restarts, faults, clock, spread
        self.broker_stops: dict[int, threading.Thread] = {}
        self.broker_down: int | None = None
        self.worker_down: int | None = None
        # Load kills whose load finished first, to try again (the run's queue takes them).
        self.requeued: list[PlannedFault] = []
        self.hosts = HostFaults(ctx, crew, loads, restarts, faults, clock, spread) if spread is not None else None

    def spark_cluster(self):  # noqa: ANN201 - the module, when a local standalone cluster serves us
        if self.spread is not None or not self.ctx.settings.spark_master.startswith("spark://"):
            return None
        try:
            from adpipe.local import spark_cluster
        except ImportError:
            return None
        return spark_cluster if spark_cluster.worker_pids(self.ctx.base) else None

    def kinds(self) -> tuple[str, ...]:
        """The fault kinds this set-up can take."""
        kinds = [STREAM_KILL, STREAM_PAUSE, BUDGET_KILL, LOAD_KILL]
        if self.spark_cluster() is not None:
            kinds.append(WORKER_KILL)
        # On hosts, the services host's brokers run by construction (their
        # pids are that host's: not to be read from here).
        if self.spread is not None or kafka_broker.status(self.ctx.base).running:
            kinds += list(BROKER_KINDS)
        if self.spread is not None:
            kinds += list(HOST_KINDS)
        return tuple(kinds)

    def inject(self, planned: PlannedFault) -> FaultRecord | None:
        """Carry out one planned fault; None when it must wait (its target
        does not run now, a broker is still down or catching up, a worker is
        still down, a stream_pause is still on or its driver has not taken
        over its transactional id yet). A fault is recorded only
        once its signal reached a live target; a load kill is deferred, and
        recorded when it lands (:meth:`land_load_kill`)."""
        kind, pick = planned.kind, planned.pick
        record = FaultRecord(kind, "", round(self.clock.elapsed(), 1), round(planned.down_s, 1))
        crew, loads = self.crew, self.loads
        if kind in (STREAM_KILL, STREAM_PAUSE):
            if not crew.stream.alive or crew.pause is not None:
                return None
            if (kind == STREAM_PAUSE or crew.with_standby) and not has_fenced(crew.stream):
                # A driver still starting is no zombie yet: resumed, it would
                # start as a new instance and fence its successor. With a
                # standby, a fault hits the active driver, not one taking over.
                return None
            # Read once (its log and the leadership group): the gate and the note.
            standby = self._standby_ready()
            if standby is None:
                return None
            standby = standby or None
            record.failover = kind == STREAM_KILL
            if kind == STREAM_PAUSE and crew.with_standby and (crew.standby is None or not crew.standby.alive):
                # With a standby, the standby is the paused driver's successor
                # (a driver started beside it on another lock would be a
                # second job on the checkpoint once the standby came back).
                return None
            on_host = f" on {crew.stream.host}" if crew.stream.host else ""
            record.target = f"stream pid {crew.stream.proc.pid}{on_host}"  # type: ignore[union-attr]
            if standby is not None:
                record.note = f"standby {standby}"
            if not crew.stream.signal(signal.SIGKILL if kind == STREAM_KILL else signal.SIGSTOP):
                return None
            if kind == STREAM_PAUSE:
                self.zombies.start(record)
        elif kind == BUDGET_KILL:
            part = crew.budgets[int(pick * len(crew.budgets))]
            record.target = part.name + (f" on {part.host}" if part.host else "")
            if not part.signal(signal.SIGKILL):
                return None
            part.hold_until = time.monotonic() + planned.down_s
        elif kind == LOAD_KILL:
            if loads.load is not None and loads.load.alive:
                record.target = f"load {loads.load_hour}"
                if not loads.load.signal(signal.SIGKILL):
                    return None
            else:
                loads.start_next()
                if loads.load is None:
                    return None
                # Killed a few seconds into its run (Spark start-up, staging or publish).
                delay = load_kill_delay(planned)
                record.target = f"load {loads.load_hour} (killed {delay:.0f} s into it)"
                self.clock.later(delay, "kill_load", (loads.load, record, planned))
                return record
        elif kind == WORKER_KILL:
            if not self._worker_fault(record, planned):
                return None
        elif kind in HOST_KINDS:
            if self.hosts is None or not self.hosts.inject(record, planned, self._standby_ready):
                return None
        elif not self._broker_fault(record, planned):
            return None
        self.faults.add(record)
        return record

    def _standby_ready(self) -> str | None:
        """Whether a fault may take the active driver now: its standby's state
        ("" without a standby), or None while the standby is not standing by
        again and the active driver took over less than STANDBY_WAIT_S ago."""
        crew = self.crew
        if not crew.with_standby:
            return ""
        standby = crew.standby_state()
        if standby not in ("warm", "waiting") and time.monotonic() - crew.stream.active_since < STANDBY_WAIT_S:
            return None
        return standby

    def _worker_fault(self, record: FaultRecord, planned: PlannedFault) -> bool:
        """SIGKILL a Spark worker, restarted ``down_s`` later; False: none to
        kill, or one is down already."""
        cluster = self.spark_cluster()
        if cluster is None or self.worker_down is not None:
            return False
        workers = sorted(cluster.worker_pids(self.ctx.base))
        if not workers:
            return False
        index = workers[int(planned.pick * len(workers))]
        if not cluster.kill_worker(self.ctx.base, index, signal.SIGKILL):
            return False
        self.worker_down = index
        record.target = f"spark worker {index}"
        self.clock.later(planned.down_s, "start_worker", (index, 1))
        return True

    def _broker_fault(self, record: FaultRecord, planned: PlannedFault) -> bool:
        """Stop a broker (on a thread of its own: :meth:`stop_broker`),
        restarted ``down_s`` later; False: it must wait (a broker is down
        already, a partition is not fully replicated, the coordinator is
        not known)."""
        settings = self.ctx.settings
        if self.broker_down is not None or not kafka_io.fully_replicated(settings.kafka):
            return False
        nodes = kafka_broker.nodes(self.ctx.base)
        if planned.kind == COORDINATOR_KILL:
            from adpipe.stream.job import transactional_id

            node = kafka_io.coordinator_node(settings.kafka, transactional_id(settings))
            if node is None:
                return False
            record.target = f"broker {node} (coordinator of {transactional_id(settings)})"
        else:
            node = nodes[int(planned.pick * len(nodes))].node_id
            record.target = f"broker {node}"
        sig = signal.SIGTERM if planned.kind == BROKER_TERM else signal.SIGKILL
        self.broker_down = node
        stopper = threading.Thread(target=self.stop_broker, args=(node, sig, record), daemon=True)
        self.broker_stops[node] = stopper
        stopper.start()
        self.clock.later(planned.down_s, "start_broker", (node, 1))
        return True

    def land_load_kill(self, load: Part | DagRunLoad, record: FaultRecord, planned: PlannedFault) -> None:
        """A deferred load kill (of the window's load, or of the drain's): a
        fault only if that load is still the run's and still runs. If it had
        finished first, the kill is tried again on a later load, sooner into
        it (:attr:`requeued`), LOAD_KILL_TRIES times at most."""
        if load is self.loads.load and load.signal(signal.SIGKILL):
            record.at_s = round(self.clock.elapsed(), 1)
            self.faults.add(record)
        elif load is self.loads.load and load.alive:
            # Running, but nothing of it to kill now (a DAG run between its
            # tasks, or still triggered): when its next task runs.
            self.clock.later(2.0, "kill_load", (load, record, planned))
        elif planned.tries + 1 < LOAD_KILL_TRIES:
            self.requeued.append(sooner(planned, time.monotonic() - load.started_at))
        else:
            self.faults.skip(planned, f"{record.target}: the load had finished first, {LOAD_KILL_TRIES} times")

    def due(self) -> None:
        """Carry out the actions the clock has due."""
        for _, action, arg in self.clock.take_due():
            if action == "resume_stream":
                self.zombies.resume()
            elif action == "retire_zombie":
                self.zombies.retire()
            elif action == "kill_load":
                self.land_load_kill(*arg)  # type: ignore[misc]
            elif action == "start_worker":
                self.start_worker(*arg)  # type: ignore[misc]
            elif action == "start_broker":
                threading.Thread(target=self.start_broker, args=arg, daemon=True).start()
            elif action == "heal_host" and self.hosts is not None:
                self.hosts.heal(arg)  # type: ignore[arg-type]
            elif action == "restart_host" and self.hosts is not None:
                self.hosts.restart(*arg)  # type: ignore[misc]

    # -- restarts of what a fault took down -----------------------------------

    def start_worker(self, index: int, attempt: int) -> None:
        # The module itself: with its only worker down, spark_cluster() finds none.
        from adpipe.local import spark_cluster

        try:
            spark_cluster.start_worker(self.ctx.base, index)
        except Exception as exc:  # noqa: BLE001 - SparkClusterError, OSError: retried, then reported
            self.restarts.failed(f"spark worker {index}", exc, attempt, "start_worker", index)
            return
        self.worker_down = None
        self.restarts.counts["spark_worker"] += 1
        self.faults.restored(WORKER_KILL)

    def stop_broker(self, node: int, sig: int, record: FaultRecord) -> None:
        """Signal the broker and wait until its process has exited (its
        restart waits for this thread)."""
        try:
            ran = stop_node(self.ctx, self.spread, node, sig)
        except Exception as exc:  # noqa: BLE001 - then it was not injected
            ran, record.note = False, f"stopping it failed: {exc}"
        if not ran:
            record.injected = False
            record.note = record.note or "the broker was not running"

    def start_broker(self, node: int, attempt: int) -> None:
        # Only after its old process has exited: a broker still shutting
        # down answers too, and would pass for restarted.
        stopper = self.broker_stops.get(node)
        if stopper is not None:
            stopper.join()
        try:
            start_node(self.ctx, self.spread, node)
        except Exception as exc:  # noqa: BLE001 - BrokerError, OSError: retried, then reported
            self.restarts.failed(f"broker {node}", exc, attempt, "start_broker", node)
            return
        self.restarts.counts["broker"] += 1
        self.faults.restored(*BROKER_KINDS)
        self.broker_down = None


def stop_node(ctx: RunContext, spread: Spread | None, node: int, sig: int) -> bool:
    """Signal one broker of the run's cluster (on hosts: on the services
    host, where its pid is); whether one ran."""
    if spread is None:
        return kafka_broker.stop_node(ctx.base, node, sig)
    return spread.broker(dict(os.environ), "stop", node, signal.Signals(sig).name) == "stopped"


def start_node(ctx: RunContext, spread: Spread | None, node: int) -> None:
    if spread is None:
        kafka_broker.start_node(ctx.base, node)
    else:
        spread.broker(dict(os.environ), "start", node)
