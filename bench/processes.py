"""Measuring a row of ``make bench`` from the outside: each engine runs as
a process of its own (:class:`Running`), its whole process tree sampled a
few times a second for peak memory and CPU time, JVMs and forked workers
included; what the process itself reports comes back as its last
``BENCH-REPORT {json}`` line (:func:`parse_report`)."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from adpipe.processes import start_detached

from bench.peers.peer_common import READY_LINE, REPORT_PREFIX

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")


def proc_table(proc_dir: Path = Path("/proc")) -> dict[int, tuple[int, float, int]]:
    """pid -> (parent pid, CPU seconds, resident bytes) of every process."""
    table: dict[int, tuple[int, float, int]] = {}
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        table[int(entry.name)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK, int(fields[21]) * _PAGE)
    return table


def tree_of(table: dict[int, tuple[int, float, int]], root: int) -> set[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        found.add(pid)
        todo.extend(children.get(pid, ()))
    return found


def proportional_bytes(pid: int, proc_dir: Path = Path("/proc")) -> int | None:
    """The process's proportional set size (its resident pages, a shared
    page divided among the processes sharing it: forked Python workers are
    not counted twice), or None when the kernel does not say."""
    try:
        for line in (proc_dir / str(pid) / "smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class TreeSampler:
    """Samples a process tree a few times a second: the peak of its summed
    memory (proportional set size, else resident), and the last CPU time
    seen of each of its processes (for those no one reaps into our rusage,
    such as a JVM left to init).

    A process's memory counts from the second sample that finds it: a JVM
    starts a command (Hadoop's local file system runs ``readlink`` per
    checkpoint file) through a child that shares the JVM's whole memory
    until it execs, and a sample that caught one counted the JVM twice
    (make bench once put the stream job's peak at 2.6 GB for 1.6)."""

    root: int
    interval_s: float = 0.25
    peak_rss: int = 0
    cpu_by_pid: dict[int, float] = field(default_factory=dict)
    # Processes that serve the root without being its children (a Spark
    # standalone cluster's workers, whose executors are theirs): their trees
    # count too, less the CPU time they had used before (``baseline``).
    extra_roots: tuple[int, ...] = ()
    proc_dir: Path = Path("/proc")
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        table = proc_table(self.proc_dir)
        self.baseline = {pid: table[pid][1] for pid in self._pids(table) if pid != self.root}
        self._seen = self._pids(table)

    def _pids(self, table: dict[int, tuple[int, float, int]]) -> set[int]:
        pids = set()
        for root in (self.root, *self.extra_roots):
            pids |= tree_of(table, root)
        return pids & table.keys()

    def sample(self) -> None:
        table = proc_table(self.proc_dir)
        pids = self._pids(table)
        memory = 0
        for pid in pids & self._seen:
            pss = proportional_bytes(pid, self.proc_dir)
            memory += table[pid][2] if pss is None else pss
        self.peak_rss = max(self.peak_rss, memory)
        self._seen = pids
        for pid in pids:
            self.cpu_by_pid[pid] = table[pid][1] - self.baseline.get(pid, 0.0)

    def run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._stop.set()


@dataclass
class Measured:
    """A finished process: how long, how much CPU and memory, its output."""

    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    returncode: int
    report: dict | None
    log: Path


def parse_report(text: str) -> dict | None:
    """The last ``BENCH-REPORT {json}`` line of a process's output."""
    found = None
    for line in text.splitlines():
        if line.startswith(REPORT_PREFIX):
            found = json.loads(line[len(REPORT_PREFIX) :])
    return found


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Running:
    """A process of the bench, its output going to ``log``, its tree sampled."""

    def __init__(
        self,
        cmd: Sequence[str],
        env: dict[str, str],
        log: Path,
        cwd: Path | None = None,
        serving: Sequence[int] = (),
    ) -> None:
        self.log = log
        self.cpu_before = _children_cpu()
        self.started = time.monotonic()
        self.proc = start_detached(cmd, log, env=env, cwd=cwd, append=False)
        self.sampler = TreeSampler(self.proc.pid, extra_roots=tuple(serving))
        self._thread = threading.Thread(target=self.sampler.run, daemon=True)
        self._thread.start()

    def wait_ready(self, timeout_s: float, marker: str = READY_LINE) -> bool:
        """Until the process prints ``marker`` (or dies, or the timeout)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            if marker in self.log.read_text(errors="replace"):
                return True
            time.sleep(0.5)
        return False

    def cpu_s_now(self) -> float:
        """The CPU seconds its tree has used so far (sampled now)."""
        self.sampler.sample()
        return sum(self.sampler.cpu_by_pid.values())

    def terminate(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)

    def finish(self, timeout_s: float) -> Measured:
        """Wait for the end (SIGKILL of the group past ``timeout_s``)."""
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            print(f"   timed out after {timeout_s:.0f} s: killing it (see {self.log})", flush=True)
            self.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        wall = time.monotonic() - self.started
        self.sampler.stop()
        self._thread.join()
        reaped = _children_cpu() - self.cpu_before
        cpu = max(reaped, sum(self.sampler.cpu_by_pid.values()))
        text = self.log.read_text(errors="replace")
        return Measured(
            round(wall, 2),
            round(cpu, 2),
            round(self.sampler.peak_rss / 2**20, 1),
            self.proc.returncode,
            parse_report(text),
            self.log,
        )
