"""The run's supervised processes (:class:`Part`), the long-running ones as
they stand (:class:`Crew`: the stream driver, its warm standby when the run
has one, the budget instances, a stream_pause in progress) and the
bookkeeping of their restarts (:class:`Restarts`)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from adpipe.faults import wait_group_gone
from adpipe.kafka_io.group_probe import GroupProbe
from adpipe.processes import start_detached
from adpipe.settings import Settings
from adpipe.stream import leadership
from adpipe.stream.liveness import descends_from

from .context import RunContext
from .spread import Spread
from .timeline import Clock, FaultRecord

log = logging.getLogger("adpipe.tools.chaos")

BUDGET_INSTANCES = 2
# A failed restart of a part (a Spark worker whose web UI port the killed
# one's JVM still held: BindException) is tried again after each of these
# waits; after the last the part is reported down and the run goes on.
RESTART_BACKOFF_S = (5.0, 10.0, 20.0, 40.0, 80.0)


def restart_backoff(attempt: int) -> float | None:
    """Seconds to wait before attempt ``attempt + 1`` at restarting a part
    whose attempt ``attempt`` (1-based) failed; None: give up."""
    return RESTART_BACKOFF_S[attempt - 1] if 1 <= attempt <= len(RESTART_BACKOFF_S) else None


class Part:
    """A supervised process of the run (its own process group, so a kill
    takes its JVM with it), restarted after it dies. On the run's hosts
    (``spread``) it starts on its home host while that one is usable, else
    on another (away from the hosts ``peers`` names: a standby away from
    the active driver); ``proc`` is then the nsenter that entered the host
    and waits for it, in the same process group. A ``pinned`` part (a
    host's Airflow worker) starts on its home host only."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log_dir: Path,
        spread: Spread | None = None,
        home_host: str | None = None,
        pinned: bool = False,
    ) -> None:
        self.name, self.argv, self.env, self.log_dir = name, argv, env, log_dir
        self.spread, self.home_host, self.pinned = spread, home_host, pinned
        self.peers: list[Part] = []
        self.host: str | None = None  # the host of the current start (None: this machine's own)
        self.ns_pid: int | None = None  # its pid on that host
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.exits: Counter[int] = Counter()
        self.hold_until = 0.0  # not restarted before this (monotonic)
        self.started_at = 0.0
        # A stream driver: since when it is the job's active one (monotonic;
        # a standby's start is not when it took over).
        self.active_since = 0.0

    @property
    def log_path(self) -> Path:
        """The log of the current start (each start has its own)."""
        return self.log_dir / f"{self.name}-{self.starts}.log"

    def start(self) -> bool:
        """Start it; False: no host of the run is usable now (asked again later)."""
        if self.spread is None:
            self.starts += 1
            self.proc = start_detached(self.argv, self.log_path, env=self.env, append=False)
        else:
            if self.pinned:
                host = self.spread.net[self.home_host] if self.home_host in self.spread.usable() else None
            else:
                host = self.spread.host_for(self.home_host, [p.host for p in self.peers if p.alive and p.host])
            if host is None:
                return False
            self.starts += 1
            started = host.start(self.argv, self.log_path, env=host.env(self.env))
            self.proc, self.host, self.ns_pid = started.popen, host.name, started.ns_pid
        self.started_at = self.active_since = time.monotonic()
        return True

    def runs(self, driver: leadership.Driver) -> bool:
        """Whether ``driver`` (a member of the job's leadership group) is this part."""
        if not self.alive:
            return False
        if self.spread is None:
            return driver.host == socket.gethostname() and descends_from(driver.pid, self.proc.pid)  # type: ignore[union-attr]
        return (driver.host, driver.pid) == (self.host, self.ns_pid)

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
    # The resumed driver's log: its size, and since when it has not grown (monotonic).
    log_stamp: tuple[int, int] = (-1, -1)  # the log's (size, mtime_ns)
    quiet_since: float = 0.0


class Crew:
    """The run's long-running parts: the stream driver (its successor once a
    stream_pause has retired it), with ``ADPIPE_STREAM_STANDBY=on`` a warm
    standby driver beside it (``adpipe stream --standby``, as the stream DAG
    keeps one), and the budget instances.

    With a standby the two drivers swap roles: when the active one dies the
    standby is the job's driver (it takes the checkpoint's lock the instant
    the other ends), and the dead one comes back as the standby."""

    def __init__(self, ctx: RunContext, spread: Spread | None = None) -> None:
        adpipe = [sys.executable, "-m", "adpipe"]
        self.stream_argv = [*adpipe, "stream"]
        self.standby_argv = [*self.stream_argv, "--standby"]
        self.settings = ctx.settings
        self.with_standby = ctx.settings.stream_standby
        homes = spread.home_hosts(2 + BUDGET_INSTANCES) if spread is not None else [None] * (2 + BUDGET_INSTANCES)

        def part(name: str, argv: list[str], home: str | None) -> Part:
            return Part(name, argv, ctx.env, ctx.logs, spread, home)

        self.stream = part("stream-a" if self.with_standby else "stream", self.stream_argv, homes[0])
        # None while a stream_pause has made it the paused driver's successor.
        self.standby = part("stream-b", self.standby_argv, homes[1]) if self.with_standby else None
        self.budgets = [part(f"budget-{i + 1}", [*adpipe, "budget"], homes[2 + i]) for i in range(BUDGET_INSTANCES)]
        # On hosts: the drivers keep apart, and so do the budget instances.
        for group in (self.drivers(), self.budgets):
            for member in group:
                member.peers = [other for other in group if other is not member]
        self.pause: ZombiePause | None = None
        # The leadership group asked from a child process: this one outlives the broker kills.
        self.probe = GroupProbe(ctx.env)

    def drivers(self) -> list[Part]:
        """The stream drivers the run keeps: the active one and the standby."""
        return [self.stream, *([self.standby] if self.standby is not None else [])]

    def budgets_alive(self) -> bool:
        return all(p.alive for p in self.budgets)

    def take_over(self) -> bool:
        """The active driver is gone and the standby lives: the standby is
        the job's driver now, and the dead one is the standby, started as one
        (``--standby``) when it is restarted. Whether they swapped."""
        standby = self.standby
        if standby is None or self.stream.proc is not None or not standby.alive:
            return False
        self._swap()
        return True

    def follow_lease(self) -> bool:
        """The standby leads the job (its leadership group): it is the active
        driver (two drivers started as standbys, the group gave the first the
        leadership), and the roles follow. Whether they swapped."""
        standby = self.standby
        if standby is None or not standby.alive:
            return False
        lead = _leader(self.settings, self.probe)
        if lead is None or not standby.runs(lead):
            return False
        self._swap()
        return True

    def _swap(self) -> None:
        """The standby is the job's driver from now; the other the standby."""
        assert self.standby is not None
        self.stream, self.standby = self.standby, self.stream
        self.stream.active_since = time.monotonic()

    def prepare_start(self, part: Part) -> None:
        """A driver about to be started, as its role has it (``--standby`` for the standby)."""
        if part is self.standby:
            part.argv = self.standby_argv
        elif part is self.stream:
            part.argv = self.stream_argv

    def standby_state(self) -> str:
        """How the standby stands: "warm" (its warm-up done, waiting in the
        job's leadership group), "waiting" (waiting there, its warm-up still
        running: a takeover cuts it short), "warming" (its session starting)
        or "down"."""
        standby = self.standby
        if standby is None or not standby.alive:
            return "down"
        try:
            warm = leadership.STANDBY_WARM_LINE in standby.log_path.read_text(errors="replace")
        except OSError:
            warm = False
        waiting = any(standby.runs(d) for d in _drivers(self.settings, self.probe) if not d.leads)
        if not waiting:
            return "warming"
        return "warm" if warm else "waiting"

    def kill(self, *others: Part | None) -> None:
        """Kill every part, a paused driver's successor and ``others`` too
        (and end the group probe)."""
        self.probe.close()
        successor = self.pause.successor if self.pause is not None else None
        for part in [*self.drivers(), successor, *self.budgets, *others]:
            if part is not None:
                part.signal(signal.SIGCONT)
                part.signal(signal.SIGKILL)
                part.reap()


class Restarts:
    """Restarts per part, the restarts that failed, and the parts whose
    restarts gave up."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []
        self.down: dict[str, str] = {}  # part -> why its restarts gave up

    def failed(self, part: str, exc: BaseException, attempt: int, action: str, arg: object) -> None:
        """Try again after a backoff (``action`` with ``(arg, attempt + 1)``),
        or give up: the part is reported down in the verdict, and the run
        goes on without it."""
        self.failures.append(f"{part}, attempt {attempt}: {str(exc)[:300]}")
        delay = restart_backoff(attempt)
        if delay is None:
            log.error("restarting %s failed %d times; it stays down: %s", part, attempt, exc)
            self.down[part] = str(exc)[:300]
            return
        log.warning("restarting %s failed (attempt %d), again in %.0f s: %s", part, attempt, delay, exc)
        self.clock.later(delay, action, (arg, attempt + 1))

    def parts_down(self) -> list[str]:
        return [f"{part} ({why})" for part, why in sorted(self.down.items())]


def _drivers(settings: Settings, probe: GroupProbe) -> list[leadership.Driver]:
    """The job's drivers in its leadership group (none when the brokers do not answer)."""
    try:
        return leadership.drivers(settings, timeout_s=5, describe=probe.group_members)
    except Exception as exc:  # noqa: BLE001 - asked again at the next tick
        log.debug("the stream's leadership group: %s", exc)
        return []


def _leader(settings: Settings, probe: GroupProbe) -> leadership.Driver | None:
    return next((d for d in _drivers(settings, probe) if d.leads), None)
