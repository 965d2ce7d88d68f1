"""Whether a stream job runs, seen from outside it: the files the job and
its supervisor leave under ``$ADPIPE_HOME/stream/<job_id>``
(``heartbeat.json`` after every batch, ``polled.json`` whenever Spark
reports the query's progress or its idling, ``supervisor.json`` with the pid
the supervisor started and its log). Read by the supervisor DAG
(:mod:`adpipe.orchestration.stream_supervisor`) and ``adpipe status``;
nothing here imports Spark or Airflow."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from adpipe.files import write_json
from adpipe.settings import PROJECT_ROOT, Settings

# What spark-submit runs for the job; its command line names it.
STREAM_APPLICATION = PROJECT_ROOT / "jobs" / "aggregation_stream.py"


def stream_dir(settings: Settings) -> Path:
    return settings.home / "stream" / settings.job_id


def heartbeat_path(settings: Settings) -> Path:
    """Written by the job after every batch it finished (``adpipe.stream.job``)."""
    return stream_dir(settings) / "heartbeat.json"


def polled_path(settings: Settings) -> Path:
    """Touched by the job whenever Spark reports the query's progress or that
    it is idle, waiting for input (every few seconds while it waits): a job
    that has had nothing to read for a long time is still alive, and input
    arriving now is not input it has been stuck on."""
    return stream_dir(settings) / "polled.json"


def mark_polled(settings: Settings, now: float | None = None) -> None:
    path = polled_path(settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"at": time.time() if now is None else now}))
    tmp.replace(path)


def polled_at(settings: Settings) -> float | None:
    try:
        return float(json.loads(polled_path(settings).read_text())["at"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def input_stalled(
    lag: int, now: float, stall_s: float, heartbeat_at: float | None, polled_at: float | None, started_at: float = 0.0
) -> bool:
    """A live job is stalled when input waits (``lag``) and for ``stall_s``
    it has neither finished a batch (heartbeat) nor polled (Spark reported
    progress or idling), counting from its start. A job idle for hours whose
    input arrives now has polled seconds ago: not stalled; a job stuck in a
    batch reports neither."""
    quiet_since = max(heartbeat_at or 0.0, polled_at or 0.0, started_at)
    return lag > 0 and now - quiet_since > stall_s


def failover_path(settings: Settings) -> Path:
    """Written by a standby driver once its first batch after a takeover is done."""
    return stream_dir(settings) / "failover.json"


def record_failover(settings: Settings, reason: str, batch_id: int, seconds: float) -> None:
    write_json(failover_path(settings), {"at": time.time(), "pid": os.getpid(), "reason": reason,
                                         "batch_id": batch_id, "seconds": round(seconds, 1)})


def read_failover(settings: Settings) -> dict[str, Any] | None:
    try:
        return json.loads(failover_path(settings).read_text())
    except (OSError, ValueError):
        return None


def supervisor_state_path(settings: Settings) -> Path:
    """The supervisor's record: the pid it started, when, its log, its restarts."""
    return stream_dir(settings) / "supervisor.json"


def read_state(settings: Settings) -> dict[str, Any]:
    try:
        return json.loads(supervisor_state_path(settings).read_text())
    except (OSError, ValueError):
        return {"starts": [], "restarts": []}


def read_heartbeat(settings: Settings) -> dict[str, Any] | None:
    try:
        return json.loads(heartbeat_path(settings).read_text())
    except (OSError, ValueError):
        return None


def process_alive(pid: int | None) -> bool:
    """The pid runs (not a zombie) and is the stream job started by spark-submit."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    proc = Path(f"/proc/{pid}")
    try:
        stat = (proc / "stat").read_text()
        if stat.rsplit(")", 1)[1].split()[0] in ("Z", "X"):
            return False
        return STREAM_APPLICATION.name in (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def descends_from(pid: int, ancestor: int) -> bool:
    """``pid`` is ``ancestor`` or runs under it (a driver's Python process
    under the spark-submit that started it), from /proc."""
    for _ in range(64):
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


def process_started_at(pid: int) -> float | None:
    """When ``pid`` started (epoch seconds, from /proc), or None where that
    cannot be read: the start of a job run by hand, for :func:`input_stalled`."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None
