"""What the stream supervisor's tests share: a unit job's settings and a
health reading to vary."""

from __future__ import annotations

from pathlib import Path

from adpipe.settings import Settings, load_settings


def unit_settings(tmp_path: Path, **env: str) -> Settings:
    return load_settings({"ADPIPE_HOME": str(tmp_path), "ADPIPE_JOB_ID": "unit", **env})


def health(**changes: object):  # noqa: ANN201
    """A live job's health (seen by its process, batch 3, no lag) with ``changes``."""
    from adpipe.orchestration.stream_supervisor import StreamHealth

    base = dict(
        job_id="unit", alive=True, how="process", pid=1, heartbeat_age_s=1.0, last_batch=3, watermark_ms=0, lag=0
    )
    return StreamHealth(**{**base, **changes})
