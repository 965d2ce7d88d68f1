"""One driver per checkpoint.

Two stream drivers on one checkpoint (a supervisor's restart while the old
driver still runs, a manual ``adpipe stream`` beside the DAG's) would race
for the same offset log and state versions; the transactional.id fences the
older one only at its next Kafka call. So a driver takes an exclusive
``flock`` before it touches the checkpoint and keeps it for its life; the
kernel drops it when the process dies, SIGKILL included, so a crash never
leaves a stale lock behind.

Where: beside a local (``file://``) checkpoint (``<checkpoint>.lock``), so
every driver on the host, whatever its ``ADPIPE_HOME``, meets the same lock;
for ``hdfs://`` or ``s3a://`` under ``ADPIPE_HOME``, which guards one host
(across hosts the fencing and Spark's own refusal of a concurrent offset-log
write remain).

A standby driver (``adpipe stream --standby``) waits for the lock in a
blocking ``flock``: the kernel hands it over the instant the holder dies, and
lists the waiter in ``/proc/locks`` (``->``), which is how ``adpipe status``
sees it. A paused or frozen holder keeps its lock, so the holder also renews
a lease (``<lock>.lease``: pid, host, epoch, time) twice a second; a standby
that finds it older than ``ADPIPE_STREAM_LEASE_S`` takes over with a higher
epoch, and the old driver, once resumed, reads that epoch and exits at once
(its Kafka transactions are fenced by then anyway)."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from adpipe.files import write_json
from adpipe.settings import Settings, SettingsError

log = logging.getLogger("adpipe.stream")

# What a standby driver logs once warm (adpipe.stream.driver), waiting for
# this lock: what tools and tests that watch a standby read in its log.
STANDBY_WARM_LINE = "standby: warm in "


class CheckpointInUseError(RuntimeError):
    """Another live driver holds this checkpoint."""


def lock_path(settings: Settings) -> Path:
    try:
        return Path(f"{settings.checkpoint_dir}.lock")
    except SettingsError:  # not a local folder
        return settings.home / "stream" / settings.job_id / "checkpoint.lock"


@dataclass(frozen=True)
class Lease:
    """The active driver's claim on the checkpoint, renewed every
    :data:`RENEW_S`; a takeover writes a higher ``epoch``."""

    pid: int
    host: str
    epoch: int
    at: float  # epoch seconds of the last renewal

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


RENEW_S = 0.5
# What a driver fenced by a takeover exits with (adpipe.stream.cli.EXIT_FENCED).
EXIT_FENCED = 4


def lease_path(settings: Settings) -> Path:
    return lock_path(settings).with_suffix(".lease")


def read_lease(settings: Settings) -> Lease | None:
    return _read_lease(lease_path(settings))


def _read_lease(path: Path) -> Lease | None:
    try:
        return Lease(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


class LeaseKeeper:
    """Renews this driver's lease from a thread of its own. A renewal that
    finds a higher epoch (a standby took over while this driver was paused
    or frozen) ends the process at once with :data:`EXIT_FENCED`: a resumed
    zombie does nothing more (its Kafka transactions are fenced anyway, and
    Spark refuses its next offset or commit log entry)."""

    def __init__(self, settings: Settings) -> None:
        self.path = lease_path(settings)
        current = read_lease(settings)
        self.epoch = (current.epoch if current else 0) + 1
        self.stopped = threading.Event()
        self._write()
        self.thread = threading.Thread(target=self._renew, name="checkpoint-lease", daemon=True)
        self.thread.start()

    def _write(self) -> None:
        write_json(self.path, asdict(Lease(os.getpid(), os.uname().nodename, self.epoch, time.time())), indent=None)

    def _renew(self) -> None:
        while not self.stopped.wait(RENEW_S):
            current = _read_lease(self.path)
            if current is not None and current.epoch > self.epoch:
                log.error("fenced: %s took over this checkpoint (lease epoch %d > %d) while this driver was paused; "
                          "stopping now", current.describe(), current.epoch, self.epoch)
                for handler in logging.getLogger().handlers:
                    handler.flush()
                os._exit(EXIT_FENCED)
            self._write()

    def stop(self) -> None:
        """Stop renewing and withdraw the lease (a driver that stopped cleanly
        claims nothing), unless another driver has taken it since."""
        self.stopped.set()
        self.thread.join(timeout=5)
        current = _read_lease(self.path)
        if current is not None and current.epoch == self.epoch:
            self.path.unlink(missing_ok=True)


@contextmanager
def checkpoint_lock(settings: Settings, standby: bool = False) -> Iterator[str | None]:
    """Hold the checkpoint's lock (and renew its lease) for the block, or
    raise at once, naming the process that holds it. With ``standby``, wait
    instead: until the holder ends, or until its lease is older than
    ``stream_lease_s`` (paused, frozen), whose holder is then fenced and the
    lock taken when it ends. Yields None, or for a standby the reason it
    took over."""
    path = lock_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    keeper = None
    took_over = None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _write_holder(fd)
            if standby:
                log.info("standby: no driver holds the checkpoint %s: this one is the active driver",
                         settings.checkpoint_uri)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "unknown"
            if not standby:
                raise CheckpointInUseError(
                    f"the checkpoint {settings.checkpoint_uri} is in use by another stream driver ({holder}); "
                    f"stop it first (lock {path})"
                ) from None
            took_over = _stand_by(settings, fd, holder)
        keeper = LeaseKeeper(settings)
        yield took_over
    finally:
        if keeper is not None:
            keeper.stop()
        os.close(fd)  # releases the lock


def _write_holder(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}".encode(), 0)


def _stand_by(settings: Settings, fd: int, holder: str) -> str:
    """Wait for the lock in a blocking ``flock`` (listed in the kernel's
    table, taken the instant the holder dies) while watching the holder's
    lease; the reason this standby goes on."""
    log.info("standby: the checkpoint %s is held by the active driver (%s); waiting for it (lock %s)",
             settings.checkpoint_uri, holder, lock_path(settings))
    locked = threading.Event()

    def lock() -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        _write_holder(fd)
        locked.set()

    threading.Thread(target=lock, name="checkpoint-lock", daemon=True).start()
    while not locked.wait(0.1):
        lease = read_lease(settings)
        age = time.time() - lease.at if lease else 0.0
        if lease is not None and lease.pid != os.getpid() and age > settings.stream_lease_s:
            reason = f"the active driver ({lease.describe()}) has not renewed its lease for {age:.1f} s"
            log.warning("standby: %s (paused or frozen): taking over and fencing it; its lock is taken when it ends",
                        reason)
            return reason
    running = _running_without_lock(settings)
    if running is not None:
        # A driver that took over through the lease from a paused holder runs
        # without the lock until that holder ends; the lock came here instead.
        log.info("standby: the lock is this one's, but %s runs the checkpoint (it took over through the lease); "
                 "waiting for it to end or stop renewing", running.describe())
        while _running_without_lock(settings) is not None:
            time.sleep(0.1)
        reason = f"the active driver ({running.describe()}) ended or stopped renewing its lease"
    else:
        reason = f"the active driver ({holder}) ended"
    log.info("standby: %s; taking over the checkpoint", reason)
    return reason


def _running_without_lock(settings: Settings) -> Lease | None:
    """Another driver's lease, renewed within ``stream_lease_s`` by a
    process that still runs (on another host: renewed is all one can know)."""
    lease = read_lease(settings)
    if lease is None or lease.pid == os.getpid() or time.time() - lease.at > settings.stream_lease_s:
        return None
    if lease.host == os.uname().nodename and not _process_runs(lease.pid):
        return None
    return lease


def _process_runs(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def holder(settings: Settings, lock_table: Path = Path("/proc/locks")) -> int | None:
    """The pid of the driver that holds this checkpoint's lock now (None:
    none does, or the kernel's lock table cannot be read). Read from the
    table, never by taking the lock: a probe holding it for an instant could
    make a driver that starts at that instant refuse to run."""
    read = _read_locks(settings, lock_table)
    return flock_holder(*read) if read else None


def waiters(settings: Settings, lock_table: Path = Path("/proc/locks")) -> list[int]:
    """The pids of the standby drivers waiting for this checkpoint's lock
    (read from the kernel's lock table, as :func:`holder`)."""
    read = _read_locks(settings, lock_table)
    return flock_waiters(*read) if read else []


def _read_locks(settings: Settings, lock_table: Path) -> tuple[str, str] | None:
    """The kernel's lock table and the lock file's id in it, or None."""
    try:
        st = lock_path(settings).stat()
        return lock_table.read_text(), f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    except OSError:
        return None


def flock_waiters(table: str, file_id: str) -> list[int]:
    """The pids waiting for a flock on ``major:minor:inode`` in a
    ``/proc/locks`` text: lines ``7: -> FLOCK  ADVISORY  WRITE 23650 fe:00:10944805 0 EOF``."""
    pids = []
    for line in table.splitlines():
        fields = line.split()
        if len(fields) >= 7 and fields[1] == "->" and fields[2] == "FLOCK" and fields[6] == file_id:
            pids.append(int(fields[5]))
    return pids


def flock_holder(table: str, file_id: str) -> int | None:
    """The pid holding a flock on the file ``major:minor:inode`` (hex, hex,
    decimal, as the kernel writes them) in a ``/proc/locks`` text, whose
    lines read ``7: FLOCK  ADVISORY  WRITE 23643 fe:00:10944805 0 EOF``; a
    request still waiting for the lock is listed with ``->`` and skipped."""
    for line in table.splitlines():
        fields = line.split()
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == file_id:
            return int(fields[4])
    return None
