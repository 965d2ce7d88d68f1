"""What one run is made of, wired together once: its place (the context),
its clock and books, its parts, and the hands that work on them."""

from __future__ import annotations

import random

from adpipe.settings import Settings

from .context import RunContext
from .inject import Injector
from .loads import Loads
from .monitor import Monitor
from .parts import Crew, Restarts
from .plan import ChaosSpec
from .supervise import Supervisor
from .timeline import Clock, FaultLog
from .zombie import Zombies


class Rig:
    """The state of one run and its hands; :class:`~.harness.ChaosRun` adds
    the run's course."""

    def __init__(self, settings: Settings, spec: ChaosSpec) -> None:
        self.spec = spec
        self.seed = spec.seed if spec.seed is not None else random.SystemRandom().randrange(1, 2**31)
        self.ctx = RunContext.create(settings)
        self.clock = Clock()
        self.faults = FaultLog(self.clock)
        self.restarts = Restarts(self.clock)
        self.monitor = Monitor(self.ctx.settings)
        self.crew = Crew(self.ctx)
        self.loads = Loads(self.ctx, self.monitor, self.faults)
        self.zombies = Zombies(self.ctx, self.crew, self.monitor, self.restarts, self.faults, self.clock)
        self.supervisor = Supervisor(self.crew, self.loads, self.monitor, self.restarts, self.faults, self.clock)
        self.injector = Injector(self.ctx, self.crew, self.loads, self.zombies, self.restarts, self.faults, self.clock)
        self.warm_up_s = 0.0
        self.producer_error: str | None = None
        self.last_injected_s = 0.0  # the fault clock's time of the last fault injected

    def tick(self) -> None:
        """One turn of the run's loop: the actions due, a supervisor's round,
        the recoveries judged."""
        self.injector.due()
        self.supervisor.supervise()
        self.supervisor.judge_recovery()

    def restart_counts(self) -> dict[str, int]:
        """Restarts per part (loads: runs that did not finish)."""
        return {**self.restarts.counts, "load_failed": self.loads.failed()}
