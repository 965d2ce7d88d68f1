"""A supervisor's job during the run: restart the stream driver and the
budget instances when they die, kill a stalled stream job, note the loads
that finished, and judge when each fault was recovered from."""

from __future__ import annotations

import logging
import signal
import time

from .loads import Loads
from .monitor import Monitor
from .parts import Crew, Restarts
from .plan import BUDGET_KILL, HOST_KINDS, LOAD_KILL, PART_KINDS, STREAM_KILL
from .timeline import Clock, FaultLog

log = logging.getLogger("adpipe.tools.chaos")

# A running, unpaused stream job whose ledger has not moved for this long
# while input waited all along is stalled: killed and restarted, as the stream DAG's
# supervisor does (ADPIPE_STREAM_STALL_S), and counted in the report.
STALL_S = 240.0
# A standby is started beside a stream driver that has committed a batch
# since it became the job's driver (or this long after): its first batch,
# the replay of a whole uncommitted one, is what the job is blind for, and
# a standby warming up beside it on the same cores would slow it.
STANDBY_AFTER_S = 60.0


class Supervisor:
    def __init__(
        self, crew: Crew, loads: Loads, monitor: Monitor, restarts: Restarts, faults: FaultLog, clock: Clock
    ) -> None:
        self.crew, self.loads, self.monitor = crew, loads, monitor
        self.restarts, self.faults, self.clock = restarts, faults, clock
        self.stalls = 0

    def supervise(self) -> None:
        """Restart what died (a supervisor's job), note loads that finished.
        With a standby, the active driver's death hands the job to it (the
        fault is restored then), and the dead one comes back as the standby."""
        now = time.monotonic()
        m, crew = self.monitor, self.crew
        paused = crew.pause is not None
        if (
            crew.stream.alive
            and not paused
            and m.stream_lag > 0
            and now - max(m.stream_progress_at, m.stream_waiting_since, crew.stream.active_since) > STALL_S
        ):
            log.error(
                "the stream job made no progress for %.0f s with %d records waiting: killed", STALL_S, m.stream_lag
            )
            self.stalls += 1
            crew.stream.signal(signal.SIGKILL)
        # During a stream_pause the stopped driver and its successor are the
        # pause's to handle: a restart now would be a third driver.
        parts = [*(crew.drivers() if not paused else []), *crew.budgets]
        for part in parts:
            if part.proc is not None and part.proc.poll() is not None:
                part.reap()
                part.hold_until = max(part.hold_until, now + 1)
        if not paused and crew.take_over():
            log.info("the stream driver died; its standby (%s) is the job's driver now", crew.stream.name)
            self.restarts.counts["stream_takeover"] += 1
            self.faults.restored(STREAM_KILL)
        if not paused and crew.follow_lease():
            log.info("the standby (%s) holds the checkpoint: it is the job's driver", crew.stream.name)
        for part in parts:
            if part.proc is None and now >= part.hold_until:
                if part is crew.standby and not self.standby_due(now):
                    continue
                crew.prepare_start(part)
                if not part.start():  # on hosts: none usable now
                    continue
                if part is crew.standby:
                    self.restarts.counts["standby"] += 1
                    continue
                is_stream = part is crew.stream
                self.restarts.counts["stream" if is_stream else "budget"] += 1
                self.faults.restored(STREAM_KILL if is_stream else BUDGET_KILL)
        if self.loads.airflow is not None:
            self.loads.airflow.supervise(self.restarts)
        self.loads.reap()

    def standby_due(self, now: float) -> bool:
        """Whether to start the standby now: the job's driver runs and has
        committed a batch since it became the job's driver, or
        STANDBY_AFTER_S have passed."""
        active = self.crew.stream
        if not active.alive:
            return False
        return self.monitor.stream_progress_at > active.active_since or now - active.active_since > STANDBY_AFTER_S

    def judge_recovery(self) -> None:
        """A fault is recovered from when the part it hit runs again (a
        killed or stopped stream job, budget instance or worker; a broker is
        not waited for: the others carry on) and, after the fault, what that
        part feeds moved on (the stream job's ledger, the budget service's
        offsets) or had nothing waiting. A host fault is recovered from when
        both moved on after it, whether or not the host is back: what ran
        there runs elsewhere."""
        m, now, t0 = self.monitor, time.monotonic(), self.clock.t0
        stream_idle = m.stream_lag == 0 and self.crew.stream.alive
        budget_idle = m.budget_lag == 0 and self.crew.budgets_alive()
        for record in self.faults.records:
            if record.recovery_s is not None or record.kind == LOAD_KILL:
                continue
            if record.kind in PART_KINDS and record.restored_at_s is None:
                continue
            since = t0 + max(record.at_s, record.restored_at_s or 0.0)
            stream = (m.stream_progress_at, m.stream_progress_since, stream_idle)
            budget = (m.budget_progress_at, m.budget_progress_since, budget_idle)
            moved = [self._moved(*fed, since, now) for fed in self._fed(record.kind, stream, budget)]
            if all(at is not None for at in moved):
                record.recovery_s = round(max(moved) - t0 - record.at_s, 1)  # type: ignore[type-var]
                record.recovered_idle = any(
                    not (progress_at > since and progress_since >= since)
                    for progress_at, progress_since, _idle in self._fed(record.kind, stream, budget)
                )

    @staticmethod
    def _fed(kind: str, stream: tuple, budget: tuple) -> list[tuple]:
        """What a fault's recovery waits for: the stream job's progress, the
        budget service's, or both (a host fault)."""
        if kind in HOST_KINDS:
            return [stream, budget]
        return [budget] if kind == BUDGET_KILL else [stream]

    def _moved(self, progress_at: float, progress_since: float, idle: bool, since: float, now: float) -> float | None:
        """When what a part feeds moved on after ``since`` (now, if it had
        nothing waiting), or None. Progress counts when the sample before
        the one that saw it began after ``since``: a commit that landed
        just before a fault, seen by the next sample, is no recovery."""
        if progress_at > since and progress_since >= since:
            return progress_at
        return now if idle and self.monitor.sampled_at > since else None
