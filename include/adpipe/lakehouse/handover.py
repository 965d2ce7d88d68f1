"""Files a load's steps hand over: the staged run a DAG's ``stage`` task
writes and the later steps read, each step's result beside it, and the
runs' manifests. Written whole or not at all."""

from __future__ import annotations

from pathlib import Path

from adpipe.files import write_json

__all__ = ["step_file", "write_json"]


def step_file(run_file: Path, step: str) -> Path:
    """Where a step of the run handed over in ``run_file`` writes its result."""
    return run_file.with_name(f"{run_file.stem}.{step}.json")
