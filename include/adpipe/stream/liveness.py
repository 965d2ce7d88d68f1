"""Whether a stream job runs, seen from outside it: the files the job and
its supervisor leave under ``$ADPIPE_HOME/stream/<job_id>``
(``heartbeat.json`` after every batch, ``supervisor.json`` with the pid the
supervisor started and its log). Read by the supervisor DAG
(:mod:`adpipe.orchestration.stream_supervisor`) and ``adpipe status``;
nothing here imports Spark or Airflow."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from adpipe.settings import PROJECT_ROOT, Settings

# What spark-submit runs for the job; its command line names it.
STREAM_APPLICATION = PROJECT_ROOT / "jobs" / "aggregation_stream.py"


def stream_dir(settings: Settings) -> Path:
    return settings.home / "stream" / settings.job_id


def heartbeat_path(settings: Settings) -> Path:
    """Written by the job after every batch it finished (``adpipe.stream.job``)."""
    return stream_dir(settings) / "heartbeat.json"


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
