"""The drain after the fault window: until the stream job has caught up and
its output is quiet, the window's load finished, the load kills carried
over landed, every hour loaded once more, and every aggregate charged."""

from __future__ import annotations

import logging
import time

from adpipe import kafka_io

from .airflow import DagRunLoad
from .monitor import budget_offsets
from .parts import Part
from .plan import LOAD_KILL, load_kill_delay
from .rig import Rig
from .timeline import FaultRecord

log = logging.getLogger("adpipe.tools.chaos")

# The drain ends when the aggregates topic has not grown for this long.
QUIET_S = 15.0
# The exit code noted for a drain's load that did not end before the drain's deadline.
TIMED_OUT = 124


def run(rig: Rig, started: float, timeout_s: float = 1800) -> None:
    """Until the stream job has committed everything and its output has
    been quiet for a while (a window closed by the last batch is written
    by the next), then every hour loaded once more, then until the
    budget service has read every aggregate."""
    settings, loads = rig.ctx.settings, rig.loads
    deadline = started + timeout_s
    quiet_since, last_end = time.monotonic(), -1
    while time.monotonic() < deadline:
        rig.tick()
        rig.monitor.sample()
        end = sum(kafka_io.end_offsets(settings.kafka, settings.topics.aggregates).values())
        if end != last_end or rig.monitor.stream_lag or not rig.crew.stream.alive:
            quiet_since, last_end = time.monotonic(), end
        elif time.monotonic() - quiet_since >= QUIET_S:
            break
        time.sleep(1)
    # A load of the window still running ends first: beside the stream
    # job it may hold the cluster's last cores while it waits for the
    # load lock, which the final load would hold while it waits for
    # cores (adpipe chaos found this deadlock).
    while loads.load is not None and time.monotonic() < deadline:
        rig.injector.due()
        rig.supervisor.supervise()
        time.sleep(1)
    # Every hour once more, in one load (adpipe load: a backfill, one Spark
    # start-up; with Airflow: a DAG run per hour).
    first, last = loads.hours[0], loads.hours[-1]
    hosts_back(rig, deadline)
    load_kills(rig, deadline)
    for attempt in range(1, 6):
        part = loads.part(f"final-load{attempt}", loads.hours)
        loads.own(part)  # killed with the rest if the run is stopped
        if not part.start():
            raise RuntimeError("no host of the run is usable for the final load")
        rc = finish(rig, part, deadline)
        loads.own(None)
        if rc == 0:
            for hour in loads.hours:
                loads.done[hour] = loads.done.get(hour, 0) + 1
            rig.faults.recovered_load()
            break
        log.warning("final load of %s..%s exited %d; again", first, last, rc)
    # Every aggregate charged: the service's offsets past the last
    # committed record of each partition.
    ends: dict[int, int] = {}
    for record in kafka_io.read_topic(settings.kafka, settings.topics.aggregates):
        ends[record.partition] = record.offset + 1
    while time.monotonic() < deadline:
        rig.injector.due()
        rig.supervisor.supervise()
        done = budget_offsets(settings)
        if all(done.get(p, 0) >= o for p, o in ends.items()):
            return
        time.sleep(1)
    log.error("the budget service did not charge every aggregate within %.0f s of the drain", timeout_s)


def hosts_back(rig: Rig, deadline: float) -> None:
    """On hosts: until every host cut off is healed and every host killed
    runs again (the clock's pending actions), so the drain's loads find
    them."""
    spread = rig.spread
    while spread is not None and len(spread.usable()) < len(spread.names) and time.monotonic() < deadline:
        rig.tick()
        time.sleep(1)


def finish(rig: Rig, load: Part | DagRunLoad, deadline: float) -> int:
    """``load``'s exit code once it ended, the parts supervised meanwhile
    (with Airflow, a worker killed under it comes back); TIMED_OUT when it
    had not ended by ``deadline`` (monotonic)."""
    while (rc := load.proc.poll()) is None:  # type: ignore[union-attr]
        if time.monotonic() > deadline:
            log.error("the drain's load %s did not end in time: given up", load.name)
            return TIMED_OUT
        rig.injector.due()
        rig.supervisor.supervise()
        time.sleep(1)
    load.reap()
    return rc


def load_kills(rig: Rig, deadline: float) -> None:
    """The carried-over load kills, each on a load of every hour (closed
    now) SIGKILLed ``3 + 30 * pick`` seconds into its run; one whose load
    had finished first is tried again, sooner, as in the window. The final
    load then recovers from all of them."""
    loads = rig.loads
    pending = list(rig.faults.carried)
    n = 0
    while pending:
        planned = pending.pop(0)
        n += 1
        load = loads.part(f"drain-load{n}", loads.hours)
        loads.own(load)  # killed with the rest if the run is stopped
        if not load.start():
            raise RuntimeError("no host of the run is usable for the drain's load")
        delay = load_kill_delay(planned)
        target = f"load {loads.hours[0]}..{loads.hours[-1]} (killed {delay:.0f} s into it, drain)"
        record = FaultRecord(LOAD_KILL, target, round(rig.clock.elapsed(), 1), round(planned.down_s, 1), phase="drain")
        kill_at = time.monotonic() + delay
        while time.monotonic() < kill_at and load.alive:
            time.sleep(0.2)
        rig.injector.land_load_kill(load, record, planned)
        loads.rcs[finish(rig, load, deadline)] += 1
        loads.own(None)
        pending += rig.injector.requeued
        rig.injector.requeued.clear()
