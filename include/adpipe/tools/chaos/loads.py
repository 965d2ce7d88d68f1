"""The run's hourly loads: each closed hour in turn, one load at a time, and
what they did. A load is ``adpipe load`` in a process of the run's, or,
with the run's Airflow (``--hosts``), runs of the load DAG on its workers."""

from __future__ import annotations

import sys
from collections import Counter

from .airflow import Airflow, DagRunLoad
from .context import RunContext
from .monitor import Monitor
from .parts import Part
from .spread import Spread
from .timeline import FaultLog


class Loads:
    """The load running now (the window's, or one of the drain's), the
    loads that finished per hour and every load's exit code."""

    def __init__(
        self,
        ctx: RunContext,
        monitor: Monitor,
        faults: FaultLog,
        spread: Spread | None = None,
        airflow: Airflow | None = None,
    ) -> None:
        self.ctx, self.monitor, self.faults, self.spread, self.airflow = ctx, monitor, faults, spread, airflow
        self.hours: list[str] = []  # the run's, in order (plan.run_hours)
        self.load: Part | DagRunLoad | None = None
        self.load_hour: str | None = None  # None: the drain's load (the drain reaps it)
        self.done: dict[str, int] = {}  # hour -> loads of it that finished
        self.starts = 0
        self.rcs: Counter[int] = Counter()

    def start_next(self) -> None:
        """Load the next hour that is closed (in turn), unless one runs."""
        if self.load is not None and self.load.alive:
            return
        closed = sorted(self.monitor.closed_hours)
        if not closed:
            return
        hour = closed[(self.starts + 1) % len(closed)]
        load = self.part(f"load{self.starts + 1}-{hour}", [hour])
        if not load.start():  # no host usable now: at the next turn
            return
        self.starts += 1
        self.load, self.load_hour = load, hour

    def part(self, name: str, hours: list[str]) -> Part | DagRunLoad:
        """A load of ``hours`` (consecutive): a DAG run per hour with the
        run's Airflow, else ``adpipe load --hour first [--to-hour last]``
        as a part of the run (one run of them all: one Spark start-up)."""
        if self.airflow is not None:
            return self.airflow.load(name, hours)
        span = ["--hour", hours[0], *(["--to-hour", hours[-1]] if len(hours) > 1 else [])]
        argv = [sys.executable, "-m", "adpipe", "load", *span]
        return Part(name, argv, self.ctx.env, self.ctx.logs, self.spread)

    def own(self, load: Part | DagRunLoad | None) -> None:
        """The drain's load (or none): killed with the rest if the run is
        stopped, reaped by the drain, not here."""
        self.load, self.load_hour = load, None

    def reap(self) -> None:
        """Note a load that finished: its hour loaded once more if it
        succeeded, and the load kills before it recovered from."""
        if self.load_hour is None:
            return
        if self.load is not None and self.load.proc is not None and self.load.proc.poll() is not None:
            rc = self.load.proc.returncode
            self.load.reap()
            if rc == 0:
                self.done[self.load_hour] = self.done.get(self.load_hour, 0) + 1
                self.faults.recovered_load()
            self.rcs[rc] += 1
            self.load = None

    def failed(self) -> int:
        """Loads that did not finish."""
        return sum(n for rc, n in self.rcs.items() if rc != 0)
