"""The faults on whole hosts of ``adpipe chaos --hosts``: a host cut off
(from everything, or from the brokers and PostgreSQL only) and healed, or
killed whole (every process of it) and started again."""

from __future__ import annotations

from collections.abc import Callable

from .context import RunContext
from .loads import Loads
from .parts import Crew, Restarts
from .plan import HOST_CUT, HOST_KINDS, PlannedFault
from .spread import Spread
from .timeline import Clock, FaultLog, FaultRecord
from .zombie import has_fenced


class HostFaults:
    """One host fault at a time: the host down (cut off or killed) until it
    is back."""

    def __init__(
        self,
        ctx: RunContext,
        crew: Crew,
        loads: Loads,
        restarts: Restarts,
        faults: FaultLog,
        clock: Clock,
        spread: Spread,
    ) -> None:
        self.ctx, self.crew, self.loads, self.spread = ctx, crew, loads, spread
        self.restarts, self.faults, self.clock = restarts, faults, clock
        self.host_down: str | None = None  # the host cut off or killed, until it is back
        # Host faults that picked the active driver's host and wait for its
        # standby: they stay aimed at the active driver wherever it runs when
        # they land (re-picked, they would find it moved by a driver fault
        # injected meanwhile, and seldom hit it).
        self.at_active: set[PlannedFault] = set()

    def inject(self, record: FaultRecord, planned: PlannedFault, standby_ready: Callable[[], str | None]) -> bool:
        """Cut a host off (from everything, or from the services host only)
        or kill it whole, healed or started again later; False: it must wait
        (a host is down already, a stream_pause is on, the active driver on
        the host picked has no standby standing by yet)."""
        spread, crew = self.spread, self.crew
        hosts = spread.usable()
        if self.host_down is not None or crew.pause is not None or len(hosts) < 2:
            return False
        scaled = planned.pick * len(hosts)
        name = hosts[int(scaled)]
        if planned in self.at_active and crew.stream.alive and crew.stream.host in hosts:
            name = crew.stream.host
        workers = self.loads.airflow.workers if self.loads.airflow is not None else []
        on_it = [
            p
            for p in [*crew.drivers(), *crew.budgets, *workers, self.loads.load]
            if p is not None and p.alive and p.host == name
        ]
        active = crew.stream in on_it
        if active:
            # A driver still taking over (the fault would be on the takeover),
            # or its standby not standing by yet: wait, aimed at the active driver.
            if not has_fenced(crew.stream) or standby_ready() is None:
                self.at_active.add(planned)
                return False
            record.failover = True
        self.at_active.discard(planned)
        names = [f"{p.name}{' (active)' if p is crew.stream else ''}" for p in on_it]
        record.note = "on it: " + (", ".join(names) or "nothing")
        if planned.kind == HOST_CUT:
            # From everything, or from the brokers and PostgreSQL only; for
            # longer than the leadership's lease, so its driver loses it.
            what = "everything" if scaled - int(scaled) < 0.5 else "services"
            record.down_s = round(planned.down_s + 2 * self.ctx.settings.stream_lease_s, 1)
            record.target = f"{name} (cut off from {what})"
            spread.cut_off(name, what)
            self.clock.later(record.down_s, "heal_host", name)
        else:
            record.target = name
            spread.kill(name)
            self.clock.later(planned.down_s, "restart_host", (name, 1))
        self.host_down = name
        return True

    def heal(self, name: str) -> None:
        self.spread.heal(name)
        self.host_down = None
        self.faults.restored(HOST_CUT)

    def restart(self, name: str, attempt: int) -> None:
        try:
            self.spread.restart(name)
        except Exception as exc:  # noqa: BLE001 - HostsError, OSError: retried, then reported
            self.restarts.failed(name, exc, attempt, "restart_host", name)
            return
        self.restarts.counts["host"] += 1
        self.host_down = None
        self.faults.restored(*HOST_KINDS)
