"""The run's clock (seconds since the fault clock started, and the actions
due later) and its record of the faults: those that happened, and the
planned ones that did not."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass

from .plan import LOAD_KILL, PlannedFault

log = logging.getLogger("adpipe.tools.chaos")


class Clock:
    """The fault clock (``t0``: when it started, monotonic) and the actions
    it has due: (monotonic due, action, arg), scheduled by the run's own
    thread and by the broker threads alike."""

    def __init__(self) -> None:
        self.t0 = 0.0
        self.pending: list[tuple[float, str, object]] = []
        self._pending_lock = threading.Lock()

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def later(self, delay_s: float, action: str, arg: object = None) -> None:
        with self._pending_lock:
            self.pending.append((time.monotonic() + delay_s, action, arg))

    def take_due(self) -> list[tuple[float, str, object]]:
        """The actions due now, no longer pending."""
        now = time.monotonic()
        with self._pending_lock:
            ready = [p for p in self.pending if p[0] <= now]
            self.pending = [p for p in self.pending if p[0] > now]
        return ready


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
    # It took the active stream driver (a stream_kill, or a host fault on
    # its host): its recovery is a failover to the standby.
    failover: bool = False
    # Recovered with nothing waiting (the producer done): its part ran again
    # and had no input to commit, so its recovery_s is no takeover time.
    recovered_idle: bool = False


class FaultLog:
    """The faults that happened, in order; the planned faults that did not,
    and why; the load kills carried over to the drain."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.records: list[FaultRecord] = []
        self.skipped: list[dict] = []
        # Load kills that found no hour to load in the window (the stream job
        # had closed none): carried over to the drain's load (Drain.load_kills).
        self.carried: list[PlannedFault] = []

    def add(self, record: FaultRecord) -> None:
        log.info("fault %s: %s at %.1f s", record.kind, record.target, record.at_s)
        self.records.append(record)

    def skip(self, planned: PlannedFault, why: str) -> None:
        self.skipped.append({**asdict(planned), "why": why, "at_run_s": round(self.clock.elapsed(), 1)})

    def restored(self, *kinds: str) -> None:
        """The latest fault of these kinds not yet restored is: its part runs again."""
        for record in reversed(self.records):
            if record.kind in kinds and record.restored_at_s is None:
                record.restored_at_s = round(self.clock.elapsed(), 1)
                return

    def recovered_load(self) -> None:
        """A load finished: every load kill before it is recovered from."""
        for record in self.records:
            if record.kind == LOAD_KILL and record.recovery_s is None:
                record.recovery_s = round(self.clock.elapsed() - record.at_s, 1)
