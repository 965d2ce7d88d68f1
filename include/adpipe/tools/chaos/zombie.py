"""The stream_pause fault, a real zombie: the driver stays stopped past the
transaction timeout while a successor driver takes over its checkpoint,
then is resumed and must stop by itself (fenced)."""

from __future__ import annotations

import signal
import time

from .context import RunContext
from .monitor import Monitor
from .parts import Crew, Part, Restarts, ZombiePause
from .plan import STREAM_PAUSE
from .timeline import Clock, FaultLog, FaultRecord

# The driver stays stopped past the transaction timeout (plus this margin)
# while a successor driver takes over the checkpoint, and is resumed once
# the successor has committed a batch (at most PAUSE_MAX_S). The resumed
# zombie must then stop by itself (fenced) within ZOMBIE_EXIT_S, or it is
# killed and the fault says so. A resumed driver with nothing to write (no
# input came while it was stopped, or it was stopped between batches) only
# learns it is fenced at its next transaction: one whose log stays quiet for
# ZOMBIE_QUIET_S is idle, and is killed then (it could make nothing visible).
PAUSE_MARGIN_S = 10.0
PAUSE_MAX_S = 240.0
ZOMBIE_EXIT_S = 90.0
ZOMBIE_QUIET_S = 20.0


def has_fenced(part: Part) -> bool:
    """Whether a stream driver's sink has taken its transactional id (its
    log says so: adpipe.stream.sink's "older instances fenced")."""
    try:
        return "older instances fenced" in part.log_path.read_text(errors="replace")
    except OSError:
        return False


def _quiet_s(pause: ZombiePause) -> float:
    """How long the resumed driver's log has not been written. Its size
    alone can stand still while it writes: another writer's append leaves
    the driver's own offset behind the end, and it overwrites up to it."""
    try:
        stat = pause.zombie.log_path.stat()
        stamp = (stat.st_size, stat.st_mtime_ns)
    except OSError:
        stamp = (-1, -1)
    now = time.monotonic()
    if stamp != pause.log_stamp:
        pause.log_stamp, pause.quiet_since = stamp, now
    return now - pause.quiet_since


class Zombies:
    """A stream_pause from start to end: the successor started beside the
    stopped driver (:meth:`start`), the zombie resumed (:meth:`resume`),
    then retired (:meth:`retire`); the clock calls back in between."""

    def __init__(
        self, ctx: RunContext, crew: Crew, monitor: Monitor, restarts: Restarts, faults: FaultLog, clock: Clock
    ) -> None:
        self.ctx, self.crew, self.monitor = ctx, crew, monitor
        self.restarts, self.faults, self.clock = restarts, faults, clock
        self.successors = 0

    def start(self, record: FaultRecord) -> None:
        """The stopped driver's successor: the run's standby when it has a
        live one (it takes over once the stopped driver's session in the
        leadership group expires, ``ADPIPE_STREAM_LEASE_S``), else a second
        driver started now."""
        standby = self.crew.standby
        if standby is not None and standby.alive:
            self.crew.standby = None  # the successor; the zombie is the standby once retired
            self._pause(record, standby)
        else:
            self._pause(record, self._start_successor())

    def _start_successor(self) -> Part:
        """Start a second driver of the job, as a standby: it waits in the
        job's leadership group and leads once the stopped driver's session
        has expired (ADPIPE_STREAM_LEASE_S), as a driver on another host
        would (where the transactional.id's fencing and Spark's own
        offset-log checks stand between them too)."""
        self.successors += 1
        stream = self.crew.stream
        successor = Part(
            f"stream-successor{self.successors}", self.crew.standby_argv, stream.env, self.ctx.logs, stream.spread
        )
        successor.peers = [stream]
        successor.start()
        return successor

    def _pause(self, record: FaultRecord, successor: Part) -> None:
        """The stopped driver stays stopped past the transaction timeout (the
        broker aborts its open transaction), then is resumed."""
        settings, stream = self.ctx.settings, self.crew.stream
        min_s = settings.transaction_timeout_ms / 1000 + PAUSE_MARGIN_S
        record.down_s = round(max(record.down_s, min_s), 1)
        self.crew.pause = ZombiePause(
            record, stream, successor, time.monotonic(), record.down_s, self.monitor.stream_committed
        )
        self.clock.later(record.down_s, "resume_stream")

    def resume(self) -> None:
        """SIGCONT the stopped driver once its transaction timed out and its
        successor committed a batch (or PAUSE_MAX_S passed)."""
        pause = self.crew.pause
        assert pause is not None
        stopped_s = time.monotonic() - pause.stopped_at
        # Taken over: the successor committed a batch, or (no input waits)
        # its sink fenced the stopped driver's transactional id.
        took_over = self.monitor.stream_committed > pause.committed_before or has_fenced(pause.successor)
        if not took_over and pause.successor.alive and stopped_s < PAUSE_MAX_S:
            self.clock.later(2, "resume_stream")
            return
        if not took_over:
            pause.record.injected = False
            why = (
                f"no real zombie: the successor committed nothing in {stopped_s:.0f} s "
                f"(it {'ran' if pause.successor.alive else 'exited'})"
            )
            pause.record.note = f"{pause.record.note}; {why}".lstrip("; ")
        pause.zombie.signal(signal.SIGCONT)
        pause.resumed_at = time.monotonic()
        _quiet_s(pause)  # its log's size at the resume: quiet from now on unless it grows
        pause.record.down_s = round(stopped_s, 1)
        self.clock.later(1, "retire_zombie")

    def retire(self) -> None:
        """Wait for the resumed driver to stop by itself (its leadership lost,
        or fenced); then its successor is the stream job."""
        pause = self.crew.pause
        assert pause is not None and pause.resumed_at is not None
        since = time.monotonic() - pause.resumed_at
        idle = _quiet_s(pause) >= ZOMBIE_QUIET_S
        if pause.zombie.alive and since < ZOMBIE_EXIT_S and not idle:
            self.clock.later(1, "retire_zombie")
            return
        if pause.zombie.alive:
            why = "idle (its log quiet, no batch to write)" if idle else "still ran"
            pause.record.note = f"{pause.record.note}; the zombie {why} {since:.0f} s after its resume: killed"
            pause.zombie.signal(signal.SIGKILL)
            pause.zombie.proc.wait(timeout=30)  # type: ignore[union-attr]
        rc = pause.zombie.proc.poll() if pause.zombie.proc is not None else None
        pause.zombie.reap()
        pause.record.note = f"{pause.record.note}; the resumed zombie exited {rc} after {since:.0f} s".lstrip("; ")
        # The successor is the stream job now (restarted as one if it died);
        # with a standby, the retired zombie comes back as the standby.
        self.crew.stream = pause.successor
        self.crew.stream.active_since = time.monotonic()
        if self.crew.with_standby:
            self.crew.standby = pause.zombie
        self.restarts.counts["stream_takeover"] += 1
        self.crew.pause = None
        self.faults.restored(STREAM_PAUSE)
