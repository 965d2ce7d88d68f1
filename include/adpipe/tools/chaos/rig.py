"""What one run is made of, wired together once: its place (the context),
its clock and books, its parts, and the hands that work on them."""

from __future__ import annotations

import os
import random

from adpipe.settings import Settings, load_settings

from .airflow import Airflow
from .context import RunContext
from .inject import Injector
from .loads import Loads
from .monitor import Monitor
from .parts import Crew, Restarts
from .plan import ChaosSpec
from .spread import Spread, hosts_base
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
        self.spread: Spread | None = None
        if spec.hosts:
            self.spread = self._spread_out(spec.hosts)
        self.clock = Clock()
        self.faults = FaultLog(self.clock)
        self.restarts = Restarts(self.clock)
        self.monitor = Monitor(self.ctx.settings)
        self.crew = Crew(self.ctx, self.spread)
        # On hosts the loads are the load DAG's runs on Airflow's workers there.
        self.airflow = Airflow(self.ctx, self.spread) if self.spread is not None else None
        self.loads = Loads(self.ctx, self.monitor, self.faults, self.spread, self.airflow)
        self.zombies = Zombies(self.ctx, self.crew, self.monitor, self.restarts, self.faults, self.clock)
        self.supervisor = Supervisor(self.crew, self.loads, self.monitor, self.restarts, self.faults, self.clock)
        self.injector = Injector(
            self.ctx, self.crew, self.loads, self.zombies, self.restarts, self.faults, self.clock, self.spread
        )
        self.warm_up_s = 0.0
        self.producer_error: str | None = None
        self.last_injected_s = 0.0  # the fault clock's time of the last fault injected

    def _spread_out(self, count: int) -> Spread:
        """The run's hosts, its services host's brokers and PostgreSQL up,
        and the run moved onto them (its parts on Spark's local mode each)."""
        spread = Spread(hosts_base(self.ctx.home), count)
        print(
            f"making {count} hosts and a services host (three brokers, PostgreSQL) under {spread.net.base}", flush=True
        )
        reach = spread.up(dict(os.environ))
        base = load_settings({**os.environ, **reach, "ADPIPE_HOME": str(spread.services_home)})
        # Its clients get every broker's address (run_env), not node 1's alone.
        pg = {name: reach[name] for name in ("ADPIPE_PG_HOST", "ADPIPE_PG_PORT")}
        self.ctx = self.ctx.on_cluster(base, {**pg, "ADPIPE_SPARK_MASTER": "local[2]"})
        return spread

    def tick(self) -> None:
        """One turn of the run's loop: the actions due, a supervisor's round,
        the recoveries judged."""
        self.injector.due()
        self.supervisor.supervise()
        self.supervisor.judge_recovery()

    def restart_counts(self) -> dict[str, int]:
        """Restarts per part (loads: runs that did not finish)."""
        return {**self.restarts.counts, "load_failed": self.loads.failed()}
