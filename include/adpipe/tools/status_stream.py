"""The stream job's row of ``adpipe status``: its driver and standbys (its
leadership group's members, on any host), its last committed batch (from the
checkpoint, else its heartbeat), the batch it runs, its lag, whether it is
stalled by the supervisor's own rule, and the last failover; after
``make demo``, the demo's job while this home's own never ran."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from adpipe.settings import Settings, SettingsError, load_settings
from adpipe.tools.status_common import (
    CALL_TIMEOUT_S,
    DEGRADED,
    DOWN,
    UP,
    Component,
    at_text,
    existing,
    mtime,
    reason,
    stderr_file,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointProgress:
    """What a stream job's Spark checkpoint says it has done."""

    last_committed: int | None  # newest commits/N: the batch's output is final
    committed_at: float | None  # when that commit was written (epoch s)
    newest_planned: int | None  # newest offsets/N: a batch Spark has started
    planned_at: float | None  # when Spark started it (its offsets entry written)
    watermark_ms: int | None  # the event-time watermark the last committed batch ran with
    end_offsets: dict[int, int] = field(default_factory=dict)  # where that batch stopped reading, per partition

    @property
    def uncommitted(self) -> int | None:
        """A batch started and not committed: running now, or (after a
        crash) replayed at the next start."""
        if self.newest_planned is None or (
            self.last_committed is not None and self.newest_planned <= self.last_committed
        ):
            return None
        return self.newest_planned


def checkpoint_progress(root: Path) -> CheckpointProgress | None:
    """Read a local checkpoint folder (None: there is none). Spark writes
    ``offsets/N`` before it runs batch N and ``commits/N`` after its sink
    returned (:mod:`adpipe.stream.offset_log`)."""
    from adpipe.stream.offset_log import LocalCheckpoint, OffsetLogError, batch_offsets, last_committed_batch
    from adpipe.stream.watermark import ProgressLog

    if not root.is_dir():
        return None
    files = LocalCheckpoint(root)
    planned = [int(name) for name in files.names("offsets") if name.isdigit()]
    last = last_committed_batch(files)
    committed_at = watermark = None
    end: dict[int, int] = {}
    if last is not None:
        try:
            committed_at = (root / "commits" / str(last)).stat().st_mtime
            end = batch_offsets(files, last).end
            progress = ProgressLog(files).at(last)
            watermark = progress.watermark_ms if progress is not None else None
        except (OSError, OffsetLogError, ValueError):  # a checkpoint being written, or damaged: say what is known
            pass
    newest = max(planned) if planned else None
    planned_at = mtime(root / "offsets" / str(newest)) if newest is not None else None
    return CheckpointProgress(last, committed_at, newest, planned_at, watermark, end)


def stream_component(settings: Settings, kafka_up: bool, now: float | None = None) -> Component:
    """Alive: a driver leads the job (its leadership group, on any host:
    adpipe.stream.leadership), or, the brokers not answering, the
    supervisor's pid runs. Its last batch from the checkpoint (a local one)
    or else its heartbeat; its lag from the broker (raw records not yet
    committed by its transactions). Stalled by the supervisor's own rule
    (:func:`liveness.input_stalled`, the rule it restarts a job by): input
    waits and for ADPIPE_STREAM_STALL_S the job has neither finished a batch
    nor polled. With the lag unknown (the broker does not answer): a batch
    started more than ADPIPE_STREAM_STALL_S ago and not committed yet."""
    from adpipe.stream import liveness

    now = time.time() if now is None else now
    supervised = liveness.read_state(settings)
    supervised_pid = supervised.get("pid") if liveness.process_alive(supervised.get("pid")) else None
    drivers = _drivers(settings, kafka_up)
    lead = next((d for d in drivers if d.leads), None)
    here = socket.gethostname()
    pid = (lead.pid if lead.host == here else None) if lead is not None else supervised_pid
    standbys = [d for d in drivers if not d.leads]
    facts: dict[str, Any] = {
        "job_id": settings.job_id,
        "pid": pid,
        "driver": None if lead is None else {"host": lead.host, "pid": lead.pid},
        "standby_pids": [d.pid for d in standbys if d.host == here],
        "standbys": [{"host": d.host, "pid": d.pid} for d in standbys],
    }
    if pid:
        parts = [f"pid {pid}"]
    else:
        parts = [f"led by {lead.describe()}" if lead is not None else "not running"]
    if standbys:
        parts.append("standby " + ", ".join(d.describe() for d in standbys) + " (takes over when it ends)")
    try:
        progress = checkpoint_progress(settings.checkpoint_dir)
    except SettingsError:  # hdfs://, s3a://: the heartbeat says what the last batch was
        progress = None
    beat = liveness.read_heartbeat(settings)
    failover = liveness.read_failover(settings)
    if failover is not None:
        facts["last_failover"] = failover
        parts.append(f"last failover{at_text(failover.get('at'), now)}: {failover.get('reason')}, "
                     f"next batch {failover.get('seconds')} s after")
    parts.append(_last_batch(progress, beat, facts, now))
    lag = _stream_lag(settings, kafka_up, facts, now)
    stalled = False
    if pid and facts["lag"] is not None:
        started_at = supervised.get("started_at") if pid == supervised_pid else liveness.process_started_at(pid)
        stalled = liveness.input_stalled(
            facts["lag"], now, settings.stream_stall_s, beat["at"] if beat else None,
            liveness.polled_at(settings), started_at or 0.0,
        )
    if progress is not None and progress.uncommitted is not None:
        facts["uncommitted_batch"] = progress.uncommitted
        running_s = now - (progress.planned_at or now)
        if not pid:
            parts.append(f"batch {progress.uncommitted} started, not committed: replayed at the next start")
        elif facts["lag"] is None and running_s > settings.stream_stall_s:
            stalled = True
            parts.append(f"batch {progress.uncommitted} stalled: running for {running_s:.0f} s")
        else:
            parts.append(f"batch {progress.uncommitted} running for {running_s:.0f} s")
    parts.append(lag)
    if stalled and facts["lag"] is not None:
        parts.append(
            f"stalled: input waits and no batch finished nor poll for over {settings.stream_stall_s} s "
            "(the supervisor restarts it)"
        )
    facts["stalled"] = stalled
    state = DEGRADED if stalled else (UP if pid or lead is not None else DOWN)
    logs = existing(stderr_file(pid) if pid else None, supervised.get("log"))
    return Component("stream", state, settings.checkpoint_uri, "; ".join(parts), logs, facts)


def _drivers(settings: Settings, kafka_up: bool) -> list:
    """The job's drivers in its leadership group (none when the brokers do not answer)."""
    from adpipe.stream import leadership

    if not kafka_up:
        return []
    try:
        return leadership.drivers(settings, timeout_s=5)
    except Exception as exc:  # noqa: BLE001 - status says what it knows
        log.debug("the stream's leadership group: %s", exc)
        return []


def _last_batch(
    progress: CheckpointProgress | None, beat: dict[str, Any] | None, facts: dict[str, Any], now: float
) -> str:
    """The last committed batch: the checkpoint's (a local one), else the
    heartbeat's (the last batch the job finished, wherever its checkpoint)."""
    if progress is not None and progress.last_committed is not None:
        batch, at, watermark = progress.last_committed, progress.committed_at, progress.watermark_ms
        facts["end_offsets"] = progress.end_offsets
    elif beat is not None:
        batch, at, watermark = beat.get("batch_id"), beat.get("at"), beat.get("watermark_ms")
    else:
        facts["last_batch"] = None
        return "no batch committed yet"
    facts.update(last_batch=batch, last_batch_at=at, watermark_ms=watermark)
    return f"last batch {batch}" + at_text(at, now)


def _stream_lag(settings: Settings, kafka_up: bool, facts: dict[str, Any], now: float) -> str:
    from adpipe import kafka_io

    facts["lag"] = None
    if not kafka_up:
        return "lag unknown (the broker does not answer)"
    try:
        commits = kafka_io.stream_commits(settings, CALL_TIMEOUT_S)  # read once: the count and its age
        by_partition = kafka_io.stream_lag(settings, commits, timeout_s=CALL_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - the row still says what else is known
        return f"lag unknown ({reason(exc)})"
    facts.update(lag=sum(by_partition.values()), lag_by_partition=by_partition, lag_s=None)
    try:
        facts["lag_s"] = kafka_io.stream_lag_seconds(settings, by_partition, commits, now, CALL_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - the count stands without its age
        return f"lag {facts['lag']} records (its age unknown: {reason(exc)})"
    age = "" if not facts["lag"] or facts["lag_s"] is None else f", the oldest {facts['lag_s']:.0f} s"
    return f"lag {facts['lag']} records{age}"



def described_stream_settings(settings: Settings) -> tuple[Settings, str]:
    """The settings the stream row describes: these, or, when this home's
    own job never ran and ``adpipe demo`` did, the last demo run's job (its
    own topics and job id), with a note saying so."""
    from adpipe.stream import liveness

    try:
        ran = settings.checkpoint_dir.exists()
    except SettingsError:  # a remote checkpoint: its heartbeat says
        ran = False
    if ran or liveness.read_heartbeat(settings) or liveness.read_state(settings).get("pid"):
        return settings, ""
    try:
        latest = json.loads((settings.home / "demo" / "latest.json").read_text())
        demo = load_settings({**os.environ, "ADPIPE_HOME": str(settings.home), **latest["env"]})
    except (OSError, ValueError, KeyError, TypeError, SettingsError):
        return settings, ""
    return demo, f"the last demo's job {demo.job_id} (job {settings.job_id} never ran here)"


def with_note(row: Component, note: str) -> Component:
    if not note:
        return row
    return replace(row, detail=f"{note}: {row.detail}", facts={**row.facts, "described": note})
