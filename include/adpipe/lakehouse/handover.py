"""Files of a load's steps: the staged run ``adpipe load --step stage
--run-file F`` writes and ``--step audit|publish`` read, each step's result
beside it, and the runs' manifests. Written whole or not at all. (The
Airflow DAG's tasks hand the staged run to one another in XCom; a task's
``F`` is a temporary file of its own, adpipe.orchestration.load_tasks.)"""

from __future__ import annotations

from pathlib import Path

from adpipe.files import write_json

__all__ = ["step_file", "write_json"]


def step_file(run_file: Path, step: str) -> Path:
    """Where a step of the run handed over in ``run_file`` writes its result."""
    return run_file.with_name(f"{run_file.stem}.{step}.json")
