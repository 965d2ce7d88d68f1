"""One host of the harness (:mod:`adpipe.tools.hosts`): its namespaces,
entered through its init with nsenter, and the processes started on it."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("adpipe.tools.hosts")

# Each host binds a folder of its own over the machine's /tmp.
TMP = Path("/tmp")  # noqa: S108 - named to keep the harness's folders out of it
COMMAND_TIMEOUT_S = 30.0


class HostsError(RuntimeError):
    """A command of the harness failed."""


class HostsUnavailable(HostsError):
    """This machine cannot run the harness (no root, a tool missing, no
    namespaces allowed): the reason says which."""


def _run(command: Sequence[str], check: bool = True, timeout: float = COMMAND_TIMEOUT_S) -> subprocess.CompletedProcess:
    done = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise HostsError(f"{' '.join(command)}: exit {done.returncode}: {done.stderr.strip()}")
    return done



def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc: no children file here)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def _child_of(popen: subprocess.Popen, timeout_s: float = 10.0) -> int | None:
    """The one child ``popen`` forked (nsenter's, unshare's), once it has."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / 0.02) + 1):
        found = _children(popen.pid)
        if found:
            return found[0]
        if popen.poll() is not None or time.monotonic() >= deadline:
            return None
        time.sleep(0.02)
    return None


def _ns_pid(pid: int) -> int | None:
    """``pid``'s number in its own PID namespace (what it calls itself)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    line = next((ln for ln in status.splitlines() if ln.startswith("NSpid:")), "")
    return int(line.split()[-1]) if line else None


def wait_until(what: str, condition: Callable[[], object], timeout_s: float, interval_s: float = 0.2) -> object:
    """``condition()``'s first true answer; HostsError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    for _ in range(int(timeout_s / interval_s) + 2):
        got = condition()
        if got:
            return got
        if time.monotonic() >= deadline:
            break
        time.sleep(interval_s)
    raise HostsError(f"{what}: not within {timeout_s:.0f} s")


@dataclass
class HostProcess:
    """A process started on a host. ``popen`` is the nsenter that entered the
    host and waits for it (its exit status is the process's: a signal's
    death included); signals go to ``pid``, the process itself."""

    host: str
    popen: subprocess.Popen
    log_path: Path
    pid: int | None  # in the root PID namespace
    ns_pid: int | None  # on its host (what it reports, e.g. in a Kafka client id)

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def signal(self, sig: int) -> None:
        """``sig`` to the process. A SIGCONT goes to nsenter too: nsenter
        stops itself when its child stops, and would never reap it."""
        if self.pid is not None and self.poll() is None:
            os.kill(self.pid, sig)
            if sig == signal.SIGCONT:
                os.kill(self.popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL its process group (nsenter, the process and what it
        started in its group) and reap nsenter."""
        if self.popen.poll() is None:
            try:
                os.killpg(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log.warning("nsenter %d of host %s did not end within 30 s", self.popen.pid, self.host)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Host:
    """One host: its namespaces (through its init), address and folders."""

    name: str
    netns: str
    ip: str
    directory: Path
    init: subprocess.Popen | None = None
    init_pid: int | None = None  # in the root PID namespace
    processes: list[HostProcess] = field(default_factory=list)

    @property
    def home(self) -> Path:
        """This host's ADPIPE_HOME (shares nothing with another host's)."""
        return self.directory / "home"

    @property
    def tmp(self) -> Path:
        """What the host sees as /tmp."""
        return self.directory / "tmp"

    def env(self, base: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
        """``base`` (default: this process's environment) on this host: its
        ADPIPE_HOME and /tmp."""
        return {**(os.environ if base is None else base), "ADPIPE_HOME": str(self.home), "TMPDIR": str(TMP), **extra}

    def _enter(self, cwd: Path | None) -> list[str]:
        if self.init_pid is None or self.init is None or self.init.poll() is not None:
            raise HostsError(f"host {self.name} does not run")
        target = f"--target={self.init_pid}"
        return ["nsenter", target, "--net", "--uts", "--mount", "--pid", f"--wd={cwd or self.directory}", "--"]

    def start(self, command: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None,
              cwd: Path | None = None) -> HostProcess:
        """``command`` on this host, in a session of its own, its output in ``log_path``."""
        with log_path.open("ab") as out:
            popen = subprocess.Popen(  # noqa: S603
                [*self._enter(cwd), *command], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=dict(env) if env is not None else self.env(), start_new_session=True,
            )
        pid = _child_of(popen)
        proc = HostProcess(self.name, popen, log_path, pid, _ns_pid(pid) if pid else None)
        self.processes.append(proc)
        return proc

    def run(self, command: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 120,
            cwd: Path | None = None) -> subprocess.CompletedProcess:
        """``command`` on this host to its end (on a timeout nsenter is
        killed; what it left runs until the host ends)."""
        return subprocess.run(  # noqa: S603
            [*self._enter(cwd), *command], capture_output=True, text=True, timeout=timeout, check=False,
            env=dict(env) if env is not None else self.env(), start_new_session=True,
        )

    def kill(self, timeout_s: float = 30.0) -> None:
        """SIGKILL every process of the host (its init: the kernel ends the
        PID namespace with it) and wait for them."""
        if self.init_pid is not None and self.init is not None and self.init.poll() is None:
            try:
                os.kill(self.init_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.init is not None:
            try:
                self.init.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.init.kill()
                self.init.wait(timeout=timeout_s)
            if self.init.stdin is not None:
                self.init.stdin.close()
            if self.init.stdout is not None:
                self.init.stdout.close()
        for proc in self.processes:
            proc.kill()
