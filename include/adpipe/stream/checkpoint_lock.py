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
write remain)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from adpipe.settings import Settings, SettingsError


class CheckpointInUseError(RuntimeError):
    """Another live driver holds this checkpoint."""


def lock_path(settings: Settings) -> Path:
    try:
        return Path(f"{settings.checkpoint_dir}.lock")
    except SettingsError:  # not a local folder
        return settings.home / "stream" / settings.job_id / "checkpoint.lock"


@contextmanager
def checkpoint_lock(settings: Settings) -> Iterator[Path]:
    """Hold the checkpoint's lock for the block, or raise at once, naming
    the process that holds it."""
    path = lock_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "unknown"
            raise CheckpointInUseError(
                f"the checkpoint {settings.checkpoint_uri} is in use by another stream driver ({holder}); "
                f"stop it first (lock {path})"
            ) from None
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
    try:
        st = lock_path(settings).stat()
        table = lock_table.read_text()
    except OSError:
        return None
    return flock_holder(table, f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}")


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
