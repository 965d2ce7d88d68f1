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
sees it."""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from adpipe.settings import Settings, SettingsError

log = logging.getLogger("adpipe.stream")


class CheckpointInUseError(RuntimeError):
    """Another live driver holds this checkpoint."""


def lock_path(settings: Settings) -> Path:
    try:
        return Path(f"{settings.checkpoint_dir}.lock")
    except SettingsError:  # not a local folder
        return settings.home / "stream" / settings.job_id / "checkpoint.lock"


@contextmanager
def checkpoint_lock(settings: Settings, standby: bool = False) -> Iterator[Path]:
    """Hold the checkpoint's lock for the block, or raise at once, naming
    the process that holds it; with ``standby``, wait for it instead (until
    the holder ends)."""
    path = lock_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "unknown"
            if not standby:
                raise CheckpointInUseError(
                    f"the checkpoint {settings.checkpoint_uri} is in use by another stream driver ({holder}); "
                    f"stop it first (lock {path})"
                ) from None
            log.info("standby: the checkpoint %s is held by the active driver (%s); waiting for it (lock %s)",
                     settings.checkpoint_uri, holder, path)
            fcntl.flock(fd, fcntl.LOCK_EX)  # the kernel wakes us when the holder ends
            log.info("standby: the active driver (%s) ended; taking over the checkpoint", holder)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}".encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock


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
